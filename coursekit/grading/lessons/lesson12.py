"""Graded items of lesson 12, "Adapters as artifacts"."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ... import artifacts
from .. import Choice, Numeric, Ordering
from ..checkers import (PUBLIC_ONLY_NOTE, Feedback, Mistake, _consistent, compare_arrays, describe_exception, probe,
                        quiet)

READ_RELOAD = "Reread 'Reloading: load the saved adapter, do not create a new one' in Know this."
READ_DIR = "Reread 'What is in an adapter directory' in Know this."
READ_CKPT = "Reread 'Two artifacts' and 'A resumable checkpoint' in Know this."
#: P3's run folder: the LoraConfig settings the run started with, and its last checkpoint (no adapter export).
RUN_CONFIG, RUN_CHECKPOINT = "lora_config.json", "checkpoint.pt"

#: P2: the lesson's optimizer and schedule (AdamW at lr 1e-2, LinearLR from factor 1.0 to 0.1 over TOTAL steps) and
#: its checkpoint step K.
P2_LR, P2_TOTAL, P2_K = 1e-2, 12, 6


def _lesson_optimizer(params) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.AdamW(params, lr=P2_LR)
    return opt, torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=P2_TOTAL)


def resumed_lr(load_optimizer: bool = False, load_scheduler: bool = True, at: int = P2_K) -> float:
    """P2: the learning rate the optimizer holds (the one its next step applies) after a resume from a checkpoint taken
    after step ``at``: a fresh AdamW and LinearLR, into which the saved optimizer state (``load_optimizer``) and the
    saved scheduler state (``load_scheduler``) are loaded, as ``artifacts.load_checkpoint`` does. The learning rates
    do not depend on the gradients, so the run that writes the states steps on a zero gradient."""
    w = torch.nn.Parameter(torch.zeros(2))
    opt, sched = _lesson_optimizer([w])
    for _ in range(at):
        w.grad = torch.zeros_like(w)
        opt.step()
        sched.step()
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    w2 = torch.nn.Parameter(torch.zeros(2))
    opt2, sched2 = _lesson_optimizer([w2])
    if load_optimizer:
        opt2.load_state_dict(saved_opt)
    if load_scheduler:
        sched2.load_state_dict(saved_sched)
    return float(opt2.param_groups[0]["lr"])


# --------------------------------------------------------------------------- p3: reload(base, run_dir)

LORA_TARGETS = ["fc1", "fc2"]


def _case(seed: int, d_in: int, hidden: int, n_classes: int, r: int, lora_alpha: int) -> dict:
    return dict(seed=seed, d_in=d_in, hidden=hidden, n_classes=n_classes, r=r, lora_alpha=lora_alpha)


def _public() -> list[dict]:
    return [_case(0, 8, 16, 4, 4, 8), _case(1, 6, 10, 3, 2, 4)]


def _hidden(rng: np.random.Generator) -> list[dict]:
    out = []
    for _ in range(3):
        r = int(rng.integers(1, 5))
        out.append(_case(int(rng.integers(2, 10_000)), int(rng.integers(4, 12)), int(rng.integers(6, 20)),
                         int(rng.integers(2, 6)), r, int(rng.choice([a for a in (1, 2, 4, 8, 16) if a != r]))))
    return out


def trained_adapter(case: dict, out_dir: str, steps: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train a LoRA adapter (dropout on) on a TinyNet for ``steps`` AdamW steps and leave its run folder in ``out_dir``,
    as a run that crashed before its export would: ``lora_config.json`` (the settings given to ``LoraConfig``) and
    ``checkpoint.pt`` (``artifacts.save_checkpoint`` after the last step), no ``adapter_model.safetensors``.

    Returns (X, logits of the trained adapter in eval mode, logits of the bare base in eval mode). The caller's
    global RNG states are left as they were.
    """
    import json
    from pathlib import Path

    from peft import LoraConfig, get_peft_model

    saved = artifacts.rng_state()
    try:
        torch.manual_seed(case["seed"])
        net = dict(d_in=case["d_in"], hidden=case["hidden"], n_classes=case["n_classes"], seed=case["seed"])
        X, y = artifacts.tiny_data(32, case["d_in"], case["n_classes"], seed=case["seed"])
        settings = dict(r=case["r"], lora_alpha=case["lora_alpha"], lora_dropout=0.1, target_modules=LORA_TARGETS)
        model = get_peft_model(artifacts.TinyNet(**net), LoraConfig(**settings))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
        model.train()
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(X), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        (Path(out_dir) / RUN_CONFIG).write_text(json.dumps(settings))
        artifacts.save_checkpoint(Path(out_dir) / RUN_CHECKPOINT, model, opt, None, step=steps, data_state={})
        model.eval()
        with torch.no_grad():
            ref = model(X)
            base_out = artifacts.TinyNet(**net).eval()(X)
    finally:
        artifacts.set_rng_state(saved)
    return X, ref, base_out


