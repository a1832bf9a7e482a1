"""What an optimizer owns, and what a factor update does to the adapter's correction ΔW = s·A·B.

Row-vector convention (coursekit.lora): A is d × r, B is r × m, s = lora_alpha / r, ΔW = s A B (d × m).

- :func:`trainable_params`, :func:`named_trainable`: the parameters that belong in the optimizer, selected by
  ``requires_grad`` (not by name).
- :func:`optimizer_state_bytes`, :func:`owned_params`: what a ``torch.optim`` optimizer holds and for which tensors.
- :func:`factor_update`: δ(ΔW) = s(δA·B + A·δB + δA·δB), exact, and :func:`first_order_update` without the
  second-order cross term (lesson 11, "the factor-update algebra").
- :func:`rescale_factors`: (cA, B/c), the reparameterisation that leaves AB unchanged but not the gradients.
- :func:`newton_schulz`, :func:`muon_factor_step`: an **experiment**, not a faithful Muon implementation:
  the quintic Newton–Schulz iteration from Keller Jordan's write-up "Muon: An optimizer for hidden layers in
  neural networks" (2024, https://kellerjordan.github.io/posts/muon/), applied separately to each factor.

AdamW itself lives in :mod:`coursekit.walk` (``AdamWState``, ``adamw_step``, ``sgd_step``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import lora, walk

__all__ = [
    "trainable_params",
    "named_trainable",
    "owned_params",
    "optimizer_state_bytes",
    "factor_update",
    "first_order_update",
    "rescale_factors",
    "newton_schulz",
    "muon_factor_step",
    "NS_COEFFS",
]

#: (a, b, c) of the quintic iteration X ← aX + b(XXᵀ)X + c(XXᵀ)²X, from Keller Jordan's Muon write-up.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


# --------------------------------------------------------------------------- ownership


def _module(model: Any) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    return model


def trainable_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should own: ``[p for p in model.parameters() if p.requires_grad]``.

    Order is ``model.parameters()``'s; a tensor shared by two modules (tied weights) appears once.
    Raises TypeError if ``model`` is not an ``nn.Module``.
    """
    return [p for p in _module(model).parameters() if p.requires_grad]


def named_trainable(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...], int]]:
    """``(name, shape, numel)`` of every trainable parameter, in ``named_parameters()`` order."""
    return [(n, tuple(p.shape), p.numel()) for n, p in _module(model).named_parameters() if p.requires_grad]


