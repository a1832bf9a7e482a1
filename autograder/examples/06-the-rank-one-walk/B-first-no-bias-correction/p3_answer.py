def sgd_walk_step(X, W, A, B, s, target, lr):
    """One SGD step of the walk; returns (A_new, B_new)."""
    # Typical mistake: B is updated first, and the new B is then used to compute dA.
    Z = X @ A
    D = ce_grad(X @ W + s * Z @ B, target)
    B = B - lr * s * Z.T @ D
    dA = X.T @ (s * D @ B.T)
    return A - lr * dA, B
