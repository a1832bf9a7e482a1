def log_softmax_backward(g, x):
    """dx = dL/dx for logits x and the upstream gradient g = dL/dlog_softmax(x), both n x m; returns n x m."""
    # Typical mistake: the softmax term without the row sum of g (right only when each row of g sums to 1).
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    return g - p
