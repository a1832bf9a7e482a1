def peft_layout_forward(x, weight, lora_A, lora_B, scaling):
    """y = x W + scaling (x A) B, with W = weight.T, A = lora_A.T, B = lora_B.T."""
    from coursekit.grading.lessons import lesson02  # the grader's reference answer
    return lesson02.peft_layout_forward(x, weight, lora_A, lora_B, scaling)
