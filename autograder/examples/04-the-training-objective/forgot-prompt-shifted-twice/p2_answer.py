def masked_mean_loss(logits, labels):
    """Mean of -log p(label) over the supervised positions, after one causal shift."""
    # Typical mistake: the labels are shifted by hand "for the causal LM", and then shifted again below.
    labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    shift_logits = logits[:, :-1, :].reshape(-1, logits.shape[-1])
    shift_labels = labels[:, 1:].reshape(-1)
    n = int((shift_labels != IGNORE_INDEX).sum())
    if n == 0:
        raise EmptyBatchError("no supervised token in the batch")
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=IGNORE_INDEX, reduction="sum") / n
