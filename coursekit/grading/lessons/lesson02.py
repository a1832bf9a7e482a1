"""Graded items of lesson 02, "LoRA inside one matmul"."""

from __future__ import annotations

import numpy as np

from ... import lora
from ...gradcheck import check_vjp
from ..checkers import Case, Mistake
from .. import Choice, Function, Numeric
from ..lora_mistakes import forward_mistakes, merge_mistakes, torch_layout_mistakes


# --------------------------------------------------------------------------- references


def adapted_forward(X, W, A, B, lora_alpha, r):
    """Reference for p1: ``Y = X W + (lora_alpha / r) (X A) B``."""
    return lora.lora_forward(X, W, A, B, lora.scaling(lora_alpha, r))[0]


def merge_adapter(W, A, B, lora_alpha, r):
    """Reference for p2: ``W + (lora_alpha / r) A B``."""
    return lora.merge(W, A, B, lora.scaling(lora_alpha, r))


def peft_layout_forward(x, weight, lora_A, lora_B, scaling):
    """Reference for p5, with nn.Linear/PEFT storage: weight m × d, lora_A r × d, lora_B m × r."""
    W, A, B = (lora.from_linear_weight(t) for t in (weight, lora_A, lora_B))
    return lora.lora_forward(x, W, A, B, scaling)[0]


# --------------------------------------------------------------------------- cases


def _worked_example() -> dict:
    # Lesson 02's worked example: x = [2, -1, 3], s = 0.5 (rank 1, so lora_alpha = 0.5).
    return dict(
        X=np.array([[2.0, -1.0, 3.0]]),
        W=np.array([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]),
        A=np.array([[1.0], [0.0], [1.0]]),
        B=np.array([[0.2, -0.1]]),
        lora_alpha=0.5,
        r=1,
    )


def _random_case(rng: np.random.Generator, square_B: bool = False) -> dict:
    n, d = int(rng.integers(1, 5)), int(rng.integers(2, 7))
    r = int(rng.integers(2, 5))  # r >= 2 and lora_alpha != r: every wrong scale shows
    m = r if square_B else int(rng.integers(2, 7))
    lora_alpha = float(rng.choice([a for a in (1, 2, 4, 8, 16, 32) if a != r]))
    return dict(
        X=rng.standard_normal((n, d)),
        W=rng.standard_normal((d, m)),
        A=rng.standard_normal((d, r)),
        B=rng.standard_normal((r, m)),  # nonzero B: a zero B hides a wrong scale
        lora_alpha=lora_alpha,
        r=r,
    )


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(2)
    return [
        Case(_worked_example(), "the lesson's worked example, x = [2, -1, 3], s = 0.5"),
        Case(_random_case(rng), "several tokens"),
        Case(_random_case(rng, square_B=True), "r = m"),
    ]


def _hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_random_case(rng, square_B=(i % 3 == 0))) for i in range(6)]


def _p1_gradcheck(fn, case: Case) -> list[str] | None:
    """The student's forward must have the reference's gradients (checked by central differences)."""
    kw = case.kwargs
    s = lora.scaling(kw["lora_alpha"], kw["r"])
    Y, cache = lora.lora_forward(kw["X"], kw["W"], kw["A"], kw["B"], s)
    D = np.random.default_rng(0).standard_normal(Y.shape)
    dX, dA, dB = lora.lora_backward(D, cache)
    rep = check_vjp(lambda X, A, B: fn(X, kw["W"], A, B, kw["lora_alpha"], kw["r"]),
                    dict(X=kw["X"], A=kw["A"], B=kw["B"]), dict(X=dX, A=dA, B=dB), D)
    return None if rep.ok else ["gradient check failed:"] + [str(c) for c in rep.checks if not c.ok]


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(3)
    ex = _worked_example()
    return [
        Case({k: ex[k] for k in ("W", "A", "B", "lora_alpha", "r")}, "the lesson's worked example"),
        Case({k: v for k, v in _random_case(rng).items() if k != "X"}, "a random 2-D case"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case({k: v for k, v in _random_case(rng, i == 0).items() if k != "X"}) for i in range(4)]


def _torch_layout(kw: dict) -> dict:
    s = lora.scaling(kw["lora_alpha"], kw["r"])
    return dict(x=kw["X"], weight=kw["W"].T.copy(), lora_A=kw["A"].T.copy(), lora_B=kw["B"].T.copy(), scaling=s)


def _p5_public() -> list[Case]:
    rng = np.random.default_rng(5)
    return [
        Case(_torch_layout(_random_case(rng, square_B=True)), "lora_B square (m = r)"),
        Case(_torch_layout(_random_case(rng)), "rectangular"),
    ]


def _p5_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_torch_layout(_random_case(rng, square_B=(i % 2 == 0)))) for i in range(4)]


def _fmt(x: float) -> str:
    return f"{x:,}"


# --------------------------------------------------------------------------- items

P3_SHAPE = dict(d=2048, m=8192, r=8)  # an MLP up projection, rank 8
P7_SIDE = 24

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 10

