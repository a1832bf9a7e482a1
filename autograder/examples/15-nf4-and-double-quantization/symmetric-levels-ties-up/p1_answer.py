def nf4_levels(offset):
    """The 16 NF4 levels for outermost probability `offset`, sorted ascending, ending at -1 and +1."""
    # Typical mistake: a symmetric table, 8 quantiles mirrored to both sides, and no level at 0.
    positive = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double()).float()
    levels = torch.cat([-positive, positive]).sort().values
    return levels / levels.max()
