def block_adapter_count(targets, n_layers):
    """(adapters, factor_matrices) when every module in `targets` is adapted in each of `n_layers` layers."""
    # Typical mistake: one adapter counted as one trainable matrix.
    adapters = len(targets) * n_layers
    return adapters, adapters
