def adapter_optimizer(model, lr, weight_decay):
    """AdamW over the trainable (adapter) tensors only."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
