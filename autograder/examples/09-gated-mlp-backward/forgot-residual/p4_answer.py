def residual_mlp_backward(dY, X, W_gate, W_up, W_down):
    """dL/dX of Y = X + MLP(X) for the upstream gradient dY."""
    # Typical mistake: only the MLP path is backpropagated; the skip path's dY is dropped.
    return mlp_backward(dY, X, W_gate, W_up, W_down)[0]
