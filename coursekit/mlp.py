"""The gated SiLU MLP of Llama-style models (SwiGLU), forward and backward, in the row-vector convention.

Shapes (Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202, the SwiGLU variant with
β = 1; Llama's ``LlamaMLP``: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with ``act_fn = silu``)::

    X      : n × d       n token positions of width d (hidden_size)
    W_gate : d × f       f = intermediate_size
    W_up   : d × f
    W_down : f × d

    G = X W_gate         n × f     (gate pre-activation)
    U = X W_up           n × f     (the "up" branch, not activated)
    H = SiLU(G) ⊙ U      n × f
    Y = H W_down         n × d

SiLU (Hendrycks & Gimpel 2016, arXiv:1606.08415; Elfwing et al. 2018, arXiv:1702.03118, "SiL";
Ramachandran et al. 2017, arXiv:1710.05941, "Swish" with β = 1)::

    σ(x)     = 1 / (1 + e^(−x))
    SiLU(x)  = x σ(x)
    SiLU′(x) = σ(x) + x σ(x)(1 − σ(x)) = σ(x) (1 + x (1 − σ(x)))

Backward, with ``dY = dL/dY`` (n × d) arriving from downstream::

    dW_down = Hᵀ dY                f × d
    dH      = dY W_downᵀ           n × f
    dG      = dH ⊙ U ⊙ SiLU′(G)    n × f
    dU      = dH ⊙ SiLU(G)         n × f
    dW_gate = Xᵀ dG                d × f
    dW_up   = Xᵀ dU                d × f
    dX      = dG W_gateᵀ + dU W_upᵀ   n × d   (X feeds two branches: their gradients add)

The pairs follow CS231n's layer convention: ``*_forward(...) -> (out, cache)`` and
``*_backward(dout, cache) -> gradients``. Everything is NumPy; inputs must be floating NumPy arrays of one
dtype (float64 is the reference; float32 works but gradient checks need float64). The forward
functions reject a NaN or inf entry in their inputs, naming the first (e.g. "X[2, 0] is nan").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .lora import nonfinite_entry

__all__ = [
    "MLPShapeError",
    "MLPDtypeError",
    "MLPValueError",
    "sigmoid",
    "silu",
    "silu_grad",
    "swiglu_forward",
    "swiglu_backward",
    "mlp_forward",
    "mlp_backward",
    "mlp_param_count",
]


class MLPShapeError(ValueError):
    """An argument has the wrong number of dimensions or a size that does not fit the others."""


class MLPDtypeError(TypeError):
    """An argument is not a floating NumPy array, or the arguments mix dtypes."""


class MLPValueError(ValueError):
    """An input has a NaN or infinite entry (the message names the first)."""


# --------------------------------------------------------------------------- element-wise functions


def _as_float(x: Any, name: str = "x") -> np.ndarray:
    """Floating arrays pass through; Python numbers, lists and integer arrays become float64."""
    if hasattr(x, "detach") and not isinstance(x, np.ndarray):
        raise MLPDtypeError(f"{name} must be a NumPy array or a number, got a torch tensor; pass x.detach().numpy().")
    a = np.asarray(x)
    if a.dtype == object or a.dtype.kind not in "biuf":
        raise MLPDtypeError(f"{name} must be real numbers, got dtype {a.dtype}.")
    return a if a.dtype.kind == "f" else a.astype(np.float64)


def sigmoid(x: Any) -> np.ndarray:
    """Logistic sigmoid ``σ(x) = 1 / (1 + e^(−x))``, element-wise, without overflow.

    Computed from ``e = exp(−|x|)`` (always ≤ 1): ``1 / (1 + e)`` for x ≥ 0 and ``e / (1 + e)`` for x < 0,
    so ``sigmoid(-1000.0)`` is 0.0 with no overflow warning and ``sigmoid(1000.0)`` is 1.0.

    Args: x: a number, list or NumPy array (any shape). Returns an array of x's shape, in x's floating
    dtype (float64 for integer or Python input). Raises MLPDtypeError for a torch tensor or non-numbers.
    """
    x = _as_float(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def silu(x: Any) -> np.ndarray:
    """SiLU (a.k.a. swish with β = 1): ``SiLU(x) = x σ(x)``, element-wise.

    Shape and dtype as :func:`sigmoid`. Its minimum is ≈ −0.278465 at x ≈ −1.278465 (where SiLU′ = 0).
    Source: Elfwing et al. 2018 (arXiv:1702.03118); PyTorch ``torch.nn.functional.silu``.
    """
    x = _as_float(x)
    return x * sigmoid(x)


def silu_grad(x: Any) -> np.ndarray:
    """Derivative of SiLU: ``SiLU′(x) = σ(x) (1 + x (1 − σ(x)))``, element-wise.

    Product rule on ``x σ(x)`` with ``σ′ = σ (1 − σ)``. ``1 − σ(x)`` is evaluated as ``σ(−x)`` so that no
    cancellation or overflow occurs for large |x|: SiLU′ → 1 as x → +∞ and → 0 as x → −∞.
    Values: SiLU′(0) = 0.5, SiLU′(2) ≈ 1.090784, SiLU′(−3) ≈ −0.088104; SiLU′(x) + SiLU′(−x) = 1.

    Shape and dtype as :func:`sigmoid`. Source: Elfwing et al. 2018 (arXiv:1702.03118), eq. for the
    derivative of the SiL unit.
    """
    x = _as_float(x)
    return sigmoid(x) * (1.0 + x * sigmoid(-x))


# --------------------------------------------------------------------------- checks


def _check_arrays(ndim: int | None = 2, **arrays: Any) -> None:
    """Every array is a floating NumPy array (2-D unless ndim is None) and all share one dtype; name the offender."""
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray):
            raise MLPDtypeError(
                f"{name} must be a NumPy array, got {type(a).__name__}; "
                f"wrap lists with np.asarray(..., dtype=np.float64)."
            )
        if not np.issubdtype(a.dtype, np.floating):
            raise MLPDtypeError(f"{name} must be floating point, got dtype {a.dtype}; use .astype(np.float64).")
        if ndim is not None and a.ndim != ndim:
            raise MLPShapeError(
                f"{name} must be {ndim}-D (row-vector convention), got shape {a.shape}; "
                f"a single token x of width d is passed as shape (1, d)."
            )
    dtypes = {name: str(a.dtype) for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        raise MLPDtypeError(f"all arguments must share one dtype, got {dtypes}.")


def _check_finite(**arrays: np.ndarray) -> None:
    """Every entry is finite; else MLPValueError naming the array and its first bad index."""
    for name, a in arrays.items():
        bad = nonfinite_entry(name, a)
        if bad:
            raise MLPValueError(f"{bad}; every entry of {name} must be finite, or it spreads NaN through every "
                                f"product {name} enters. Look where {name} was computed (a division by zero, an overflow).")


def _expect(name: str, actual: tuple, expected: tuple, meaning: str) -> None:
    if tuple(actual) != tuple(expected):
        hint = " (transposed? nn.Linear stores weights as out × in)" if tuple(actual) == tuple(expected)[::-1] else ""
        raise MLPShapeError(f"{name} must have shape {tuple(expected)} ({meaning}), got {tuple(actual)}{hint}.")


# --------------------------------------------------------------------------- the gate: H = SiLU(G) ⊙ U


def swiglu_forward(G: np.ndarray, U: np.ndarray) -> tuple[np.ndarray, dict]:
    """The gated product ``H = SiLU(G) ⊙ U``.

    Args:
        G: gate pre-activations, any shape (n × f in the MLP). U: the up branch, G's shape and dtype.

    Returns:
        ``(H, cache)``: H has G's shape and dtype; ``cache`` holds G, U and ``S = SiLU(G)``.

    Raises:
        MLPShapeError: U's shape differs from G's. MLPDtypeError: non-float, non-NumPy or mixed dtypes.
        MLPValueError: a NaN or inf entry in G or U (named).

    Source: Shazeer 2020 (arXiv:2002.05202), SwiGLU with β = 1.
    """
    _check_arrays(None, G=G, U=U)
    _expect("U", U.shape, G.shape, "the shape of G: the gate multiplies U element by element")
    _check_finite(G=G, U=U)
    S = silu(G)
    return S * U, {"G": G, "U": U, "S": S}


def swiglu_backward(dH: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """Backward of :func:`swiglu_forward`: ``(dG, dU)`` from ``dH = dL/dH``.

    ``dG = dH ⊙ U ⊙ SiLU′(G)`` (the gate is activated, so its local derivative is SiLU′, times the
    other factor U) and ``dU = dH ⊙ SiLU(G)`` (U enters linearly, times the activated gate). Both have
    G's shape. ``cache`` is the one :func:`swiglu_forward` returned; a hand-built dict needs only "G" and
    "U" ("S" = SiLU(G) is recomputed when absent).

    Raises MLPShapeError if dH does not have H's shape; MLPDtypeError as :func:`swiglu_forward`.
    Source: product rule on H = SiLU(G) ⊙ U; SiLU′ from :func:`silu_grad`.
    """
    G, U = cache["G"], cache["U"]
    _check_arrays(None, dH=dH, G=G)
    S = cache["S"] if "S" in cache else silu(G)  # a hand-built cache may hold only G and U
    _expect("dH", dH.shape, G.shape, "the shape of H = SiLU(G) ⊙ U")
    dG = dH * U * silu_grad(G)
    dU = dH * S
    return dG, dU


# --------------------------------------------------------------------------- the whole MLP


def mlp_forward(X: np.ndarray, W_gate: np.ndarray, W_up: np.ndarray, W_down: np.ndarray) -> tuple[np.ndarray, dict]:
    """Gated SiLU MLP: ``G = X W_gate``, ``U = X W_up``, ``H = SiLU(G) ⊙ U``, ``Y = H W_down``.

    Args:
        X: n × d. W_gate: d × f. W_up: d × f. W_down: f × d_out (d_out = d in a transformer block).
            All floating NumPy arrays of one dtype. (``nn.Linear.weight`` is the transpose: out × in.)

    Returns:
        ``(Y, cache)``: Y is n × d_out; ``cache`` holds X, the three weights, G, U, S = SiLU(G) and H for
        :func:`mlp_backward`.

    Raises:
        MLPShapeError: an argument is not 2-D or its shape does not fit (names it, expected vs actual).
        MLPDtypeError: non-float, non-NumPy or mixed dtypes.
        MLPValueError: a NaN or inf entry in X or a weight (named).

    Source: Shazeer 2020 (arXiv:2002.05202); transformers ``LlamaMLP.forward``.
    """
    _check_arrays(X=X, W_gate=W_gate, W_up=W_up, W_down=W_down)
    n, d = X.shape
    for name, W in (("W_gate", W_gate), ("W_up", W_up)):
        if W.shape[0] != d:
            hint = " (transposed? nn.Linear stores weights as out × in)" if W.shape[1] == d else ""
            raise MLPShapeError(
                f"{name} must have {d} rows (d × f, d = X.shape[1]; X has shape {X.shape}), got shape {W.shape}{hint}."
            )
    f = W_gate.shape[1]
    _expect("W_up", W_up.shape, (d, f), "d × f, the shape of W_gate")
    if W_down.shape[0] != f:
        hint = " (transposed? nn.Linear stores weights as out × in)" if W_down.shape[1] == f else ""
        raise MLPShapeError(
            f"W_down must have {f} rows (f × d_out, f = W_gate.shape[1]), got shape {W_down.shape}{hint}."
        )
    _check_finite(X=X, W_gate=W_gate, W_up=W_up, W_down=W_down)
    G = X @ W_gate
    U = X @ W_up
    H, sw = swiglu_forward(G, U)
    Y = H @ W_down
    return Y, {"X": X, "W_gate": W_gate, "W_up": W_up, "W_down": W_down, "G": G, "U": U, "S": sw["S"], "H": H}


def mlp_backward(dY: np.ndarray, cache: dict) -> dict[str, np.ndarray]:
    """Backward of :func:`mlp_forward` from ``dY = dL/dY`` (n × d_out).

    Returns a dict with
        ``dW_down = Hᵀ dY`` (f × d_out), then ``dH = dY W_downᵀ`` and ``(dG, dU)`` from
        :func:`swiglu_backward`, ``dW_gate = Xᵀ dG`` (d × f), ``dW_up = Xᵀ dU`` (d × f) and
        ``dX = dG W_gateᵀ + dU W_upᵀ`` (n × d): X feeds both the gate and the up projection, so the two
        branches' gradients add.
    Keys: ``"dX"``, ``"dW_gate"``, ``"dW_up"``, ``"dW_down"``; each shaped like its tensor.

    Raises MLPShapeError if dY is not n × d_out; MLPDtypeError as :func:`mlp_forward`.
    Source: chain rule through :func:`mlp_forward` (CS231n layer convention).
    """
    X, W_gate, W_up, W_down, H = (cache[k] for k in ("X", "W_gate", "W_up", "W_down", "H"))
    _check_arrays(dY=dY, X=X)
    _expect("dY", dY.shape, (X.shape[0], W_down.shape[1]), "n × d_out, the shape of Y")
    dW_down = H.T @ dY
    dH = dY @ W_down.T
    dG, dU = swiglu_backward(dH, {k: cache[k] for k in ("G", "U", "S") if k in cache})
    return {
        "dX": dG @ W_gate.T + dU @ W_up.T,
        "dW_gate": X.T @ dG,
        "dW_up": X.T @ dU,
        "dW_down": dW_down,
    }


def mlp_param_count(d: int, f: int) -> int:
    """Weights of one gated MLP without biases: ``3 d f`` (gate d × f, up d × f, down f × d).

    Example: SmolLM2-135M (d = 576, f = 1536) has 2,654,208 per layer. Raises ValueError for a
    non-positive or non-integer size.
    """
    for name, v in {"d": d, "f": f}.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}.")
    return 3 * int(d) * int(f)
