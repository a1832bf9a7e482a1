"""Graded items of lesson 09, "Gated MLP backward"."""

from __future__ import annotations


import numpy as np

from ... import mlp
from ..checkers import Case, Mistake, worded
from .. import Choice, Function, Numeric

READ_SILU = "Reread 'SiLU and its slope' in Know this."
READ_MLP = "Reread 'The gated MLP' in Know this."
READ_GATE = "Reread 'Through the gate' in Know this and 'The gate, derived' after P2."
READ_BRANCH = "Reread 'Branches add' in Know this."
READ_RESID = "Reread 'Residuals pass the gradient to both operands' in Know this."
READ_LORA = "Reread 'Where LoRA fits' in Know this."
READ_COST = "Reread 'Through the gate', 'Branches add' and 'Where LoRA fits' in Know this."

# SmolLM2-135M's MLP (config.json of the embedded checkpoint: hidden_size, intermediate_size).
SMOL_D, SMOL_F = 576, 1536


# --------------------------------------------------------------------------- references (coursekit.mlp)


def swish_grad_ref(x, beta):
    """Reference for p1: the slope of swish_β(x) = x·σ(βx) = SiLU(βx)/β, which is SiLU′(βx)."""
    return mlp.silu_grad(float(beta) * np.asarray(x, dtype=np.float64))


def swiglu_backward_ref(dH, G, U):
    """Reference for p2: ``(dG, dU)`` of ``H = SiLU(G) ⊙ U``."""
    _, cache = mlp.swiglu_forward(G, U)
    return mlp.swiglu_backward(dH, cache)


def mlp_backward_ref(dY, X, W_gate, W_up, W_down):
    """Reference for p3: ``(dX, dW_gate, dW_up, dW_down)``."""
    _, cache = mlp.mlp_forward(X, W_gate, W_up, W_down)
    g = mlp.mlp_backward(dY, cache)
    return g["dX"], g["dW_gate"], g["dW_up"], g["dW_down"]


def residual_mlp_backward_ref(dY, X, W_gate, W_up, W_down):
    """``dX`` of one residual block ``Y = X + MLP(X)``: the skip path dY plus the MLP's dX (P6's rule)."""
    return dY + mlp_backward_ref(dY, X, W_gate, W_up, W_down)[0]


def _stack_inputs(X, W_gate, W_up, W_down) -> list[np.ndarray]:
    """The input of each block of the stack Z ← Z + MLP_l(Z), l = 0 … L−1, starting from Z = X."""
    Z, inputs = np.asarray(X, dtype=np.float64), []
    for Wg, Wu, Wd in zip(W_gate, W_up, W_down):
        inputs.append(Z)
        Z = Z + mlp.mlp_forward(Z, Wg, Wu, Wd)[0]
    return inputs


def _stack_backward(dY, X, W_gate, W_up, W_down, block_dX=None, skip=True, order="backward", upstream="chained",
                    at="own input"):
    """``dX`` of the stack, and of its classic wrong versions: ``block_dX(dZ, Z, Wg, Wu, Wd)`` is one MLP's dX (right by
    default); ``skip=False`` drops every residual; ``order="forward"`` runs the blocks from the first; ``upstream="dY"``
    hands dY to every block and adds their dX's; ``at="X"`` evaluates every block at the stack's input."""
    block_dX = block_dX or (lambda dZ, Z, Wg, Wu, Wd: mlp_backward_ref(dZ, Z, Wg, Wu, Wd)[0])
    dY = np.asarray(dY, dtype=np.float64)
    inputs = _stack_inputs(X, W_gate, W_up, W_down)
    if at == "X":
        inputs = [np.asarray(X, dtype=np.float64)] * len(inputs)
    blocks = list(range(len(inputs)))
    if upstream == "dY":
        return dY + sum(block_dX(dY, inputs[l], W_gate[l], W_up[l], W_down[l]) for l in blocks)
    dZ = dY
    for l in (blocks[::-1] if order == "backward" else blocks):
        dZ = (dZ if skip else 0.0) + block_dX(dZ, inputs[l], W_gate[l], W_up[l], W_down[l])
    return dZ


