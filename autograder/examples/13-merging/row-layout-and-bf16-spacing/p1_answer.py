def merge(weight, lora_A, lora_B, lora_alpha, r, lora_dropout):
    """The merged weight in PEFT's layout, m × d, for eval-mode inference."""
    # Typical mistake: lesson 02's row-vector merge W + sAB applied to PEFT's transposed tensors.
    W, A, B = weight.T, lora_A.T, lora_B.T
    return W + (lora_alpha / r) * (A @ B)