def _measure_reload(fn: Callable, base: torch.nn.Module, run_dir: str, X: torch.Tensor) -> dict:
    """Call ``reload(base, run_dir)`` and read the returned model as data: its logits on ``X`` (in eval mode
    when two calls differ, i.e. dropout is on)."""
    model = fn(base=base, run_dir=run_dir)
    if model is None:
        return {"kind": "none"}
    if not callable(model):
        return {"kind": "not callable", "type": type(model).__name__}
    with torch.no_grad():
        out1, out2 = model(X), model(X)
    dropout = not torch.equal(out1, out2)
    if dropout:
        model.eval()
        with torch.no_grad():
            out1 = model(X)
    return {"kind": "model", "out1": out1, "dropout": dropout}


def _check_reload_case(fn: Callable, case: dict, tag: str) -> tuple:
    """Run the student's reload on one case; (passed, feedback lines), or (False, lines, labels) when the answer made
    known mistakes (their labels go to Feedback.mistakes, which the class report counts)."""
    net = dict(d_in=case["d_in"], hidden=case["hidden"], n_classes=case["n_classes"], seed=case["seed"])
    noise: list[str] = []   # what the student's code wrote to stderr or warned: shown, not graded
    with tempfile.TemporaryDirectory(prefix="coursekit-12-") as tmp:
        with quiet([]):      # the grader's own library warnings are nobody's business
            X, ref, base_out = trained_adapter(case, tmp)
        base = artifacts.TinyNet(**net)  # a fresh nn.Module is in train mode, as a new process builds it
        saved = artifacts.rng_state()
        try:
            with quiet(noise):
                got = probe(fn, _measure_reload, base, tmp, X)
            if got["kind"] == "none":
                return False, [f"✗ {tag}: reload returned None; return the model with the adapter attached."]
            if got["kind"] == "not callable":
                return False, [f"✗ {tag}: reload should return a model (an nn.Module); got {got['type']}."]
            out1 = got["out1"]
            lines: list[str] = []
            if got["dropout"]:
                lines.append("two calls on the same input gave different logits: dropout is still active. The model is "
                             "in training mode: get_peft_model leaves it so, as every new module is (and so do "
                             "PeftModel.from_pretrained(..., is_trainable=True) and .train()); for inference call "
                             "model.eval() before you return it. " + READ_RELOAD)
        except NotImplementedError:
            raise
        except Exception as e:  # the student's bug, reported, not raised
            text = f"✗ {tag}: " + describe_exception(e, "reload", {"base": None, "run_dir": None})
            if "adapter_config.json" in str(e) or "adapter_model" in str(e):
                text += (" The run folder holds no adapter export for PeftModel.from_pretrained to read, only "
                         f"{RUN_CONFIG} and {RUN_CHECKPOINT}: attach an adapter built from those settings, then copy the "
                         "checkpoint's trained factors into it. " + READ_CKPT)
            return False, [text]
        finally:
            artifacts.set_rng_state(saved)
    note = ["    (your code wrote warnings or to stderr, not graded: " + "; ".join(dict.fromkeys(noise))[:300] + ")"] if noise else []
    if not isinstance(out1, torch.Tensor):
        return False, [f"✗ {tag}: calling the returned model on a batch gave {type(out1).__name__}, not a tensor of logits; "
                       f"return the model itself (the PeftModel)."] + note
    lines = ["    " + l for l in lines]
    dropout = ["dropout active"] if lines else []
    if tuple(out1.shape) != tuple(ref.shape):
        return False, [f"✗ {tag}: the logits have shape {tuple(out1.shape)}; expected {tuple(ref.shape)}."] + lines + note, dropout
    if out1.dtype != ref.dtype:
        return False, [f"✗ {tag}: the logits are {str(out1.dtype).replace('torch.', '')}; the trained model's are "
                       f"{str(ref.dtype).replace('torch.', '')}. A reload computes exactly what was saved: return the "
                       f"PeftModel itself, without a cast. " + READ_RELOAD] + lines + note, dropout
    if torch.allclose(out1, base_out, rtol=0, atol=1e-7) and not torch.allclose(ref, base_out, rtol=0, atol=1e-7):
        return False, [f"✗ {tag}: your outputs equal the base model's: you created a fresh adapter (B = 0) instead of "
                       f"loading the saved one. get_peft_model(base, LoraConfig(...)) initialises lora_B to zero; the "
                       f"trained factors are in {RUN_CHECKPOINT} (its \"params\"), and artifacts.load_checkpoint copies "
                       f"them into the adapter you attached. " + READ_CKPT] + lines + note, \
            ["fresh adapter"] + dropout
    if torch.equal(out1, ref):
        if lines:
            return False, [f"✗ {tag}: in eval mode the logits equal the trained adapter's, but:"] + lines + note, \
                ["dropout active"]
        return True, [f"✓ {tag}: the logits equal the trained adapter's bit for bit."] + note
    if torch.allclose(out1, ref, rtol=1e-5, atol=1e-6):
        diff = (out1 - ref).abs().max().item()
        return False, [f"✗ {tag}: the logits are close to the trained adapter's but not bitwise equal (largest difference "
                       f"{diff:.1e}). A reload computes exactly what was saved; merging (merge_and_unload) or a dtype cast "
                       f"rounds differently. Merging is not saving: return the unmerged PeftModel. " + READ_RELOAD] + lines + note, \
            ["merged or cast"] + dropout
    _, msg = compare_arrays(out1.numpy(), ref.numpy().astype(np.float64), "logits", 0.0, 0.0)
    return False, [f"✗ {tag}: the logits are not the trained adapter's:"] + ["    " + m for m in msg] + [
        f"    Attach the adapter {RUN_CONFIG} describes to the base you were given, and copy the factors of the "
        f"{RUN_CHECKPOINT} you were given into it."] + lines + note, \
        dropout


