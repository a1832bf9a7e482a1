def residual_curve(sigma):
    # Entry k: sqrt(sum of the squares of all but the k largest singular values).
    # Typical mistake: truncating sigma in the order it was given, without sorting it first.
    s = np.asarray(sigma, dtype=float)
    return np.array([math.sqrt(np.sum(s[k:] ** 2)) for k in range(len(s) + 1)])
