"""Judging a model that answers with one label: two scoring rules, intervals and a confusion matrix.

Two ways to read a label off a causal LM, used for every model the capstone compares (untrained base
with a better prompt, QLoRA, LoRA on bf16, merged models):

* **Generation, first-word rule.** Greedy decoding of a few tokens; the answer counts when its first
  word, lower-cased and stripped of punctuation (:func:`first_word`), is the label. It is what a user
  of the model sees, and it punishes a model that knows the category but says "The category is …".
* **Label scoring.** For each candidate label, the log-likelihood of the whole answer (the label's
  tokens and the end-of-turn token) after the prompt, :func:`answer_logprobs`; the prediction is the
  label with the highest score. It asks only which label the model ranks first, so it is the fairer
  baseline for an untrained model (Brown et al. 2020, "Language Models are Few-Shot Learners",
  arXiv:2005.14165, score multiple-choice tasks this way). The sum is not length-normalised: every
  candidate ends with the same end-of-turn token, and the labels are one or two tokens long. For an
  untrained model that end-of-turn term can decide the ranking alone, so :func:`label_rule_scores` also
  reads the same pass without it, per token, and calibrated against a content-free input.

Speed. Prompts of one style share a long prefix (system turn, instruction, definitions, few-shot
turns). :func:`prefill` runs that prefix once and keeps its keys and values (the KV cache); each batch
then feeds only its tickets' remaining tokens. Label scoring feeds the batch's suffixes once, then the
six candidate answers (a few tokens each) on a copy of the cache per candidate: two forward passes per
batch instead of six full ones. Inside a batch the suffixes have different lengths, so the padding
sits between the shared prefix and each suffix (or after it); ``attention_mask`` marks it and explicit
``position_ids`` keep every real token at the position it has in the unpadded prompt. Tests compare
both scorers with the slow, obvious computation in float32.

Statistics. Accuracy on n examples is a binomial proportion; :func:`wilson_interval` gives its 95 %
Wilson score interval (Wilson 1927, "Probable inference, the law of succession, and statistical
inference", JASA 22:209). It assumes independent examples. Tickets that share a symptom are not
independent (three phrasings of one cue tend to be right or wrong together), so for the held-out
splits the interval is optimistic; lesson 19 also reports accuracy per symptom.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch

from . import data as cdata
from .data import prompts as cprompts

__all__ = [
    "SCORINGS",
    "first_word",
    "answer_logprobs",
    "wilson_interval",
    "cluster_bootstrap_interval",
    "confusion_matrix",
    "common_prefix_length",
    "prefill",
    "generate_answers",
    "label_logprobs",
    "LABEL_RULES",
    "label_rule_scores",
    "evaluate_label_rules",
    "next_token_logits",
    "evaluate",
    "encode_prompts",
    "summarize",
    "evaluating",
]

#: The two scoring rules: greedy generation read by its first word, and label scoring.
SCORINGS: tuple[str, ...] = ("generate", "labels")
#: In a confusion matrix, the column for a generated first word that is no label.
OTHER = "(other)"


#: What :func:`first_word` strips from around the word.
FIRST_WORD_PUNCTUATION = ".,:;!?\"'`*()[]"


def first_word(text: str) -> str:
    """The first word of ``text``, lower-cased, without surrounding punctuation ("" for blank text).

    ``"Thermal."`` → ``"thermal"``; ``"  **software** issue"`` → ``"software"``; ``"The fan…"`` → ``"the"``.
    Raises TypeError for a non-string."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    words = text.strip().lower().split()
    return words[0].strip(FIRST_WORD_PUNCTUATION) if words else ""