def residual_stack_backward_ref(dY, X, W_gate, W_up, W_down):
    """Reference for p4: ``dX`` of L residual MLP blocks in a row, weights stacked on a leading axis of length L."""
    return _stack_backward(dY, X, W_gate, W_up, W_down)


# --------------------------------------------------------------------------- known mistakes


def _sig(x):
    return mlp.sigmoid(np.asarray(x, dtype=np.float64))


# Every mistake message in this lesson quotes formulas only (σ(x)(1 − σ(x)), dH ⊙ U ⊙ SiLU′(G)), never a case's values
# or shapes: each is also its hint (checkers.worded), shown whole on hidden cases.


def _silu_grad_wrongs(x) -> list[tuple[str, np.ndarray, str]]:
    """Wrong SiLU′ formulas: (label, value, why)."""
    x = np.asarray(x, dtype=np.float64)
    s = _sig(x)
    return [
        ("sigma", s, "SiLU′ taken as σ(x): the product rule on x·σ(x) gives σ(x) + x·σ′(x); the second term is missing. " + READ_SILU),
        ("sigma'", s * (1 - s), "SiLU′ taken as σ′(x) = σ(x)(1 − σ(x)), the sigmoid's own derivative; SiLU′(x) = σ(x)(1 + x(1 − σ(x))). " + READ_SILU),
        ("silu", x * s, "that is SiLU(x) = x·σ(x) itself, not its derivative. " + READ_SILU),
        ("x sigma'", x * s * (1 - s), "only the second term x·σ′(x) of the product rule; add σ(x). " + READ_SILU),
        ("no sigma factor", 1 + x * (1 - s), "the factor σ(x) in front is missing: SiLU′(x) = σ(x)·(1 + x(1 − σ(x))). " + READ_SILU),
    ]


def swish_grad_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    """P1's wrong slopes of x·σ(βx), as the values they produce (at β = 1 three of them are the right slope)."""
    x, beta = np.asarray(kw["x"], dtype=np.float64), float(kw["beta"])
    u = beta * x
    s = _sig(u)
    right = mlp.silu_grad(u)
    ms = [
        Mistake("sigma", s, "the slope taken as σ(βx): the product rule on x·σ(βx) gives σ(βx) plus x times the slope of "
                "σ(βx); the second term is missing. " + READ_SILU),
        Mistake("sigma'", s * (1 - s), "the slope taken as σ(βx)(1 − σ(βx)), the sigmoid's own slope; the product rule on "
                "x·σ(βx) gives σ(βx)(1 + βx(1 − σ(βx))). " + READ_SILU),
        Mistake("silu", x * s, "that is swish_β(x) = x·σ(βx) itself, not its slope. " + READ_SILU),
        Mistake("no inner beta", s * (1 + x * (1 - s)), "the chain rule's β is missing: the slope of σ(βx) is "
                "β·σ(βx)(1 − σ(βx)), so the product rule gives σ(βx)(1 + βx(1 − σ(βx))). " + READ_SILU),
        Mistake("beta times", beta * right, "you multiplied SiLU′(βx) by β: x·σ(βx) = SiLU(βx)/β, so the chain rule's β "
                "cancels the 1/β, and the slope is SiLU′(βx) = σ(βx)(1 + βx(1 − σ(βx))). " + READ_SILU),
        Mistake("SiLU'(x)", mlp.silu_grad(x), "that is SiLU′(x), the slope of x·σ(x); with x·σ(βx) every σ takes βx and the "
                "chain rule brings a β: σ(βx)(1 + βx(1 − σ(βx))). " + READ_SILU),
        Mistake("no sigma factor", 1 + u * (1 - s), "the factor σ(βx) in front is missing: the slope is "
                "σ(βx)·(1 + βx(1 − σ(βx))). " + READ_SILU),
    ]
    ms = [m for m in ms if not np.allclose(m.value, right, rtol=1e-9, atol=1e-12)]
    return worded({"swish_grad(x)": ms})


