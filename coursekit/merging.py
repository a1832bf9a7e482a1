"""Merging a LoRA adapter into its base weight: PEFT's storage layout, and what rounding keeps of the update.

Row-vector convention (coursekit.lora): ``W_merged = W + s A B`` with W d × m, A d × r, B r × m.
PEFT and ``torch.nn.Linear`` store the transposes: ``weight`` is m × d (out × in), ``lora_A.weight`` is
r × d and ``lora_B.weight`` is m × r, so the same merge reads ::

    weight_merged = weight + scaling · (lora_B.weight @ lora_A.weight)        m × d

(PEFT ``LoraLayer.get_delta_weight``: ``transpose(weight_B @ weight_A, fan_in_fan_out) * scaling``).
No dropout factor appears: PEFT's ``lora_dropout`` is inverted dropout (``torch.nn.Dropout`` scales kept
entries by 1 / (1 − p) at training time), so in eval mode the adapter path is exactly ``s (XA) B``.

Merging in a low-precision dtype rounds ``W + ΔW`` to that dtype's grid. Near |w| the grid spacing is
``spacing(w, dtype)`` (2⁻⁷ ≈ 0.0078 at 1.0 in bfloat16, 2⁻¹⁰ in float16, 2⁻²³ in float32), and an update
smaller than half of it vanishes: :func:`merge_residual` measures how much of ΔW survives.
Sources: Hu et al. 2021 (arXiv:2106.09685) section 4.1; PEFT ``tuners/lora/layer.py``; IEEE 754 rounding
to nearest, ties to even.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import lora

__all__ = ["merge_peft", "unmerge_peft", "spacing", "merge_residual", "DTYPES"]

#: Names accepted wherever a dtype is asked for.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _peft_shapes(weight: Any, lora_A: Any, lora_B: Any) -> None:
    for name, t in (("weight", weight), ("lora_A", lora_A), ("lora_B", lora_B)):
        if getattr(t, "ndim", None) != 2:
            raise lora.LoRAShapeError(f"{name} must be a 2-D array (PEFT layout), got {type(t).__name__} "
                                      f"with shape {tuple(getattr(t, 'shape', ()))}.")
    m, d = weight.shape
    r = lora_A.shape[0]
    if lora_A.shape != (r, d):
        raise lora.LoRAShapeError(f"lora_A must have shape (r, {d}) (r × d, d = weight.shape[1]), got {tuple(lora_A.shape)}"
                                  + (" (transposed? PEFT stores lora_A.weight as r × d)" if lora_A.shape[0] == d else "") + ".")
    if tuple(lora_B.shape) != (m, r):
        raise lora.LoRAShapeError(f"lora_B must have shape ({m}, {r}) (m × r, m = weight.shape[0], r = lora_A.shape[0]), "
                                  f"got {tuple(lora_B.shape)}.")


def merge_peft(weight: Any, lora_A: Any, lora_B: Any, scaling: float) -> Any:
    """``weight + scaling · lora_B @ lora_A`` in PEFT / ``nn.Linear`` layout (m × d).

    Args:
        weight: m × d base weight (``nn.Linear.weight``, out × in). lora_A: r × d. lora_B: m × r.
            All NumPy or all torch, one floating dtype.
        scaling: s = lora_alpha / r (see :func:`coursekit.lora.scaling`). No dropout factor: see the module.
    Returns: the merged m × d weight, in the inputs' library and dtype.
    Raises: LoRAShapeError naming the argument and expected vs actual shape; LoRADtypeError as
        :func:`coursekit.lora.merge`; LoRAValueError for a NaN or inf entry (named in PEFT's layout,
        e.g. "lora_B[3, 0] is nan") or a scaling that is not finite.
    Source: the transpose of :func:`coursekit.lora.merge` (W = weight.T, A = lora_A.T, B = lora_B.T);
        PEFT ``LoraLayer.get_delta_weight``.
    """
    _peft_shapes(weight, lora_A, lora_B)
    lora._check_scale(scaling, "scaling")
    lora._check_finite(weight=weight, lora_A=lora_A, lora_B=lora_B)
    return lora.merge(weight.T, lora_A.T, lora_B.T, scaling).T


def unmerge_peft(weight_merged: Any, lora_A: Any, lora_B: Any, scaling: float) -> Any:
    """Inverse of :func:`merge_peft`: ``weight_merged − scaling · lora_B @ lora_A`` (m × d).

    Exact only up to rounding: in float32 the round trip returns the base within a few units in the last
    place; in bfloat16 the update may not have survived the merge at all (:func:`merge_residual`).
    Raises as :func:`merge_peft`.
    """
    lora._check_scale(scaling, "scaling")  # before -scaling, which None or a string would break obscurely
    return merge_peft(weight_merged, lora_A, lora_B, -scaling)


def _torch_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be one of {sorted(DTYPES)} (a name or a torch.dtype), got {dtype!r}.")


def _as_tensor(name: str, x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, (np.ndarray, float, int, list)) and not isinstance(x, bool):
        t = torch.as_tensor(np.asarray(x, dtype=np.float64))
    else:
        raise TypeError(f"{name} must be a NumPy array, a torch tensor or a number, got {type(x).__name__}.")
    if not t.is_floating_point() and t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}.")
    return t.to(torch.float64)


def spacing(x: Any, dtype: Any) -> Any:
    """Gap between |x| (rounded to ``dtype``) and the next larger number of ``dtype``: one unit in the last place.

    x: a number or an array of any shape. dtype: "bfloat16", "float16", "float32", "float64" or the torch dtype.
    Returns: a float for a scalar x, else a float64 NumPy array of x's shape.
    Example: ``spacing(1.0, "bfloat16") == 2**-7`` (bfloat16 keeps 8 significant bits), float16 2**-10,
    float32 2**-23. An update below half the spacing rounds away (ties go to the even neighbour).
    Raises ValueError for an unknown dtype, TypeError for a non-numeric x.
    """
    dt = _torch_dtype(dtype)
    t = _as_tensor("x", x).abs().to(dt)
    up = torch.nextafter(t, torch.full_like(t, float("inf")))
    out = (up.to(torch.float64) - t.to(torch.float64)).numpy()
    return float(out) if out.ndim == 0 else out


def merge_residual(W: Any, delta: Any, dtype: Any) -> float:
    """How much of an update a merge in ``dtype`` loses: ``‖(fl(W_q + ΔW_q) − W_q) − ΔW‖_F / ‖ΔW‖_F``.

    ``W_q`` and ``ΔW_q`` are W and ΔW rounded to ``dtype``; ``fl(·)`` is the sum rounded to ``dtype``
    (what ``weight.data += delta`` does on a tensor of that dtype). ``fl(W_q + ΔW_q) − W_q`` is the update
    the merged weight actually carries, compared with the exact ΔW (float64).

    W, delta: arrays of one shape (any layout; entries are compared one to one), NumPy or torch.
    dtype: "bfloat16", "float16", "float32" or "float64" (or the torch dtype).
    Returns: a float ≥ 0: 0 means the whole update survived, 1 means none of it did (e.g. bfloat16, |W| ~ 1,
        |ΔW| ~ 1e-4); it can exceed 1 when rounding overshoots.
    Raises: ValueError for different shapes, an all-zero delta or an unknown dtype; TypeError for non-numbers.
    """
    dt = _torch_dtype(dtype)
    Wt, Dt = _as_tensor("W", W), _as_tensor("delta", delta)
    if Wt.shape != Dt.shape:
        raise ValueError(f"W and delta must have one shape, got W {tuple(Wt.shape)} and delta {tuple(Dt.shape)}.")
    norm = torch.linalg.vector_norm(Dt)
    if not norm > 0:
        raise ValueError("delta is all zeros: there is no update to keep (is B still at its zero initialisation?).")
    Wq = Wt.to(dt)
    carried = (Wq + Dt.to(dt)).to(torch.float64) - Wq.to(torch.float64)
    return float(torch.linalg.vector_norm(carried - Dt) / norm)
