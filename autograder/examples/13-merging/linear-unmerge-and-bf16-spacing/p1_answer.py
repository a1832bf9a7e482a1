def merge_unmerge(weight, lora_A, lora_B, lora_alpha, r):
    """The bf16 weight, m × d, a LoRA layer holds after PEFT's merge() and then unmerge()."""
    # Typical mistake: unmerge "undoes" merge, so the base comes back as it was.
    return weight
