def swish_grad(x, beta):
    """The slope of x·σ(βx) at every entry of x, finite for large |βx|."""
    # Typical mistake: the slope taken as σ(βx), the product rule's second term dropped.
    u = beta * np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(u))
    return np.where(u >= 0, 1 / (1 + e), e / (1 + e))
