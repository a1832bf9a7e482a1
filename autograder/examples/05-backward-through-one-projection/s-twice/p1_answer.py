def lora_backward(D, X, W, A, B, s):
    """(dX, dA, dB) of Y = X W + s (X A) B for the upstream gradient D = dL/dY."""
    # Typical mistake: s is already inside dZ, and it is multiplied in a second time.
    Z = X @ A
    dB = s * Z.T @ D
    dZ = s * D @ B.T
    dA = s * X.T @ dZ
    dX = D @ W.T + s * dZ @ A.T
    return dX, dA, dB
