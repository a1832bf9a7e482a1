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
    return None if rep.ok else (["your outputs match on these inputs, but nudging X, A or B slightly moves them differently "
                                 "from X W + (lora_alpha / r) (X A) B (a slope compared with its finite difference):"]
                                + [str(c) for c in rep.checks if not c.ok])


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

# P3: the same A and B read under another scale convention. A rank-16 adapter trained with lora_alpha = 32 under
# PEFT's default s = lora_alpha / r is loaded with use_rslora=True (s = lora_alpha / sqrt(r)).
P3_CONFIG = dict(r=16, lora_alpha=32)


def _p3_factor() -> float:
    """New s over old s: the factor by which the same adapter's contribution s (X A) B changes."""
    r, alpha = P3_CONFIG["r"], P3_CONFIG["lora_alpha"]
    return lora.scaling(alpha, r, use_rslora=True) / lora.scaling(alpha, r)


# P4: which entries a rank-2 merge changes. A (d × 2) and B (2 × m) are zero except at these positions; the nonzero
# values are random, so no sum of products cancels. Entry (i, j) of sAB changes when some k has A[i, k] and B[k, j]
# both nonzero: the union of the two rank-one pieces' rectangles, which share entry (2, 1).
P4_SHAPE = (6, 5)
P4_A_ROWS = ((0, 1, 2), (2, 3))      # nonzero rows of A's column 0 and column 1
P4_B_COLS = ((0, 1), (1, 2, 3))      # nonzero columns of B's row 0 and row 1


