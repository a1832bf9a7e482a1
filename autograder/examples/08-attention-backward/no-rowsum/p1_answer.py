def softmax_backward_kq(Pt, dPt):
    """dSᵀ from Pᵀ and dPᵀ, all laid out keys × queries: shape (..., T, T), keys in axis -2, queries in axis -1."""
    # Typical mistake: treats the softmax like an elementwise exp and forgets the normalisation's sum.
    return Pt * dPt
