"""Finite-difference gradient checks that say where they fail.

Central differences (error O(ε²); Nocedal & Wright, *Numerical Optimization*, 2nd ed., section 8.1)::

    ∂f/∂x_i ≈ (f(x + ε e_i) − f(x − ε e_i)) / (2ε)

For a layer with an upstream gradient D (the vector–Jacobian product, as in CS231n's
``eval_numerical_gradient_array``) the scalar is ``f = sum(forward(...) * D)``, whose gradient with
respect to each input is exactly what the layer's backward returns.

Relative error, element-wise, ``|a − n| / max(|a| + |n|, tiny)``; the report keeps the worst.
Bands in float64 with ε = 1e-6, stricter than CS231n's "gradient checks" notes (which accept up to 1e-4 where the
objective has kinks, and call above 1e-2 probably wrong): < 1e-7 right; 1e-7 … 1e-4 look closer (kinks,
cancellation); > 1e-4 almost certainly wrong. float32 round-off alone reaches ~1e-3,
so check in float64. A check that must run in float32 needs ε ≈ 1e-3 and looser bands
(``band(err, "float32")``: < 1e-3 right, > 1e-2 wrong).

Choosing ε: a central difference errs by truncation ε²|f‴|/6 plus round-off u|f|/ε (u the unit
round-off), smallest near ε* = (3u|f|/|f‴|)^(1/3) (:func:`optimal_step`); :func:`epsilon_sweep`
measures the error per ε.
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
    "BANDS",
    "unit_roundoff",
    "default_step",
    "optimal_step",
    "error_model",
    "relative_errors",
    "epsilon_sweep",
    "entry_name",
]


def entry_name(name: str, index: tuple) -> str:
    """How feedback names one entry: ``W[2, 0]`` for an entry of an array, plain ``W`` for a 0-d array (never ``W[]``)."""
    return f"{name}{[int(i) for i in index]}" if len(index) else name


def _check_positive(name: str, v: Any, meaning: str, zero_ok: bool = False) -> float:
    """v is one finite real number > 0 (≥ 0 with zero_ok); returns it as a float."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number ({meaning}), got {type(v).__name__} {v!r}.")
    if not (np.isfinite(v) and (v >= 0 if zero_ok else v > 0)):
        raise ValueError(f"{name} must be a finite {'number ≥ 0' if zero_ok else 'positive number'} ({meaning}), got {v!r}"
                         + ("; a zero step divides by 2ε = 0." if v == 0 and not zero_ok else "."))
    return float(v)


RIGHT = 1e-7
WRONG = 1e-4

# dtype name -> (below this: "right", above this: "wrong"). float64 with ε = 1e-6: the course's bands, stricter than
# CS231n's notes (which accept up to 1e-4 where the objective has kinks; these kernels have none).
# float32: with ε = 1e-3 the round-off term u·|f|/ε alone is ~1e-4·|f|/|f′|, so a correct kernel
# routinely shows 1e-4 … 1e-3; a real bug (missing scale, transpose) shows 1e-1 or more.
BANDS: dict[str, tuple[float, float]] = {"float64": (RIGHT, WRONG), "float32": (1e-3, 1e-2)}


def _dtype_name(dtype: Any) -> str:
    name = str(getattr(dtype, "__name__", dtype)).replace("torch.", "")
    if name not in BANDS:
        raise ValueError(f"dtype must be one of {sorted(BANDS)} (a name, a NumPy or a torch dtype), got {dtype!r}.")
    return name


def band(rel_err: float, dtype: Any = "float64") -> str:
    """Name the band of a relative error: ``"right"``, ``"look closer"`` or ``"wrong"``.

    ``dtype="float64"`` (default): < 1e-7 right, > 1e-4 wrong (stricter than CS231n's notes, "Gradient checks",
    which accept up to 1e-4 for objectives with kinks and call above 1e-2 probably wrong: the course's kernels are
    smooth). ``dtype="float32"``
    (or ``np.float32`` / ``torch.float32``): < 1e-3 right, > 1e-2 wrong, for checks run in float32 with
    ε ≈ 1e-3 (see :data:`BANDS`). NaN and inf are "wrong". Raises ValueError for another dtype.
    """
    right, wrong = BANDS[_dtype_name(dtype)]
    if not np.isfinite(rel_err) or rel_err > wrong:
        return "wrong"
    return "right" if rel_err < right else "look closer"


