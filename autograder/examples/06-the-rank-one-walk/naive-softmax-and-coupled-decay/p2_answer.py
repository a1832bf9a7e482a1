def adamw_step(param, grad, m, v, t, lr, betas, eps, weight_decay):
    """One AdamW step; returns (new_param, new_m, new_v)."""
    # Typical mistake: weight decay added to the gradient (Adam with L2), not decoupled.
    b1, b2 = betas
    grad = grad + weight_decay * param
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v
