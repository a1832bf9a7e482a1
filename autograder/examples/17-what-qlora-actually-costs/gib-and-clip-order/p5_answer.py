def ledger_gb(n_params, n_adapter, method, double_quant=True):
    # Partial total in decimal GB; QLoRA includes the NF4 block scales.
    # Typical mistake: dividing by 2**30 (GiB) instead of 1e9 (GB).
    if method == "full":
        total = n_params * (2 + 2 + 2 * 4)
    else:
        base = n_params * (2 if method == "lora" else 0.5)
        total = base + n_adapter * (2 + 2 + 2 * 4)
        if method == "qlora":
            blocks = math.ceil(n_params / 64)
            total += blocks + 4 * math.ceil(blocks / 256) if double_quant else 4 * blocks
    return total / 2**30
