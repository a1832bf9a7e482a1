"""The capstone's recipe, preflight, training loop and adapter artifacts: the reference for what lesson 19's
student writes.

Recipe (QLoRA, Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", arXiv:2305.14314;
PEFT's quantization guide): an NF4 base with double quantization, ``prepare_model_for_kbit_training``,
LoRA on every linear layer of the decoder (PEFT ``target_modules="all-linear"``, which leaves the tied
output head alone), AdamW over the adapter parameters only, linear warm-up then linear decay, gradient
accumulation with a token-weighted loss (lesson 04), one tqdm bar, the loss logged every step. The loss
runs the output layer only at supervised positions (:func:`supervised_loss_sum`).

Evaluation lives in :mod:`coursekit.evaluate`; the whole experiment in :mod:`coursekit.capstone`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from . import data as cdata
from . import model as cmodel
from .artifacts import warn_if_untrained

__all__ = [
    "TrainConfig",
    "attach_adapter",
    "trainable_report",
    "preflight",
    "PreflightError",
    "load_for_lora",
    "supervised_loss_sum",
    "adapter_optimizer",
    "make_windows",
    "train_steps",
    "train",
    "save_adapter",
    "load_adapter",
    "merge_into_bf16",
    "peak_rss_mb",
]


class PreflightError(RuntimeError):
    """A check before a long run failed; the message names the parameters or layers and the likely cause."""


@dataclass
class TrainConfig:
    """Hyperparameters of one run. Names follow PEFT (``r``, ``lora_alpha``, ``target_modules``)."""

    r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: Any = "all-linear"
    lr: float = 1e-3
    weight_decay: float = 0.0
    steps: int = 150
    micro_batch: int = 8
    accumulation: int = 1
    warmup_steps: int = 10
    seed: int = 0
    max_new_tokens: int = 5

    def __post_init__(self) -> None:
        for name in ("r", "steps", "micro_batch", "accumulation"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {v!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"TrainConfig.warmup_steps must be >= 0, got {self.warmup_steps}")

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, default=str).encode()).hexdigest()[:16]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (10⁶ bytes; Linux ru_maxrss is in KiB).

    "So far" means since the process started or since the last reset of its high-water mark:
    ``coursekit.memory.peak_rss_delta`` resets it, and ``ru_maxrss`` follows."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def attach_adapter(model: torch.nn.Module, cfg: TrainConfig, quantized: bool | None = None):
    """Freeze the base and add LoRA adapters (PEFT). For a 4-bit base, run ``prepare_model_for_kbit_training`` first
    (it freezes every parameter and casts the unquantized bf16/fp16 ones, embedding and norms, to fp32; peft/utils/other.py).
    It is called with ``use_gradient_checkpointing=False``, so it installs no hook that makes the embedding output require
    gradients (PEFT adds that hook only together with reentrant checkpointing). Gradient checkpointing stays off: it
    runs every decoder layer's forward a second time in each backward, and the course's short CPU jobs fit in memory
    without it (lesson 17 measures what it would save), so it would only make each step slower.

    Returns the ``PeftModel``. Raises ValueError if ``cfg.r`` is not positive.
    """
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.r <= 0:
        raise ValueError(f"r must be positive, got {cfg.r}")
    if quantized is None:
        quantized = bool(getattr(model, "is_loaded_in_4bit", False))
    if quantized:
        with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x; harmless
            warnings.simplefilter("ignore", FutureWarning)
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        cmodel.keep_4bit_layers_trainable(model)
    lcfg = LoraConfig(r=cfg.r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, lcfg)


def trainable_report(model: torch.nn.Module) -> dict:
    """Trainable parameter names, shapes and counts, and the total; what lesson 11's preflight prints first."""
    rows = [(n, tuple(p.shape), p.numel()) for n, p in model.named_parameters() if p.requires_grad]
    total = sum(p.numel() for p in model.parameters())
    return {"rows": rows, "trainable": sum(r[2] for r in rows), "total": total}


