def gqa_backward(dC, Q, K, V, P):
    """(dQ, dK, dV) of causal grouped-query attention: query head h reads KV head h // (H / H_kv)."""
    # Typical mistake: each KV head gets the mean of its query heads' gradients, not their sum.
    n_rep = Q.shape[0] // K.shape[0]
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for h in range(Q.shape[0]):
        g = h // n_rep
        dq, dk, dv = attention_backward(dC[h], Q[h], K[g], V[g], P[h])
        dQ[h] = dq
        dK[g] += dk / n_rep
        dV[g] += dv / n_rep
    return dQ, dK, dV
