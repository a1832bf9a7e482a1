"""Finite-difference gradient checks that say where they fail.

Central differences (error O(ε²); Nocedal & Wright, *Numerical Optimization*, 2nd ed., section 8.1)::

    ∂f/∂x_i ≈ (f(x + ε e_i) − f(x − ε e_i)) / (2ε)

For a layer with an upstream gradient D (the vector–Jacobian product, as in CS231n's
``eval_numerical_gradient_array``) the scalar is ``f = sum(forward(...) * D)``, whose gradient with
respect to each input is exactly what the layer's backward returns.

Relative error, element-wise, ``|a − n| / max(|a| + |n|, tiny)``; the report keeps the worst.
Bands in float64 with ε = 1e-6 (CS231n "gradient checks" notes): < 1e-7 right; 1e-7 … 1e-4 look
closer (kinks, cancellation); > 1e-4 almost certainly wrong. float32 round-off alone reaches ~1e-3,
so check in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

__all__ = [
    "numeric_gradient",
    "relative_error",
    "TensorCheck",
    "GradReport",
    "check_vjp",
    "band",
]

RIGHT = 1e-7
WRONG = 1e-4


def band(rel_err: float) -> str:
    """Name the CS231n band of a float64 relative error: ``"right"``, ``"look closer"`` or ``"wrong"``."""
    if not np.isfinite(rel_err) or rel_err > WRONG:
        return "wrong"
    return "right" if rel_err < RIGHT else "look closer"


def numeric_gradient(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of a scalar ``f`` at ``x``, every entry.

    Args:
        f: maps an array shaped like ``x`` to a Python float or 0-d array. Called 2·x.size times.
        x: float64 array (any shape); perturbed in place and restored.
        eps: step ε (same units as x). 1e-6 balances truncation (∝ ε²) and round-off (∝ 1/ε) in float64.

    Returns a float64 array shaped like ``x``. Raises TypeError if ``x`` is not a floating NumPy array.
    """
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"x must be a floating NumPy array, got {type(x).__name__} {getattr(x, 'dtype', '')}.")
    grad = np.zeros(x.shape, dtype=np.float64)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = float(f(x))
        x[i] = old - eps
        fm = float(f(x))
        x[i] = old
        grad[i] = (fp - fm) / (2 * eps)
    return grad


def _float64(x: Any) -> np.ndarray:
    # Torch tensors that require grad (e.g. lora_backward on autograd inputs) refuse np.asarray.
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.array(x, dtype=np.float64)


def relative_error(analytic: Any, numeric: Any) -> float:
    """Worst element-wise ``|a − n| / max(|a| + |n|, 1e-12)``; 0.0 for empty arrays, inf on a shape mismatch."""
    a = _float64(analytic)
    n = _float64(numeric)
    if a.shape != n.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - n) / np.maximum(np.abs(a) + np.abs(n), 1e-12)))


@dataclass
class TensorCheck:
    """The outcome for one input tensor: where it is worst, and the two values there."""

    name: str
    shape: tuple
    rel_error: float
    max_abs_error: float
    worst_index: tuple
    analytic: float
    numeric: float
    tol: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.rel_error) and self.rel_error <= self.tol)

    def __str__(self) -> str:
        verdict = "ok  " if self.ok else "FAIL"
        return (
            f"{verdict} d{self.name:<4} shape {str(self.shape):<10} rel.err {self.rel_error:9.2e} "
            f"({band(self.rel_error)})  worst at {self.name}{list(self.worst_index)}: "
            f"analytic {self.analytic:+.8g}, numeric {self.numeric:+.8g}"
        )


@dataclass
class GradReport:
    """Per-tensor checks; ``ok`` when every tensor is within tolerance. Prints as a small table."""

    checks: list[TensorCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def worst(self) -> TensorCheck:
        return max(self.checks, key=lambda c: c.rel_error)

    def __getitem__(self, name: str) -> TensorCheck:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def __str__(self) -> str:
        return "\n".join(str(c) for c in self.checks)

    _repr_pretty_ = lambda self, p, cycle: p.text(str(self))  # noqa: E731  (IPython display)


def _compare(name: str, analytic: Any, numeric: np.ndarray, tol: float) -> TensorCheck:
    a = _float64(analytic)
    if a.shape != numeric.shape:
        return TensorCheck(name, tuple(numeric.shape), float("inf"), float("inf"), (), float("nan"), float("nan"), tol)
    err = np.abs(a - numeric) / np.maximum(np.abs(a) + np.abs(numeric), 1e-12)
    # Entries where both are ~0 (e.g. dA with B = 0) have no meaningful relative error.
    err = np.where(np.abs(a - numeric) < 1e-10, 0.0, err)
    if a.size == 0:
        return TensorCheck(name, a.shape, 0.0, 0.0, (), 0.0, 0.0, tol)
    idx = np.unravel_index(int(np.argmax(err)), a.shape)
    return TensorCheck(
        name=name,
        shape=tuple(a.shape),
        rel_error=float(err[idx]),
        max_abs_error=float(np.max(np.abs(a - numeric))),
        worst_index=tuple(int(i) for i in idx),
        analytic=float(a[idx]),
        numeric=float(numeric[idx]),
        tol=tol,
    )


def check_vjp(
    forward: Callable[..., Any],
    inputs: Mapping[str, np.ndarray],
    grads: Mapping[str, Any],
    D: np.ndarray,
    eps: float = 1e-6,
    tol: float = 1e-6,
    wrt: list[str] | None = None,
) -> GradReport:
    """Check analytic gradients against central differences of ``sum(forward(**inputs) * D)``.

    Args:
        forward: ``forward(**inputs)`` returns the output array (or ``(output, cache)``), shape of D.
        inputs: name → float64 array; every entry of each checked input is perturbed.
        grads: name → the analytic gradient to check (same shape as the input).
        D: upstream gradient dL/d(output), float64, the output's shape.
        eps: finite-difference step. tol: largest accepted relative error (float64).
        wrt: names to check (default: every name in ``grads``).

    Returns a :class:`GradReport` naming, per tensor, the worst index with both values.
    Raises KeyError if a name in ``wrt`` is not an input; TypeError if an input is not float64-able.
    """
    inputs = {k: _float64(v) for k, v in inputs.items()}
    D = _float64(D)
    names = list(wrt) if wrt is not None else list(grads)
    report = GradReport()

    def objective(**kw: np.ndarray) -> float:
        out = forward(**kw)
        if isinstance(out, tuple):
            out = out[0]
        out = np.asarray(out, dtype=np.float64)
        if out.shape != D.shape:
            raise ValueError(f"forward returned shape {out.shape}, but D has shape {D.shape}.")
        return float(np.sum(out * D))

    for name in names:
        if name not in inputs:
            raise KeyError(f"{name!r} is not one of the inputs {list(inputs)}.")
        x = inputs[name]
        num = numeric_gradient(lambda v, name=name: objective(**{**inputs, name: v}), x, eps)
        report.checks.append(_compare(name, grads[name], num, tol))
    return report
