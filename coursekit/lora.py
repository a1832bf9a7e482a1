"""One LoRA-adapted linear projection, forward and backward, in the row-vector convention.

Shapes (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685,
section 4.1, written for row vectors; lesson 02 teaches this layer)::

    X : n × d      n token positions of width d (batch and sequence flattened together)
    W : d × m      the frozen base weight
    A : d × r      trainable "down" factor (PEFT's ``lora_A``, stored there as r × d)
    B : r × m      trainable "up" factor   (PEFT's ``lora_B``, stored there as m × r)
    s              scalar scale, ``lora_alpha / r`` (or ``lora_alpha / sqrt(r)`` for rsLoRA)

    Z = X A                      n × r
    Y = X W + s Z B              n × m

Backward, with ``D = dL/dY`` (n × m) arriving from downstream::

    dB = s Zᵀ D                  r × m
    dZ = s D Bᵀ                  n × r
    dA = Xᵀ dZ  = s Xᵀ D Bᵀ      d × r
    dX = D Wᵀ + dZ Aᵀ            n × d   (base path + adapter path, they add)

W is frozen: no ``dW`` is formed, but ``D Wᵀ`` still flows to X.

Every function accepts NumPy arrays or torch tensors (all arguments of one kind, one floating
dtype). The forward/backward pair follows CS231n's layer convention: ``lora_forward`` returns
``(Y, cache)`` and ``lora_backward(D, cache)`` returns ``(dX, dA, dB)``.

Bad input raises at once, naming the argument: the scale s must be one real, finite number, and
every entry of X, W, A, B (and D) must be finite — a single NaN would otherwise turn whole rows of Y
into NaN with no hint where it came from.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from .gradcheck import entry_name

__all__ = [
    "LoRAShapeError",
    "LoRADtypeError",
    "LoRAValueError",
    "scaling",
    "lora_forward",
    "lora_backward",
    "merge",
    "unmerge",
    "param_count",
    "dense_param_count",
    "adapter_fraction",
    "from_linear_weight",
]


class LoRAShapeError(ValueError):
    """An argument has the wrong number of dimensions or a size that does not fit the others."""


class LoRADtypeError(TypeError):
    """An argument is not floating point, or the arguments mix dtypes or array libraries."""


class LoRAValueError(ValueError):
    """An argument has the right type and shape but an unusable value: a NaN or infinite entry or scale."""


def _is_torch(x: Any) -> bool:
    # If torch was never imported, x cannot be a tensor: NumPy-only users skip torch's import time.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def _is_float(x: Any) -> bool:
    if _is_torch(x):
        return x.is_floating_point()
    return isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating)


def _check_arrays(**arrays: Any) -> None:
    """Every array is 2-D, floating point, of one library and one dtype; name the offender."""
    kinds = {name: ("torch" if _is_torch(a) else "numpy") for name, a in arrays.items()}
    for name, a in arrays.items():
        if not (_is_torch(a) or isinstance(a, np.ndarray)):
            raise LoRADtypeError(
                f"{name} must be a NumPy array or a torch tensor, got {type(a).__name__}; "
                f"wrap lists with np.asarray(..., dtype=np.float64)."
            )
        if not _is_float(a):
            raise LoRADtypeError(
                f"{name} must be floating point, got dtype {_dtype_name(a)}; "
                f"gradients, scales and finite differences need floats. Use .astype(np.float64) or .double()."
            )
        if a.ndim != 2:
            raise LoRAShapeError(
                f"{name} must be 2-D (row-vector convention), got shape {tuple(a.shape)}; "
                f"a single token x of width d is passed as shape (1, d)."
            )
    if len(set(kinds.values())) > 1:
        raise LoRADtypeError(f"mixed NumPy arrays and torch tensors: {kinds}; use one library for all arguments.")
    dtypes = {name: _dtype_name(a) for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        raise LoRADtypeError(f"all arguments must share one dtype, got {dtypes}.")


def nonfinite_entry(name: str, a: Any) -> str | None:
    """``None`` if every entry of the NumPy array or torch tensor ``a`` is finite, else the first bad one
    in row-major order, e.g. ``"X[2, 0] is nan"``. One ``isfinite().all()`` pass; the search runs only on failure."""
    finite = a.isfinite() if _is_torch(a) else np.isfinite(a)
    if bool(finite.all()):
        return None
    first = int((~finite).reshape(-1).nonzero()[0][0])
    index = tuple(int(i) for i in np.unravel_index(first, tuple(a.shape)))
    return f"{entry_name(name, index)} is {float(a.detach()[index] if _is_torch(a) else a[index])}"


def _check_finite(**arrays: Any) -> None:
    """Every entry of every array is finite; else LoRAValueError naming the tensor and the first bad index."""
    for name, a in arrays.items():
        bad = nonfinite_entry(name, a)
        if bad:
            raise LoRAValueError(
                f"{bad}; every entry of {name} must be finite, or it spreads NaN through every product {name} enters. "
                f"Look where {name} was computed (a division by zero, log(0), an overflow)."
            )


def _is_real_dtype(a: Any) -> bool:
    if _is_torch(a):
        return not (a.is_complex() or _dtype_name(a) == "bool")
    return a.dtype.kind in "iuf"


def _check_scale(s: Any, name: str = "s") -> None:
    """s is one real, finite number: a Python or NumPy number, a 0-d array or a 0-d torch tensor (not a bool)."""
    what = {"s": "the adapter scale, lora_alpha / r", "lora_alpha": "PEFT's lora_alpha, e.g. 16",
            "scaling": "PEFT's scaling, lora_alpha / r"}.get(name, "a real number")
    if _is_torch(s) or isinstance(s, np.ndarray):
        if s.ndim != 0:
            raise LoRAShapeError(
                f"{name} must be one number ({what}), got an array of shape {tuple(s.shape)}; "
                f"one adapter has one scale."
            )
        if not _is_real_dtype(s):
            raise LoRADtypeError(f"{name} must be a real number ({what}), got a 0-d array of dtype {_dtype_name(s)}.")
    elif isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, float, np.integer, np.floating)):
        hint = ("; convert text with float(...)" if isinstance(s, (str, bytes)) else
                "; compute it first, e.g. s = scaling(lora_alpha, r)" if s is None and name == "s" else "")
        raise LoRADtypeError(f"{name} must be a real number ({what}), got {type(s).__name__} {s!r}{hint}.")
    value = float(s.detach() if _is_torch(s) else s)  # detach: float() of a tensor in the graph warns
    if not math.isfinite(value):
        raise LoRAValueError(f"{name} must be finite ({what}), got {value}; with it the adapter's output is all NaN or inf.")


def _expect(name: str, actual: tuple, expected: tuple, meaning: str) -> None:
    if tuple(actual) != tuple(expected):
        raise LoRAShapeError(f"{name} must have shape {tuple(expected)} ({meaning}), got {tuple(actual)}.")


def _check_lora_shapes(X: Any, W: Any, A: Any, B: Any) -> tuple[int, int, int, int]:
    _check_arrays(X=X, W=W, A=A, B=B)
    n, d = X.shape

    def rows(name: str, a: Any, want: int, what: str) -> None:
        if a.shape[0] != want:
            hint = " (transposed? nn.Linear and PEFT store weights as out × in)" if a.shape[1] == want else ""
            raise LoRAShapeError(
                f"{name} must have {want} rows ({what}; X has shape {tuple(X.shape)}), got shape {tuple(a.shape)}{hint}."
            )

    rows("W", W, d, "W is d × m, d = X.shape[1]")
    rows("A", A, d, "A is d × r, d = X.shape[1]")
    m, r = W.shape[1], A.shape[1]
    _expect("B", B.shape, (r, m), "r × m, r = A.shape[1], m = W.shape[1]")
    return n, d, m, r


def scaling(lora_alpha: float, r: int, use_rslora: bool = False) -> float:
    """The adapter scale s.

    ``s = lora_alpha / r`` (LoRA, Hu et al. 2021, section 4.1; PEFT ``LoraLayer.scaling``), or
    ``s = lora_alpha / sqrt(r)`` with ``use_rslora=True`` (rank-stabilised LoRA, Kalajdzievski 2023,
    arXiv:2312.03732). Units: dimensionless.

    Raises ``ValueError`` if ``r`` is not a positive integer or ``lora_alpha`` is not finite
    (:class:`LoRAValueError`); :class:`LoRADtypeError` (a ``TypeError``) if ``lora_alpha`` is not a real
    number (None, a string, a bool).
    """
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r <= 0:
        raise ValueError(f"r must be a positive integer (the adapter's rank), got {r!r}.")
    _check_scale(lora_alpha, "lora_alpha")
    return float(lora_alpha) / (math.sqrt(r) if use_rslora else r)


def lora_forward(X: Any, W: Any, A: Any, B: Any, s: float) -> tuple[Any, dict]:
    """Forward pass ``Y = X W + s (X A) B``.

    Args:
        X: n × d input rows. W: d × m frozen base. A: d × r. B: r × m. All one floating dtype,
            all NumPy or all torch (torch tensors keep autograd).
        s: the scale (see :func:`scaling`): one real, finite number (Python or NumPy number, 0-d array or
            0-d tensor; not a bool).

    Returns:
        ``(Y, cache)``: Y is n × m in the inputs' dtype; ``cache`` holds X, W, A, B, s and Z = XA for
        :func:`lora_backward`.

    Raises:
        LoRAShapeError: an argument is not 2-D or its shape does not fit (the message names it and
            gives expected and actual shapes), or s is an array. LoRADtypeError: non-float, mixed
            dtypes or libraries, or s not a real number. LoRAValueError: a NaN or inf entry in X, W,
            A or B (the message names the first, e.g. "X[2, 0] is nan"), or s not finite.

    Source: Hu et al. 2021 (arXiv:2106.09685), section 4.1, eq. 3, in row-vector form (lesson 02).
    """
    _check_lora_shapes(X, W, A, B)
    _check_scale(s)
    _check_finite(X=X, W=W, A=A, B=B)
    Z = X @ A
    Y = X @ W + s * (Z @ B)
    return Y, {"X": X, "W": W, "A": A, "B": B, "s": s, "Z": Z}


def lora_backward(D: Any, cache: dict) -> tuple[Any, Any, Any]:
    """Backward pass of :func:`lora_forward`: ``(dX, dA, dB)`` from the upstream gradient ``D = dL/dY``.

    ``dB = s Zᵀ D`` (r × m), ``dZ = s D Bᵀ`` (n × r), ``dA = Xᵀ dZ`` (d × r),
    ``dX = D Wᵀ + dZ Aᵀ`` (n × d). Uses the B of this forward pass (the cache), never an updated one.
    No gradient for the frozen W is formed.

    Raises LoRAShapeError if D is not n × m; LoRAValueError if D has a NaN or inf entry (named) or the
    cache's s is not finite. Source: the chain rule through :func:`lora_forward`, derived in lesson 05
    (Hu et al. 2021, arXiv:2106.09685, give the forward pass only).
    """
    X, W, A, B, s, Z = (cache[k] for k in ("X", "W", "A", "B", "s", "Z"))
    _check_arrays(D=D, X=X)
    _expect("D", D.shape, (X.shape[0], W.shape[1]), "n × m, the shape of Y")
    _check_scale(s)
    _check_finite(D=D)
    dB = s * (Z.T @ D)
    dZ = s * (D @ B.T)
    dA = X.T @ dZ
    dX = D @ W.T + dZ @ A.T
    return dX, dA, dB


def merge(W: Any, A: Any, B: Any, s: float) -> Any:
    """Merged weight ``W + s A B`` (d × m), so that ``X (W + sAB) = XW + s(XA)B`` up to rounding.

    Raises LoRAShapeError / LoRADtypeError / LoRAValueError as :func:`lora_forward` (for W, A, B and s).
    Source: Hu et al. 2021, section 4.1.
    """
    _check_arrays(W=W, A=A, B=B)
    d, m = W.shape
    _expect("A", A.shape, (d, A.shape[1]), "d × r, d = W.shape[0]")
    _expect("B", B.shape, (A.shape[1], m), "r × m, r = A.shape[1], m = W.shape[1]")
    _check_scale(s)
    _check_finite(W=W, A=A, B=B)
    return W + s * (A @ B)


def unmerge(W_merged: Any, A: Any, B: Any, s: float) -> Any:
    """Inverse of :func:`merge`: ``W_merged - s A B`` (exact only up to floating-point rounding).

    Shapes, dtypes and errors as :func:`merge` (W_merged is d × m)."""
    _check_scale(s)  # before -s, which a string or None would break with an unrelated message
    return merge(W_merged, A, B, -s)


def dense_param_count(d: int, m: int) -> int:
    """Entries of a dense d × m correction: ``d * m``."""
    _check_positive(d=d, m=m)
    return int(d) * int(m)


def param_count(d: int, m: int, r: int) -> int:
    """Trainable entries of one rank-r adapter on a d × m weight: ``r (d + m)`` (A is d × r, B is r × m).

    Example (lesson 02): d = m = 4096, r = 16 gives 131,072. Raises ValueError on a
    non-positive or non-integer size.
    """
    _check_positive(d=d, m=m, r=r)
    return int(r) * (int(d) + int(m))


def adapter_fraction(d: int, m: int, r: int) -> float:
    """``r (d + m) / (d m)``, the adapter's size relative to the dense matrix (a fraction, not percent)."""
    return param_count(d, m, r) / dense_param_count(d, m)


def _check_positive(**sizes: Any) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}.")


def from_linear_weight(weight: Any) -> Any:
    """Row-vector W (in × out) from a ``torch.nn.Linear.weight`` (stored out_features × in_features).

    ``nn.Linear`` computes ``y = x @ weight.T``, so ``W = weight.T``. The same holds for PEFT's
    factors: ``A = lora_A.weight.T`` (d × r) and ``B = lora_B.weight.T`` (r × m).
    Raises LoRADtypeError if ``weight`` is not a NumPy array or torch tensor, LoRAShapeError if not 2-D.
    Source: PyTorch ``torch.nn.Linear`` documentation.
    """
    if not (_is_torch(weight) or isinstance(weight, np.ndarray)):
        raise LoRADtypeError(f"weight must be a NumPy array or a torch tensor (e.g. linear.weight), got {type(weight).__name__}.")
    if weight.ndim != 2:
        raise LoRAShapeError(f"weight must be 2-D (out_features × in_features), got shape {tuple(weight.shape)}.")
    return weight.T
