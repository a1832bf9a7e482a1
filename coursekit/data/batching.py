"""From chat examples to a supervised causal-LM batch and a token-weighted loss.

What supervised fine-tuning trains against (lesson 04): after batching we have ``input_ids``
[batch, length], an attention mask and ``labels`` of the same shape; the attention mask says which
positions may be attended to, the loss mask (``labels == -100``) says which predictions count; the
causal shift (logit at t predicts token t+1) must happen exactly once; batches with no supervised
token are rejected instead of producing an undefined average.

Contract used throughout (transformers ``*ForCausalLM``):

* ``labels`` are **aligned** with ``input_ids`` (``labels[b, t]`` is ``input_ids[b, t]`` or -100).
  The model shifts them once inside its loss (``transformers.loss.loss_utils.ForCausalLMLoss``);
  nothing here shifts by hand except ``token_loss_sum``, which *is* that one shift, written out.
* Assistant-only supervision: labels equal input_ids on the answer tokens and on the token that
  ends the assistant turn (``<|im_end|>`` for SmolLM2), and are -100 everywhere else
  (system/user turns, role headers, padding).
* Padding is on the right, with ``pad_id``; padded positions get attention_mask 0 and label -100,
  decided by each row's length, never by comparing ids with ``pad_id`` (for SmolLM2 pad == eos ==
  ``<|im_end|>``, so an id comparison would also mask every real end-of-turn token).
* Token weighting across gradient accumulation: with N = supervised tokens in the whole window,
  each micro-batch contributes (sum of its token losses) / N, so the summed micro-batch losses
  equal the window's per-token mean. transformers implements this through the
  ``num_items_in_batch`` keyword of the model's forward (``fixed_cross_entropy`` uses
  ``reduction="sum"`` and divides by it); see the transformers blog post "Fixing Gradient
  Accumulation" (2024-10) and the Trainer docs on ``num_items_in_batch``. Verified against the
  installed transformers by ``tests/test_data.py`` (loss × N == hand-computed sum of token losses,
  and equal gradients for 2 micro-batches of 1 row vs 1 batch of 2 rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "IGNORE_INDEX",
    "EmptyBatchError",
    "TemplatePrefixError",
    "end_of_turn_id",
    "render_ids",
    "encode_example",
    "collate",
    "count_supervised",
    "num_items_in_window",
    "micro_batch_loss",
    "token_loss_sum",
    "window_loss",
]

IGNORE_INDEX = -100


class EmptyBatchError(ValueError):
    """A batch (or a row that must be supervised) has no position with a label other than -100."""


class TemplatePrefixError(ValueError):
    """The chat template's rendering of the prompt is not a token prefix of the full conversation."""


def end_of_turn_id(tokenizer: Any) -> int:
    """Id of the token that ends an assistant turn.

    ``<|im_end|>`` (ChatML: SmolLM2, Qwen) or ``<|eot_id|>`` (Llama 3) when the vocabulary has it,
    else ``tokenizer.eos_token_id``. Raises ValueError when none exists.
    """
    for tok in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        # One lookup, not get_vocab(): that builds a dict of the whole vocabulary (49,152 entries for SmolLM2)
        # on every call, and made encoding a training example 20 times slower.
        i = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(i, int) and i >= 0 and tokenizer.convert_ids_to_tokens(i) == tok:
            return int(i)
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no end-of-turn token and no eos_token_id")
    return int(tokenizer.eos_token_id)


def render_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's own chat template (list of int)."""
    enc = tokenizer.apply_chat_template(
        list(messages), tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=True
    )
    return [int(i) for i in enc["input_ids"]]


