def central_difference(f, x, eps):
    """(f(x + eps e_i) - f(x - eps e_i)) / (2 eps) for every index i of x; returns an array shaped like x."""
    # Typical mistake: a forward difference, (f(x + eps) - f(x)) / eps, first-order accurate.
    grad = np.zeros(x.shape, dtype=np.float64)
    f0 = f(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        grad[idx] = (f(x) - f0) / eps
        x[idx] = old
    return grad