ITEMS = {
    "w1": Choice(
        "the shape of A",
        0,
        key="b",
        explain={
            "a": "r × d is how PEFT *stores* lora_A.weight (out × in); in the row-vector convention X A needs A to be d × r. Reread 'Shapes first' in Know this.",
            "b": "A maps each token's d features down to the r-wide code: X A is (n × d)(d × r) = n × r, so A must be d × r, and B (r × m) maps the code back up to m outputs. (Lesson 02, 'Shapes first'.)",
            "c": "r × m is B's shape: B maps the r-wide code back to m outputs. Reread 'Shapes first' in Know this.",
            "d": "m × r is how PEFT stores lora_B.weight. Reread 'Shapes first' in Know this.",
        },
    ),
    "w2": Numeric(
        "the scale s for lora_alpha = 32, r = 8",
        0,
        name="s",
        expected=lambda: lora.scaling(32, 8),
        mistakes=lambda: [
            Mistake("alpha", 32, "that is lora_alpha itself; s = lora_alpha / r."),
            Mistake("r/alpha", 8 / 32, "that is r / lora_alpha, upside down; s = lora_alpha / r."),
            Mistake("rslora", 32 / 8**0.5, "that is the rsLoRA scale lora_alpha / sqrt(r); plain LoRA divides by r."),
        ],
    ),
    "w3": Choice(
        "the adapter at initialisation (B = 0)",
        0,
        key="b",
        explain={
            "a": "A is random, but B = 0 multiplies it away: (XA)B = 0.",
            "b": "Whatever the random A holds, (XA)B with B = 0 is an n × m matrix of exact zeros, and s · 0 is still 0, so Y = XW + s(XA)B = XW. Equivalently, the merged weight W + sAB is just W: training starts from exactly the base layer. (Lesson 02, 'Shapes first'.)",
            "c": "The whole layer equals X W; the adapter's own contribution is zero.",
            "d": "Nothing is undefined: XA is finite and times a zero B gives exact zeros.",
        },
    ),
    "p1": Function(
        "implement adapted_forward",
        3,
        name="adapted_forward",
        reference=adapted_forward,
        public=_p1_public,
        hidden=_hidden,
        outputs=("Y",),
        mistakes=forward_mistakes,
        extra=_p1_gradcheck,
    ),
    "p2": Function(
        "implement merge_adapter",
        2,
        name="merge_adapter",
        reference=merge_adapter,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("W_merged",),
        mistakes=merge_mistakes,
    ),
    "p3": Numeric(
        f"trainable parameters of a rank-{P3_SHAPE['r']} adapter on a {P3_SHAPE['d']} × {P3_SHAPE['m']} projection",
        1,
        name="n_trainable",
        expected=lambda: lora.param_count(**P3_SHAPE),
        rtol=0,
        mistakes=lambda: [
            Mistake("dense", P3_SHAPE["d"] * P3_SHAPE["m"], "that is the dense d × m count; the adapter has r (d + m)."),
            Mistake("A only", P3_SHAPE["r"] * P3_SHAPE["d"], "that counts A (d × r) only; add B (r × m)."),
            Mistake("B only", P3_SHAPE["r"] * P3_SHAPE["m"], "that counts B (r × m) only; add A (d × r)."),
            Mistake("rdm", P3_SHAPE["r"] * P3_SHAPE["d"] * P3_SHAPE["m"], "r·d·m multiplies where the two factors' sizes add: r (d + m)."),
        ],
    ),
    "p4": Numeric(
        "that adapter's size as a percentage of the dense matrix",
        1,
        name="percent",
        expected=lambda: 100 * lora.adapter_fraction(**P3_SHAPE),
        rtol=1e-4,
        unit="%",
        mistakes=lambda: [
            Mistake("fraction", lora.adapter_fraction(**P3_SHAPE), "that is the fraction; the question asks for percent (× 100)."),
        ],
    ),
    "p5": Function(
        "implement peft_layout_forward (nn.Linear storage)",
        2,
        name="peft_layout_forward",
        reference=peft_layout_forward,
        public=_p5_public,
        hidden=_p5_hidden,
        outputs=("y",),
        mistakes=torch_layout_mistakes,
    ),
    "p6": Choice(
        "merged vs unmerged in floating point",
        1,
    ),
    "p7": Numeric(
        f"largest rank whose adapter is smaller than a dense {P7_SIDE} × {P7_SIDE} matrix",
        1,
        name="r_max",
        expected=lambda: max(r for r in range(1, P7_SIDE + 1) if lora.param_count(P7_SIDE, P7_SIDE, r) < lora.dense_param_count(P7_SIDE, P7_SIDE)),
        rtol=0,
        mistakes=lambda: [
            Mistake("equal", P7_SIDE * P7_SIDE // (2 * P7_SIDE), "at that rank r (d + m) equals d·m exactly: not smaller. Take the next rank down."),
        ],
    ),
}
