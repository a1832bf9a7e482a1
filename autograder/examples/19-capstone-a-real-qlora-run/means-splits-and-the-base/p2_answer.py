def preflight(model, batch, optimizer):
    """Raise if the setup cannot train as intended; otherwise return with model and optimizer unchanged."""
    # Typical mistake: the parameters are put back, the optimizer's state from the test step is not.
    params = dict(model.named_parameters())
    trainable = [n for n, p in params.items() if p.requires_grad]
    if not trainable:
        raise RuntimeError("nothing is trainable: every parameter has requires_grad=False")
    saved = {n: p.detach().clone() for n, p in params.items()}
    model.train()
    optimizer.zero_grad(set_to_none=True)
    try:
        loss = model(**batch).loss
        if not torch.isfinite(loss):
            raise RuntimeError(f"the loss on one batch is {loss.item()}")
        loss.backward()
        for n in trainable:
            g = params[n].grad
            if g is None:
                raise RuntimeError(f"{n} gets no gradient at all (its .grad is None): the loss does not depend on it")
            if not torch.isfinite(g).all():
                raise RuntimeError(f"{n} has a gradient that is not finite (NaN or inf)")
            if "lora_B" in n and not g.abs().sum() > 0:
                raise RuntimeError(f"{n} gets an all-zero gradient: no gradient reaches its layer")
        optimizer.step()
        moved = [n for n, p in params.items() if "lora_" not in n and not torch.equal(p.detach(), saved[n])]
        if moved:
            raise RuntimeError(f"one optimizer step moved {len(moved)} base tensors, e.g. {moved[0]}")
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])
        optimizer.zero_grad(set_to_none=True)