def _gate_wrongs(dH, G, U) -> tuple[list, list]:
    """Wrong (dG, dU) values: lists of (label, value, why)."""
    S = mlp.silu(G)
    dG_wrong = [
        ("no U", dH * mlp.silu_grad(G), "dG is missing the factor U: H = SiLU(G) ⊙ U, so dG = dH ⊙ U ⊙ SiLU′(G). " + READ_GATE),
        ("no silu'", dH * U, "dG has no SiLU′(G): the gate goes through SiLU, so its local derivative SiLU′(G) multiplies in. " + READ_GATE),
        ("silu not silu'", dH * U * S, "dG uses SiLU(G) where SiLU′(G) belongs. " + READ_GATE),
        ("swapped", dH * S, "your dG is dH ⊙ SiLU(G), which is dU: did you swap the two outputs? " + READ_GATE),
    ]
    for label, v, why in _silu_grad_wrongs(G):
        if label in ("sigma", "sigma'", "no sigma factor"):
            dG_wrong.append((label, dH * U * v, "in dG = dH ⊙ U ⊙ SiLU′(G): " + why))
    dU_wrong = [
        ("G not silu", dH * G, "dU uses G where SiLU(G) belongs: U is multiplied by the activated gate SiLU(G), not by G. " + READ_GATE),
        ("silu'", dH * mlp.silu_grad(G), "dU uses SiLU′(G): U enters linearly, so its local derivative is the other factor, SiLU(G). " + READ_GATE),
        ("no factor", dH, "dU is missing the factor SiLU(G): dU = dH ⊙ SiLU(G). " + READ_GATE),
        ("swapped", dH * U * mlp.silu_grad(G), "your dU is dH ⊙ U ⊙ SiLU′(G), which is dG: did you swap the two outputs? " + READ_GATE),
    ]
    return dG_wrong, dU_wrong


def swiglu_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    dH, G, U = (np.asarray(kw[k], dtype=np.float64) for k in ("dH", "G", "U"))
    dG_wrong, dU_wrong = _gate_wrongs(dH, G, U)
    return worded({"dG": [Mistake(l, v, m) for l, v, m in dG_wrong], "dU": [Mistake(l, v, m) for l, v, m in dU_wrong]})


def _mlp_parts(kw: dict) -> dict:
    X, Wg, Wu, Wd, dY = (np.asarray(kw[k], dtype=np.float64) for k in ("X", "W_gate", "W_up", "W_down", "dY"))
    G, U = X @ Wg, X @ Wu
    S = mlp.silu(G)
    dH = dY @ Wd.T
    dG, dU = dH * U * mlp.silu_grad(G), dH * S
    return dict(X=X, Wg=Wg, Wu=Wu, Wd=Wd, dY=dY, G=G, U=U, S=S, dH=dH, dG=dG, dU=dU)


def _dX_wrongs(p: dict) -> list[tuple[str, np.ndarray, str]]:
    """Wrong MLP input gradients (without the residual)."""
    gate, up = p["dG"] @ p["Wg"].T, p["dU"] @ p["Wu"].T
    out = [
        ("gate only", gate, "dX has the gate branch dG W_gateᵀ only: X also feeds the up projection, so add dU W_upᵀ. " + READ_BRANCH),
        ("up only", up, "dX has the up branch dU W_upᵀ only (or the gate branch was overwritten by it: accumulate with +=, "
                        "don't assign twice): dX = dG W_gateᵀ + dU W_upᵀ. " + READ_BRANCH),
        ("averaged", (gate + up) / 2, "dX averages the two branches: gradients of a tensor used twice add, they are not averaged. " + READ_BRANCH),
    ]
    dG_wrong, dU_wrong = _gate_wrongs(p["dH"], p["G"], p["U"])
    out += [(l, dg @ p["Wg"].T + up, "in the gate branch of dX: " + m) for l, dg, m in dG_wrong if l != "swapped"]
    out += [(l, gate + du @ p["Wu"].T, "in the up branch of dX: " + m) for l, du, m in dU_wrong if l != "swapped"]
    return out


