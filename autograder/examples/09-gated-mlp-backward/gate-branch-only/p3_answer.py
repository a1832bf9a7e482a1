def mlp_backward(dY, X, W_gate, W_up, W_down):
    """(dX, dW_gate, dW_up, dW_down) of the gated SiLU MLP for the upstream gradient dY = dL/dY."""
    # Typical mistake: the gradient to X is taken through the gate (the nonlinear path) only.
    G, U = X @ W_gate, X @ W_up
    H = G / (1 + np.exp(-np.clip(G, -700, 700))) * U
    dW_down = H.T @ dY
    dH = dY @ W_down.T
    dG, dU = swiglu_backward(dH, G, U)
    dX = dG @ W_gate.T
    return dX, X.T @ dG, X.T @ dU, dW_down