@dataclass
class ReloadItem:
    """Implement ``reload(base, run_dir)``: from a run folder with no adapter export (the LoraConfig settings and the
    last resumable checkpoint), the model ready for inference; graded by the logits of the returned model against the
    trained adapter's (bitwise), with the fresh-adapter, dropout and merge mistakes named."""

    title: str
    points: float

    def check(self, answer: Any, ctx: Any) -> Feedback:
        if not callable(answer):
            return Feedback(0, self.points, [f"reload should be a function; got {type(answer).__name__}. Define it with def reload(base, run_dir):"])
        cases = [(c, False) for c in _public()]
        if ctx.hidden:
            cases += [(c, True) for c in _hidden(ctx.rng())]
        passed, lines, seen, named = 0, [], {}, []
        for i, (case, hidden) in enumerate(cases, 1):
            tag = f"{'hidden' if hidden else 'public'} case {i}" + (
                "" if hidden else f" (TinyNet d_in={case['d_in']}, hidden={case['hidden']}, r={case['r']}, lora_alpha={case['lora_alpha']})")
            try:
                ok, msg, *labels = _check_reload_case(answer, case, tag)
                if labels and labels[0]:
                    named.append(list(labels[0]))
            except NotImplementedError:
                return Feedback(0, self.points, ["reload still raises NotImplementedError: replace the stub with your code."])
            passed += ok
            head = re.sub(r"\d", "", msg[0].split(": ", 1)[-1]) if msg else ""  # numbers aside
            if not ok and head in seen:  # the same mistake again: say so once, not five times
                lines.append(f"✗ {tag}: the same mistake as {seen[head]}.")
            else:
                if not ok:
                    seen[head] = tag.split(" (")[0]
                lines += msg
        if not ctx.hidden:
            lines.append(PUBLIC_ONLY_NOTE)
        return Feedback(self.points * passed / len(cases), self.points, lines, mistakes=_consistent(named))


# --------------------------------------------------------------------------- items


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 14

