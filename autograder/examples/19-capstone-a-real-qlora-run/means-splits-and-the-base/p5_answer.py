def answer_logprobs(logits, labels):
    """Per row, Σ log p(answer token | everything before it) over the positions whose label is not -100."""
    # Typical mistake, again a mean where a sum belongs: the log-probabilities averaged over the answer's tokens.
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = labels[:, 1:]
    keep = target != -100
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * keep).sum(dim=-1) / keep.sum(dim=-1).clamp(min=1)
