"""Adapters as artifacts: an inference export bound to its base, and a checkpoint that resumes bit for bit.

Two different things get saved after (or during) a LoRA run (lesson 12; PEFT's ``save_pretrained`` docs;
PyTorch's "Saving and loading a general checkpoint" tutorial):

- an **adapter export** — the factors A and B of every target module, the configuration that gives them a
  meaning (``r``, ``lora_alpha``, ``target_modules``) and the identity of the base they were trained on.
  PEFT writes the first two (``adapter_config.json``, ``adapter_model.safetensors``); :func:`export_adapter`
  adds the third, and :func:`load_adapter_checked` refuses another base. For the course's real model,
  :func:`coursekit.train.save_adapter` / :func:`coursekit.train.load_adapter` do the same with the
  checkpoint's file hashes.
- a **resumable checkpoint** — everything the next optimizer step reads: the trainable parameters, the
  optimizer's moments and step counters, the scheduler's position, the random-number states (torch, NumPy,
  Python ``random``), the data position and the step. :func:`save_checkpoint` / :func:`load_checkpoint`.
  Leave any of them out and the resumed run is a different run.

It also holds the small deterministic setup lesson 12 proves this on: :class:`TinyNet` (two linear layers with
dropout), :func:`tiny_data` and :class:`ShuffledBatches`, a seeded sampler whose whole state is
``(seed, epoch, position)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from torch import nn

__all__ = [
    "FINGERPRINT_FILE",
    "TinyNet",
    "tiny_data",
    "ShuffledBatches",
    "base_parameters",
    "base_fingerprint",
    "export_adapter",
    "load_adapter_checked",
    "UntrainedAdapterWarning",
    "zero_lora_B",
    "warn_if_untrained",
    "rng_state",
    "set_rng_state",
    "RNG_PARTS",
    "save_checkpoint",
    "load_checkpoint",
]

FINGERPRINT_FILE = "base_fingerprint.json"


# --------------------------------------------------------------------------- the small deterministic setup


class TinyNet(nn.Module):
    """Two linear layers with a ReLU and dropout between them: ``logits = fc2(dropout(relu(fc1(x))))``.

    Shapes: x is (n, d_in) float32, logits (n, n_classes). ``fc1.weight`` is (hidden, d_in) and ``fc2.weight``
    (n_classes, hidden) — ``nn.Linear`` stores out × in. The weights come from ``torch.Generator(seed)`` only,
    so two instances built with the same arguments are bitwise equal and building one leaves the global RNG
    untouched. Dropout is active in train mode, so a training step consumes the global torch RNG.

    Raises ValueError for a non-positive size or a dropout probability outside [0, 1).
    """

    def __init__(self, d_in: int = 8, hidden: int = 16, n_classes: int = 4, p_drop: float = 0.1, seed: int = 0):
        super().__init__()
        for name, v in (("d_in", d_in), ("hidden", hidden), ("n_classes", n_classes)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not 0.0 <= p_drop < 1.0:
            raise ValueError(f"p_drop must be in [0, 1), got {p_drop!r}")
        with torch.random.fork_rng(devices=[]):  # nn.Linear's default init draws from the global RNG; undo that
            self.fc1 = nn.Linear(d_in, hidden)
            self.fc2 = nn.Linear(hidden, n_classes)
        self.drop = nn.Dropout(p_drop)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def tiny_data(n: int = 64, d_in: int = 8, n_classes: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded classification set: X (n, d_in) float32 standard normal, y (n,) int64 labels of a fixed random
    linear teacher (argmax of X T, T d_in × n_classes). Raises ValueError for non-positive sizes."""
    for name, v in (("n", n), ("d_in", d_in), ("n_classes", n_classes)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_in, generator=g)
    T = torch.randn(d_in, n_classes, generator=g)
    return X, (X @ T).argmax(dim=1)