def encode_example(
    example: Mapping[str, Any] | Sequence[Mapping[str, str]],
    tokenizer: Any,
    *,
    end_id: int | None = None,
    max_length: int | None = None,
) -> dict[str, list[int]]:
    """Render one conversation and mask everything but the assistant answer.

    Args:
        example: ``{"messages": [..., {"role": "assistant", "content": answer}]}`` or the message
            list itself; the last message must be the assistant's.
        tokenizer: any Hugging Face tokenizer with a chat template.
        end_id: the token that ends the assistant turn; default ``end_of_turn_id(tokenizer)``.
        max_length: if given and the encoded row is longer, raise ValueError (we never truncate
            silently: truncation is how answers disappear from the loss).

    Returns:
        ``{"input_ids": [L ints], "attention_mask": [L ones], "labels": [L ints]}`` where
        ``labels[t] == input_ids[t]`` on the answer tokens and the end-of-turn token, -100 elsewhere.
        Template tokens after the end-of-turn token (SmolLM2 renders a trailing "\\n") are dropped:
        they would be masked anyway.

    How the answer span is found: the prompt (all messages but the last) is rendered with
    ``add_generation_prompt=True`` and the full conversation without it; the prompt ids must be a
    token prefix of the full ids (else ``TemplatePrefixError``). The answer starts right after that
    prefix, at index ``len(prompt_ids)`` of the full rendering — not at a length measured after an
    extra EOS was appended to the prompt, which would mask the first answer token.

    Raises:
        ValueError: last message not from the assistant; end-of-turn token missing after the
            answer; the decoded span does not contain the answer text; row longer than max_length.
        TemplatePrefixError: see above.
    """
    messages = list(example["messages"] if isinstance(example, Mapping) else example)
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("the last message must have role 'assistant' (the answer to supervise)")
    if end_id is None:
        end_id = end_of_turn_id(tokenizer)
    prompt_ids = render_ids(tokenizer, messages[:-1], add_generation_prompt=True)
    full_ids = render_ids(tokenizer, messages, add_generation_prompt=False)
    n = len(prompt_ids)
    if full_ids[:n] != prompt_ids:
        first = next((i for i, (a, b) in enumerate(zip(prompt_ids, full_ids)) if a != b), min(n, len(full_ids)))
        raise TemplatePrefixError(
            f"the chat template's prompt rendering (add_generation_prompt=True, {n} tokens) is not a "
            f"token prefix of the full conversation ({len(full_ids)} tokens); first difference at "
            f"position {first}: prompt {prompt_ids[first:first + 5]} vs full {full_ids[first:first + 5]}. "
            "Cannot locate the answer span safely."
        )
    completion = full_ids[n:]
    if end_id not in completion:
        raise ValueError(
            f"end-of-turn token id {end_id} not found after the answer; completion ids {completion[:20]}"
        )
    stop = completion.index(end_id) + 1
    answer = messages[-1]["content"]
    decoded = tokenizer.decode(completion[: stop - 1])
    if answer.strip() not in decoded:
        raise ValueError(f"answer span decodes to {decoded!r}, which does not contain {answer!r}")
    input_ids = prompt_ids + completion[:stop]
    labels = [IGNORE_INDEX] * n + completion[:stop]
    if max_length is not None and len(input_ids) > max_length:
        raise ValueError(f"encoded row has {len(input_ids)} tokens > max_length={max_length}")
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def _ids(row: int, key: str, seq: Any) -> list[int]:
    """One row's ``input_ids`` or ``labels`` as a list of Python ints; a clear error for anything else."""
    where = f"row {row} {key}"
    if seq is None or isinstance(seq, (str, bytes, Mapping)):
        raise TypeError(f"{where} must be a flat sequence of token ids (ints), got {type(seq).__name__} {seq!r:.60}; "
                        "tokenize text first (encode_example).")
    if isinstance(seq, torch.Tensor):
        if seq.ndim != 1 or seq.is_floating_point() or seq.is_complex() or seq.dtype == torch.bool:
            raise TypeError(f"{where} must be a 1-D integer tensor, got dtype {seq.dtype} and shape {tuple(seq.shape)}.")
        seq = seq.tolist()
    out = []
    for t, v in enumerate(seq):
        if isinstance(v, torch.Tensor) and v.ndim == 0 and not (v.is_floating_point() or v.dtype == torch.bool):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            kind = "a nested sequence (a batch inside one row?)" if isinstance(v, (list, tuple)) else type(v).__name__
            raise TypeError(f"{where}[{t}] is {kind} {v!r:.40}; token ids must be ints (a float id would be truncated).")
        out.append(int(v))
    return out


