def adamw_step(param, grad, m, v, t, lr, betas, eps, weight_decay):
    """One AdamW step; returns (new_param, new_m, new_v)."""
    # Typical mistake: the moments are used without bias correction.
    b1, b2 = betas
    param = param * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    return param - lr * m / (np.sqrt(v) + eps), m, v