def _default_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def preflight(model: torch.nn.Module, batch: Any, *, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
              optimizer: torch.optim.Optimizer | None = None, trainable: Callable[[str], bool] | None = None,
              overfit_steps: int = 0, overfit_factor: float = 2.0) -> dict:
    """Checks before a long run, on one batch (lesson 11).

    Always:

    1. something trains (:func:`trainable_report`); with ``trainable`` (a predicate on parameter names, e.g.
       ``lambda n: "lora_" in n``), every matching parameter must have ``requires_grad`` set (else: the adapter
       is not trainable), and the names that are trainable but do not match are reported (``unexpected``);
    2. the loss is finite, and every trainable gradient exists and is finite;
    3. **every adapter receives a gradient**. With B = 0 at initialisation, ∇A = s Xᵀ D Bᵀ is zero everywhere,
       but ∇B = s Zᵀ D is not — unless no gradient D reaches that layer. So a ``lora_B`` with an all-zero gradient
       means the path above it is cut: a detached or frozen-and-no-grad module, or (bitsandbytes 0.50.2 on
       AVX512-BF16 CPUs) a 4-bit layer repacked for inference after an eval pass (coursekit.model).

    With an ``optimizer`` (opt-in: it copies every parameter once and takes a step; the capstone's reference recipe
    passes its optimizer, for check 4):

    4. the optimizer owns every trainable tensor, and one ``optimizer.step()`` leaves every *frozen* parameter
       bit-identical (``torch.equal``). Frozen means ``requires_grad`` is False, or, with ``trainable``, that the
       name does not match. AdamW skips a parameter whose ``.grad`` is None but decays one whose gradient is a
       tensor of zeros, θ ← θ(1 − lr·λ), so a weight "frozen" by zeroing its gradient still moves;
    5. if ``overfit_steps`` > 0, that many further steps on this same batch must bring the loss below
       first loss / ``overfit_factor``: a pipeline that cannot memorise one tiny batch has a bug (passing says
       nothing about generalisation).

    Afterwards every parameter and the optimizer's state are restored, so the run starts where it would have.

    Args:
        model: any ``nn.Module``. batch: whatever ``loss_fn`` takes; by default a dict of keyword arguments for
            ``model(**batch)``, whose output has ``.loss`` (a transformers / PEFT causal LM).
        loss_fn: ``loss_fn(model, batch)`` → a scalar loss tensor, for models without ``.loss``.
        optimizer: a ``torch.optim.Optimizer`` built over the model's parameters (enables checks 4 and 5).
        trainable: predicate on ``named_parameters()`` names: which parameters are meant to train.
        overfit_steps: ≥ 0 (needs ``optimizer``). overfit_factor: > 1.

    Returns a dict: ``loss`` (first loss), ``trainable``, ``total`` (parameter counts), ``tensors`` (trainable
    tensors), ``rows`` (name, shape, count of each trainable tensor), ``unexpected`` (trainable names not matching
    ``trainable``), and with an optimizer ``frozen_checked`` (frozen tensors compared) and ``losses`` (the loss
    before each step). Raises :class:`PreflightError` naming the offending parameters and the likely cause,
    TypeError / ValueError for bad arguments.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    if not isinstance(overfit_steps, int) or overfit_steps < 0:
        raise ValueError(f"overfit_steps must be a non-negative integer, got {overfit_steps!r}.")
    if overfit_steps and optimizer is None:
        raise ValueError("overfit_steps > 0 needs an optimizer to take the steps.")
    if not overfit_factor > 1:
        raise ValueError(f"overfit_factor must be > 1, got {overfit_factor}.")
    loss_fn = loss_fn or _default_loss
    rep = trainable_report(model)
    named = list(model.named_parameters())
    if trainable is not None:
        frozen_adapter = [n for n, p in named if trainable(n) and not p.requires_grad]
        if frozen_adapter:
            raise PreflightError(f"{len(frozen_adapter)} parameters meant to train have requires_grad=False (e.g. "
                                 f"{frozen_adapter[0]}): the adapter is not trainable. A PeftModel loaded with "
                                 f"from_pretrained(...) is frozen unless is_trainable=True; or something called "
                                 f"requires_grad_(False) on the whole model after get_peft_model.")
    unexpected = [n for n, p in named if p.requires_grad and trainable is not None and not trainable(n)]
    if rep["trainable"] == 0:
        raise PreflightError("no trainable parameters: the adapter was not attached, or everything is frozen.")
    model.train()
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, batch)
    if not torch.isfinite(loss):
        raise PreflightError(f"the loss is {loss.item()} on the first batch: check the labels (is any token supervised?), "
                             f"the inputs (NaN or inf in the data?) and the dtype.")
    loss.backward()
    missing, zero, nonfinite = [], [], []
    for n, p in named:
        if not p.requires_grad:
            continue
        if p.grad is None:
            missing.append(n)
        elif not torch.isfinite(p.grad).all():
            nonfinite.append(n)
        elif "lora_B" in n and not p.grad.abs().sum() > 0:
            zero.append(n)
    if missing or zero or nonfinite:
        model.zero_grad(set_to_none=True)
        parts = []
        if missing:
            parts.append(f"{len(missing)} trainable tensors got no gradient at all (e.g. {missing[0]})")
        if zero:
            parts.append(f"{len(zero)} lora_B tensors got an all-zero gradient (e.g. {zero[0]}): no gradient reaches "
                         f"those layers. A layer above them passes none — a detach, a no_grad region, or a 4-bit layer "
                         f"repacked for inference (run coursekit.model.keep_4bit_layers_trainable(model)).")
        if nonfinite:
            parts.append(f"{len(nonfinite)} gradients are not finite (e.g. {nonfinite[0]})")
        raise PreflightError("; ".join(parts))
    out = {"loss": loss.item(), "trainable": rep["trainable"], "total": rep["total"], "tensors": len(rep["rows"]),
           "rows": rep["rows"], "unexpected": unexpected}
    if optimizer is None:
        model.zero_grad(set_to_none=True)
        return out
    out.update(_preflight_steps(model, batch, loss_fn, optimizer, trainable, overfit_steps, overfit_factor, loss.item()))
    return out


def _preflight_steps(model, batch, loss_fn, optimizer, trainable, overfit_steps, overfit_factor, first_loss) -> dict:
    """Checks 4 and 5 of :func:`preflight`; the gradients of the first batch are already in ``.grad``."""
    import copy

    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    named = list(model.named_parameters())
    not_owned = [n for n, p in named if p.requires_grad and id(p) not in owned]
    if not_owned:
        model.zero_grad(set_to_none=True)
        raise PreflightError(f"{len(not_owned)} trainable tensors are not in the optimizer (e.g. {not_owned[0]}): they get "
                             f"gradients but never move. Build the optimizer after attaching the adapter, from "
                             f"[p for p in model.parameters() if p.requires_grad].")
    is_frozen = (lambda n, p: not trainable(n)) if trainable is not None else (lambda n, p: not p.requires_grad)
    saved = {n: p.detach().clone() for n, p in named}
    saved_opt = copy.deepcopy(optimizer.state_dict())
    losses = [first_loss]
    try:
        optimizer.step()
        moved = [(n, (p.detach() - saved[n]).abs().max().item()) for n, p in named
                 if is_frozen(n, p) and not torch.equal(p.detach(), saved[n])]
        if moved:
            n, dmax = moved[0]
            in_opt = sum(1 for nn, p in named if is_frozen(nn, p) and id(p) in owned)
            raise PreflightError(
                f"{len(moved)} frozen tensors changed in one optimizer step (e.g. {n}, max |change| {dmax:.3g}). The "
                f"optimizer owns {in_opt} frozen tensors, and they have gradient tensors (possibly all zeros): AdamW's "
                f"decoupled weight decay θ ← θ(1 − lr·λ) moves a parameter whose gradient is zero (only a None "
                f"gradient is skipped). Freeze with requires_grad_(False) and build the optimizer from "
                f"[p for p in model.parameters() if p.requires_grad].")
        for _ in range(overfit_steps):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model, batch)
            if not torch.isfinite(loss):
                raise PreflightError(f"the loss became {loss.item()} after {len(losses)} steps on one batch: the "
                                     f"learning rate is too high, or the dtype overflows.")
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
        if overfit_steps:
            with torch.no_grad():
                losses.append(loss_fn(model, batch).item())
            if not losses[-1] <= losses[0] / overfit_factor:
                raise PreflightError(
                    f"the loss on one tiny batch went {losses[0]:.4g} → {losses[-1]:.4g} in {overfit_steps} steps, not "
                    f"below {losses[0] / overfit_factor:.4g} (1/{overfit_factor:g} of the start): a model that cannot "
                    f"memorise one batch has a pipeline bug (labels all −100 or misaligned, an adapter cut off the "
                    f"loss, a learning rate of 0), or needs more steps or a larger learning rate.")
    finally:
        with torch.no_grad():
            for n, p in named:
                p.copy_(saved[n])
        optimizer.load_state_dict(saved_opt)
        model.zero_grad(set_to_none=True)
    return {"frozen_checked": sum(1 for n, p in named if is_frozen(n, p)), "losses": losses}


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else cdata.end_of_turn_id(tokenizer)


def _batches(rows: list[dict], size: int, seed: int) -> Iterable[list[dict]]:
    """Endless mini-batches: a fresh shuffle every epoch (deterministic for a seed)."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        for i in range(0, len(order) - size + 1, size):
            yield [rows[j] for j in order[i:i + size]]


