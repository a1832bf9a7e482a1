def merge_unmerge(weight, lora_A, lora_B, lora_alpha, r):
    """The bf16 weight, m × d, a LoRA layer holds after PEFT's merge() and then unmerge()."""
    # Typical mistake: the round trip computed in float32, never stored in the weight's bf16.
    delta = (lora_alpha / r) * (lora_B @ lora_A)
    w = weight.float() + delta
    return w - delta
