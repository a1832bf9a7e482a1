def confusion_matrix(true, pred, labels):
    """Counts: row = true label, column = predicted label; the last column counts predictions that are no label."""
    # Typical mistake: predictions that are no label are dropped instead of counted in a last column.
    counts = np.zeros((len(labels), len(labels)), dtype=int)
    for t, p in zip(true, pred):
        if p in labels:
            counts[labels.index(t), labels.index(p)] += 1
    return counts
