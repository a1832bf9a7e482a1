"""Small reference kernels for the causal-LM training objective (lesson 04).

Everything here works on toy tensors: ``input_ids`` and ``labels`` are int64 ``[B, T]`` (batch,
positions), ``logits`` are float ``[B, T, V]`` (V = vocabulary size). ``labels`` are **aligned**
with ``input_ids`` and use -100 (:data:`coursekit.data.IGNORE_INDEX`) for positions the loss
ignores; the causal shift (logit t is scored against label t+1) happens once, inside the loss, as in
transformers' ``ForCausalLMLoss``. The batching and token-weighted loss of real chat data live in
:mod:`coursekit.data`; this module adds what the lesson needs to show the two classic mistakes:

* the double shift (labels shifted by hand, then shifted again by the model): :func:`shift_left`
  with :func:`oracle_logits`, whose loss is ~0 on aligned labels and ~``margin`` on shifted ones;
* example-weighted averaging (:func:`example_weighted_loss`, the mean of per-row means) versus the
  token-weighted mean (:func:`token_weighted_loss`) of lesson 04,
  L = −(1/N) Σ log p(correct token) over the N supervised positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .data.batching import IGNORE_INDEX, EmptyBatchError, count_supervised, token_loss_sum

__all__ = ["oracle_logits", "shift_left", "per_row_loss", "token_weighted_loss", "example_weighted_loss"]


def _check_ids(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [B, T], got shape {tuple(x.shape)}")
    if x.dtype != torch.long:
        raise TypeError(f"{name} must be int64 (torch.long), got {x.dtype}")


def _check_pair(logits: torch.Tensor, labels: torch.Tensor) -> None:
    _check_ids("labels", labels)
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point torch.Tensor, got {getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.dim() != 3 or logits.shape[:2] != labels.shape:
        raise ValueError(f"logits must be [B, T, V] with [B, T] = labels.shape {tuple(labels.shape)}; got {tuple(logits.shape)}")


def oracle_logits(input_ids: torch.Tensor, vocab_size: int, margin: float = 10.0) -> torch.Tensor:
    """Logits of a model that already knows each next token.

    ``logits[b, t, input_ids[b, t + 1]] = margin`` and 0 elsewhere for t < T − 1; the last position
    (nothing to predict) is all zeros. Under the causal-LM loss with aligned labels every scored
    position then costs log(1 + (V − 1)·e^(−margin)) ≈ 0; scored one position too far (double shift)
    the true token has logit 0 while another has ``margin``, costing ≈ ``margin``.

    Args:
        input_ids: int64 [B, T], every id in [0, vocab_size).
        vocab_size: V ≥ 2.
        margin: logit of the right next token (float, > 0).
    Returns: float64 [B, T, V].
    Raises: TypeError / ValueError naming the argument for a wrong type, shape, id range or margin.
    """
    _check_ids("input_ids", input_ids)
    if int(vocab_size) < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise ValueError(f"input_ids must lie in [0, {vocab_size}); got range [{int(input_ids.min())}, {int(input_ids.max())}]")
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    B, T = input_ids.shape
    logits = torch.zeros(B, T, int(vocab_size), dtype=torch.float64)
    if T > 1:
        logits[:, :-1, :].scatter_(2, input_ids[:, 1:].unsqueeze(-1), float(margin))
    return logits


def shift_left(labels: torch.Tensor) -> torch.Tensor:
    """``labels`` moved one position to the left, -100 written into the last column.

    This is the shift a causal LM does inside its loss. Doing it by hand *and* passing the result
    to a model that shifts again scores logit t against token t + 2: the double-shift bug.
    labels: int64 [B, T]. Returns a new int64 [B, T] tensor.
    """
    _check_ids("labels", labels)
    out = torch.full_like(labels, IGNORE_INDEX)
    out[:, :-1] = labels[:, 1:]
    return out


def per_row_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed token losses and the supervised-token count, after the one shift.

    Args: logits float [B, T, V]; labels int64 [B, T], aligned with input_ids, -100 = ignored.
    Returns: (sums float [B] in the logits' dtype (float32 for half precision), counts int64 [B]);
    row b's sum is Σ_{t ≥ 1, labels[b, t] ≠ −100} −log softmax(logits[b, t − 1])[labels[b, t]].
    """
    _check_pair(logits, labels)
    lg = logits[:, :-1, :]
    if lg.dtype in (torch.float16, torch.bfloat16):
        lg = lg.float()
    tok = F.cross_entropy(lg.transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX, reduction="none")
    return tok.sum(dim=1), (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)


def token_weighted_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """L = (Σ token losses) / N over the N supervised positions of the whole batch (lesson 04).

    The objective transformers' causal LMs compute with ``labels=``; every supervised token weighs
    the same, whatever row it sits in. logits float [B, T, V]; labels int64 [B, T] aligned.
    Returns a 0-dim tensor. Raises :class:`~coursekit.data.EmptyBatchError` when N = 0 (0/0).
    """
    _check_pair(logits, labels)
    n = count_supervised(labels)
    if n == 0:
        raise EmptyBatchError("no supervised token in the batch: the mean loss would be 0/0 = NaN")
    return token_loss_sum(logits, labels) / n


def example_weighted_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over rows of each row's mean token loss: every *example* weighs the same.

    Differs from :func:`token_weighted_loss` whenever rows have different supervised counts (a token
    of a short answer then weighs more than a token of a long one). The same arithmetic, applied to
    micro-batch means under gradient accumulation, is the mean-of-means mistake.
    Returns a 0-dim tensor. Raises EmptyBatchError if any row has no supervised token.
    """
    sums, counts = per_row_loss(logits, labels)
    if bool((counts == 0).any()):
        rows = [int(i) for i in torch.nonzero(counts == 0).flatten()]
        raise EmptyBatchError(f"rows {rows} have no supervised token: their mean loss would be 0/0")
    return (sums / counts).mean()
