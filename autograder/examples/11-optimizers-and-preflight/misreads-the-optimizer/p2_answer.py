def moved_by_step(opt):
    """The parameters whose values one opt.step() of this AdamW will change, as a list."""
    # Typical mistake: the first moment forgotten; a zero gradient after a real one is taken to move a tensor only
    # through the decay, so a head in a group without weight decay is left out.
    moved = []
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            decays = group["lr"] * group["weight_decay"] != 0 and bool(p.detach().any())
            if decays or bool(p.grad.any()):
                moved.append(p)
    return moved