def mlp_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    p = _mlp_parts(kw)
    dG_wrong, dU_wrong = _gate_wrongs(p["dH"], p["G"], p["U"])
    m_dX = [Mistake(l, v, m) for l, v, m in _dX_wrongs(p)]
    m_dWg = [Mistake(l, p["X"].T @ dg, "in dW_gate = Xᵀ dG: " + m) for l, dg, m in dG_wrong]
    m_dWu = [Mistake(l, p["X"].T @ du, "in dW_up = Xᵀ dU: " + m) for l, du, m in dU_wrong]
    m_dWd = [
        Mistake("G for H", (p["G"] * p["U"]).T @ p["dY"],
                "dW_down = Hᵀ dY needs H = SiLU(G) ⊙ U; you used G ⊙ U (the gate without its activation). " + READ_MLP),
        Mistake("S for H", p["S"].T @ p["dY"], "dW_down = Hᵀ dY needs H = SiLU(G) ⊙ U; you used SiLU(G) alone. " + READ_MLP),
    ]
    return worded({"dX": m_dX, "dW_gate": m_dWg, "dW_up": m_dWu, "dW_down": m_dWd})


def residual_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    p = _mlp_parts(kw)
    full = p["dG"] @ p["Wg"].T + p["dU"] @ p["Wu"].T
    out = [
        Mistake("forgot residual", full, "you returned the MLP's dX only and forgot the residual: Y = X + MLP(X) passes dY "
                                         "to X directly as well, so dX = dY + (the MLP's dX). " + READ_RESID),
        Mistake("skip only", p["dY"], "you returned dY only, the skip path: the MLP's dX must be added to it. " + READ_RESID),
        Mistake("residual replaced", p["dY"] @ p["Wd"].T, "dY W_downᵀ is dH, the gradient at H inside the MLP, not at X. " + READ_RESID),
    ]
    out += [Mistake(l, p["dY"] + v, "in the MLP part of dX = dY + MLP's dX: " + m) for l, v, m in _dX_wrongs(p)]
    return worded({"dX": out})


def stack_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    """P4's wrong answers, each the value a stack built that way returns: slips in the stack itself, then one MLP's
    slip (P3's list, through the student's own mlp_backward) made in every block."""
    dY, X, Wg, Wu, Wd = (np.asarray(kw[k], dtype=np.float64) for k in ("dY", "X", "W_gate", "W_up", "W_down"))
    right = _stack_backward(dY, X, Wg, Wu, Wd)
    out = [
        Mistake("forgot residual", _stack_backward(dY, X, Wg, Wu, Wd, skip=False), "you passed the gradient through the "
                "MLPs only and forgot the residuals: each block Z + MLP(Z) hands its incoming gradient to Z directly as well, "
                "so going down a block is dZ ← dZ + (that block's MLP dX at its own input, for upstream dZ). " + READ_RESID),
        Mistake("skip only", dY, "you returned dY only, the skip paths: every block's MLP dX must be added on the way "
                "down. " + READ_RESID),
        Mistake("dY to every block", _stack_backward(dY, X, Wg, Wu, Wd, upstream="dY"), "you handed dY to every block and "
                "added their dX's: a lower block's upstream gradient is what reaches its output, dY plus everything the "
                "blocks above it added, not dY itself. Go down one block at a time, dZ ← dZ + MLP's dX for upstream dZ. "
                + READ_RESID),
        Mistake("first block first", _stack_backward(dY, X, Wg, Wu, Wd, order="forward"), "you went through the blocks in "
                "the forward order: the gradient arrives at the last block's output, so the backward starts at the last "
                "block and ends at the first. " + READ_RESID),
        Mistake("every block at X", _stack_backward(dY, X, Wg, Wu, Wd, at="X"), "you evaluated every block's backward at the "
                "stack's input X: block l reads Z_l, the output of the blocks below it, and its gradient (SiLU′(G), U, "
                "SiLU(G)) depends on that input. Run the forward once and keep each block's input. " + READ_RESID),
    ]
    labels = [l for l, _, _ in _dX_wrongs(_mlp_parts(dict(dY=dY, X=X, W_gate=Wg[0], W_up=Wu[0], W_down=Wd[0])))]
    for label in labels:
        def block_dX(dZ, Z, g, u, d, label=label):
            return next(v for l, v, _ in _dX_wrongs(_mlp_parts(dict(dY=dZ, X=Z, W_gate=g, W_up=u, W_down=d))) if l == label)
        why = next(m for l, _, m in _dX_wrongs(_mlp_parts(dict(dY=dY, X=X, W_gate=Wg[0], W_up=Wu[0], W_down=Wd[0])))
                   if l == label)
        out.append(Mistake(label, _stack_backward(dY, X, Wg, Wu, Wd, block_dX=block_dX),
                           "the same slip in every block's MLP (P3's mlp_backward): " + why))
    out = [m for m in out if not np.allclose(m.value, right, rtol=1e-9, atol=1e-12)]  # L = 1: some coincide with right
    return worded({"dX": out})


