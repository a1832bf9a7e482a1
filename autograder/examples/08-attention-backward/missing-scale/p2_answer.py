def attention_backward(dC, Q, K, V, P):
    """(dQ, dK, dV) of C = softmax(Q Kᵀ / √d_h + causal mask) V for every head, given P and dC = dL/dC."""
    # Typical mistake: the forward divided the scores by √d_h, the backward forgets it.
    T_ = lambda M: np.swapaxes(M, -1, -2)
    dV = T_(P) @ dC
    dS = T_(softmax_backward_kq(T_(P), T_(dC @ T_(V))))
    dQ = dS @ K
    dK = T_(dS) @ Q
    return dQ, dK, dV
