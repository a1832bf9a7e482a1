def rel_error(a, n):
    """max over entries of |a - n| / max(|a|, |n|, 1e-12)."""
    # Typical mistake: CS231n's code's denominator |a| + |n| instead of max(|a|, |n|, tiny).
    a, n = np.asarray(a, dtype=np.float64), np.asarray(n, dtype=np.float64)
    return float(np.max(np.abs(a - n) / np.maximum(np.abs(a) + np.abs(n), 1e-12)))