def load_for_lora(path: str | os.PathLike | None, r: int, lora_alpha: int, target_modules: Any = "all-linear",
                  quantize: bool = True, lora_dropout: float = 0.0):
    """The QLoRA recipe in four calls (Dettmers et al. 2023; PEFT's quantization guide), or plain LoRA on bf16.

    With ``quantize``: ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)`` → ``from_pretrained`` →
    ``prepare_model_for_kbit_training`` (norms and embedding to fp32) → ``get_peft_model`` with
    ``LoraConfig(r, lora_alpha, target_modules, lora_dropout, task_type="CAUSAL_LM")``. Without: the bf16
    base and the same adapter, no preparation (there is nothing quantized to prepare for).

    path: checkpoint folder (None: the course's embedded base). Returns the ``PeftModel`` in train mode,
    only the adapter trainable. Raises ValueError for r < 1 or lora_alpha ≤ 0; ModelError if loading fails.
    """
    if not isinstance(r, int) or r < 1:
        raise ValueError(f"r must be a positive integer, got {r!r}")
    if not lora_alpha > 0:
        raise ValueError(f"lora_alpha must be positive, got {lora_alpha!r}")
    base = cmodel.load_model("nf4" if quantize else "bf16", path)
    cfg = TrainConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules, lora_dropout=lora_dropout)
    model = attach_adapter(base, cfg, quantized=quantize)
    model.train()
    return model


