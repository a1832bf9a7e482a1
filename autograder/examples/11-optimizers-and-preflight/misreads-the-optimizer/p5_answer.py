def rescaled_grads(X, W, A, B, s, D, c):
    """Gradients of the loss with respect to c*A and B/c; returns (dA_c, dB_c)."""
    # Typical mistake: "the product did not change, so the gradients did not either".
    dB = s * (X @ A).T @ D
    dA = X.T @ (s * D @ B.T)
    return dA, dB
