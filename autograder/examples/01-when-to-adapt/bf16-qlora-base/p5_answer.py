# P5: implement ledger
def ledger(n_params, n_adapter, method):
    """The four memory buckets in bytes ("base_weights", "base_grads", "base_moments", "adapter") for method."""
    # Typical mistake: QLoRA counted like LoRA, with the frozen base still in bf16 (2 bytes per weight).
    bf16, fp32 = 2, 4
    adapter = n_adapter * (bf16 + bf16 + 2 * fp32)
    if method == "full":
        return {"base_weights": n_params * bf16, "base_grads": n_params * bf16,
                "base_moments": n_params * 2 * fp32, "adapter": 0}
    if method in ("lora", "qlora"):
        return {"base_weights": n_params * bf16, "base_grads": 0, "base_moments": 0, "adapter": adapter}
    raise ValueError(f"unknown method {method!r}")
