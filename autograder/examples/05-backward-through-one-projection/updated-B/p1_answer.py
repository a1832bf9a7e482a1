def lora_backward(D, X, W, A, B, s):
    """(dX, dA, dB) of Y = X W + s (X A) B for the upstream gradient D = dL/dY."""
    # Typical mistake: the optimizer step on B is taken in the middle of the backward pass,
    # and dA is then formed with the updated B.
    Z = X @ A
    dB = s * Z.T @ D
    dX = D @ W.T + s * D @ B.T @ A.T
    B = B - 0.01 * dB
    dA = X.T @ (s * D @ B.T)
    return dX, dA, dB
