def make_labels(input_ids, attention_mask, prompt_len, pad_id):
    """Labels aligned with input_ids: ids on the answer, -100 on the prompt (t < prompt_len[b]) and on padding."""
    # Typical mistake: only the padding is masked; the prompt stays supervised.
    labels = input_ids.copy()
    labels[attention_mask == 0] = IGNORE_INDEX
    return labels
