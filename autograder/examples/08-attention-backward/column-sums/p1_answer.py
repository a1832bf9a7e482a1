def softmax_backward(P, dP):
    """dS = P ⊙ (dP − rowsum(dP ⊙ P)), rows over the last axis; P and dP of shape (..., T, T)."""
    # Typical mistake: sums over the queries (axis=-2), i.e. each key's column, instead of each query's row.
    return P * (dP - (dP * P).sum(axis=-2, keepdims=True))