def numeric_gradient(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of a scalar ``f`` at ``x``, every entry.

    Args:
        f: maps an array shaped like ``x`` to a Python float or 0-d array. Called 2·x.size times.
        x: float64 array (any shape); perturbed in place and restored.
        eps: step ε (same units as x). 1e-6 balances truncation (∝ ε²) and round-off (∝ 1/ε) in float64.

    Returns a float64 array shaped like ``x``. Raises TypeError if ``x`` is not a floating NumPy array
    or ``eps`` not a number; ValueError if ``eps`` is not finite and > 0.
    """
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"x must be a floating NumPy array, got {type(x).__name__} {getattr(x, 'dtype', '')}.")
    eps = _check_positive("eps", eps, "the finite-difference step ε, e.g. 1e-6 in float64")
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
    a, n = _float64(analytic), _float64(numeric)
    if a.shape != n.shape:
        return float("inf")
    return float(relative_errors(a, n, denominator="sum").max(initial=0.0))


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
            f"({band(self.rel_error)})  worst at {entry_name(self.name, self.worst_index)}: "
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
    Raises KeyError if a name in ``wrt`` is not an input; TypeError if an input is not float64-able or
    eps/tol is not a number; ValueError if eps is not finite and > 0 or tol not finite and ≥ 0.
    """
    eps = _check_positive("eps", eps, "the finite-difference step ε, e.g. 1e-6 in float64")
    tol = _check_positive("tol", tol, "the largest accepted relative error, e.g. 1e-6", zero_ok=True)
    inputs = {k: _float64(v) for k, v in inputs.items()}
    D = _float64(D)
    names = list(wrt) if wrt is not None else list(grads)
    report = GradReport()

    def objective(**kw: np.ndarray) -> float:
        out = forward(**kw)
        if isinstance(out, tuple):
            out = out[0]
        out = _float64(out)  # a tensor that requires grad is an honest answer too
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


# --------------------------------------------------------------------------- choosing ε, and ε sweeps


def unit_roundoff(dtype: Any = "float64") -> float:
    """Unit round-off u = machine epsilon / 2 of ``dtype`` ("float64": 2⁻⁵³ ≈ 1.1e-16, "float32": 2⁻²⁴ ≈ 6.0e-8).

    Raises ValueError for a dtype other than float64 / float32.
    """
    return float(np.finfo(_dtype_name(dtype)).eps) / 2


def default_step(dtype: Any = "float64") -> float:
    """The conventional central-difference step: 1e-6 in float64 (CS231n), 1e-3 in float32."""
    return {"float64": 1e-6, "float32": 1e-3}[_dtype_name(dtype)]


def optimal_step(dtype: Any = "float64", f_scale: float = 1.0, d3_scale: float = 1.0) -> float:
    """The ε that minimises :func:`error_model`: ``ε* = (3 u |f| / |f‴|)^(1/3)``.

    With |f| ≈ |f‴| this is ≈ 6.9e-6 in float64 and ≈ 5.6e-3 in float32. ``f_scale`` ≈ |f| at x,
    ``d3_scale`` ≈ |f‴| (both positive). Source: Nocedal & Wright, *Numerical Optimization*, 2nd ed.,
    section 8.1 (the ε ≈ u^(1/3) rule for central differences). Raises ValueError for non-positive scales.
    """
    _check_positive("f_scale", f_scale, "|f| at x")
    _check_positive("d3_scale", d3_scale, "|f‴| at x")
    return float((3 * unit_roundoff(dtype) * f_scale / d3_scale) ** (1 / 3))


def error_model(eps: Any, dtype: Any = "float64", f_scale: float = 1.0, d3_scale: float = 1.0) -> np.ndarray:
    """Error bound of a central difference: truncation ``ε² |f‴| / 6`` plus round-off ``u |f| / ε``.

    Truncation from Taylor's theorem (the ε² term of (f(x+ε) − f(x−ε)) / 2ε); round-off because each of
    f(x ± ε) carries an error up to u·|f|, and their difference is divided by 2ε. ``eps``: a positive
    number or array. Returns a float64 array shaped like ``eps`` (absolute error, in f's units per unit
    of x). Raises ValueError if an ε is not positive.
    """
    e = np.asarray(eps, dtype=np.float64)
    if not np.all((e > 0) & np.isfinite(e)):
        raise ValueError(f"every eps must be a finite positive number, got {eps!r}.")
    return e**2 * d3_scale / 6 + unit_roundoff(dtype) * f_scale / e


def relative_errors(analytic: Any, numeric: Any, denominator: str = "max", tiny: float = 1e-12) -> np.ndarray:
    """Element-wise relative errors, float64, shaped like the inputs.

    ``denominator="max"``: ``|a − n| / max(|a|, |n|, tiny)`` (CS231n notes, "gradient checks");
    ``denominator="sum"``: ``|a − n| / max(|a| + |n|, tiny)`` (what :func:`relative_error` reports).
    The two differ by at most a factor 2, which no band boundary cares about. Where both are 0 the
    error is 0. Raises ValueError on a shape mismatch or an unknown ``denominator``.
    """
    a, n = _float64(analytic), _float64(numeric)
    if a.shape != n.shape:
        raise ValueError(f"analytic has shape {a.shape} but numeric has shape {n.shape}.")
    if denominator == "max":
        den = np.maximum(np.maximum(np.abs(a), np.abs(n)), tiny)
    elif denominator == "sum":
        den = np.maximum(np.abs(a) + np.abs(n), tiny)
    else:
        raise ValueError(f"denominator must be 'max' or 'sum', got {denominator!r}.")
    return np.abs(a - n) / den


def epsilon_sweep(f: Callable[[np.ndarray], float], x: np.ndarray, analytic: Any, eps_values: Any,
                  reduce: str = "max") -> np.ndarray:
    """Relative error of central differences against ``analytic`` for each step in ``eps_values``.

    Args:
        f: scalar function of an array shaped like ``x`` (as for :func:`numeric_gradient`). To see
            float32 behaviour, let ``f`` cast its argument to float32: x ± ε is then rounded to float32
            inside f, as it would be in a float32 model.
        x: floating NumPy array, perturbed in place and restored. analytic: the gradient at x, x's shape.
        eps_values: 1-D sequence of positive steps. reduce: "max" (worst entry) or "median" over entries.

    Returns a float64 array, one relative error (``denominator="max"``, see :func:`relative_errors`)
    per ε. Calls f 2·x.size·len(eps_values) times. Raises ValueError for a non-positive ε, a shape
    mismatch or an unknown ``reduce``; TypeError as :func:`numeric_gradient`.
    """
    eps = np.asarray(eps_values, dtype=np.float64)
    if eps.ndim != 1 or eps.size == 0 or not np.all((eps > 0) & np.isfinite(eps)):
        raise ValueError(f"eps_values must be a non-empty 1-D sequence of finite positive steps, got {eps_values!r}.")
    if reduce not in ("max", "median"):
        raise ValueError(f"reduce must be 'max' or 'median', got {reduce!r}.")
    a = _float64(analytic)
    if a.shape != np.shape(x):
        raise ValueError(f"analytic has shape {a.shape} but x has shape {np.shape(x)}.")
    agg = np.max if reduce == "max" else np.median
    return np.array([float(agg(relative_errors(a, numeric_gradient(f, x, float(e))))) for e in eps])
