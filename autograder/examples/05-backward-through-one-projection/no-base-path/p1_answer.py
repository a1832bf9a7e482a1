def lora_backward(D, X, W, A, B, s):
    """(dX, dA, dB) of Y = X W + s (X A) B for the upstream gradient D = dL/dY."""
    # Typical mistake: "W is frozen, so no gradient goes through it" — dX keeps only the adapter path.
    Z = X @ A
    dB = s * Z.T @ D
    dZ = s * D @ B.T
    dA = X.T @ dZ
    dX = dZ @ A.T
    return dX, dA, dB
