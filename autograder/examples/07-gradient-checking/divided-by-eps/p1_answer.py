def central_difference(f, x, eps):
    """(f(x + eps e_i) - f(x - eps e_i)) / (2 eps) for every index i of x; returns an array shaped like x."""
    # Typical mistake: the two points are 2 eps apart, but the difference is divided by eps.
    grad = np.zeros(x.shape, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        f_plus = f(x)
        x[idx] = old - eps
        f_minus = f(x)
        x[idx] = old
        grad[idx] = (f_plus - f_minus) / eps
    return grad