class ShuffledBatches:
    """Mini-batches of indices into a data set of ``n`` rows: a fresh permutation every epoch, drawn from a
    private ``torch.Generator`` seeded with ``seed + epoch`` (the global RNG is never touched).

    The whole state is ``{"seed", "epoch", "position"}`` (plus ``n`` and ``batch_size`` for checking), so
    ``load_state_dict(state_dict())`` puts the stream exactly where it was: that is the "data position" of a
    resumable checkpoint. An incomplete last batch of an epoch is dropped.

    Raises ValueError when ``batch_size`` is not in [1, n], or when a state belongs to another data set.
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0):
        if not isinstance(n, int) or n <= 0:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if not isinstance(batch_size, int) or not 1 <= batch_size <= n:
            raise ValueError(f"batch_size must be an integer in [1, n={n}], got {batch_size!r}")
        self.n, self.batch_size, self.seed = n, batch_size, int(seed)
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        if self.position + self.batch_size > self.n:
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._permutation()
        idx = self._order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return idx

    def state_dict(self) -> dict:
        return {"n": self.n, "batch_size": self.batch_size, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        for k in ("n", "batch_size"):
            if state.get(k) != getattr(self, k):
                raise ValueError(f"sampler state is for {k}={state.get(k)!r}, this sampler has {k}={getattr(self, k)!r}")
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._order = self._permutation()


# --------------------------------------------------------------------------- base identity


def base_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base's tensors under their names in the plain model, whether or not ``model`` is wrapped by PEFT.

    PEFT renames ``fc1.weight`` to ``base_model.model.fc1.base_layer.weight`` and adds ``lora_A``/``lora_B``;
    this undoes the renaming and drops every adapter tensor, so a bare base and the same base inside a
    ``PeftModel`` give the same dict (and the same :func:`base_fingerprint`).
    """
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if "lora_" in name:
            continue
        if name.startswith("base_model.model."):
            name = name[len("base_model.model."):]
        out[name.replace(".base_layer.", ".")] = t
    return out


def base_fingerprint(model: nn.Module) -> dict:
    """What an adapter is bound to: SHA-256 hashes of the base's parameter names, shapes and dtypes
    (``"structure"``) and of their values as well (``"values"``), plus the shapes themselves.

    Returns ``{"structure": hex, "values": hex, "shapes": {name: [dims]}}``. Two bases with the same
    architecture but other weights share ``structure`` and differ in ``values``: an adapter trained on one
    means something else on the other: same-shaped weights from another base are not interchangeable
    (lesson 12). Hashing reads every base byte once (~0.5 s for 135 M parameters).
    """
    params = base_parameters(model)
    if not params:
        raise ValueError("the model has no base parameters to fingerprint")
    structure, values = hashlib.sha256(), hashlib.sha256()
    shapes = {}
    for name in sorted(params):
        t = params[name].detach()
        head = f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode()
        structure.update(head)
        values.update(head)
        values.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        shapes[name] = list(t.shape)
    return {"structure": structure.hexdigest(), "values": values.hexdigest(), "shapes": shapes}


def _compare_fingerprints(saved: dict, here: dict, what: str) -> None:
    """Raise ValueError naming the first difference between two fingerprints."""
    if saved["structure"] != here["structure"]:
        a, b = saved["shapes"], here["shapes"]
        missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        if missing or extra:
            detail = f"parameters missing here: {missing[:3]}, unexpected here: {extra[:3]}"
        else:
            name = next((k for k in sorted(a) if list(a[k]) != list(b[k])), None)
            detail = (f"{name} has shape {tuple(a[name])} in the saved base and {tuple(b[name])} here"
                      if name else "the dtypes differ")
        raise ValueError(f"{what} was saved for a base with another architecture: {detail}. "
                         f"Load it onto the base it was trained on.")
    if saved["values"] != here["values"]:
        raise ValueError(f"{what} was saved for a base with the same shapes but other weights (fingerprint "
                         f"{saved['values'][:12]}… saved, {here['values'][:12]}… here): same architecture is not "
                         f"the same base. Load it onto the base it was trained on.")


# --------------------------------------------------------------------------- adapter export


class UntrainedAdapterWarning(UserWarning):
    """An adapter being saved or loaded has every ``lora_B`` equal to zero: it computes exactly the base model."""


