def peft_layout_forward(x, weight, lora_A, lora_B, scaling):
    """y = x W + scaling (x A) B, with W = weight.T, A = lora_A.T, B = lora_B.T."""
    # Typical mistake: lora_B.weight used as B without the transpose.
    return x @ weight.T + scaling * (x @ lora_A.T) @ lora_B
