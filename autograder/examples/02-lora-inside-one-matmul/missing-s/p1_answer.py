def adapted_forward(X, W, A, B, lora_alpha, r):
    """The adapted layer's output for the inputs X; returns an n × m array."""
    # Typical mistake: the adapter path is added without its scale.
    return X @ W + (X @ A) @ B
