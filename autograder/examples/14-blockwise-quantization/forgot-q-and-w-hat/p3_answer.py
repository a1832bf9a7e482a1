def toy_walk_D(X, W, A, B, s, target, step):
    """D and ∇X of the walk on the toy INT4 base Ŵ = step · round(W / step); returns (D, dX)."""
    # Typical mistake: the forward uses Ŵ, but the base path of ∇X multiplies by the original W.
    W_hat = np.round(W / step) * step
    Y = X @ W_hat + s * (X @ A) @ B
    p = np.exp(Y - Y.max(axis=1, keepdims=True))
    D = p / p.sum(axis=1, keepdims=True)
    D[0, target] -= 1.0
    dX = D @ W.T + s * (D @ B.T) @ A.T
    return D, dX
