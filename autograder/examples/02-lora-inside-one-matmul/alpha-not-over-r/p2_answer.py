def merge_adapter(W, A, B, lora_alpha, r):
    """The merged weight, shape d × m."""
    # Typical mistake, again: lora_alpha used as the scale, without dividing by r.
    return W + lora_alpha * (A @ B)
