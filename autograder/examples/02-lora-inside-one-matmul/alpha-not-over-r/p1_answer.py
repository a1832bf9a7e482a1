def adapted_forward(X, W, A, B, lora_alpha, r):
    """The adapted layer's output for the inputs X; returns an n × m array."""
    # Typical mistake: lora_alpha used as the scale, without dividing by r.
    s = lora_alpha
    return X @ W + s * (X @ A) @ B