def _p4_factors(rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A and B with P4's pattern of nonzeros, filled with random values (away from zero)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    (d, m), r = P4_SHAPE, len(P4_A_ROWS)
    A, B = np.zeros((d, r)), np.zeros((r, m))
    for k in range(r):
        A[list(P4_A_ROWS[k]), k] = rng.choice([-1, 1], len(P4_A_ROWS[k])) * rng.uniform(0.5, 2, len(P4_A_ROWS[k]))
        B[k, list(P4_B_COLS[k])] = rng.choice([-1, 1], len(P4_B_COLS[k])) * rng.uniform(0.5, 2, len(P4_B_COLS[k]))
    return A, B


def _p4_changed(A: np.ndarray, B: np.ndarray, s: float = 0.5) -> int:
    """How many entries of W the merge W + sAB changes, counted on the merged matrix."""
    W = np.random.default_rng(1).standard_normal((A.shape[0], B.shape[1]))
    return int(np.count_nonzero(lora.merge(W, A, B, s) != W))


def _p4_key() -> int:
    return _p4_changed(*_p4_factors())


def _p4_mistakes() -> list[Mistake]:
    A, B = _p4_factors()
    pieces = [_p4_changed(A[:, [k]], B[[k], :]) for k in range(A.shape[1])]
    rows, cols = np.flatnonzero(A.any(axis=1)), np.flatnonzero(B.any(axis=0))
    read = "Reread 'Merging: the same layer as one matrix' in Know this."
    return [
        Mistake("pieces added", sum(pieces), "you added the two rank-one pieces' counts, but entry (2, 1) is changed by "
                "both pieces and is one entry of W: count the union. " + read),
        Mistake("rows × columns", len(rows) * len(cols), "not every row that A touches meets every column that B touches: "
                "sAB is a sum of rank-one pieces, and each pairs one column of A with the same row of B only. " + read),
        Mistake("one piece only", pieces[0], "that is one rank-one piece alone (one column of A with the same row of B; "
                "here each of the two changes as many entries): the other piece changes entries too. " + read),
        Mistake("one per rank", A.shape[1], "a rank-2 adapter does not change two weights: each rank-one piece is an outer "
                "product and changes every entry where its column of A and its row of B are both nonzero. " + read),
        Mistake("every entry", A.shape[0] * B.shape[1], "rows where A is zero and columns where B is zero stay as they "
                "were: the merge does not touch every entry. " + read),
    ]


# P7: the trainable parameters of one whole configuration, counted per adapted matrix and summed (the lesson's own
# counts are per matrix: 4096 × 4096 and the 48 × 48 crossover). SmolLM2-135M: 30 layers, q_proj 576 × 576,
# v_proj 576 × 192 (3 key-value heads of width 64).
P7_CONFIG = dict(layers=30, shapes={"q_proj": (576, 576), "v_proj": (576, 192)}, r=8)


def _p7_count(layers: int = P7_CONFIG["layers"], shapes: dict | None = None, r: int = P7_CONFIG["r"]) -> int:
    shapes = P7_CONFIG["shapes"] if shapes is None else shapes
    return layers * sum(lora.param_count(d, m, r) for d, m in shapes.values())


def _p7_key() -> int:
    return _p7_count()


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
            Mistake("alpha", 32, "that is lora_alpha itself; s = lora_alpha / r. Reread 'The scale s' in Know this."),
            Mistake("r/alpha", 8 / 32, "that is r / lora_alpha, upside down; s = lora_alpha / r. Reread 'The scale s' in Know this."),
            Mistake("rslora", 32 / 8**0.5, "that is the rsLoRA scale lora_alpha / sqrt(r); plain LoRA divides by r. Reread 'The scale s' in Know this."),
        ],
    ),
    "w3": Choice(
        "the adapter at initialisation (B = 0)",
        0,
        key="d",
        explain={
            "a": "A is random, but B = 0 multiplies it away: (XA)B = 0. Reread 'The scale s' in Know this.",
            "b": "Nothing is undefined: XA is finite and times a zero B gives exact zeros. Reread 'The scale s' in Know this.",
            "c": "The whole layer equals X W; the adapter's own contribution is zero. Reread 'The scale s' in Know this.",
            "d": "Whatever the random A holds, (XA)B with B = 0 is an n × m matrix of exact zeros, and s · 0 is still 0, so Y = XW + s(XA)B = XW. Equivalently, the merged weight W + sAB is just W: training starts from exactly the base layer. (Lesson 02, 'The scale s'.)",
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
        "the factor by which a rank-16, lora_alpha = 32 adapter's contribution changes when it is loaded with use_rslora=True",
        1,
        name="factor",
        expected=_p3_factor,
        rtol=1e-3,
        reread="Reread 'The scale s' in Know this.",
        mistakes=lambda: [
            Mistake("upside down", 1 / _p3_factor(), "that is old over new: rsLoRA divides lora_alpha by sqrt(r) = 4 instead "
                    "of r = 16, so its s is larger, and so is the contribution. Reread 'The scale s' in Know this."),
            Mistake("new s", lora.scaling(P3_CONFIG["lora_alpha"], P3_CONFIG["r"], use_rslora=True),
                    "that is the new scale lora_alpha / sqrt(r) itself; the contribution changes by new s over old s, and "
                    "the old one was lora_alpha / r. Reread 'The scale s' in Know this."),
            Mistake("old s", lora.scaling(P3_CONFIG["lora_alpha"], P3_CONFIG["r"]),
                    "that is the scale the adapter was trained with, lora_alpha / r; the question asks by what factor the "
                    "contribution changes when s becomes lora_alpha / sqrt(r). Reread 'The scale s' in Know this."),
            Mistake("r", P3_CONFIG["r"], "the two scales differ by r / sqrt(r) = sqrt(r), not by r: rsLoRA still divides "
                    "by something, sqrt(r). Reread 'The scale s' in Know this."),
        ],
    ),
    "p4": Numeric(
        "how many entries of a 6 × 5 weight a rank-2 merge with a given pattern of nonzeros changes",
        1,
        name="n_changed",
        expected=_p4_key,
        rtol=0,
        mistakes=_p4_mistakes,
        reread="Reread 'Merging: the same layer as one matrix' in Know this.",
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
        "trainable parameters of rank-8 adapters on q_proj (576 × 576) and v_proj (576 × 192) in 30 layers",
        1,
        name="n_trainable",
        expected=_p7_key,
        rtol=0,
        reread="Reread 'Counting what LoRA trains' in Know this.",
        mistakes=lambda: [
            Mistake("one layer", _p7_count(layers=1), "that is one layer's two adapters; every one of the 30 layers has its "
                    "own q_proj and v_proj, and each gets its own A and B. Reread 'Counting what LoRA trains' in Know this."),
            Mistake("square v_proj", _p7_count(shapes={"q_proj": (576, 576), "v_proj": (576, 576)}),
                    "you counted v_proj as 576 × 576; it maps 576 features to 192, so its adapter has r (576 + 192) "
                    "entries. Reread 'Counting what LoRA trains' in Know this."),
            Mistake("q_proj only", _p7_count(shapes={"q_proj": (576, 576)}),
                    "that counts q_proj's adapters only; v_proj is adapted too. Reread 'Counting what LoRA trains' in Know this."),
            Mistake("dense", P7_CONFIG["layers"] * sum(lora.dense_param_count(d, m) for d, m in P7_CONFIG["shapes"].values()),
                    "that is the count of the dense q_proj and v_proj weights, which stay frozen; the adapter trains "
                    "r (d + m) entries per matrix. Reread 'Counting what LoRA trains' in Know this."),
        ],
    ),
}
