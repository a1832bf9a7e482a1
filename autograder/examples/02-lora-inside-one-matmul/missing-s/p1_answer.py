def adapted_forward(X, W, A, B, lora_alpha, r):
    """Y = X W + (lora_alpha / r) (X A) B; returns an n × m array."""
    # Typical mistake: the adapter path is added without its scale.
    return X @ W + (X @ A) @ B
