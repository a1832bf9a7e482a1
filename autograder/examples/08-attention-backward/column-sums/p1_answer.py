def softmax_backward_kq(Pt, dPt):
    """dSᵀ from Pᵀ and dPᵀ, all laid out keys × queries: shape (..., T, T), keys in axis -2, queries in axis -1."""
    # Typical mistake: copies Know this's line, which sums over axis -1; in this layout axis -1 runs over the queries.
    return Pt * (dPt - (dPt * Pt).sum(axis=-1, keepdims=True))
