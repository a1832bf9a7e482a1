def smallest_significant_gain(d):
    """The smallest gain a_only − b_only (tickets) at which McNemar's exact two-sided test on d discordant tickets
    gives p < 0.05 (d ≥ 6)."""
    # Typical mistake: the one-sided tail (QLoRA's side alone) instead of the two-sided p.
    from math import comb

    for a in range(d // 2 + 1, d + 1):
        if sum(comb(d, i) for i in range(a, d + 1)) / 2 ** d < 0.05:
            return 2 * a - d