def collate(features: Sequence[Mapping[str, Sequence[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows into a batch.

    Args:
        features: rows with ``input_ids`` and ``labels`` (equal lengths, aligned — no shift).
        pad_id: the id written into padded input positions (may equal the eos id).

    Returns:
        ``input_ids`` [B, T] int64 (padded with pad_id), ``attention_mask`` [B, T] int64 (1 on each
        row's real tokens, 0 on padding), ``labels`` [B, T] int64 (padded with -100). T is the
        longest row. Padding is decided by row length only, never by ``id == pad_id``.

    Raises:
        TypeError: features is not a list of rows (None, one row on its own), a row lacks ``input_ids``
            or ``labels``, an id is not an int (None, a string, a float, a nested list), or pad_id is not an int.
        ValueError: empty batch, empty row, labels/input_ids of different lengths, a negative input id
            or pad_id, or a label that is neither -100 nor a token id ≥ 0 (``F.cross_entropy`` would
            raise an IndexError later, far from the cause).
        EmptyBatchError: no row has a supervised position the model can score (a label != -100 at
            t ≥ 1; the label at t = 0 is never predicted after the shift). The message lists each
            row and why.
    """
    if features is None or isinstance(features, (str, bytes, Mapping)) or not hasattr(features, "__len__"):
        hint = "; to collate one row, pass [row]" if isinstance(features, Mapping) else ""
        raise TypeError(f"features must be a list of rows (dicts with input_ids and labels), got "
                        f"{type(features).__name__}{hint}.")
    if len(features) == 0:
        raise ValueError("empty batch: collate needs at least one row")
    if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)):
        raise TypeError(f"pad_id must be a token id, an int (e.g. tokenizer.pad_token_id), got {type(pad_id).__name__} {pad_id!r}.")
    if pad_id < 0:
        raise ValueError(f"pad_id must be a token id ≥ 0 (e.g. tokenizer.pad_token_id), got {pad_id}.")
    rows = []
    for i, f in enumerate(features):
        if not isinstance(f, Mapping) or "input_ids" not in f or "labels" not in f:
            raise TypeError(f"row {i} must be a dict with 'input_ids' and 'labels' (as encode_example returns), got "
                            f"{type(f).__name__}" + (f" with keys {sorted(f)}" if isinstance(f, Mapping) else "") + ".")
        ids, labels = _ids(i, "input_ids", f["input_ids"]), _ids(i, "labels", f["labels"])
        if len(ids) == 0:
            raise ValueError(f"row {i} has no tokens")
        if len(ids) != len(labels):
            raise ValueError(f"row {i}: {len(ids)} input_ids but {len(labels)} labels (they must be aligned)")
        bad = next((t for t, v in enumerate(ids) if v < 0), None)
        if bad is not None:
            raise ValueError(f"row {i} input_ids[{bad}] is {ids[bad]}; token ids are ≥ 0 (-100 belongs in labels only).")
        bad = next((t for t, v in enumerate(labels) if v < 0 and v != IGNORE_INDEX), None)
        if bad is not None:
            raise ValueError(f"row {i} labels[{bad}] is {labels[bad]}; a label is a token id ≥ 0 or exactly {IGNORE_INDEX} "
                             f"(ignored). -1 is a common mistake for the ignore index.")
        rows.append((ids, labels))
    T = max(len(ids) for ids, _ in rows)
    B = len(rows)
    input_ids = torch.full((B, T), int(pad_id), dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    for b, (ids, lab) in enumerate(rows):
        L = len(ids)
        input_ids[b, :L] = torch.tensor(ids, dtype=torch.long)
        attention_mask[b, :L] = 1
        labels[b, :L] = torch.tensor(lab, dtype=torch.long)
    per_row = (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)
    if int(per_row.sum()) == 0:
        reasons = []
        for b, (ids, lab) in enumerate(rows):
            if all(x == IGNORE_INDEX for x in lab):
                why = f"all {len(lab)} labels are -100 (prompt only, or the answer was cut off)"
            else:
                why = "its only supervised label is at position 0, which no logit predicts after the shift"
            reasons.append(f"row {b}: {why}")
        raise EmptyBatchError(
            f"batch of {B} rows has no supervised token, so the mean loss is undefined (0/0): "
            + "; ".join(reasons)
        )
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def count_supervised(labels: torch.Tensor) -> int:
    """Number of positions the causal-LM loss scores: ``(labels[..., 1:] != -100).sum()``.

    labels: [B, T] int64, aligned with input_ids. Position 0 is excluded because after the
    model's shift no logit predicts it.
    """
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def num_items_in_window(micro_batches: Iterable[Mapping[str, torch.Tensor]]) -> int:
    """N = supervised tokens over all micro-batches of one optimizer step (gradient-accumulation window).

    Raises EmptyBatchError if the window has none, ValueError if it has no micro-batch.
    """
    counts = [count_supervised(mb["labels"]) for mb in micro_batches]
    if not counts:
        raise ValueError("empty window: no micro-batches")
    N = sum(counts)
    if N == 0:
        raise EmptyBatchError(f"window of {len(counts)} micro-batches has no supervised token")
    return N


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ over supervised positions of −log p(label), with the causal shift done here, once.

    logits: [B, T, V] float; labels: [B, T] int64 aligned with input_ids. Logit t is scored
    against label t+1. Returns a 0-dim float32 (or wider) tensor. The reference for
    ``micro_batch_loss``; use it when a model's loss ignores ``num_items_in_batch``.
    Raises ValueError for a label below 0 other than -100 (named with its index).
    """
    bad = (labels < 0) & (labels != IGNORE_INDEX)
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        raise ValueError(f"labels{where} is {int(labels[tuple(where)])}; a label is a token id ≥ 0 or exactly "
                         f"{IGNORE_INDEX} (ignored). -1 is a common mistake for the ignore index.")
    shift_logits = logits[:, :-1, :].reshape(-1, logits.size(-1))
    if shift_logits.dtype in (torch.float16, torch.bfloat16):
        shift_logits = shift_logits.float()  # as transformers does: no half-precision log-softmax
    shift_labels = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=IGNORE_INDEX, reduction="sum")


def micro_batch_loss(model: Any, batch: Mapping[str, torch.Tensor], num_items_in_window: int) -> torch.Tensor:
    """This micro-batch's share of the window loss: (Σ its token losses) / N, a 0-dim tensor.

    Calls ``model(input_ids, attention_mask, labels=labels, num_items_in_batch=N)``; the model
    shifts the labels once and, given ``num_items_in_batch``, sums the token losses and divides by
    N instead of averaging over this micro-batch alone. Summing the returned losses (or calling
    ``.backward()`` on each) over the window gives the token-weighted mean and its gradient.

    Args:
        model: a transformers ``*ForCausalLM`` (or a PEFT wrapper of one).
        batch: ``collate`` output (tensors on the model's device).
        num_items_in_window: N from ``num_items_in_window`` (int > 0).
    Raises:
        ValueError: N ≤ 0.
    """
    if int(num_items_in_window) <= 0:
        raise ValueError(f"num_items_in_window must be a positive token count, got {num_items_in_window}")
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
        num_items_in_batch=int(num_items_in_window),
    )
    return out.loss


def window_loss(loss_sums: Sequence[float], counts: Sequence[int]) -> float:
    """Token-weighted window loss Σ sums / Σ counts (not the mean of per-micro-batch means).

    loss_sums[i]: summed token losses of micro-batch i; counts[i]: its supervised tokens.
    Example: sums (2.0, 4.0), counts (2, 8) → 6/10 = 0.6 (the mean of means would be 0.75).
    Raises ValueError on length mismatch, no micro-batches, negative counts, or Σ counts == 0.
    """
    if len(loss_sums) != len(counts):
        raise ValueError(f"{len(loss_sums)} loss sums but {len(counts)} counts")
    if len(counts) == 0:
        raise ValueError("no micro-batches")
    if any(c < 0 for c in counts):
        raise ValueError(f"counts must be non-negative, got {list(counts)}")
    total = sum(counts)
    if total == 0:
        raise EmptyBatchError("window has no supervised token: loss undefined (0/0)")
    return float(sum(loss_sums)) / total
