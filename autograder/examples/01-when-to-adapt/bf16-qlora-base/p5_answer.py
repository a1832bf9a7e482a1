# P5: implement ledger
def ledger(n_params, n_adapter, method, n_unfrozen):
    """The four memory buckets in bytes ("base_weights", "base_grads", "base_moments", "adapter") for method,
    with n_unfrozen base parameters trained beside the adapter."""
    # Typical mistake: QLoRA counted like LoRA, with the frozen base still in bf16 (2 bytes per weight).
    bf16, fp32 = 2, 4
    if method == "full":
        return {"base_weights": n_params * bf16, "base_grads": n_params * bf16,
                "base_moments": n_params * 2 * fp32, "adapter": 0}
    if method in ("lora", "qlora"):
        return {"base_weights": n_params * bf16, "base_grads": n_unfrozen * bf16,
                "base_moments": n_unfrozen * 2 * fp32, "adapter": n_adapter * (bf16 + bf16 + 2 * fp32)}
    raise ValueError(f"unknown method {method!r}")
