def masked_mean_loss(logits, labels):
    """Mean of -log p(label) over the supervised positions, after one causal shift."""
    # Typical mistake: each row is averaged first, then the rows are averaged (example-weighted).
    if int((labels[:, 1:] != IGNORE_INDEX).sum()) == 0:
        raise EmptyBatchError("no supervised token in the batch")
    row_means = [F.cross_entropy(logits[b, :-1], labels[b, 1:], ignore_index=IGNORE_INDEX) for b in range(labels.shape[0])]
    return torch.stack(row_means).mean()
