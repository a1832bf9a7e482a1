"""The rank-one walk: one adapted projection used as a two-class classifier, trained step by step.

This module holds the reference kernels of lesson 06 and a function that runs the walk and records
every quantity of every step::

    1. Z = X A,  Y = X W + s Z B,  p = softmax(Y),  L = −log p[target]
    2. D = ∂L/∂Y = p − onehot(target)                         (one row; rows are averaged otherwise)
    3. ∇B = s Zᵀ D
    4. dZ = s D Bᵀ
    5. ∇A = Xᵀ dZ
    6. ∇X = D Wᵀ + dZ Aᵀ
    7. update A and B with the optimizer (W stays frozen; X is not a parameter)
    8. recompute the loss (training-example loss, not held-out quality)

Steps 1 and 3–6 are :func:`coursekit.lora.lora_forward` / :func:`coursekit.lora.lora_backward`.

Conventions: row vectors (X is n × d, W d × m, A d × r, B r × m, Y n × m); NumPy float64 arrays;
``target`` holds class indices, one per row of Y. Bad input raises ``ValueError`` (wrong shape or
value, naming the argument and expected vs actual) or ``TypeError`` (not a floating array).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import lora

__all__ = [
    "EIGHT_STEPS",
    "softmax",
    "log_softmax",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "softmax_backward",
    "log_softmax_backward",
    "AdamWState",
    "adamw_step",
    "sgd_step",
    "worked_example",
    "StepRecord",
    "run_walk",
    "format_record",
    "Page",
    "walk_pages",
    "page_html",
    "step_through",
]

EIGHT_STEPS = (
    "logits and cross-entropy for the target class",
    "D = softmax(Y) − onehot(target)",
    "∇B = s Zᵀ D",
    "dZ = s D Bᵀ",
    "∇A = Xᵀ dZ",
    "∇X = D Wᵀ + dZ Aᵀ (both input paths add)",
    "update A and B with the optimizer; W stays frozen",
    "recompute the loss (training example, not held-out quality)",
)


# --------------------------------------------------------------------------- input checks


def _float_array(name: str, x: Any, ndim: int | None = None) -> np.ndarray:
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise TypeError(
            f"{name} must be a floating NumPy array, got {type(x).__name__}"
            f"{' of dtype ' + str(x.dtype) if hasattr(x, 'dtype') else ''}; use np.asarray(..., dtype=np.float64)."
        )
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}.")
    return x


def _finite(**arrays: np.ndarray) -> None:
    for name, a in arrays.items():
        bad = lora.nonfinite_entry(name, a)
        if bad:
            raise ValueError(f"{bad}; an optimizer step with it would make the parameter NaN or inf. "
                             f"Look where {name} was computed.")


def _number(name: str, v: Any, meaning: str) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number ({meaning}), got {type(v).__name__} {v!r}.")
    return float(v)


def _hyper(name: str, v: Any, meaning: str, positive: bool = False) -> float:
    """v is one finite real number ≥ 0 (> 0 with positive=True); returns it as a float."""
    v = _number(name, v, meaning)
    if not (np.isfinite(v) and (v > 0 if positive else v >= 0)):
        raise ValueError(f"{name} must be a finite {'positive' if positive else 'non-negative'} number ({meaning}), "
                         f"got {v!r}.")
    return v


def _betas(betas: Any) -> tuple[float, float]:
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise TypeError(f"betas must be a pair (beta1, beta2), e.g. (0.9, 0.999), got {betas!r}.")
    b1, b2 = (_number(f"beta{k}", b, "a moment's decay rate") for k, b in enumerate(betas, 1))
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"betas must lie in [0, 1), got {tuple(betas)}; at 1 a moment would never forget, "
                         f"and the bias correction would divide by 0.")
    return b1, b2


def _targets(target: Any, n: int, m: int) -> np.ndarray:
    t = np.atleast_1d(np.asarray(target))
    if t.dtype == bool or not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"target must hold integer class indices, got {t.dtype} {np.asarray(target)!r}.")
    if t.shape != (n,):
        raise ValueError(f"target must hold one class index per row of Y: expected shape ({n},), got {t.shape}.")
    if np.any((t < 0) | (t >= m)):
        raise ValueError(f"target indices must lie in [0, {m}) (Y has {m} classes), got {t.tolist()}.")
    return t.astype(np.int64)


# --------------------------------------------------------------------------- softmax and cross-entropy


def softmax(Y: np.ndarray) -> np.ndarray:
    """Row-wise softmax ``p[i, j] = exp(Y[i, j] − max_j Y[i]) / Σ_k exp(Y[i, k] − max_j Y[i])``.

    Y: n × m floating array (any float dtype; the result has Y's dtype). Subtracting the row maximum
    changes nothing mathematically and keeps ``exp`` from overflowing for large logits.
    Raises TypeError (not a floating array) or ValueError (not 2-D).
    """
    Y = _float_array("Y", Y, 2)
    e = np.exp(Y - Y.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def log_softmax(Y: np.ndarray) -> np.ndarray:
    """Row-wise ``log softmax(Y) = Y − max − log Σ exp(Y − max)`` (n × m, stable for large logits)."""
    Y = _float_array("Y", Y, 2)
    shifted = Y - Y.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def cross_entropy_forward(Y: np.ndarray, target: Any) -> tuple[float, dict]:
    """Mean cross-entropy of logits ``Y`` (n × m) against class indices ``target`` (n ints).

    ``L = −(1/n) Σ_i log softmax(Y)[i, target[i]]`` (PyTorch ``F.cross_entropy`` with its default
    ``reduction="mean"``; lesson 04). Returns ``(L, cache)``, L a Python float, cache holding
    ``p`` (n × m probabilities) and the targets for :func:`cross_entropy_backward`.

    Raises TypeError / ValueError for a non-floating or non-2-D Y, or targets of the wrong count or range.
    """
    Y = _float_array("Y", Y, 2)
    n, m = Y.shape
    t = _targets(target, n, m)
    logp = log_softmax(Y)
    loss = float(-logp[np.arange(n), t].mean())
    return loss, {"p": np.exp(logp), "target": t}


def cross_entropy_backward(cache: dict) -> np.ndarray:
    """``D = ∂L/∂Y = (softmax(Y) − onehot(target)) / n`` (n × m), from :func:`cross_entropy_forward`'s cache.

    For a single row (n = 1) this is the walk's ``D = p − onehot(target)``. Derivation: the log-softmax
    rule of :func:`log_softmax_backward` with upstream ``g = −onehot / n``.
    """
    p, t = cache["p"], cache["target"]
    n = p.shape[0]
    D = p.copy()
    D[np.arange(n), t] -= 1.0
    return D / n


def softmax_backward(g: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Vector–Jacobian product of ``p = softmax(x)`` (row-wise): ``dx = p ⊙ (g − Σ_j g_j p_j)``.

    g: upstream gradient ∂L/∂p, n × m. p: the softmax output, n × m (pass p, not x). Returns n × m.
    The Jacobian is diag(p) − p pᵀ per row; the row sum broadcasts across the row (lesson 08's
    attention rule dS = P ⊙ (dP − rowsum(dP ⊙ P))). Raises ValueError if the shapes differ.
    """
    g, p = _float_array("g", g, 2), _float_array("p", p, 2)
    if g.shape != p.shape:
        raise ValueError(f"g must have the shape of p {p.shape} (one upstream entry per probability), got {g.shape}.")
    return p * (g - (g * p).sum(axis=1, keepdims=True))


def log_softmax_backward(g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Vector–Jacobian product of ``log_softmax(x)`` (row-wise): ``dx = g − softmax(x) Σ_j g_j``.

    g: upstream gradient ∂L/∂(log_softmax(x)), n × m. x: the input logits, n × m. Returns n × m.
    The Jacobian of log softmax is I − 1 pᵀ per row. Example: x = [0.1, 0.9], g = [1, 1] gives
    [0.3799, −0.3799] (4 d.p.). Raises ValueError if the shapes differ.
    """
    g, x = _float_array("g", g, 2), _float_array("x", x, 2)
    if g.shape != x.shape:
        raise ValueError(f"g must have the shape of x {x.shape}, got {g.shape}.")
    return g - softmax(x) * g.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------- optimizers


@dataclass
class AdamWState:
    """What AdamW owns for one parameter: first moment ``m``, second moment ``v`` (both shaped like the
    parameter, zeros before the first step) and the number of steps taken ``t``."""

    m: np.ndarray
    v: np.ndarray
    t: int = 0

    @classmethod
    def zeros_like(cls, param: np.ndarray) -> "AdamWState":
        return cls(np.zeros_like(param), np.zeros_like(param), 0)


def adamw_step(param: np.ndarray, grad: np.ndarray, state: AdamWState, lr: float = 1e-3,
               betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 1e-2) -> tuple[np.ndarray, AdamWState]:
    """One AdamW step for one parameter; returns ``(new_param, new_state)`` and changes neither input.

    With t = state.t + 1 (the algorithm of ``torch.optim.AdamW``, defaults included; Loshchilov & Hutter,
    *Decoupled Weight Decay Regularization*, arXiv:1711.05101, Algorithm 2)::

        θ ← θ (1 − lr·λ)                       decoupled decay: not added to the gradient
        m ← β₁ m + (1 − β₁) g
        v ← β₂ v + (1 − β₂) g²
        m̂ = m / (1 − β₁ᵗ),  v̂ = v / (1 − β₂ᵗ)    bias correction
        θ ← θ − lr m̂ / (√v̂ + ε)                  ε outside the square root

    param, grad: float arrays of one shape (any shape), finite. lr ≥ 0, eps > 0, 0 ≤ β < 1,
    weight_decay ≥ 0, all finite numbers. state: an :class:`AdamWState` shaped like param.
    Raises TypeError (not floating arrays, a hyperparameter that is not a number, betas not a pair, state
    not an AdamWState) or ValueError (shapes differ, a NaN/inf entry — named — or a hyperparameter out of range).
    """
    param, grad = _float_array("param", param), _float_array("grad", grad)
    if grad.shape != param.shape:
        raise ValueError(f"grad must have the shape of param {param.shape}, got {grad.shape}.")
    if not isinstance(state, AdamWState):
        raise TypeError(f"state must be an AdamWState (AdamWState.zeros_like(param) before the first step), got {type(state).__name__}.")
    if state.m.shape != param.shape or state.v.shape != param.shape:
        raise ValueError(f"state.m and state.v must have the shape of param {param.shape}, got {state.m.shape} and {state.v.shape}.")
    b1, b2 = _betas(betas)
    lr = _hyper("lr", lr, "the learning rate")
    eps = _hyper("eps", eps, "added to √v̂ so the step never divides by 0", positive=True)
    weight_decay = _hyper("weight_decay", weight_decay, "the decoupled decay λ")
    _finite(param=param, grad=grad)
    t = state.t + 1
    theta = param * (1.0 - lr * weight_decay)
    m = b1 * state.m + (1.0 - b1) * grad
    v = b2 * state.v + (1.0 - b2) * grad * grad
    m_hat = m / (1.0 - b1**t)
    v_hat = v / (1.0 - b2**t)
    theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
    return theta, AdamWState(m, v, t)


def sgd_step(param: np.ndarray, grad: np.ndarray, lr: float, weight_decay: float = 0.0) -> np.ndarray:
    """Plain SGD, ``θ − lr (g + λ θ)``, as ``torch.optim.SGD`` without momentum (its weight decay is
    coupled: added to the gradient). param, grad: float arrays of one shape. Returns a new array.
    lr, weight_decay: finite numbers ≥ 0. Raises TypeError / ValueError as :func:`adamw_step`."""
    param, grad = _float_array("param", param), _float_array("grad", grad)
    if grad.shape != param.shape:
        raise ValueError(f"grad must have the shape of param {param.shape}, got {grad.shape}.")
    lr = _hyper("lr", lr, "the learning rate")
    weight_decay = _hyper("weight_decay", weight_decay, "SGD's coupled decay λ")
    _finite(param=param, grad=grad)
    return param - lr * (grad + weight_decay * param)


# --------------------------------------------------------------------------- the walk


def worked_example() -> dict:
    """Lesson 06's worked walk: X = [1, 2], A = [0.1, −0.2]ᵀ, B = [0, 0],
    W = [[0.63, −0.47], [0.28, 0.91]], s = 1 (r = lora_alpha = 1), target class 1. Fresh float64 arrays."""
    return dict(
        X=np.array([[1.0, 2.0]]),
        W=np.array([[0.63, -0.47], [0.28, 0.91]]),
        A=np.array([[0.1], [-0.2]]),
        B=np.zeros((1, 2)),
        s=1.0,
        target=1,
    )


@dataclass
class StepRecord:
    """Every quantity of one training step of the walk. Tensors are float64 copies.

    ``A``, ``B`` are the factors this step's forward and backward used; ``A_after``, ``B_after`` the
    optimizer's result; ``loss_after`` step 8's recomputed loss. Shapes: X 1 × d (or n × d), Z n × r,
    Y, p, D n × m, dA like A, dB like B, dX like X.
    """

    step: int
    optimizer: str
    A: np.ndarray
    B: np.ndarray
    Z: np.ndarray
    Y: np.ndarray
    p: np.ndarray
    loss: float
    D: np.ndarray
    dB: np.ndarray
    dZ: np.ndarray
    dA: np.ndarray
    dX: np.ndarray
    A_after: np.ndarray
    B_after: np.ndarray
    loss_after: float
    hyper: dict = field(default_factory=dict)


def run_walk(X: np.ndarray, W: np.ndarray, A: np.ndarray, B: np.ndarray, s: float, target: Any,
             steps: int = 2, optimizer: str = "adamw", lr: float | None = None,
             betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
             weight_decay: float = 0.0) -> list[StepRecord]:
    """Run ``steps`` training steps of the walk and return one :class:`StepRecord` per step.

    Each step does the eight steps of :data:`EIGHT_STEPS`: forward with :func:`coursekit.lora.lora_forward`,
    mean cross-entropy, ``D`` from :func:`cross_entropy_backward`, ``(dX, dA, dB)`` from
    :func:`coursekit.lora.lora_backward` (with this step's B: the update waits until backward is done),
    then one optimizer update of A and B only, then the loss again. W is never changed.

    Args:
        X (n × d), W (d × m), A (d × r), B (r × m): float64 arrays (not modified). s: the adapter scale.
        target: class index (int) or n indices. steps: ≥ 1.
        optimizer: ``"adamw"`` (one :class:`AdamWState` per factor, kept across steps, as one
            ``torch.optim.AdamW`` instance would) or ``"sgd"``. lr: default 0.01 for AdamW and 0.1 for
            SGD (lesson 06's settings). betas, eps: AdamW only. weight_decay: AdamW's decoupled decay,
            or SGD's coupled one; lesson 06 uses 0.

    Raises ValueError / TypeError for bad shapes, targets, step counts or optimizer names
    (:mod:`coursekit.lora` errors are ValueError / TypeError subclasses).
    """
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}.")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}.")
    for name, a in dict(X=X, W=W, A=A, B=B).items():
        _float_array(name, a, 2)
    lr = (0.01 if optimizer == "adamw" else 0.1) if lr is None else _hyper("lr", lr, "the learning rate")
    hyper = dict(lr=lr, weight_decay=weight_decay) | (dict(betas=tuple(betas), eps=eps) if optimizer == "adamw" else {})
    A, B = A.copy(), B.copy()
    states = (AdamWState.zeros_like(A), AdamWState.zeros_like(B))
    records = []
    for step in range(1, int(steps) + 1):
        Y, cache = lora.lora_forward(X, W, A, B, s)
        loss, ce = cross_entropy_forward(Y, np.full(X.shape[0], target) if np.ndim(target) == 0 else target)
        D = cross_entropy_backward(ce)
        dX, dA, dB = lora.lora_backward(D, cache)
        dZ = s * (D @ B.T)
        if optimizer == "adamw":
            A_new, sa = adamw_step(A, dA, states[0], lr, betas, eps, weight_decay)
            B_new, sb = adamw_step(B, dB, states[1], lr, betas, eps, weight_decay)
            states = (sa, sb)
        else:
            A_new, B_new = sgd_step(A, dA, lr, weight_decay), sgd_step(B, dB, lr, weight_decay)
        Y_after, _ = lora.lora_forward(X, W, A_new, B_new, s)
        loss_after, _ = cross_entropy_forward(Y_after, ce["target"])
        records.append(StepRecord(step, optimizer, A, B, cache["Z"].copy(), Y.copy(), ce["p"], loss, D, dB, dZ, dA, dX,
                                  A_new, B_new, loss_after, dict(hyper)))
        A, B = A_new, B_new
    return records


# --------------------------------------------------------------------------- showing the walk


def _fmt(a: np.ndarray) -> str:
    return np.array2string(np.asarray(a, dtype=np.float64), precision=6, suppress_small=True, floatmode="fixed",
                           separator=", ", max_line_width=100)


def format_record(rec: StepRecord) -> str:
    """A plain-text summary of one training step (lesson 06's printout, 6 decimals)."""
    return "\n".join([
        f"step {rec.step} ({rec.optimizer}): loss before = {rec.loss:.6f}",
        f"  Z  = {_fmt(rec.Z)}   Y = {_fmt(rec.Y)}   p = {_fmt(rec.p)}",
        f"  D  = {_fmt(rec.D)}",
        f"  dA = {_fmt(rec.dA.ravel())}   dB = {_fmt(rec.dB)}   dX = {_fmt(rec.dX)}",
        f"  A after = {_fmt(rec.A_after.ravel())}   B after = {_fmt(rec.B_after)}",
        f"  loss after = {rec.loss_after:.6f}",
    ])


@dataclass(frozen=True)
class Page:
    """One page of the step-through: ``title`` (which training step, which of the eight steps), the ``tensors``
    that step computes or uses, each ``(name, values, before)`` with ``before`` the values this step replaced
    (None when the step does not change that tensor), and a one-line ``note``."""

    title: str
    tensors: tuple[tuple[str, np.ndarray, np.ndarray | None], ...]
    note: str = ""

    @property
    def text(self) -> str:
        """The page as plain text: each tensor with its shape (``before → after`` for a changed one), then the note."""
        lines = []
        for name, values, before in self.tensors:
            shape = " × ".join(map(str, np.shape(values)))
            shown = _fmt(values) if before is None else f"{_fmt(before)} → {_fmt(values)}"
            lines.append(f"{name} ({shape}) = {shown}")
        return "\n".join(lines + ([self.note] if self.note else []))


def walk_pages(records: Sequence[StepRecord]) -> list[Page]:
    """The step-through's pages: for every training step, the eight steps of :data:`EIGHT_STEPS`, each a
    :class:`Page` holding that step's matrices. ``len(pages) == 8 * len(records)``. Raises ValueError for no records."""
    if not records:
        raise ValueError("records must hold at least one StepRecord (run run_walk first).")
    pages = []
    for rec in records:
        steps = [
            ((("A", rec.A, None), ("B", rec.B, None), ("Z = X A", rec.Z, None), ("Y = X W + s Z B", rec.Y, None),
              ("p = softmax(Y)", rec.p, None)), f"loss = −log p[target] = {rec.loss:.6f}"),
            ((("p", rec.p, None), ("D = p − onehot", rec.D, None)), "D is the loss's gradient with respect to Y."),
            ((("Zᵀ", rec.Z.T, None), ("D", rec.D, None), ("∇B = s Zᵀ D", rec.dB, None)),
             "∇B has B's shape: one entry per entry of B."),
            ((("D", rec.D, None), ("Bᵀ", rec.B.T, None), ("dZ = s D Bᵀ", rec.dZ, None)),
             "B is still zero, so dZ is zero: the gradient cannot reach A yet." if not rec.B.any()
             else "dZ uses this step's B, before the update."),
            ((("dZ", rec.dZ, None), ("∇A = Xᵀ dZ", rec.dA, None)),
             "∇A has A's shape; it is zero while dZ is." if not rec.dA.any() else "∇A has A's shape."),
            ((("∇X = D Wᵀ + dZ Aᵀ", rec.dX, None),), "Both paths into X add: through W and through the adapter."),
            ((("A", rec.A_after, rec.A), ("B", rec.B_after, rec.B)),
             f"{rec.optimizer}: " + ", ".join(f"{k} = {v}" for k, v in rec.hyper.items())
             + "; W is frozen and does not change."),
            ((), f"loss: {rec.loss:.6f} → {rec.loss_after:.6f} (on the training example)"),
        ]
        for k, (title, (tensors, note)) in enumerate(zip(EIGHT_STEPS, steps), 1):
            pages.append(Page(f"training step {rec.step} ({rec.optimizer}) · {k}/8: {title}", tensors, note))
    return pages


#: The step-through's tensor area, in CSS: the same height on every page (it scrolls if a page needs more).
STEP_THROUGH_HEIGHT = "15em"

_CELL = "padding:2px 7px;border:1px solid #bbb;text-align:right;font-family:monospace"


def _matrix_html(name: str, values: np.ndarray, before: np.ndarray | None) -> str:
    """One tensor as an HTML table under its name and shape; with ``before``, both tables and the changed entries
    shaded."""
    def table(a: np.ndarray, changed: np.ndarray | None) -> str:
        a = np.atleast_2d(np.asarray(a, dtype=np.float64))
        rows = []
        for i, row in enumerate(a):
            cells = []
            for j, v in enumerate(row):
                shade = ";background:#ffe58f" if changed is not None and changed[i, j] else ""
                cells.append(f'<td style="{_CELL}{shade}">{v:.6f}</td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")
        return '<table style="border-collapse:collapse;display:inline-table;vertical-align:middle">' + "".join(rows) + "</table>"

    shape = " × ".join(map(str, np.shape(values)))
    head = f'<div style="font-family:monospace;margin-bottom:2px">{html.escape(name)} <span style="color:#666">({shape})</span></div>'
    if before is None:
        body = table(values, None)
    else:
        changed = np.atleast_2d(np.asarray(values) != np.asarray(before))
        body = table(before, None) + '<span style="margin:0 8px">→</span>' + table(values, changed)
    return f'<div style="display:inline-block;vertical-align:top;margin:0 18px 10px 0">{head}{body}</div>'


def page_html(page: Page) -> str:
    """A :class:`Page` as the HTML the step-through shows: its matrices side by side, then its note."""
    parts = [_matrix_html(*t) for t in page.tensors]
    note = f'<div style="margin-top:4px">{html.escape(page.note)}</div>' if page.note else ""
    return "<div>" + "".join(parts) + "</div>" + note


def step_through(records: Sequence[StepRecord]):
    """An ipywidgets step-through of :func:`walk_pages`: Previous / Next buttons, a label naming the step and an
    HTML area (fixed height :data:`STEP_THROUGH_HEIGHT`) showing that step's matrices with their shapes; on the
    update page the entries that changed are shaded. The index clamps at the first and last page (the buttons
    disable there). Returns an ``ipywidgets.VBox`` with attributes ``prev``, ``next``, ``label``, ``out``,
    ``pages`` and ``index`` (an int). Creating it needs no browser; the notebook prints the same numbers statically.
    """
    import ipywidgets as widgets

    pages = walk_pages(records)
    prev = widgets.Button(description="◀ Previous")
    nxt = widgets.Button(description="Next ▶")
    label = widgets.Label()
    out = widgets.HTML(layout=widgets.Layout(height=STEP_THROUGH_HEIGHT, overflow="auto"))
    box = widgets.VBox([widgets.HBox([prev, nxt, label]), out])
    box.prev, box.next, box.label, box.out, box.pages, box.index = prev, nxt, label, out, pages, 0
    box.add_class("coursekit-step-through")

    def show(i: int) -> None:
        box.index = max(0, min(len(pages) - 1, i))
        page = pages[box.index]
        label.value = f"{box.index + 1}/{len(pages)} · {page.title}"
        out.value = page_html(page)
        prev.disabled = box.index == 0
        nxt.disabled = box.index == len(pages) - 1

    prev.on_click(lambda _b: show(box.index - 1))
    nxt.on_click(lambda _b: show(box.index + 1))
    show(0)
    return box
