def unmerge(weight_merged, lora_A, lora_B, lora_alpha, r):
    """The base weight, m × d, recovered from a merged one."""
    # Same slip: translated to the row-vector layout and never transposed back.
    W, A, B = weight_merged.T, lora_A.T, lora_B.T
    return W - (lora_alpha / r) * (A @ B)