ITEMS = {
    "w1": Choice(
        "what an inference adapter export holds",
        0,
        key="d",
        explain={
            "a": "A is not regenerated: training changed it, and B alone means nothing without the A it was trained with. Reread 'Two artifacts' in Know this.",
            "b": "That is a merged model, the size of the base; an adapter export is the small part plus what binds it to its base. Reread 'Two artifacts' in Know this.",
            "c": "Optimizer moments are for resuming training; an inference export does not need them. And it lacks what inference does need: the LoraConfig, which says where the factors go and how they scale (s = lora_alpha / r), and the identity of the base they correct. Reread 'Two artifacts' in Know this.",
            "d": "Inference must rebuild the adapted layers exactly: both trained factors of every target module, the configuration that says where they go and how they scale (r, lora_alpha, target_modules, so s = lora_alpha / r), and the identity of the base, because the frozen base weights are not saved but bound by identity. Its test is that the reloaded logits equal the trained model's. (Lesson 12, 'Two artifacts'.)",
        },
    ),
    "w2": Choice(
        "resuming without the RNG state, dropout on",
        0,
        key="c",
        explain={
            "a": "Dropout draws a new mask from the global RNG at every training forward, not only at initialisation. Reread 'A resumable checkpoint' in Know this.",
            "b": "Nothing fails: the run continues, silently on a different path. Reread 'A resumable checkpoint' in Know this.",
            "c": "Dropout draws a new mask from the global torch RNG at every training forward, and a resumed process finds that RNG somewhere else; so step k + 1 uses other masks, and its loss and its update differ at once, with no error. Restoring the torch, NumPy and Python RNG states (last, after the model is built) is what makes the resumed run bitwise equal to the uninterrupted one. (Lesson 12, 'A resumable checkpoint'.)",
            "d": "Resumed steps are training steps: dropout is on, and its masks come from the RNG you did not restore. Reread 'A resumable checkpoint' in Know this.",
        },
    ),
    "w3": Choice(
        "which reload gives the base model's logits bit for bit",
        0,
        key="b",
        explain={
            "a": "from_pretrained copies the saved factors into the rebuilt layers and switches to eval mode: the logits equal the trained model's exactly, not the base's. Reread 'Reloading: load the saved adapter, do not create a new one' in Know this.",
            "b": "get_peft_model creates a new adapter: lora_A random, lora_B zero (PEFT's default initialisation), so s(XA)B is exactly zero and every adapted layer returns its base output, bit for bit. The same r and lora_alpha do not bring the trained factors back, and nothing warns you. (Lesson 12, 'Reloading: load the saved adapter, do not create a new one'.)",
            "c": "is_trainable=True loads the trained factors but leaves the model in training mode: dropout makes two calls differ from each other, not equal to the base. Reread 'Reloading: load the saved adapter, do not create a new one' in Know this.",
            "d": "A dtype mismatch rounds the trained update to bfloat16: the logits move a little away from the trained ones, but the update is still there, so they do not equal the base's bit for bit. Reread 'Reloading: load the saved adapter, do not create a new one' in Know this.",
        },
    ),
    "p1": Choice(
        "loading the adapter onto its base rounded to bfloat16 and back to float32",
        1,
    ),
    "p2": Numeric(
        "the learning rate of the first resumed step, with the scheduler's state restored and the optimizer's left out",
        1,
        name="lr",
        expected=lambda: resumed_lr(),
        rtol=1e-6,
        reread="Reread 'A resumable checkpoint' in Know this.",
        mistakes=lambda: [
            Mistake("scheduler's lr", resumed_lr(load_optimizer=True),
                    "that is the uninterrupted run's learning rate at step k + 1. Restoring the scheduler brings back "
                    "its counter (last_epoch), not the learning rate: the rate a step applies sits in the optimizer's "
                    "param_groups, and a fresh AdamW holds its initial lr there until the scheduler's next step() "
                    "writes a new one. " + READ_CKPT),
            Mistake("step k's lr", resumed_lr(load_optimizer=True, at=P2_K - 1),
                    "that is the learning rate of step k, the last step before the checkpoint; and a fresh AdamW does "
                    "not hold the schedule's rate anyway: restoring the scheduler brings back its counter, the "
                    "learning rate sits in the optimizer's param_groups. " + READ_CKPT),
        ],
    ),
    "p3": ReloadItem("implement reload(base, run_dir): an inference model from a run folder with no export", 3),
    "p4": Ordering(
        "resume a run from a checkpoint with a preflight before the first step, in order",
        2,
        labels={
            "attach": "attach the adapter with the same LoraConfig",
            "base": "build the same base and check its fingerprint",
            "load": "load the adapter weights, optimizer and scheduler state and the sampler position",
            "optimizer": "build the optimizer and scheduler over the adapter's parameters",
            "preflight": "run lesson 11's preflight, with the optimizer, on a fixed batch",
            "rng": "restore the torch, NumPy and Python RNG states",
            "step": "run step k + 1",
        },
    ),
    "p5": Choice(
        "which omissions break the bitwise resume here",
        2,
        options="abcdef",
        multi=True,
    ),
    "p6": Choice(
        "predict the logits of the same adapter attached again to a model it was already merged into",
        1,
    ),
}
