"""A 4-bit data type judged as the QLoRA paper judges it: by the model's held-out loss with its base in that type.

Weight error (lessons 14 and 15) says how far each quantized weight is from the original; what matters is how much
worse the *model* predicts text. Dettmers et al. 2023 (QLoRA, arXiv:2305.14314, §4: Figure 3, Table 2) compare
NF4, FP4 and int4 by the perplexity and zero-shot accuracy of a model whose linear layers hold the quantized weights.
This module does that on a small scale:

* :func:`round_trip` gives the weight a layer computes with after storing it in a data type and decoding it:
  ``"nf4"`` and ``"fp4"`` (:func:`coursekit.quant.round_trip_4bit`, bit-exact with bitsandbytes, blocks of 64, no
  double quantization), ``"int4"`` (blockwise absmax with 4 bits, codes −7..7: :func:`coursekit.quant.absmax_round_trip`)
  and ``"bf16"`` (the checkpoint as stored: the reference).
* :func:`set_base` writes that round trip into every linear layer of the decoder blocks (attention q, k, v, o and the
  MLP's gate, up, down), which is what ``load_model("nf4")`` quantizes (the embedding, the tied ``lm_head`` and the
  norms stay as they are). The model stays an ordinary float model: only the weights' values change, so every variant
  runs through the same float32 arithmetic and differences come from the data type alone.
* :func:`ticket_losses` gives each example's summed next-token cross-entropy (nats) over the tokens after the prefix
  all examples share, and :func:`compare_data_types` the table: mean loss per token for each data type, and its
  difference from the reference with a paired interval (:func:`coursekit.paired.paired_loss_interval`, resampling
  whole symptoms).

Which tokens are scored. Every example is rendered as the whole chat (``coursekit.data.encode_example``: system turn,
user turn, answer, end of turn). The longest token prefix shared by all examples (for the ticket data: the system
turn and "Return the issue category for:") is run once and its keys and values reused (the KV cache, as in
:mod:`coursekit.evaluate`); the loss covers every token after it: the ticket's own words, the markers that close the
user turn and open the assistant's, the answer and its end-of-turn token. That is language-modelling loss on text the
model has to predict, the analogue of the paper's perplexity, with ~27 tokens per ticket rather than the 2 or 3 of
the answer alone.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import data as cdata
from . import model as cmodel
from . import paired, quant
from .fingerprint import code_fingerprint
from .evaluate import _expand, common_prefix_length, evaluating

__all__ = ["DATA_TYPES", "LESSON_TICKETS", "round_trip", "base_linears", "set_base", "ticket_losses", "compare_data_types",
           "weight_errors", "stored_comparison"]

#: The data types compared, the reference first: bf16 (the checkpoint as stored), then the three 4-bit types of
#: QLoRA's comparison.
DATA_TYPES: tuple[str, ...] = ("bf16", "nf4", "fp4", "int4")

#: How many held-out tickets (the first of the ``unseen_phrasing`` split) lesson 15 scores, as one batch: the
#: grader fills the store with exactly this comparison before grading the lesson (``coursekit.course``).
LESSON_TICKETS = 48

_IN_BLOCK = re.compile(r"(^|\.)layers\.\d+\.")


def round_trip(W: torch.Tensor, data_type: str, blocksize: int = 64) -> torch.Tensor:
    """The weight a layer computes with once ``W`` is stored in ``data_type`` and decoded again.

    Args:
        W: float tensor (float32, bfloat16 or float16), any shape, at least one element.
        data_type: ``"bf16"`` (W rounded to bfloat16: exact for a bf16 checkpoint), ``"nf4"`` or ``"fp4"``
            (``quant.round_trip_4bit``: bitsandbytes' codes and absmax in blocks of ``blocksize``, decoded in float32
            as a ``Linear4bit`` with ``compute_dtype=float32`` decodes them), ``"int4"`` (``quant.absmax_round_trip``
            with 4 bits: ``round(x / absmax · 7)``, 15 evenly spaced levels per block).
        blocksize: values per block for the 4-bit types (bitsandbytes' default 64; nf4/fp4 need one of
            ``quant.BLOCKSIZES``).
    Returns:
        float32 tensor of W's shape.
    Raises:
        ValueError: an unknown data type. ``quant.QuantError`` (a ValueError): W not a float tensor, empty, non-finite,
        or a bad blocksize.
    Sources: QLoRA (Dettmers et al. 2023, arXiv:2305.14314) §3 for NF4, §4 for the FP4/int4 comparison; bitsandbytes
    0.50.2 for the nf4/fp4 codes; Dettmers et al. 2021 (arXiv:2110.02861) §2 for blockwise absmax.
    """
    if data_type not in DATA_TYPES:
        raise ValueError(f"data_type must be one of {', '.join(map(repr, DATA_TYPES))}; got {data_type!r}")
    if not torch.is_tensor(W) or W.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise quant.QuantError(f"W must be a float32, bfloat16 or float16 tensor, got "
                               f"{W.dtype if torch.is_tensor(W) else type(W).__name__}")
    if data_type == "bf16":
        if W.numel() == 0:
            raise quant.QuantError("cannot round an empty tensor")
        return W.detach().to(torch.bfloat16).float()
    if data_type == "int4":
        return quant.absmax_round_trip(W, bits=4, blocksize=blocksize).float()
    return quant.round_trip_4bit(W.detach().float(), blocksize=blocksize, quant_type=data_type)


def base_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """``(name, module)`` of every ``nn.Linear`` inside the decoder blocks (a name containing ``layers.<i>.``), in
    module order: the layers a QLoRA base stores in 4 bits. Raises ValueError when there is none (a model without
    decoder blocks, or one whose blocks hold bitsandbytes 4-bit layers already: load it in bf16 or fp32)."""
    out = [(name, m) for name, m in model.named_modules()
           if type(m) is torch.nn.Linear and _IN_BLOCK.search(name)]
    if not out:
        raise ValueError("the model has no nn.Linear inside decoder blocks (names with 'layers.<i>.'); load the "
                         "base in bf16 or fp32, not already in 4 bits")
    return out


@torch.no_grad()
def set_base(model: torch.nn.Module, originals: dict[str, torch.Tensor], data_type: str, blocksize: int = 64) -> int:
    """Write ``round_trip(originals[name], data_type, blocksize)`` into the weight of every :func:`base_linears` layer,
    cast to that weight's dtype (a float32 model computes with the decoded float32 weight; a bf16 model with it
    rounded to bf16, as ``compute_dtype=bfloat16`` does). Biases and every other module are left alone.

    originals: ``{name: weight}`` for every base layer, the weights as stored (e.g. cloned before the first call);
    they are read, never changed. Returns the number of weights written. Raises ValueError for a missing or
    mis-shaped original, or as :func:`round_trip`."""
    layers = base_linears(model)
    for name, m in layers:
        W = originals.get(name)
        if W is None or tuple(W.shape) != tuple(m.weight.shape):
            raise ValueError(f"originals[{name!r}] must be that layer's weight, shape {tuple(m.weight.shape)}; got "
                             f"{None if W is None else tuple(W.shape)}")
        m.weight.copy_(round_trip(W, data_type, blocksize).to(m.weight.dtype))
    return len(layers)


def ticket_losses(model: torch.nn.Module, tokenizer, examples: Sequence[dict[str, Any]], batch_size: int = 16,
                  progress: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Each example's summed next-token cross-entropy over the tokens after the prefix all examples share.

    examples: dicts with ``"messages"`` ending in the assistant's answer (the ticket data's examples), at least one.
    Each is rendered by ``coursekit.data.encode_example`` (the chat template, cut after the answer's end-of-turn
    token). Let P be the longest token prefix shared by all rows (``evaluate.common_prefix_length``, at least one
    token short of the shortest row). Token t of a row (t ≥ max(P, 1)) is scored by −log softmax(logits at t − 1)
    [token t], in float32; the prefix runs once and its KV cache is reused, each batch right-padded after it with
    the padding masked. Eval mode and no gradients for the duration (``evaluate.evaluating``), the model's mode
    restored. ``progress``: called with the number of examples finished after each batch.
    Returns ``{"ids": [N] (example ids, or their indices), "loss": float64 [N] (nats, summed over the scored tokens),
    "tokens": int64 [N] (scored tokens per example), "prefix": P}``; the mean loss per token is
    ``loss.sum() / tokens.sum()``. Raises ValueError for no examples or a batch_size that is not a positive integer,
    and as ``encode_example`` for a malformed example.
    Source: the causal-LM loss as transformers computes it (logit t − 1 scores token t), summed instead of averaged.
    """
    if len(examples) == 0:
        raise ValueError("no examples to score")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    rows = [cdata.encode_example(ex, tokenizer)["input_ids"] for ex in examples]
    pad = cdata.end_of_turn_id(tokenizer)
    P = common_prefix_length(rows)
    start = max(P, 1)
    losses, counts = [], []
    with evaluating(model):
        cache, first = None, None
        if P:
            out = model(input_ids=torch.tensor([rows[0][:P]]), use_cache=True)
            cache, first = out.cache, out.logits[0, -1].float()
        for i in range(0, len(rows), batch_size):
            suffixes = [r[P:] for r in rows[i:i + batch_size]]
            B, S = len(suffixes), max(map(len, suffixes))
            ids = torch.tensor([s + [pad] * (S - len(s)) for s in suffixes])
            real = torch.tensor([[1] * len(s) + [0] * (S - len(s)) for s in suffixes])
            kwargs = {"cache": _expand(cache, B), "use_cache": True} if cache is not None else {}
            out = model(input_ids=ids, attention_mask=torch.cat([torch.ones(B, P, dtype=torch.long), real], dim=1),
                        position_ids=P + torch.arange(S).expand(B, S), **kwargs)
            logits = out.logits.float()
            V = logits.shape[-1]
            lead = first.expand(B, 1, V) if first is not None else logits.new_zeros(B, 1, V)
            pred = torch.cat([lead, logits[:, :-1]], dim=1)                        # pred[:, j] scores suffix token j
            target = ids.masked_fill(real == 0, cdata.IGNORE_INDEX)
            if P == 0:
                target[:, 0] = cdata.IGNORE_INDEX                                    # token 0 has nothing before it
            nll = F.cross_entropy(pred.reshape(-1, V), target.reshape(-1), ignore_index=cdata.IGNORE_INDEX,
                                  reduction="none").reshape(B, S)
            losses.append(nll.double().sum(dim=1))
            counts.append((target != cdata.IGNORE_INDEX).sum(dim=1))
            if progress:
                progress(B)
    tokens = torch.cat(counts).numpy().astype(np.int64)
    assert (tokens == np.array([len(r) - start for r in rows])).all()
    return {"ids": [ex.get("id", i) for i, ex in enumerate(examples)], "loss": torch.cat(losses).numpy(),
            "tokens": tokens, "prefix": P}


