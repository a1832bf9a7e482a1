def ce_grad(Y, target):
    """D = softmax(Y) - onehot(target) for one row Y (1 x m); returns a 1 x m array."""
    # Typical mistake: exp of the raw logits, which overflows for large logits.
    e = np.exp(Y)
    D = e / e.sum(axis=1, keepdims=True)
    D[0, target] -= 1.0
    return D