def owned_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's ``param_groups`` (what ``step()`` may touch), in group order."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
    return [p for g in optimizer.param_groups for p in g["params"]]


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by the optimizer's per-parameter state tensors (for AdamW: ``exp_avg``, ``exp_avg_sq`` and the
    scalar ``step``). State exists only for parameters that have had a gradient at a ``step()``: zero before the
    first step, and never for a parameter whose ``.grad`` stayed ``None``."""
    owned_params(optimizer)  # type check
    total = 0
    for st in optimizer.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
    return total


# --------------------------------------------------------------------------- factor-update algebra


def _f64(name: str, x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    a = np.asarray(x)
    if a.dtype == object or not np.issubdtype(a.dtype, np.floating) or a.ndim != 2:
        raise TypeError(f"{name} must be a 2-D float array, got {type(x).__name__} with dtype {a.dtype} and {a.ndim} dims.")
    return a


def _factors(A: Any, B: Any, dA: Any, dB: Any) -> tuple[np.ndarray, ...]:
    A, B, dA, dB = _f64("A", A), _f64("B", B), _f64("dA", dA), _f64("dB", dB)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A (d × r) and B (r × m) must share r: got A {A.shape} and B {B.shape}.")
    if dA.shape != A.shape:
        raise ValueError(f"dA must have A's shape {A.shape}, got {dA.shape}.")
    if dB.shape != B.shape:
        raise ValueError(f"dB must have B's shape {B.shape}, got {dB.shape}.")
    return A, B, dA, dB


def factor_update(A: Any, B: Any, dA: Any, dB: Any, s: float) -> np.ndarray:
    """The exact change of ΔW = s·A·B when the factors change by δA (``dA``) and δB (``dB``)::

        δ(ΔW) = s(A + δA)(B + δB) − s·A·B = s(δA·B + A·δB + δA·δB)

    A, dA: d × r; B, dB: r × m (float arrays or tensors; computed in float64). Returns a d × m float64 array.
    Here dA, dB are **updates** (e.g. −lr·∇A), not gradients. Source: expanding the product (lesson 11).
    s: one real, finite number (:func:`coursekit.lora.scaling`).
    Raises TypeError (not 2-D float, s not a number) or ValueError (shapes that do not fit, naming expected
    vs actual; s not finite).
    """
    A, B, dA, dB = _factors(A, B, dA, dB)
    lora._check_scale(s)
    return float(s) * (dA @ B + A @ dB + dA @ dB)


def first_order_update(A: Any, B: Any, dA: Any, dB: Any, s: float) -> np.ndarray:
    """δ(ΔW) without the cross term: s(δA·B + A·δB). It differs from :func:`factor_update` by s·δA·δB, which is
    second order: halve both updates and it shrinks fourfold. Shapes and errors as :func:`factor_update`."""
    A, B, dA, dB = _factors(A, B, dA, dB)
    lora._check_scale(s)
    return float(s) * (dA @ B + A @ dB)


def rescale_factors(A: Any, B: Any, c: float) -> tuple[np.ndarray, np.ndarray]:
    """(c·A, B/c): the same product A·B, so the same forward pass. The loss gradients are not the same:
    with Z' = X(cA) = cZ, ∇(cA) = s Xᵀ D (B/c)ᵀ = ∇A / c and ∇(B/c) = s (cZ)ᵀ D = c ∇B (lesson 05's formulas).
    Raises ValueError if c is zero or not finite, TypeError / ValueError for bad A, B."""
    c = float(c)
    if c == 0.0 or not np.isfinite(c):
        raise ValueError(f"c must be a finite nonzero number, got {c}.")
    A, B, _, _ = _factors(A, B, A, B)
    return c * A, B / c


# --------------------------------------------------------------------------- Muon-style experiment


def newton_schulz(G: Any, steps: int = 5, eps: float = 1e-7) -> np.ndarray:
    """Approximately orthogonalise G (p × q): push every singular value toward 1 while keeping the singular vectors,
    i.e. approximate U Vᵀ from G = U Σ Vᵀ. Quintic iteration X ← aX + b(XXᵀ)X + c(XXᵀ)²X with (a, b, c) =
    :data:`NS_COEFFS`, after scaling G to Frobenius norm 1 (Keller Jordan, "Muon", 2024). Tuned for speed, not
    exactness: the singular values land roughly in [0.7, 1.2], not at 1. Works on the short side (transposes a
    tall G). float64 NumPy; returns an array of G's shape. Raises TypeError / ValueError for a non-2-D input or
    steps < 1."""
    X = _f64("G", G).copy()
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}.")
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / (np.linalg.norm(X) + eps)
    a, b, c = NS_COEFFS
    for _ in range(steps):
        M = X @ X.T
        X = a * X + (b * M + c * M @ M) @ X
    return X.T if tall else X


def muon_factor_step(param: Any, grad: Any, buf: Any, lr: float, momentum: float = 0.95,
                     steps: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """One Muon-style step on **one factor** (an experiment; not a faithful Muon and not a recipe):
    buf ← μ·buf + grad; update = newton_schulz(grad + μ·buf) (Nesterov form); param ← param − lr·√max(1, p/q)·update.
    The √(p/q) factor follows the write-up's shape scaling. param, grad, buf: 2-D float arrays of one shape.
    Returns ``(new_param, new_buf)``. Raises ValueError for mismatched shapes, lr not a finite number ≥ 0 or
    momentum not in [0, 1); TypeError if lr or momentum is not a number."""
    param, grad, buf = _f64("param", param), _f64("grad", grad), _f64("buf", buf)
    if grad.shape != param.shape or buf.shape != param.shape:
        raise ValueError(f"grad and buf must have param's shape {param.shape}, got {grad.shape} and {buf.shape}.")
    lr = walk._hyper("lr", lr, "the learning rate")
    if not 0.0 <= walk._number("momentum", momentum, "μ, the buffer's decay") < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum!r}.")
    buf = momentum * buf + grad
    upd = newton_schulz(grad + momentum * buf, steps)
    p, q = param.shape
    return param - lr * max(1.0, p / q) ** 0.5 * upd, buf