def supervised_loss_sum(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
    """(Σ token losses over the supervised positions, their number) for one collated batch.

    The same loss as ``model(**batch).loss`` × count, computed without the logits nobody scores: the
    decoder's hidden states [B, T, d] are gathered at the positions whose next token is supervised
    (labels shifted once, here), and only those go through the output layer (d → V = 49,152 for SmolLM2).
    Under 5 % of a capstone batch's positions are supervised, so this skips most of the largest matmul and
    of the softmax. batch: ``coursekit.data.collate`` output. Returns a 0-dim float32 tensor (with grad) and
    an int. Raises EmptyBatchError if no position is supervised.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = inner.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    target = batch["labels"][:, 1:]
    keep = target != cdata.IGNORE_INDEX
    n = int(keep.sum())
    if n == 0:
        raise cdata.EmptyBatchError("no supervised position in this batch: the loss is undefined (0/0)")
    logits = inner.get_output_embeddings()(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum"), n


def adapter_optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the trainable tensors only (``requires_grad``), never the frozen base. Raises ValueError if
    nothing is trainable."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("nothing is trainable: attach the adapter first")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def make_windows(examples: Sequence[dict], tokenizer, cfg: TrainConfig) -> list[list[dict]]:
    """``cfg.steps`` accumulation windows of ``cfg.accumulation`` collated micro-batches of ``cfg.micro_batch``
    examples: a fresh shuffle every epoch, deterministic in ``cfg.seed``. Raises ValueError when ``examples``
    cannot fill one micro-batch."""
    if len(examples) < cfg.micro_batch:
        raise ValueError(f"{len(examples)} training examples cannot fill a micro-batch of {cfg.micro_batch}.")
    rows = [cdata.encode_example(ex, tokenizer) for ex in examples]
    stream = _batches(rows, cfg.micro_batch, cfg.seed)
    pad_id = _pad_id(tokenizer)
    return [[cdata.collate(next(stream), pad_id) for _ in range(cfg.accumulation)] for _ in range(cfg.steps)]


def train_steps(model: torch.nn.Module, windows: Sequence[Sequence[dict]], optimizer: torch.optim.Optimizer,
                scheduler: Any = None, progress: bool = True,
                on_step: Callable[[int, float], None] | None = None) -> dict:
    """One optimizer step per window: the token-weighted mean loss over the window, AdamW, the schedule.

    With N = the window's supervised tokens, every micro-batch adds (its loss sum) / N to the gradient, so
    the window's gradient is that of Σ token losses / N: every token weighs the same, however the tokens
    fall into micro-batches (lesson 04; averaging per micro-batch would weigh a short answer's tokens more).
    Returns the history: ``loss`` (window mean), ``lr``, ``seconds`` and ``tokens`` per step.
    """
    from tqdm.auto import tqdm

    hist: dict[str, list] = {"loss": [], "lr": [], "seconds": [], "tokens": []}
    model.train()
    bar = tqdm(windows, desc="training", unit="step", disable=not progress)
    for step, window in enumerate(bar):
        t0 = time.perf_counter()
        n = sum(cdata.count_supervised(b["labels"]) for b in window)
        total = 0.0
        for b in window:
            loss_sum, _ = supervised_loss_sum(model, b)
            (loss_sum / n).backward()
            total += loss_sum.item()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        hist["loss"].append(total / n)
        hist["lr"].append(optimizer.param_groups[0]["lr"])
        hist["seconds"].append(time.perf_counter() - t0)
        hist["tokens"].append(n)
        bar.set_postfix(loss=f"{total / n:.3f}")
        if on_step:
            on_step(step, total / n)
    return hist


def train(model: torch.nn.Module, tokenizer, examples: Sequence[dict], cfg: TrainConfig,
          progress: bool = True, on_step: Callable[[int, float], None] | None = None) -> dict:
    """Train the adapter in ``model`` (a PeftModel) on ``examples`` (chat-format dicts with "messages"):
    :func:`make_windows`, :func:`adapter_optimizer`, linear warm-up then linear decay
    (``transformers.get_linear_schedule_with_warmup``), :func:`train_steps`. Returns the history.

    Raises ValueError for an empty training set or one smaller than a micro-batch.
    """
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(cfg.seed)
    windows = make_windows(examples, tokenizer, cfg)
    opt = adapter_optimizer(model, cfg.lr, cfg.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, cfg.warmup_steps, cfg.steps)
    return train_steps(model, windows, opt, sched, progress=progress, on_step=on_step)


# --------------------------------------------------------------------------- artifacts


IDENTITY = "coursekit_identity.json"


def base_identity(checkpoint: str | os.PathLike | None = None) -> dict:
    """What an adapter belongs to: the base model's name and checkpoint hashes (from its manifest)."""
    folder = Path(checkpoint) if checkpoint else cmodel.default_checkpoint_dir()
    m = cmodel.read_manifest(folder)
    return {"model": m["model"], "checkpoint_files": m["checkpoint"]["files"], "route": m["route"]}


def save_adapter(model, out_dir: str | os.PathLike, cfg: TrainConfig, checkpoint: str | os.PathLike | None = None,
                 extra: dict | None = None) -> Path:
    """Save the adapter (PEFT: adapter_config.json + adapter_model.safetensors) and its base identity:
    checkpoint hashes, target modules, r, lora_alpha, the run's config. Returns the folder."""
    out = Path(out_dir)
    warn_if_untrained(model, "saving", out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    peft_cfg = model.peft_config["default"]
    ident = {"base": base_identity(checkpoint), "r": peft_cfg.r, "lora_alpha": peft_cfg.lora_alpha,
             "target_modules": sorted(peft_cfg.target_modules), "config": asdict(cfg), **(extra or {})}
    (out / IDENTITY).write_text(json.dumps(ident, indent=2, default=str) + "\n")
    return out


def load_adapter(base_model, adapter_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                 is_trainable: bool = False):
    """Attach a saved adapter to ``base_model`` after checking it was trained on this base.

    Raises ValueError when the saved base identity (checkpoint hashes) differs from ``checkpoint``'s, or when the
    folder has no adapter: loading onto another base would run, silently, and mean something else.
    """
    from peft import PeftModel

    folder = Path(adapter_dir)
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder} holds no adapter (adapter_config.json is missing)")
    ident_file = folder / IDENTITY
    if ident_file.is_file():
        saved = json.loads(ident_file.read_text())["base"]
        here = base_identity(checkpoint)
        if saved["checkpoint_files"] != here["checkpoint_files"]:
            raise ValueError(f"this adapter was trained on another base checkpoint ({saved['model']}, "
                             f"{list(saved['checkpoint_files'].values())[0][:12]}…) than the one loaded "
                             f"({list(here['checkpoint_files'].values())[0][:12]}…)")
    model = PeftModel.from_pretrained(base_model, str(folder), is_trainable=is_trainable)
    warn_if_untrained(model, "loaded", folder)
    return model


def load_nf4_with_adapter(adapter_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None):
    """A fresh NF4 base, prepared exactly as for training (``prepare_model_for_kbit_training`` casts the norms
    to fp32), with the saved adapter attached: the same function as the model that was trained."""
    from peft import prepare_model_for_kbit_training

    with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x; harmless
        warnings.simplefilter("ignore", FutureWarning)
        base = prepare_model_for_kbit_training(cmodel.load_model("nf4", checkpoint), use_gradient_checkpointing=False)
    cmodel.keep_4bit_layers_trainable(base)
    return load_adapter(base, adapter_dir, checkpoint)


def merge_into_bf16(adapter_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None):
    """Load the **bf16** base W16, attach the adapter and merge: W16 + s·AB, rounded once to bf16 (lesson 13).

    The recipe most tutorials give (``merge_onto_w16`` in lesson 19), not the function that was trained: that is
    :func:`merge_into_dequantized`'s, and lesson 19 measures what the difference costs on held-out tickets. Merging
    into the NF4 weights instead would re-quantize W + sAB and add a second rounding error (:func:`merge_into_nf4`)."""
    base = cmodel.load_model("bf16", checkpoint)
    return load_adapter(base, adapter_dir, checkpoint).merge_and_unload()


def merge_into_dequantized(adapter_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None):
    """Merge onto dequant(W4) instead of W16: every NF4 layer dequantized to a bf16 ``nn.Linear``
    (:func:`coursekit.model.dequantized_copy`), then W4' + s·AB rounded to bf16. The base the adapter was trained
    against, in a plain bf16 model; lesson 19 compares it with :func:`merge_into_bf16`."""
    base = cmodel.dequantized_copy(cmodel.load_model("nf4", checkpoint))
    return load_adapter(base, adapter_dir, checkpoint).merge_and_unload()


def merge_into_nf4(adapter_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None):
    """The mistake, for comparison: PEFT's ``merge_and_unload`` on the NF4 model, which dequantizes each weight,
    adds s·AB and quantizes the sum to NF4 again (a second rounding, of a 4-bit size)."""
    return merge_nf4_model(load_nf4_with_adapter(adapter_dir, checkpoint))


def merge_nf4_model(model):
    """:func:`merge_into_nf4` on a PeftModel already loaded on an NF4 base (changes it; returns the merged model)."""
    with warnings.catch_warnings():  # PEFT warns that a 4-bit merge rounds: that rounding is what this shows
        warnings.simplefilter("ignore", UserWarning)
        return model.merge_and_unload()
