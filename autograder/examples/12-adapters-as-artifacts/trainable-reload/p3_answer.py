def reload(base, adapter_dir):
    """The model `base` with the adapter saved in `adapter_dir` attached, in eval mode."""
    # Typical mistake: is_trainable=True for inference; the model stays in training mode with dropout on.
    model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    return model