def zero_lora_B(model: nn.Module) -> tuple[int, int]:
    """``(number of lora_B tensors that are all zero, number of lora_B tensors)`` in ``model``."""
    bs = [p for n, p in model.named_parameters() if "lora_B" in n]
    return sum(1 for p in bs if not bool(p.detach().ne(0).any())), len(bs)


def warn_if_untrained(model: nn.Module, action: str, where: str | os.PathLike) -> bool:
    """Warn (:class:`UntrainedAdapterWarning`) when every ``lora_B`` of ``model`` is zero; return whether it did.

    LoRA starts from B = 0 so that the adapted model equals the base at step 0 (Hu et al. 2021, "LoRA",
    arXiv:2106.09685, section 4.1). An adapter that still has B = 0 everywhere changes nothing, and nothing
    downstream fails: evaluation, reload and merge all quietly reproduce the base. action: "saving" or
    "loaded", for the message."""
    zero, total = zero_lora_B(model)
    if total and zero == total:
        import warnings

        cause = ("it was saved before any training step, or it is a freshly attached adapter "
                 "(get_peft_model(...)) instead of the trained one" if action == "saving" else
                 "the folder holds an adapter saved before training, or a fresh get_peft_model(...) adapter "
                 "was saved in place of the trained one")
        warnings.warn(f"{action} an adapter whose {total} lora_B tensors are all zero ({where}): it computes exactly "
                      f"the base model. Likely cause: {cause}.", UntrainedAdapterWarning, stacklevel=3)
        return True
    return False



def export_adapter(model, out_dir: str | os.PathLike) -> Path:
    """Save an inference adapter: PEFT's ``save_pretrained`` (``adapter_config.json`` with ``r``, ``lora_alpha``,
    ``target_modules``; ``adapter_model.safetensors`` with every ``lora_A``/``lora_B`` weight) plus
    :data:`FINGERPRINT_FILE`, the base's :func:`base_fingerprint`. No optimizer state, no base weights.

    ``model`` is a ``peft.PeftModel``; raises TypeError otherwise. Returns the folder. Warns
    (:class:`UntrainedAdapterWarning`) when every ``lora_B`` is zero: such an adapter reproduces the base.
    """
    if not hasattr(model, "peft_config"):
        raise TypeError(f"model should be a peft.PeftModel (get_peft_model or PeftModel.from_pretrained); got {type(model).__name__}")
    out = Path(out_dir)
    warn_if_untrained(model, "saving", out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / FINGERPRINT_FILE).write_text(json.dumps(base_fingerprint(model), indent=1) + "\n")
    return out


def load_adapter_checked(base: nn.Module, adapter_dir: str | os.PathLike, is_trainable: bool = False):
    """Attach a saved adapter to ``base`` with ``PeftModel.from_pretrained`` after checking the base's fingerprint.

    ``is_trainable=False`` (inference) freezes the adapter and puts the model in eval mode (dropout off);
    ``True`` is for continuing training. Raises ValueError when the folder holds no adapter, or when the base
    differs from the one saved in :data:`FINGERPRINT_FILE` (another architecture, or the same shapes with
    other weights) — PEFT alone would load it silently onto same-shaped weights. Warns
    (:class:`UntrainedAdapterWarning`) when every loaded ``lora_B`` is zero.
    """
    from peft import PeftModel

    folder = Path(adapter_dir)
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder} holds no adapter (adapter_config.json is missing)")
    fp = folder / FINGERPRINT_FILE
    if fp.is_file():
        _compare_fingerprints(json.loads(fp.read_text()), base_fingerprint(base), f"the adapter in {folder}")
    model = PeftModel.from_pretrained(base, str(folder), is_trainable=is_trainable)
    warn_if_untrained(model, "loaded", folder)
    if not is_trainable:
        model.eval()
    return model


# --------------------------------------------------------------------------- resumable checkpoint


