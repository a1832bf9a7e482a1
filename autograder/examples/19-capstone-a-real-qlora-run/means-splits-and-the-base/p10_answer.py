def train_probe(features, labels, classes, steps, lr):
    """Gradient descent on the mean cross-entropy of softmax(features @ W + b); returns (W [H, K], b [K])."""
    # Typical mistake: only W is trained; the bias stays at zero, so its gradient (the column sums of dZ) is lost.
    X = torch.as_tensor(features, dtype=torch.float32)
    Y = torch.nn.functional.one_hot(torch.tensor([list(classes).index(label) for label in labels]), len(classes)).float()
    W, b = torch.zeros(X.shape[1], len(classes)), torch.zeros(len(classes))
    for _ in range(steps):
        dZ = (torch.softmax(X @ W + b, dim=1) - Y) / X.shape[0]
        W = W - lr * X.T @ dZ
    return W, b