def answer_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row, Σ log p(labels[t] | tokens before t) over the positions whose label is not -100.

    logits: [R, T, V] (any float dtype; computed in float32); labels: [R, T] int64, aligned with the
    input ids exactly as for training (lesson 04): the logit at position t predicts the token at t + 1,
    so ``labels[:, 0]`` is never scored. Returns a float32 tensor [R] (≤ 0); a row with no supervised
    position scores 0. It is minus the row's summed training loss: label scoring asks the model
    "how likely is this whole answer?" with the same arithmetic that trained it.
    Raises ValueError for mismatched shapes.
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [R, T, V] and labels [R, T]; got {tuple(logits.shape)} and {tuple(labels.shape)}")
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = labels[:, 1:]
    keep = target != cdata.IGNORE_INDEX
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * keep).sum(dim=-1)


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95 % (for the default z) Wilson score interval of a proportion k/n: ``(low, high)`` in [0, 1].

    (p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n). Unlike p̂ ± z·√(p̂(1−p̂)/n) it never leaves [0, 1]
    and is not empty at p̂ = 0 or 1. Raises ValueError unless 0 ≤ k ≤ n and n ≥ 1."""
    if not (isinstance(k, (int, np.integer)) and isinstance(n, (int, np.integer))) or n < 1 or not 0 <= k <= n:
        raise ValueError(f"need integers 0 <= k <= n and n >= 1, got k={k!r}, n={n!r}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def cluster_bootstrap_interval(correct: Sequence[bool], groups: Sequence[Any], n_boot: int = 2000,
                               level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of accuracy that resamples whole groups (e.g. the tickets of one symptom)
    instead of single examples: ``(low, high)``.

    Examples in one group tend to be right or wrong together, so they carry less information than as many
    independent examples; a binomial interval such as :func:`wilson_interval` then comes out too narrow. Each
    of ``n_boot`` replicates draws as many groups as there are, with replacement, and takes the accuracy over
    all their examples (Efron and Tibshirani, "An Introduction to the Bootstrap", 1993, resampling the
    independent units). Deterministic for a ``seed``. Raises ValueError for unequal lengths, no examples, or
    a level outside (0, 1)."""
    if len(correct) != len(groups) or not len(correct):
        raise ValueError(f"need one group per example and at least one example; got {len(correct)} and {len(groups)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    by_group: dict[Any, list[bool]] = {}
    for c, g in zip(correct, groups):
        by_group.setdefault(g, []).append(bool(c))
    right = np.array([sum(v) for v in by_group.values()], dtype=float)
    size = np.array([len(v) for v in by_group.values()], dtype=float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(right), size=(n_boot, len(right)))
    acc = right[draws].sum(axis=1) / size[draws].sum(axis=1)
    lo, hi = np.quantile(acc, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def confusion_matrix(true: Sequence[str], pred: Sequence[str], labels: Sequence[str] = cdata.LABELS) -> np.ndarray:
    """Counts [L, L + 1] (int64): row = true label, column = predicted label, the last column for a prediction
    that is no label (a generated first word such as "the"). Raises ValueError for unequal lengths or a true
    label outside ``labels``."""
    if len(true) != len(pred):
        raise ValueError(f"{len(true)} true labels but {len(pred)} predictions")
    index = {label: i for i, label in enumerate(labels)}
    out = np.zeros((len(labels), len(labels) + 1), dtype=np.int64)
    for t, p in zip(true, pred):
        if t not in index:
            raise ValueError(f"true label {t!r} is not one of {list(labels)}")
        out[index[t], index.get(p, len(labels))] += 1
    return out


# --------------------------------------------------------------------------- batched, prefix-cached passes


def encode_prompts(tokenizer, messages: Sequence[Sequence[dict[str, str]]]) -> list[list[int]]:
    """Each conversation rendered by the chat template with the assistant turn opened (list of token ids)."""
    return [cdata.render_ids(tokenizer, m, add_generation_prompt=True) for m in messages]


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest common token prefix of ``rows``, kept at least one token short of the shortest
    row (every row must feed at least one token after the cached prefix). 0 for fewer than two rows."""
    if len(rows) < 2:
        return 0
    first, n = rows[0], min(len(r) for r in rows) - 1
    for r in rows[1:]:
        i = 0
        while i < n and r[i] == first[i]:
            i += 1
        n = i
    return max(n, 0)


@torch.no_grad()
def prefill(model: torch.nn.Module, prefix: Sequence[int]):
    """Run the shared prefix once (one row) and return its KV cache (``transformers.DynamicCache``), or None
    for an empty prefix. Copy it (``copy.deepcopy``) before extending it: a forward pass appends to it."""
    if not prefix:
        return None
    return model(input_ids=torch.tensor([list(prefix)]), use_cache=True).cache


def _expand(cache, rows: int):
    if cache is None:
        return None
    out = copy.deepcopy(cache)
    out.batch_repeat_interleave(rows)
    return out


@contextlib.contextmanager
def evaluating(model: torch.nn.Module):
    """Eval mode, no gradients and the 4-bit repack guard (``coursekit.model.keep_4bit_layers_trainable``: an
    eval-mode pass must never cut a later training run's gradient path, lesson 16) for the duration; the model's
    mode and the grad mode are restored afterwards."""
    from . import model as cmodel

    cmodel.keep_4bit_layers_trainable(model)
    was_training, grad = model.training, torch.is_grad_enabled()
    model.eval()
    torch.set_grad_enabled(False)
    try:
        yield model
    finally:
        torch.set_grad_enabled(grad)
        model.train(was_training)


def _check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    if len(prompts) == 0:
        raise ValueError("no prompts to evaluate")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt is empty (0 tokens)")


def generate_answers(model: torch.nn.Module, tokenizer, prompts: Sequence[Sequence[int]], max_new_tokens: int = 5,
                     batch_size: int = 32, progress: Callable | None = None) -> list[str]:
    """Greedy continuations (decoded text, special tokens dropped) of token-id ``prompts``, batched.

    The prompts' common prefix is computed once (:func:`prefill`); each batch is
    ``[prefix, padding, suffix]`` with the padding masked, and ``transformers``' ``generate`` decodes
    greedily from there (it derives position ids from the attention mask, so padding in the middle is
    harmless). Runs in eval mode without gradients and with the 4-bit repack guard; the model's mode is
    restored. ``progress``: called with the number of prompts finished after each batch.
    Raises ValueError for no prompts or an empty prompt.
    """
    _check_prompts(prompts)
    end = cdata.end_of_turn_id(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end
    out: list[str] = []
    with evaluating(model):
        P = common_prefix_length(prompts)
        cache = prefill(model, prompts[0][:P])
        for i in range(0, len(prompts), batch_size):
            suffixes = [list(p[P:]) for p in prompts[i:i + batch_size]]
            S = max(map(len, suffixes))
            ids = torch.tensor([list(prompts[0][:P]) + [pad] * (S - len(s)) + s for s in suffixes])
            mask = torch.tensor([[1] * P + [0] * (S - len(s)) + [1] * len(s) for s in suffixes])
            kwargs = {"cache": _expand(cache, len(suffixes))} if cache is not None else {}
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad, eos_token_id=end, **kwargs)
            out += tokenizer.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)
            if progress:
                progress(len(suffixes))
    return out


def _suffix_batches(model, prompts: Sequence[Sequence[int]], batch_size: int, pad: int):
    """For each batch of prompts: one forward pass over the suffixes after the cached common prefix, laid out as
    ``[prefix (cached), padding, suffix]`` so that every row's last real token sits in the last column; only that
    column's logits are computed. Yields ``(n suffix lengths [B], attention mask [B, P + S], the pass's output)``;
    ``output.logits[:, -1]`` predicts each prompt's next token and ``output.cache`` continues each row."""
    P = common_prefix_length(prompts)
    cache = prefill(model, prompts[0][:P])
    for i in range(0, len(prompts), batch_size):
        suffixes = [list(p[P:]) for p in prompts[i:i + batch_size]]
        B, S = len(suffixes), max(map(len, suffixes))
        n = torch.tensor([len(s) for s in suffixes])
        ids = torch.tensor([[pad] * (S - len(s)) + s for s in suffixes])
        mask = torch.cat([torch.ones(B, P, dtype=torch.long), (torch.arange(S).expand(B, S) >= (S - n)[:, None]).long()], dim=1)
        pos = (P + torch.arange(S) - (S - n)[:, None]).clamp(min=P)
        kwargs = {"cache": _expand(cache, B)} if cache is not None else {}
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **kwargs)
        yield P + n, mask, out


def next_token_logits(model: torch.nn.Module, tokenizer, prompts: Sequence[Sequence[int]], batch_size: int = 32) -> torch.Tensor:
    """The logits that predict the token after each prompt: float32 [N, V]. For a prompt that opens the assistant
    turn, the first answer token: its argmax is where greedy decoding starts. Prefix-cached and batched like
    :func:`label_logprobs`; eval mode, no gradients, the model's mode restored. Raises ValueError for no prompts
    or an empty prompt."""
    _check_prompts(prompts)
    with evaluating(model):
        return torch.cat([out.logits[:, -1].float()
                          for _, _, out in _suffix_batches(model, prompts, batch_size, cdata.end_of_turn_id(tokenizer))])


def label_logprobs(model: torch.nn.Module, tokenizer, prompts: Sequence[Sequence[int]],
                   labels: Sequence[str] = cdata.LABELS, batch_size: int = 32,
                   logprob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = answer_logprobs,
                   progress: Callable | None = None) -> torch.Tensor:
    """Log-likelihood of every candidate answer after every prompt: float32 tensor [N prompts, L labels].

    A candidate answer is the label's tokens followed by the end-of-turn token, exactly as training
    supervises it. Per batch: the suffixes after the cached common prefix in one pass (its last column's
    logits predict every row's first answer token), then all L candidates at once on L copies of that
    cache. ``logprob_fn(logits, labels)`` turns the logits [R, T, V] of the answer positions into per-row
    scores, with labels aligned as in training (first column -100).
    Raises ValueError for no prompts, an empty prompt or no labels.
    """
    return _label_passes(model, tokenizer, prompts, labels, batch_size, logprob_fn, progress)[0]


def _checked_rows(logprob_fn: Callable, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``logprob_fn(logits, labels)`` as float32 [R], refusing what would silently rank labels wrongly: another
    shape, or a score that is NaN or +inf (a log-probability is finite or −inf, and never above 0)."""
    name = getattr(logprob_fn, "__name__", "logprob_fn")
    rows = torch.as_tensor(logprob_fn(logits, labels), dtype=torch.float32)
    if rows.shape != (logits.shape[0],):
        raise ValueError(f"{name}(logits, labels) must return one score per row, shape [{logits.shape[0]}]; "
                         f"got shape {list(rows.shape)}")
    bad = torch.isnan(rows) | (rows == float("inf"))
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"{name}(logits, labels) returned {rows[i].item()} for row {i} (of {rows.numel()}): a "
                         f"log-probability sum is a finite number ≤ 0 (or -inf), so labels cannot be ranked by it")
    return rows


def _label_passes(model, tokenizer, prompts, labels, batch_size, logprob_fn, progress) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sums of :func:`label_rule_scores` from one pass: (label tokens and end of turn, label tokens only), [N, L] each."""
    _check_prompts(prompts)
    if len(labels) == 0:
        raise ValueError("no candidate labels")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    end = cdata.end_of_turn_id(tokenizer)
    answers = [tokenizer.encode(label, add_special_tokens=False) + [end] for label in labels]
    L, C = len(answers), max(map(len, answers))
    cont = torch.tensor([a + [end] * (C - len(a)) for a in answers])                    # [L, C]
    cont_labels = torch.tensor([[cdata.IGNORE_INDEX] + a + [cdata.IGNORE_INDEX] * (C - len(a)) for a in answers])
    label_only = torch.tensor([[cdata.IGNORE_INDEX] + a[:-1] + [cdata.IGNORE_INDEX] * (C + 1 - len(a)) for a in answers])
    with_end, only = [], []
    with evaluating(model):
        for start, mask, out in _suffix_batches(model, prompts, batch_size, end):
            B = len(start)
            first = out.logits[:, -1].float()                                              # [B, V]: predicts token 1
            run = out.cache
            run.batch_repeat_interleave(L)
            mask2 = torch.cat([mask.repeat_interleave(L, dim=0), torch.ones(B * L, C, dtype=torch.long)], dim=1)
            pos2 = start.repeat_interleave(L).unsqueeze(1) + torch.arange(C)
            out2 = model(input_ids=cont.repeat(B, 1), attention_mask=mask2, position_ids=pos2, cache=run)
            logits = torch.cat([first.repeat_interleave(L, dim=0).unsqueeze(1), out2.logits.float()], dim=1)
            for dest, lab in ((with_end, cont_labels), (only, label_only)):
                dest.append(_checked_rows(logprob_fn, logits, lab.repeat(B, 1)).reshape(B, L))
            if progress:
                progress(B)
    return torch.cat(with_end), torch.cat(only)


#: The readings of one label-scoring pass, each predicting the label with the highest score (see
#: :func:`label_rule_scores`), and their names in tables.
LABEL_RULES: dict[str, str] = {
    "with_end": "label + end",
    "label_only": "label only",
    "label_mean": "label, mean",
    "calibrated": "calibrated",
}


def label_rule_scores(model: torch.nn.Module, tokenizer, prompts: Sequence[Sequence[int]], content_free: Sequence[int],
                      labels: Sequence[str] = cdata.LABELS, batch_size: int = 16,
                      logprob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = answer_logprobs,
                      progress: Callable | None = None) -> dict[str, torch.Tensor]:
    """Every reading of :data:`LABEL_RULES` from one label-scoring pass: ``{rule: float32 [N, L]}``.

    * ``with_end``: Σ log p over the label's tokens and the end-of-turn token (:func:`label_logprobs`, what
      training supervises). An untrained chat model rarely ends its turn after one word, so the end-of-turn
      term costs every label several nats, by different amounts, and can decide the ranking by itself.
    * ``label_only``: Σ log p over the label's tokens alone: which label the model would start to write.
    * ``label_mean``: ``label_only`` divided by the label's number of tokens (length normalisation).
    * ``calibrated``: ``label_only`` minus the same score after ``content_free`` (the same layout with a ticket
      that says nothing, :data:`coursekit.data.prompts.CONTENT_FREE`): the prompt's own preference for each label
      is taken out, as in Zhao et al. 2021, "Calibrate Before Use", arXiv:2102.09690 (their diagonal
      calibration, in log space).

    prompts: token-id lists (N ≥ 1); content_free: one token-id list. Raises ValueError as :func:`label_logprobs`.
    """
    with_end, only = _label_passes(model, tokenizer, prompts, labels, batch_size, logprob_fn, progress)
    _, bias = _label_passes(model, tokenizer, [content_free], labels, 1, logprob_fn, None)
    n_tokens = torch.tensor([len(tokenizer.encode(label, add_special_tokens=False)) for label in labels], dtype=torch.float32)
    return {"with_end": with_end, "label_only": only, "label_mean": only / n_tokens, "calibrated": only - bias}


def evaluate_label_rules(model: torch.nn.Module, tokenizer, examples: Sequence[dict[str, Any]], style: str,
                         shots: Sequence[dict[str, Any]] = (), batch_size: int = 16, progress: bool = False,
                         desc: str = "label scoring",
                         logprob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = answer_logprobs) -> dict[str, dict]:
    """:func:`evaluate` for every reading of :data:`LABEL_RULES` at the cost of one pass: ``{rule: result}``, each
    result as :func:`evaluate` returns it (``predictions`` carry that rule's six scores). Raises ValueError for an
    unknown style or no examples."""
    if not examples:
        raise ValueError("no examples to evaluate")
    prompts = encode_prompts(tokenizer, [cprompts.style_messages(style, ex["ticket"], shots) for ex in examples])
    content_free = encode_prompts(tokenizer, [cprompts.style_messages(style, cprompts.CONTENT_FREE, shots)])[0]
    from tqdm.auto import tqdm

    with tqdm(total=len(examples), desc=desc, unit="ticket", disable=not progress, leave=False) as bar:
        scores = label_rule_scores(model, tokenizer, prompts, content_free, cdata.LABELS, batch_size, logprob_fn,
                                   progress=bar.update)
    out = {}
    for rule, table in scores.items():
        preds = [cdata.LABELS[j] for j in table.argmax(dim=1).tolist()]
        extra = [{"scores": [round(v, 4) for v in row]} for row in table.tolist()]
        out[rule] = summarize([ex["label"] for ex in examples], preds, [ex["id"] for ex in examples], extra)
    return out


def evaluate(model: torch.nn.Module, tokenizer, examples: Sequence[dict[str, Any]], scoring: str = "labels",
             style: str = "plain", shots: Sequence[dict[str, Any]] = (), max_new_tokens: int = 5,
             batch_size: int | None = None, progress: bool = False, desc: str = "evaluating",
             first_word: Callable[[str], str] = first_word,
             logprob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = answer_logprobs) -> dict[str, Any]:
    """Accuracy of ``model`` on ``examples`` (dicts with "id", "ticket", "label") under one scoring rule.

    scoring: ``"generate"`` (greedy, first-word rule) or ``"labels"`` (label scoring).
    style: the prompt style (``coursekit.data.prompts.PROMPT_STYLES``); ``shots`` for the few-shot styles.
    batch_size: prompts per batch (default 32 for generation, 16 for label scoring, whose six copies of each
    row's cache make larger batches slower on a 2-core CPU).
    first_word, logprob_fn: the two rules, replaceable (lesson 19 passes the student's own).
    Returns a JSON-ready dict: ``n``, ``correct``, ``accuracy``, ``interval`` (Wilson 95 %), ``per_label``
    (accuracy per true label), ``confusion`` (see :func:`confusion_matrix`, as nested lists), ``labels``
    (its row order) and ``predictions`` (per example: id, label, pred, and the generated text or the six
    scores). Raises ValueError for an unknown scoring or style, or no examples.
    """
    if scoring not in SCORINGS:
        raise ValueError(f"unknown scoring {scoring!r}; expected one of {SCORINGS}")
    if not examples:
        raise ValueError("no examples to evaluate")
    prompts = encode_prompts(tokenizer, [cprompts.style_messages(style, ex["ticket"], shots) for ex in examples])
    from tqdm.auto import tqdm

    bar = tqdm(total=len(examples), desc=desc, unit="ticket", disable=not progress, leave=False)
    try:
        if scoring == "generate":
            answers = generate_answers(model, tokenizer, prompts, max_new_tokens, batch_size or 32, progress=bar.update)
            preds = [first_word(a) for a in answers]
            extra = [{"answer": a.strip()} for a in answers]
        else:
            scores = label_logprobs(model, tokenizer, prompts, cdata.LABELS, batch_size or 16, logprob_fn, progress=bar.update)
            preds = [cdata.LABELS[j] for j in scores.argmax(dim=1).tolist()]
            extra = [{"scores": [round(v, 4) for v in row]} for row in scores.tolist()]
    finally:
        bar.close()
    return summarize([ex["label"] for ex in examples], preds, [ex["id"] for ex in examples], extra)


def summarize(true: Sequence[str], preds: Sequence[str], ids: Sequence[str] | None = None,
              extra: Sequence[dict] | None = None) -> dict[str, Any]:
    """The result dict of :func:`evaluate` from true labels and predictions (see there). Raises ValueError for no
    labels, unequal lengths, or a true label outside ``coursekit.data.LABELS``."""
    n = len(true)
    if n == 0 or len(preds) != n:
        raise ValueError(f"need one prediction per true label and at least one; got {n} and {len(preds)}")
    unknown = [t for t in true if t not in cdata.LABELS]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not one of the labels {list(cdata.LABELS)} ({len(unknown)} such examples)")
    correct = sum(t == p for t, p in zip(true, preds))
    per = {label: [0, 0] for label in cdata.LABELS}
    for t, p in zip(true, preds):
        per[t][0] += t == p
        per[t][1] += 1
    ids = list(ids) if ids is not None else [str(i) for i in range(n)]
    extra = list(extra) if extra is not None else [{} for _ in range(n)]
    return {
        "n": n, "correct": correct, "accuracy": correct / n, "interval": list(wilson_interval(correct, n)),
        "per_label": {k: v[0] / v[1] for k, v in per.items() if v[1]},
        "labels": list(cdata.LABELS), "confusion": confusion_matrix(true, preds).tolist(),
        "predictions": [{"id": i, "label": t, "pred": p, **e} for i, t, p, e in zip(ids, true, preds, extra)],
    }