def compare_data_types(model: torch.nn.Module, tokenizer, examples: Sequence[dict[str, Any]],
                       data_types: Sequence[str] = DATA_TYPES, reference: str = "bf16", blocksize: int = 64,
                       batch_size: int = 16, group_key: str | None = "symptom", n_boot: int = 2000,
                       level: float = 0.95, seed: int = 0,
                       progress: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """The held-out loss of ``model`` with its base in each data type, and each one's difference from ``reference``.

    For each data type: :func:`set_base` with the model's own base weights as the originals, then
    :func:`ticket_losses` on ``examples``. The base weights are restored afterwards, also after an error.
    model: a float model (bf16 or float32 weights; load it with ``load_model("bf16")``, and on a CPU without bf16
    matmuls make it compute in float32 with ``model.compute_in_float32``). group_key: the example field whose equal
    values resample together in the interval (``"symptom"``: the tickets of one symptom are not independent);
    ``None`` resamples single examples. ``progress``: called with the number of examples finished after each batch,
    ``len(data_types) · len(examples)`` in all.
    Returns ``{"rows": [one per data type, in order], "losses": {data type: float64 [N] nats per example},
    "tokens": int64 [N], "ids": [N]}``; a row is ``{"data_type", "loss" (mean nats per token), "difference" (loss −
    the reference's, nats per token; 0 for the reference), "interval" ((lo, hi) of the difference at ``level``,
    paired, resampling groups; None for the reference), "n_examples", "n_tokens", "n_groups"}``.
    Raises ValueError for an unknown data type, a reference not among ``data_types``, or an example without
    ``group_key``, and as :func:`ticket_losses`.
    Source: QLoRA (arXiv:2305.14314) §4 compares data types by the quality of the model with its base in each.
    """
    data_types = list(data_types)
    bad = [d for d in data_types if d not in DATA_TYPES]
    if bad or not data_types:
        raise ValueError(f"data_types must be among {DATA_TYPES}; got {data_types!r}")
    if reference not in data_types:
        raise ValueError(f"the reference {reference!r} must be one of the data types compared, {data_types!r}")
    if len(examples) == 0:
        raise ValueError("no examples to score")
    if group_key is None:
        groups = list(range(len(examples)))
    else:
        lost = [i for i, ex in enumerate(examples) if group_key not in ex]
        if lost:
            raise ValueError(f"{len(lost)} examples have no {group_key!r} to group by, e.g. example {lost[0]}; "
                             "pass group_key=None to resample single examples")
        groups = [ex[group_key] for ex in examples]
    originals = {name: m.weight.detach().clone() for name, m in base_linears(model)}
    losses: dict[str, np.ndarray] = {}
    try:
        for d in data_types:
            set_base(model, originals, d, blocksize)
            result = ticket_losses(model, tokenizer, examples, batch_size, progress)
            losses[d] = result["loss"]
    finally:
        with torch.no_grad():
            for name, m in base_linears(model):
                m.weight.copy_(originals[name])
    tokens = result["tokens"]
    N = int(tokens.sum())
    ref = losses[reference]
    rows = []
    for d in data_types:
        diff = float((losses[d] - ref).sum() / N)
        interval = None if d == reference else paired.paired_loss_interval(
            losses[d], ref, tokens, groups, n_boot=n_boot, level=level, seed=seed)
        rows.append({"data_type": d, "loss": float(losses[d].sum() / N), "difference": diff, "interval": interval,
                     "n_examples": len(examples), "n_tokens": N, "n_groups": len(set(groups))})
    return {"rows": rows, "losses": losses, "tokens": tokens, "ids": result["ids"]}


@torch.no_grad()
def weight_errors(model: torch.nn.Module, data_types: Sequence[str] = ("nf4", "fp4", "int4"),
                  blocksize: int = 64) -> dict[str, float]:
    """Each data type's relative weight error over every :func:`base_linears` layer of ``model`` together:
    √(Σ‖round_trip(W) − W‖² / Σ‖W‖²), the sums over all those weights' entries, in float64 (a number, no unit).

    Returns ``{data type: error}`` in the order given. Raises ValueError as :func:`base_linears` and
    :func:`round_trip`. Source: the relative Frobenius error of lessons 14 and 15, pooled over the layers.
    """
    sq = {d: 0.0 for d in data_types}
    ref = 0.0
    for _, layer in base_linears(model):
        W = layer.weight.detach()
        ref += W.double().square().sum().item()
        for d in sq:
            sq[d] += (round_trip(W, d, blocksize).double() - W.double()).square().sum().item()
    return {d: (v / ref) ** 0.5 for d, v in sq.items()}


def _checkpoint_key(folder: Path) -> dict:
    """What identifies a checkpoint: its manifest's file hashes (the course's converted model), else the SHA-256 of
    its config and weight files (a checkpoint written by ``model.tiny_checkpoint``)."""
    try:
        return cmodel.read_manifest(folder)["checkpoint"]["files"]
    except cmodel.CacheError:
        files = sorted(folder.glob("*.safetensors")) + [folder / "config.json"]
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def stored_comparison(store, examples: Sequence[dict[str, Any]], checkpoint: str | Path | None = None,
                      data_types: Sequence[str] = DATA_TYPES, blocksize: int = 64, batch_size: int = 16,
                      progress: bool = True) -> dict[str, Any]:
    """:func:`compare_data_types` and :func:`weight_errors` of the bf16 checkpoint, computed once and then read
    from ``store``.

    store: a ``coursekit.capstone.Store``; the result is kept under kind ``"quantloss"`` and a key made of what
    decides it: the checkpoint's files, the examples (ids and messages), the data types, blocksize, batch size, the
    code of this module's functions and of the quantizers they call, and the versions of torch, transformers and
    bitsandbytes. A store made with ``fresh=True`` computes it again. A store that may not compute (inside
    ``nbgrader autograde``) reads a stored result and otherwise computes it here without keeping it.
    checkpoint: folder of the model (default: the course's converted SmolLM2), loaded only when the result is not
    stored: ``load_model("bf16")``, computing in float32 (``model.compute_in_float32``).
    progress: a progress bar over the ``len(data_types) · len(examples)`` tickets scored.
    Returns :func:`compare_data_types`'s dict (``"losses"`` as float64 arrays [N], ``"tokens"`` int64 [N]) plus
    ``"weight_error"`` (:func:`weight_errors` of the 4-bit types), ``"n_weights"`` (layers quantized),
    ``"n_layers"`` (decoder blocks), ``"seconds"`` (the computation's wall time, load included, also when read
    back) and ``"cached"`` (read from the store). Raises ValueError as :func:`compare_data_types`.
    """
    from transformers import __version__ as transformers_version
    import bitsandbytes

    from .capstone import CacheMiss

    if len(examples) == 0:
        raise ValueError("no examples to score")
    folder = Path(checkpoint) if checkpoint is not None else cmodel.default_checkpoint_dir()
    data_types = list(data_types)
    key = {"checkpoint": _checkpoint_key(folder),
           "examples": [[ex.get("id"), ex.get("messages")] for ex in examples],
           "data_types": data_types, "blocksize": blocksize, "batch_size": batch_size,
           "code": {f.__qualname__: code_fingerprint(f) for f in (compare_data_types, weight_errors, round_trip,
                                                                   quant.round_trip_4bit, quant.absmax_round_trip)},
           "versions": {"torch": torch.__version__, "transformers": transformers_version,
                        "bitsandbytes": bitsandbytes.__version__}}

    def compute() -> dict:
        from tqdm.auto import tqdm

        model = cmodel.compute_in_float32(cmodel.load_model("bf16", checkpoint))
        tokenizer = cmodel.load_tokenizer()
        with tqdm(total=len(data_types) * len(examples), desc=f"held-out loss, {len(data_types)} data types",
                  unit="ticket", disable=not progress) as bar:
            out = compare_data_types(model, tokenizer, examples, data_types, batch_size=batch_size, blocksize=blocksize,
                                     progress=bar.update)
        return {"rows": out["rows"], "losses": {d: v.tolist() for d, v in out["losses"].items()},
                "tokens": out["tokens"].tolist(), "ids": out["ids"],
                "weight_error": weight_errors(model, [d for d in data_types if d != "bf16"], blocksize),
                "n_weights": len(base_linears(model)), "n_layers": model.config.num_hidden_layers}

    try:
        out = store.result("quantloss", key, compute, by="coursekit.quantloss")
    except CacheMiss:
        t0 = time.perf_counter()
        out = {**compute(), "seconds": time.perf_counter() - t0, "cached": False}
    out["losses"] = {d: np.asarray(v, dtype=np.float64) for d, v in out["losses"].items()}
    out["tokens"] = np.asarray(out["tokens"], dtype=np.int64)
    out["rows"] = [{**r, "interval": None if r["interval"] is None else tuple(r["interval"])} for r in out["rows"]]
    return out
