"""The capstone's training loop, evaluation and artifacts, written out so a lesson can show every step.

Recipe (QLoRA, Dettmers et al. 2023, arXiv:2305.14314; seed 003 "Preparing the model"): an NF4 base
with double quantization, ``prepare_model_for_kbit_training``, LoRA on every linear layer of the
decoder (PEFT ``target_modules="all-linear"``, which leaves the tied output head alone), AdamW over
the adapter parameters only, linear warm-up then linear decay, gradient accumulation with a
token-weighted loss (coursekit.data), one tqdm bar, the loss logged every step.

Evaluation is greedy generation with the same prompt for the baseline and the tuned model, scored
by exact match of the first word with the label.
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

__all__ = [
    "TrainConfig",
    "attach_adapter",
    "trainable_report",
    "preflight",
    "PreflightError",
    "train",
    "generate_answers",
    "evaluate",
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
    (casts norms to fp32, enables input gradients; seed 003). Gradient checkpointing stays off: at these sequence
    lengths on CPU it costs time and saves little.

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
    """Checks before a long run, on one batch (seed 000, "Run a small preflight"; lesson 11).

    Always:

    1. something trains (:func:`trainable_report`); with ``trainable`` (a predicate on parameter names, e.g.
       ``lambda n: "lora_" in n``), every matching parameter must have ``requires_grad`` set (else: the adapter
       is not trainable), and the names that are trainable but do not match are reported (``unexpected``);
    2. the loss is finite, and every trainable gradient exists and is finite;
    3. **every adapter receives a gradient**. With B = 0 at initialisation, ∇A = s Xᵀ D Bᵀ is zero everywhere,
       but ∇B = s Zᵀ D is not — unless no gradient D reaches that layer. So a ``lora_B`` with an all-zero gradient
       means the path above it is cut: a detached or frozen-and-no-grad module, or (bitsandbytes 0.50.2 on
       AVX512-BF16 CPUs) a 4-bit layer repacked for inference after an eval pass (coursekit.model).

    With an ``optimizer`` (opt-in: it copies every parameter once, so the capstone does not pass one):

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


def train(model: torch.nn.Module, tokenizer, examples: Sequence[dict], cfg: TrainConfig,
          progress: bool = True, on_step: Callable[[int, float], None] | None = None) -> dict:
    """Train the adapter in ``model`` (a PeftModel) on ``examples`` (chat-format dicts with "messages").

    Each optimizer step sums ``cfg.accumulation`` micro-batches of ``cfg.micro_batch`` rows, each weighted by
    its share of the window's supervised tokens (``coursekit.data.micro_batch_loss``), then AdamW and the
    schedule step. Returns the history: loss and learning rate per step, and seconds per step.

    Raises ValueError for an empty training set or one smaller than a micro-batch.
    """
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    if len(examples) < cfg.micro_batch:
        raise ValueError(f"{len(examples)} training examples cannot fill a micro-batch of {cfg.micro_batch}.")
    torch.manual_seed(cfg.seed)
    rows = [cdata.encode_example(ex, tokenizer) for ex in examples]
    pad_id = _pad_id(tokenizer)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, cfg.warmup_steps, cfg.steps)
    stream = _batches(rows, cfg.micro_batch, cfg.seed)
    hist = {"loss": [], "lr": [], "seconds": []}
    model.train()
    bar = tqdm(range(cfg.steps), desc="training", unit="step", disable=not progress)
    for step in bar:
        t0 = time.perf_counter()
        micro = [cdata.collate(next(stream), pad_id) for _ in range(cfg.accumulation)]
        n_window = cdata.num_items_in_window(micro)
        total = 0.0
        for b in micro:
            loss = cdata.micro_batch_loss(model, b, n_window)
            loss.backward()
            total += loss.item()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        hist["loss"].append(total)
        hist["lr"].append(sched.get_last_lr()[0])
        hist["seconds"].append(time.perf_counter() - t0)
        bar.set_postfix(loss=f"{total:.3f}")
        if on_step:
            on_step(step, total)
    return hist


def _first_word(text: str) -> str:
    words = text.strip().lower().split()
    return words[0].strip(".,:;!?\"'`*()[]") if words else ""


@torch.no_grad()
def generate_answers(model: torch.nn.Module, tokenizer, tickets: Sequence[str], max_new_tokens: int = 5,
                     batch_size: int = 16) -> list[str]:
    """Greedy answers (decoded new text) to the course's prompt for each ticket, batched with left padding.

    Runs in eval mode without gradients — which on AVX512-BF16 CPUs makes bitsandbytes repack 4-bit weights
    for inference unless :func:`coursekit.model.keep_4bit_layers_trainable` has been applied; this function
    applies it first, so evaluating before or between training steps never cuts the gradient path.
    """
    cmodel.keep_4bit_layers_trainable(model)
    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out: list[str] = []
    try:
        for i in range(0, len(tickets), batch_size):
            prompts = [tokenizer.apply_chat_template(cdata.prompt_messages(t), tokenize=False, add_generation_prompt=True)
                       for t in tickets[i:i + batch_size]]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=_pad_id(tokenizer))
            out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


def evaluate(model: torch.nn.Module, tokenizer, examples: Sequence[dict], max_new_tokens: int = 5) -> dict:
    """Exact-label accuracy of greedy answers: overall, per label, and every prediction.

    An answer is right when its first word, lower-cased and stripped of punctuation, equals the label.
    """
    tickets = [ex["ticket"] for ex in examples]
    answers = generate_answers(model, tokenizer, tickets, max_new_tokens)
    per: dict[str, list[int]] = {}
    preds = []
    for ex, ans in zip(examples, answers):
        ok = _first_word(ans) == ex["label"]
        per.setdefault(ex["label"], [0, 0])
        per[ex["label"]][0] += ok
        per[ex["label"]][1] += 1
        preds.append({"ticket": ex["ticket"], "label": ex["label"], "answer": ans.strip(), "correct": ok})
    n = len(examples)
    return {"accuracy": sum(p["correct"] for p in preds) / n if n else float("nan"),
            "per_label": {k: v[0] / v[1] for k, v in sorted(per.items())}, "predictions": preds}


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
    return PeftModel.from_pretrained(base_model, str(folder), is_trainable=is_trainable)


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
    """Load the **bf16** base, attach the adapter and merge: W + sAB in full precision (lesson 13).

    Merging into the NF4 weights instead would re-quantize W + sAB and add a second rounding error.
    """
    base = cmodel.load_model("bf16", checkpoint)
    return load_adapter(base, adapter_dir, checkpoint).merge_and_unload()
