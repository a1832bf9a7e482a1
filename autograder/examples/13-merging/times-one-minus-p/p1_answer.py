def merge(weight, lora_A, lora_B, lora_alpha, r, lora_dropout):
    """The merged weight in PEFT's layout, m × d, for eval-mode inference."""
    # Typical mistake: the classic test-time dropout scaling carried into the merge.
    s = lora_alpha / r
    return weight + (1 - lora_dropout) * s * (lora_B @ lora_A)
