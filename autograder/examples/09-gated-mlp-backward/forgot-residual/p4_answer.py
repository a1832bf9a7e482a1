def residual_stack_backward(dY, X, W_gate, W_up, W_down):
    """dL/dX of L residual blocks Z <- Z + MLP_l(Z), l = 0 ... L-1, starting from Z = X, for the upstream gradient dY."""
    # Typical mistake: only the MLP path of each block is backpropagated; the skip path's dZ is dropped.
    inputs, Z = [], X
    for Wg, Wu, Wd in zip(W_gate, W_up, W_down):
        inputs.append(Z)
        G = Z @ Wg
        Z = Z + (G / (1 + np.exp(-np.clip(G, -700, 700))) * (Z @ Wu)) @ Wd
    dZ = dY
    for l in reversed(range(len(inputs))):
        dZ = mlp_backward(dZ, inputs[l], W_gate[l], W_up[l], W_down[l])[0]
    return dZ
