def lora_backward(D, X, W, A, B, s):
    """(dX, dA, dB) of Y = X W + s (X A) B for the upstream gradient D = dL/dY."""
    # Typical mistake: dA built in PEFT's storage layout (r × d, like lora_A.weight) instead of A's shape.
    Z = X @ A
    dB = s * Z.T @ D
    dZ = s * D @ B.T
    dA = dZ.T @ X
    dX = D @ W.T + dZ @ A.T
    return dX, dA, dB
