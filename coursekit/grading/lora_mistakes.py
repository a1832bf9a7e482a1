"""The classic mistakes in LoRA kernels, as the wrong values they produce.

Each function takes the keyword arguments of one test case and returns, per output name, a list of
:class:`~coursekit.grading.checkers.Mistake`: the value a specific mistake would give, the message
that names it (quoting the case's numbers) and a hint that says the same without them (what a hidden
case shows: its inputs stay hidden). The checker compares a wrong answer with each and reports the first that matches.
Arguments use the row-vector convention of :mod:`coursekit.lora` (X n×d, W d×m, A d×r, B r×m) and
either ``s`` or ``lora_alpha`` and ``r``.
"""

from __future__ import annotations

import math

import numpy as np

from .checkers import Mistake, as_array

SEE_SCALE = "(Lesson 02, 'The scale s'.)"


def _scale(kw: dict) -> tuple[float, list[tuple[str, float, str, str]]]:
    """The right s, and the wrong scales students use instead: (label, wrong scale, message with the case's
    numbers, hint without them)."""
    if "s" in kw:
        s = float(kw["s"])
        return s, [("missing s", 1.0, f"the scale s is missing: the adapter path must be multiplied by s = {s:g}. {SEE_SCALE}",
                    f"the scale s is missing: the adapter path must be multiplied by s. {SEE_SCALE}")]
    a, r = float(kw["lora_alpha"]), int(kw["r"])
    s = a / r
    wrong = [
        ("missing s", 1.0, f"the scale is missing: multiply the adapter path by s = lora_alpha / r = {s:g}. {SEE_SCALE}",
         f"the scale is missing: multiply the adapter path by s = lora_alpha / r. {SEE_SCALE}"),
        ("alpha", a, f"you scaled by lora_alpha = {a:g} instead of s = lora_alpha / r = {s:g}. {SEE_SCALE}",
         f"you scaled by lora_alpha instead of s = lora_alpha / r. {SEE_SCALE}"),
        ("r/alpha", r / a, f"you scaled by r / lora_alpha = {r / a:g}; the scale is lora_alpha / r = {s:g}. {SEE_SCALE}",
         f"you scaled by r / lora_alpha; the scale is lora_alpha / r. {SEE_SCALE}"),
        ("floor", float(a // r), f"you divided with // (integer division): lora_alpha // r = {a // r:g}, but s = lora_alpha / r = {s:g}. {SEE_SCALE}",
         f"you divided with // (integer division), which drops the fraction; s = lora_alpha / r. {SEE_SCALE}"),
        ("rslora", a / math.sqrt(r), f"you used the rsLoRA scale lora_alpha / sqrt(r) = {a / math.sqrt(r):g}; plain LoRA uses lora_alpha / r = {s:g}. {SEE_SCALE}",
         f"you used the rsLoRA scale lora_alpha / sqrt(r); plain LoRA uses lora_alpha / r. {SEE_SCALE}"),
    ]
    return s, [w for w in wrong if not math.isclose(w[1], s)]


def forward_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    """Wrong values of ``Y = XW + s(XA)B``."""
    X, W, A, B = (np.asarray(kw[k], dtype=np.float64) for k in ("X", "W", "A", "B"))
    s, wrong_scales = _scale(kw)
    base, adapter = X @ W, (X @ A) @ B
    out = [Mistake(label, base + c * adapter, msg, hint) for label, c, msg, hint in wrong_scales]
    out += [
        Mistake("no base", s * adapter, "your Y has only the adapter path: add the frozen base output X @ W."),
        Mistake("no adapter", base, "your Y is the base output X @ W alone: add the adapter path s (X A) B."),
        Mistake("transposed", (base + s * adapter).T, "your Y is transposed: in the row-vector convention Y is n × m (one row per token)."),
    ]
    if B.shape[0] == B.shape[1]:
        out.append(Mistake("B.T", base + s * (X @ A) @ B.T, "you used Bᵀ where B belongs: B is r × m and multiplies (XA) from the right."))
    return {"Y": out, "result": out}


def merge_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    """Wrong values of ``W + s A B``."""
    W, A, B = (np.asarray(kw[k], dtype=np.float64) for k in ("W", "A", "B"))
    s, wrong_scales = _scale(kw)
    out = [Mistake(label, W + c * (A @ B), msg, hint) for label, c, msg, hint in wrong_scales]
    out += [
        Mistake("delta only", s * (A @ B), "you returned only the update s A B: the merged weight is W + s A B."),
        Mistake("transposed", (W + s * A @ B).T, "your merged weight is transposed: in the row-vector convention it is d × m, like W."),
    ]
    return {"W_merged": out, "result": out}


def torch_layout_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    """Wrong values of the PEFT-layout forward ``y = x weightᵀ + scaling (x lora_Aᵀ) lora_Bᵀ``.

    Arguments: x (n × d), weight (m × d), lora_A (r × d), lora_B (m × r), scaling.
    """
    x, Wt, At, Bt = (np.asarray(kw[k], dtype=np.float64) for k in ("x", "weight", "lora_A", "lora_B"))
    s = float(kw["scaling"])
    out = [
        Mistake("missing s", x @ Wt.T + (x @ At.T) @ Bt.T, f"the scaling ({s:g}) is missing from the adapter path.",
                "the scaling is missing from the adapter path."),
        Mistake("no base", s * (x @ At.T) @ Bt.T, "the base output x @ weight.T is missing."),
    ]
    if Bt.shape[0] == Bt.shape[1]:
        out.append(Mistake("B not transposed", x @ Wt.T + s * (x @ At.T) @ Bt,
                           "you used lora_B.weight as B without transposing it: nn.Linear stores out_features × in_features, so B = lora_B.weight.T."))
    if Wt.shape[0] == Wt.shape[1]:
        out.append(Mistake("W not transposed", x @ Wt + s * (x @ At.T) @ Bt.T,
                           "you used weight as W without transposing it: nn.Linear stores out_features × in_features, so W = weight.T."))
    return {"y": out, "result": out}


def backward_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    """Wrong values of ``(dX, dA, dB)`` for a forward pass with upstream gradient ``D``.

    Recognises: a missing or wrong scale in dB / dA / dX, the scale applied twice in dA / dX, a
    transposed dA, dB or dX, W or B used without its transpose (square cases only), the adapter
    path missing from dX, only the adapter path in dX, and dA computed with B already updated
    (B − η dB for the η that fits best, reported when it fits exactly).
    """
    X, W, A, B, D = (np.asarray(kw[k], dtype=np.float64) for k in ("X", "W", "A", "B", "D"))
    s, wrong_scales = _scale(kw)
    Z = X @ A
    dB = s * Z.T @ D
    dZ = s * D @ B.T
    dA = X.T @ dZ
    dX = D @ W.T + dZ @ A.T
    m_dB = [Mistake(l, c * Z.T @ D, "in ∇B = s Zᵀ D: " + msg, "in ∇B = s Zᵀ D: " + hint) for l, c, msg, hint in wrong_scales]
    m_dA = [Mistake(l, c * X.T @ D @ B.T, "in ∇A = s Xᵀ D Bᵀ: " + msg, "in ∇A = s Xᵀ D Bᵀ: " + hint)
            for l, c, msg, hint in wrong_scales]
    m_dX = [Mistake(l, D @ W.T + c * D @ B.T @ A.T, "in the adapter path of ∇X: " + msg, "in the adapter path of ∇X: " + hint)
            for l, c, msg, hint in wrong_scales]
    # s applied twice: dZ = s D Bᵀ already carries the scale, and it is multiplied in again.
    if not math.isclose(s * s, s) and not any(math.isclose(s * s, c) for _, c, _, _ in wrong_scales):
        why = ("dZ = s D Bᵀ already carries s, so ∇A = Xᵀ dZ and the adapter path dZ Aᵀ take no second factor s. "
               "(Lesson 05, 'The four gradients'.)")
        twice = f"the scale s = {s:g} is applied twice (s² = {s * s:g}): " + why
        twice_hint = "the scale s is applied twice (s²): " + why
        m_dA.append(Mistake("s twice", s * s * X.T @ D @ B.T, "in ∇A: " + twice, "in ∇A: " + twice_hint))
        m_dX.append(Mistake("s twice", D @ W.T + s * s * D @ B.T @ A.T, "in ∇X: " + twice, "in ∇X: " + twice_hint))
    if W.shape[0] == W.shape[1]:
        m_dX.append(Mistake("W not transposed", D @ W + dZ @ A.T,
                            "the base path of ∇X is D Wᵀ, not D W: W is d × m and maps X to Y, so the way back multiplies by Wᵀ."))
    if B.shape[0] == B.shape[1]:
        m_dA.append(Mistake("B not transposed", s * X.T @ D @ B,
                            "∇A needs dZ = s D Bᵀ: B maps Z to Y, so the gradient goes back through Bᵀ, not B."))
    m_dB.append(Mistake("transposed", dB.T, "your ∇B is transposed: ∇B has the shape of B (r × m), ∇B = s Zᵀ D."))
    m_dA.append(Mistake("transposed", dA.T, "your ∇A has the shape of Aᵀ: ∇A = Xᵀ dZ is d × r, like A."))
    flipped = ("the upstream gradient is D = ∂L/∂Y as given; each gradient is D carried back "
               "through the product it came from, with no minus sign. (Lesson 05, 'The four gradients'.)")
    m_dX.insert(0, Mistake("sign", -dX, "every entry of ∇X has the wrong sign: " + flipped))
    m_dA.insert(0, Mistake("sign", -dA, "every entry of ∇A has the wrong sign: " + flipped))
    m_dB.insert(0, Mistake("sign", -dB, "every entry of ∇B has the wrong sign: " + flipped))
    m_dX += [
        Mistake("no adapter path", D @ W.T, "∇X is missing the adapter path: X feeds both paths, so ∇X = D Wᵀ + dZ Aᵀ."),
        Mistake("no base path", dZ @ A.T, "∇X is missing the base path D Wᵀ: W is frozen, but it still passes gradient to X."),
        Mistake("transposed", dX.T, "your ∇X is transposed: it has the shape of X (n × d)."),
    ]
    # B updated before computing dA: dA' = s Xᵀ D (B − η dB)ᵀ = dA − η s Xᵀ D dBᵀ.
    direction = s * X.T @ D @ dB.T
    # as_array: the student's dA may be anything (a tensor that requires grad, a ragged list).
    # Named only when it is the mistake made: ∇B and ∇X are right (the update came after them), the fitted
    # step is a plausible learning rate, and ∇A is off by more than its dtype's rounding.
    got = got or {}
    g = as_array(got.get("dA"))
    others_right = all(_close(got.get(k), want) for k, want in (("dB", dB), ("dX", dX)))
    if (g is not None and g.shape == dA.shape and np.all(np.isfinite(g)) and np.any(direction) and others_right
            and _beyond_rounding(got.get("dA"), g, dA)):
        eta = float(np.sum((dA - g) * direction) / np.sum(direction * direction))
        if 1e-5 <= eta <= 10 and np.allclose(g, dA - eta * direction, rtol=1e-6, atol=1e-9):
            then = ("finish the backward pass with this step's B, then update. (Lesson 05, 'The four gradients'; "
                    "lesson 06 walks the order step by step.)")
            # With one token and r = 1 every multiple of dA fits some η: a wrong scale that gives the same numbers is
            # as likely, and the feedback says both rather than guess (the other cases tell them apart).
            same = [m for m in m_dA if m.label != "sign" and np.shape(m.value) == g.shape
                    and np.allclose(m.value, g, rtol=1e-6, atol=1e-9)]
            if same:
                m_dA.remove(same[0])
                def both(first: str) -> str:
                    return ("on this case two mistakes give exactly these numbers: " + first.rstrip(". ")
                            + "; or you computed ∇A with B already updated (B − η·∇B). Your other cases tell which one: " + then)

                m_dA.insert(0, Mistake(same[0].label + " or updated B", g, both(same[0].message), both(same[0].hint or same[0].message)))
            else:
                m_dA.append(Mistake("updated B", g, f"you computed ∇A with B already updated (B − {eta:g}·∇B): " + then,
                                    "you computed ∇A with B already updated (B − η·∇B for some step size η): " + then))
    return {"dX": m_dX, "dA": m_dA, "dB": m_dB}


def _close(got, want: np.ndarray) -> bool:
    a = as_array(got)
    return a is not None and a.shape == want.shape and bool(np.allclose(a, want, rtol=1e-6, atol=1e-9))


def _beyond_rounding(raw, g: np.ndarray, want: np.ndarray) -> bool:
    """Whether ``g`` differs from ``want`` by more than the rounding of the student's dtype (a float32 answer's
    rounding error must not be read as a mistake)."""
    dtype = getattr(raw, "dtype", np.float64)
    try:
        eps = float(np.finfo(np.dtype(str(dtype).removeprefix("torch."))).eps)
    except TypeError:
        eps = float(np.finfo(np.float64).eps)
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(g - want))) > 1000 * eps * scale