def rng_state() -> dict:
    """The three global random-number states a training step may consume: torch (CPU), NumPy's legacy global
    generator and Python's ``random``. Stored as tensors, lists and ints so ``torch.load(weights_only=True)``
    reads them back."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "python": random.getstate(),
    }


RNG_PARTS = ("torch", "numpy", "python")


def set_rng_state(state: dict, parts: Iterable[str] = RNG_PARTS) -> None:
    """Restore what :func:`rng_state` captured, for the generators named in ``parts`` (default: all three).

    Raises ValueError for an unknown part name or a part missing from ``state``.
    """
    parts = tuple(parts)
    unknown = sorted(set(parts) - set(RNG_PARTS))
    if unknown:
        raise ValueError(f"unknown RNG part(s) {unknown}; choose among {list(RNG_PARTS)}")
    missing = sorted(set(parts) - set(state))
    if missing:
        raise ValueError(f"rng state lacks {missing}")
    if "torch" in parts:
        torch.set_rng_state(state["torch"])
    if "numpy" in parts:
        n = state["numpy"]
        np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "python" in parts:
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))


def _trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, step: int, data_state: dict) -> Path:
    """Write a resumable training checkpoint to ``path`` (one ``torch.save`` file).

    Holds: ``params`` (the trainable tensors by name — the adapter, not the frozen base), ``optimizer``
    (``optimizer.state_dict()``: AdamW's exp_avg, exp_avg_sq and step per parameter, lr and betas),
    ``scheduler`` (its ``state_dict()``, or None), ``rng`` (:func:`rng_state`), ``step`` (optimizer steps
    done), ``data_state`` (e.g. :meth:`ShuffledBatches.state_dict`) and ``base`` (:func:`base_fingerprint`).
    Call it between steps: after ``optimizer.step()`` and ``scheduler.step()``, before the next batch is drawn.

    Raises ValueError if nothing is trainable or ``step`` is negative. Returns the path.
    """
    params = _trainable(model)
    if not params:
        raise ValueError("the model has no trainable parameters: nothing to checkpoint")
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    ckpt = {
        "format": 1,
        "params": {n: p.detach().clone() for n, p in params.items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        "step": step,
        "data_state": data_state,
        "base": base_fingerprint(model),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return path


def load_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, restore_rng: bool | Iterable[str] = True) -> dict:
    """Restore a checkpoint written by :func:`save_checkpoint` into a freshly built ``model`` (the same base
    with the same adapter configuration), ``optimizer`` (built over the same parameters, in the same order)
    and ``scheduler``. Returns ``{"step": int, "data_state": dict}``; restore the sampler from ``data_state``.

    Passing ``optimizer=None``, ``scheduler=None`` or ``restore_rng=False`` skips that part — which is how
    lesson 12 shows that each one is needed for a bitwise resume. ``restore_rng`` may also name the generators
    to restore, e.g. ``("torch", "numpy")``. The RNG states are restored last, so call this after building
    everything that draws random numbers (PEFT initialises ``lora_A`` from the torch RNG).

    Raises ValueError when the base fingerprint differs, or when the trainable parameters' names or shapes
    differ from the checkpoint's (another adapter configuration); FileNotFoundError when ``path`` is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    _compare_fingerprints(ckpt["base"], base_fingerprint(model), f"the checkpoint {path.name}")
    params = _trainable(model)
    saved = ckpt["params"]
    if set(saved) != set(params):
        missing, extra = sorted(set(saved) - set(params)), sorted(set(params) - set(saved))
        raise ValueError(f"the model's trainable parameters do not match the checkpoint's: in the checkpoint only "
                         f"{missing[:3]}, in the model only {extra[:3]}. Attach the adapter with the same "
                         f"target_modules before loading.")
    for n, p in params.items():
        if p.shape != saved[n].shape:
            raise ValueError(f"{n} has shape {tuple(p.shape)} in the model and {tuple(saved[n].shape)} in the "
                             f"checkpoint: the adapter's r or the layer sizes differ.")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(saved[n])
    if optimizer is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    if scheduler is not None and ckpt["scheduler"] is not None:
        scheduler.load_state_dict(ckpt["scheduler"])
    if restore_rng is True:
        set_rng_state(ckpt["rng"])
    elif restore_rng:
        set_rng_state(ckpt["rng"], restore_rng)
    return {"step": ckpt["step"], "data_state": ckpt["data_state"]}
