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
    """Peak resident memory of this process so far, in MB (10⁶ bytes; Linux ru_maxrss is in KiB)."""
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


def preflight(model: torch.nn.Module, batch: dict) -> dict:
    """Checks before a long run, on one batch: something trains, the loss and every gradient are finite, and
    **every adapter receives a gradient**.

    With B = 0 at initialisation, ∇A = s Xᵀ D Bᵀ is zero everywhere, but ∇B = s Zᵀ D is not — unless no
    gradient D reaches that layer. So a ``lora_B`` with an all-zero gradient means the path above it is cut:
    a detached or frozen-and-no-grad module, or (bitsandbytes 0.50.2 on AVX512-BF16 CPUs) a 4-bit layer
    repacked for inference after an eval pass, which passes no input gradient (coursekit.model).

    Returns a dict with the loss and counts. Raises :class:`PreflightError` naming the offending parameters.
    """
    rep = trainable_report(model)
    if rep["trainable"] == 0:
        raise PreflightError("no trainable parameters: the adapter was not attached, or everything is frozen.")
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    loss = out.loss
    if not torch.isfinite(loss):
        raise PreflightError(f"the loss is {loss.item()} on the first batch: check the labels (is any token supervised?) and the dtype.")
    loss.backward()
    missing, zero, nonfinite = [], [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            missing.append(n)
        elif not torch.isfinite(p.grad).all():
            nonfinite.append(n)
        elif "lora_B" in n and not p.grad.abs().sum() > 0:
            zero.append(n)
    model.zero_grad(set_to_none=True)
    if missing or zero or nonfinite:
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
    return {"loss": loss.item(), "trainable": rep["trainable"], "total": rep["total"], "tensors": len(rep["rows"])}


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
