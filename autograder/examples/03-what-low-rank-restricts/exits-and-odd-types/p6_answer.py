def residual_curve(sigma):
    # Entry k: sqrt(sum of the squares of all but the k largest singular values).
    s = np.sort(np.asarray(sigma, dtype=float))[::-1]
    return np.array([math.sqrt(np.sum(s[k:] ** 2)) for k in range(len(s) + 1)]) * np.nan  # all NaN
