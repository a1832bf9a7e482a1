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

# P3 and P4: rank-8 adapters on a layer's q_proj (2048 × 2048) and its grouped-query v_proj (2048 × 512), d × m.
P3_R = 8
P3_SHAPES = {"q_proj": (2048, 2048), "v_proj": (2048, 512)}
P7_SHAPE = (576, 192)  # d × m of SmolLM2's k_proj


def _p3_count(shapes: dict = P3_SHAPES, r: int = P3_R) -> int:
    return sum(lora.param_count(d, m, r) for d, m in shapes.values())


def _p3_dense(shapes: dict = P3_SHAPES) -> int:
    return sum(lora.dense_param_count(d, m) for d, m in shapes.values())


def _p7_key(d: int = P7_SHAPE[0], m: int = P7_SHAPE[1]) -> int:
    return max(r for r in range(1, min(d, m) + 1) if lora.param_count(d, m, r) < lora.dense_param_count(d, m))

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
        "trainable parameters of rank-8 adapters on a 2048 × 2048 q_proj and a 2048 × 512 v_proj",
        1,
        name="n_trainable",
        expected=_p3_count,
        rtol=0,
        mistakes=lambda: [
            Mistake("v square", 2 * lora.param_count(2048, 2048, P3_R),
                    "that counts v_proj as 2048 × 2048; it maps 2048 features to 512, so its adapter has r (2048 + 512)."),
            Mistake("q only", lora.param_count(2048, 2048, P3_R), "that is q_proj's adapter alone; add v_proj's, r (2048 + 512)."),
            Mistake("v only", lora.param_count(2048, 512, P3_R), "that is v_proj's adapter alone; add q_proj's, r (2048 + 2048)."),
            Mistake("dense", _p3_dense(), "that is the two dense matrices' count; each adapter has r (d + m)."),
        ],
    ),
    "p4": Numeric(
        "those adapters' parameters as a percentage of the two dense matrices' entries",
        1,
        name="percent",
        expected=lambda: 100 * _p3_count() / _p3_dense(),
        rtol=1e-4,
        unit="%",
        mistakes=lambda: [
            Mistake("fraction", _p3_count() / _p3_dense(), "that is the fraction; the question asks for percent (× 100)."),
            Mistake("mean of percentages",
                    50 * sum(lora.param_count(d, m, P3_R) / lora.dense_param_count(d, m) for d, m in P3_SHAPES.values()),
                    "that averages the two layers' percentages, which weighs the small v_proj like the large q_proj; divide "
                    "the total adapter count by the total dense count."),
            Mistake("v square", 100 * 2 * lora.param_count(2048, 2048, P3_R) / (2 * 2048 * 2048),
                    "that treats v_proj as 2048 × 2048; it is 2048 × 512."),
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
        "merged vs unmerged once X is scaled by 1024",
        1,
    ),
    "p7": Numeric(
        "largest rank whose adapter is smaller than a dense 576 × 192 matrix",
        1,
        name="r_max",
        expected=_p7_key,
        rtol=0,
        mistakes=lambda: [
            Mistake("equal", _p7_key() + 1, "at that rank r (d + m) equals d·m exactly: not smaller. Take the next rank down."),
            Mistake("square d", _p7_key(576, 576), "that is the answer for a 576 × 576 matrix; here m = 192, so r < d·m / (d + m)."),
            Mistake("square m", _p7_key(192, 192), "that is the answer for a 192 × 192 matrix; here d = 576, so r < d·m / (d + m)."),
            Mistake("half the side", 576 // 2, "half the side is the break-even of a square matrix only; here r < d·m / (d + m)."),
        ],
    ),
}
