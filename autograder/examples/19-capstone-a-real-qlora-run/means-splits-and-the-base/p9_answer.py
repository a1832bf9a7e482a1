def probe_features(hidden_states, attention_mask, layer):
    """Mean over each row's real tokens of decoder layer `layer`'s output (hidden_states[0] is the embeddings)."""
    # Typical mistake: the mean runs over every position, so the padding is averaged in with the real tokens.
    return hidden_states[layer].mean(dim=1)
