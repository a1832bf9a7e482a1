def o_adapter_grads(dy, cache):
    """(dA_o, dB_o) of the o_proj adapter, for the upstream gradient dy = dL/dy of the block's output."""
    # Typical mistake: "the residual hands dy to h", forgetting that h also feeds the MLP branch.
    dh = dy
    A_o, B_o = cache["adapters"]["o"]
    mh, s_o = cache["mh"], cache["s"]
    dB_o = s_o * (mh @ A_o).T @ dh
    dA_o = mh.T @ (s_o * dh @ B_o.T)
    return dA_o, dB_o
