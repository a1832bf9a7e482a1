def v_adapter_grads(dh, cache):
    """(dA_v, dB_v) of the v_proj adapter, for the gradient dh = dL/dh at h = x + o."""
    # Typical mistake, the same belief as in P1: "a frozen o_proj passes nothing back", so only o's adapter (if any) feeds the heads.
    po = cache["proj"]["o"]
    dmh = 0 * dh
    if "A" in po:
        dmh = dmh + (po["s"] * dh @ po["B"].T) @ po["A"].T
    dQ, dK, dV = attention.attention_backward(attention.split_heads(dmh, cache["n_heads"]), cache["attn"])
    D = attention.merge_heads(dV)
    pv = cache["proj"]["v"]
    return pv["X"].T @ (pv["s"] * D @ pv["B"].T), pv["s"] * (pv["X"] @ pv["A"]).T @ D
