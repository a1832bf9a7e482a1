def block_input_grad(dh, cache):
    """dx = dL/dx at the block's input, for the gradient dh = dL/dh at h = x + o."""
    # Typical mistake: "the base is frozen, so only the residual carries gradient down": the attention branch is left out.
    return dh
