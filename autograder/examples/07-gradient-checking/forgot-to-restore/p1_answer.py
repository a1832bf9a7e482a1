def central_difference(f, x, eps):
    """(f(x + eps e_i) - f(x - eps e_i)) / (2 eps) for every index i of x; returns an array shaped like x."""
    # Typical mistake: each entry is perturbed and never put back, so later entries see a shifted x.
    grad = np.zeros(x.shape, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        x[idx] += eps
        f_plus = f(x)
        x[idx] -= 2 * eps
        f_minus = f(x)
        grad[idx] = (f_plus - f_minus) / (2 * eps)
    return grad