# --------------------------------------------------------------------------- cases

# Public p1 points: the three values the lesson quotes (0, 2, −3), both sides of the minimum, and large |x|.
_P1_X = np.array([0.0, 2.0, -3.0, -1.0, 0.5, 4.0])


#: β of the sigmoid approximation of GELU, x·σ(1.702x) (Hendrycks & Gimpel, arXiv:1606.08415, section 2).
GELU_BETA = 1.702


def _p1_public() -> list[Case]:
    return [
        Case(dict(x=_P1_X.copy(), beta=1.0), "β = 1, SiLU itself: x = [0, 2, −3, −1, 0.5, 4]"),
        Case(dict(x=np.linspace(-6.0, 6.0, 13), beta=GELU_BETA), "β = 1.702 (x·σ(1.702x), the sigmoid approximation of "
             "GELU): 13 points from −6 to 6"),
        # Large |x| checks overflow; the moderate entries keep σ(βx) (a classic wrong slope) from passing here.
        Case(dict(x=np.array([[-800.0, -40.0, -2.0], [1.5, 40.0, 800.0]]), beta=1.5),
             "β = 1.5, large |x| (a 2 × 3 array): no overflow, no NaN"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    return [
        Case(dict(x=rng.standard_normal(int(rng.integers(5, 12))) * 3, beta=float(rng.choice([0.5, 2.0, 3.0])))),  # β < 1 too
        Case(dict(x=rng.standard_normal((3, 4)) * 5, beta=float(rng.uniform(0.2, 4.0)))),
        Case(dict(x=np.concatenate([rng.choice([-1, 1], size=6) * rng.uniform(30, 1000, size=6), rng.uniform(-3, 3, size=2)]),
                  beta=float(rng.uniform(1.2, 3.0)))),
    ]


def _gate_case(rng: np.random.Generator, n: int, f: int) -> dict:
    return dict(dH=rng.standard_normal((n, f)), G=rng.standard_normal((n, f)) * 2, U=rng.standard_normal((n, f)))


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(9)
    return [
        Case(dict(dH=np.array([[1.0, 1.0, 1.0]]), G=np.array([[0.0, 2.0, -3.0]]), U=np.array([[1.0, -1.0, 2.0]])),
             "one token, dH = 1, G = [0, 2, −3], U = [1, −1, 2]"),
        Case(_gate_case(rng, 4, 6), "four tokens, f = 6"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_gate_case(rng, int(rng.integers(1, 6)), int(rng.integers(2, 9)))) for _ in range(4)]


def _mlp_case(rng: np.random.Generator, n: int, d: int, f: int) -> dict:
    return dict(
        dY=rng.standard_normal((n, d)),
        X=rng.standard_normal((n, d)),
        W_gate=rng.standard_normal((d, f)),
        W_up=rng.standard_normal((d, f)),
        W_down=rng.standard_normal((f, d)),
    )


def _p3_public() -> list[Case]:
    rng = np.random.default_rng(19)
    return [
        Case(_mlp_case(rng, 1, 2, 3), "one token, d = 2, f = 3"),
        Case(_mlp_case(rng, 3, 4, 6), "three tokens, d = 4, f = 6"),
        Case(_mlp_case(rng, 5, 2, 3), "five tokens, d = 2, f = 3"),
    ]


def _p3_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for _ in range(5):
        n, d = (int(v) for v in rng.integers(1, 6, size=2))
        f = int(rng.integers(d + 1, d + 6))  # f > d as in a real MLP: a transposed weight cannot fit
        cases.append(Case(_mlp_case(rng, n, d, f)))
    return cases


def _stack_case(rng: np.random.Generator, L: int, n: int, d: int, f: int) -> dict:
    """L blocks' weights stacked on a leading axis; scaled by 1/√width so that the activations stay ordinary."""
    return dict(
        dY=rng.standard_normal((n, d)),
        X=rng.standard_normal((n, d)),
        W_gate=rng.standard_normal((L, d, f)) / np.sqrt(d),
        W_up=rng.standard_normal((L, d, f)) / np.sqrt(d),
        W_down=rng.standard_normal((L, f, d)) / np.sqrt(f),
    )


def _p4_public() -> list[Case]:
    rng = np.random.default_rng(29)
    return [Case(_stack_case(rng, 1, 3, 4, 6), "one block (L = 1), three tokens, d = 4, f = 6"),
            Case(_stack_case(rng, 2, 1, 2, 3), "two blocks (L = 2), one token, d = 2, f = 3"),
            Case(_stack_case(rng, 3, 3, 4, 6), "three blocks (L = 3), three tokens, d = 4, f = 6")]


def _p4_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_stack_case(rng, L, int(rng.integers(1, 5)), int(rng.integers(2, 5)), int(rng.integers(5, 8))))
            for L in (2, 4, 3)]


