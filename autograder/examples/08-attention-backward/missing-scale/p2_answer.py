def attention_backward(dC, Q, K, V, P):
    """(dQ, dK, dV) of C = softmax(Q Kᵀ / √d_h + causal mask) V, given P and dC = dL/dC."""
    # Typical mistake: the forward divided the scores by √d_h, the backward forgets it.
    dV = P.T @ dC
    dS = softmax_backward(P, dC @ V.T)
    dQ = dS @ K
    dK = dS.T @ Q
    return dQ, dK, dV
