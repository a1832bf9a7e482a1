def unmerge(weight_merged, lora_A, lora_B, lora_alpha, r, fan_in_fan_out):
    """The base weight recovered from a merged one, in the layer's own layout."""
    # Typical mistake: nn.Linear's update on every layer, fan_in_fan_out ignored.
    return weight_merged - (lora_alpha / r) * (lora_B @ lora_A)