# P6: one token, every width 1 (printed in the notebook), inside a residual block y = x + MLP(x).
# w_up = −1.5, not −1: with −1 both branch terms equal −dy, so a student who dropped a branch and the residual
# landed on another named mistake's value (round thirteen of review).
P6_CASE = dict(x=1.0, w_gate=0.5, w_up=-1.5, w_down=2.0, dy=1.0)


def p6_arrays() -> dict:
    c = P6_CASE
    return dict(dY=np.array([[c["dy"]]]), X=np.array([[c["x"]]]), W_gate=np.array([[c["w_gate"]]]),
                W_up=np.array([[c["w_up"]]]), W_down=np.array([[c["w_down"]]]))


def _p6_expected() -> float:
    return float(residual_mlp_backward_ref(**p6_arrays())[0, 0])


def _p6_mistakes() -> list[Mistake]:
    kw = p6_arrays()
    return [Mistake(m.label, float(np.asarray(m.value).ravel()[0]), m.message) for m in residual_mistakes(kw)["dX"]]


def _p7_expected() -> float:
    """Multiply-adds per token in the frozen base weights during the backward pass: only the input gradients
    dH = dY W_downᵀ (f·d), and dX = dG W_gateᵀ + dU W_upᵀ (2·d·f); no ∇W = Xᵀ D is formed for a frozen weight."""
    return float(3 * SMOL_D * SMOL_F)


def _p7_mistakes() -> list[Mistake]:
    df = SMOL_D * SMOL_F
    return [
        Mistake("weight gradients", 6 * df, "that is twice the answer: it is what a backward that also forms ∇W = Xᵀ D for "
                "every projection spends (full fine-tuning), or the right count in FLOPs (two per multiply-add). A frozen "
                "weight needs no ∇W; the gradient still passes through it: dH = dY W_downᵀ, dX = dG W_gateᵀ + dU W_upᵀ. "
                + READ_COST),
        Mistake("one branch", 2 * df, "two products are missing one: X feeds both gate and up, so dX = dG W_gateᵀ + dU W_upᵀ "
                "needs both, and dH = dY W_downᵀ comes first. " + READ_COST),
        Mistake("one projection", df, "that is one product; the backward passes through all three frozen weights: "
                "dH = dY W_downᵀ, then dG W_gateᵀ and dU W_upᵀ for dX. " + READ_COST),
        Mistake("forward and full backward", 9 * df, "that is the forward plus a full backward with ∇W; the question asks "
                "for the backward through frozen weights only: three input-gradient products. " + READ_COST),
        Mistake("nothing", 0, "a frozen weight is not a detached one: the gradient must pass through W_down to reach the "
                "gate and up adapters and through W_gate and W_up to reach the layers below, one product each. "
                + READ_COST),
    ]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 8

