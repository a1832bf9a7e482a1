def trainable_params(model):
    """The parameters the optimizer should own, as a list."""
    # Typical mistake: selecting by name instead of by requires_grad.
    return [p for n, p in model.named_parameters() if "lora" in n]
