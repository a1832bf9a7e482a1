def softmax_backward(P, dP):
    """dS = P ⊙ (dP − rowsum(dP ⊙ P)), rows over the last axis; P and dP of shape (..., T, T)."""
    # Typical mistake: treats the softmax like an elementwise exp and forgets the normalisation's row sum.
    return P * dP
