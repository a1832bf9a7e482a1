def rope_backward(dy, cos, sin):
    """R_tᵀ dy_t at every position t: dy of shape (..., T, d), cos and sin of shape (T, d)."""
    # Typical mistake: the forward rotation (by +θ) where its transpose (by −θ) belongs.
    h = dy.shape[-1] // 2
    rotated = np.concatenate((-dy[..., h:], dy[..., :h]), axis=-1)
    return dy * cos + rotated * sin