ITEMS = {
    "w1": Choice(
        "the shape of H and of dH",
        0,
        key="c",
        explain={
            "a": "n × d is the shape of X and of the MLP's output Y; H lives in the wide intermediate space, n × f. Reread 'The gated MLP' in Know this.",
            "b": "f × d is W_down's shape. H has one row per token: n × f. Reread 'The gated MLP' in Know this.",
            "c": "H = SiLU(G) ⊙ U is element-wise, so it has the shape of G = X W_gate and U = X W_up: (n × d)(d × f) = n × f, one row per token in the wide intermediate space. A gradient has the shape of its tensor, so dH = dY W_downᵀ is n × f too. (Lesson 09, 'The gated MLP'.)",
            "d": "d × f is W_gate's (and W_up's) shape. H = SiLU(XW_gate) ⊙ (XW_up) has one row per token: n × f. Reread 'The gated MLP' in Know this.",
        },
    ),
    "w2": Numeric(
        "SiLU′(0)",
        0,
        name="SiLU′(0)",
        expected=lambda: float(mlp.silu_grad(0.0)),
        rtol=1e-9,
        atol=1e-12,
        mistakes=lambda: [
            Mistake("sigma'", 0.25, "0.25 is σ′(0) = σ(0)(1 − σ(0)), the sigmoid's slope; SiLU is x·σ(x): use the product rule, then set x = 0. " + READ_SILU),
            Mistake("silu", 0.0, "0 is SiLU(0), the value, not the slope. " + READ_SILU),
            Mistake("relu", 1.0, "1 is a ReLU's slope for x > 0; SiLU is smooth at 0: differentiate x·σ(x) with the product rule. " + READ_SILU),
        ],
    ),
    "w3": Choice(
        "the gradient reaching X in the gated MLP",
        0,
        key="d",
        explain={
            "a": "That drops the up branch: X is used by both the gate and the up projection, and a tensor used twice collects both gradients. Reread 'Branches add' in Know this.",
            "b": "The branches are combined by adding their gradients, not by multiplying them element by element. Reread 'Branches add' in Know this.",
            "c": "Averaging halves each contribution: the chain rule sums over every path from X to the loss. Reread 'Branches add' in Know this.",
            "d": "X reaches the loss along two paths, and the chain rule sums over every path: the gate branch contributes dG W_gateᵀ, the up branch dU W_upᵀ (each n × d), and the two add, as micrograd's += does. It is the same rule that gave lesson 05's ∇X = D Wᵀ + dZ Aᵀ. (Lesson 09, 'Branches add'.)",
        },
    ),
    "p1": Function(
        "implement swish_grad: the slope of x·σ(βx)",
        2,
        name="swish_grad",
        reference=swish_grad_ref,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("swish_grad(x)",),
        mistakes=swish_grad_mistakes,
        rtol=1e-7,
        atol=1e-10,
    ),
    "p2": Function(
        "implement swiglu_backward",
        3,
        name="swiglu_backward",
        reference=swiglu_backward_ref,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("dG", "dU"),
        mistakes=swiglu_mistakes,
    ),
    "p3": Function(
        "implement mlp_backward",
        4,
        name="mlp_backward",
        reference=mlp_backward_ref,
        public=_p3_public,
        hidden=_p3_hidden,
        outputs=("dX", "dW_gate", "dW_up", "dW_down"),
        mistakes=mlp_mistakes,
    ),
    "p4": Function(
        "implement residual_stack_backward: dX of L residual MLP blocks in a row",
        2,
        name="residual_stack_backward",
        reference=residual_stack_backward_ref,
        public=_p4_public,
        hidden=_p4_hidden,
        outputs=("dX",),
        mistakes=stack_mistakes,
    ),
    "p5": Choice(
        "which adapters a token with a closed gate trains",
        1,
    ),
    "p6": Numeric(
        "dx of the one-number residual MLP",
        1,
        name="dx",
        reread=READ_RESID,
        expected=_p6_expected,
        rtol=1e-4,  # the prompt: graded to 4 significant digits
        atol=1e-9,
        mistakes=_p6_mistakes,
    ),
    "p7": Numeric(
        "multiply-adds per token of the backward through one SmolLM2 MLP's frozen weights",
        1,
        name="multiply-adds",
        reread="Reread 'Through the gate' in Know this.",
        expected=_p7_expected,
        rtol=0,
        atol=0.5,
        mistakes=_p7_mistakes,
    ),
}
