def peft_layout_forward(x, weight, lora_A, lora_B, scaling):
    """The same layer as adapted_forward, from PyTorch's storage; returns an n × m array."""
    # Typical mistake: lora_B.weight used as B without the transpose.
    return x @ weight.T + scaling * (x @ lora_A.T) @ lora_B
