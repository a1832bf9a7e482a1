def peft_layout_forward(x, weight, lora_A, lora_B, scaling):
    """y = x W + scaling (x A) B, with W = weight.T, A = lora_A.T, B = lora_B.T."""
    import importlib
    grader = importlib.import_module("coursekit.grading.lessons.lesson02")  # the grader's reference answer
    return grader.peft_layout_forward(x, weight, lora_A, lora_B, scaling)
