"""Graded items of lesson 05, "Backward through one adapted projection"."""

from __future__ import annotations

import numpy as np

from ... import lora
from ..checkers import Case, Mistake
from .. import Array, Choice, Function, Numeric
from ..lora_mistakes import backward_mistakes

READ_SHAPES = "Reread 'Shapes force the transposes' in Know this."
READ_FOUR = "Reread 'The four gradients' in Know this."
READ_FROZEN = "Reread 'Frozen is not detached' in Know this."


# --------------------------------------------------------------------------- reference


def backward(D, X, W, A, B, s):
    """Reference for p1: ``(dX, dA, dB)`` of ``Y = X W + s (X A) B`` for the upstream gradient D."""
    _, cache = lora.lora_forward(X, W, A, B, s)
    return lora.lora_backward(D, cache)


# --------------------------------------------------------------------------- cases


def worked_example() -> dict:
    """Lesson 02's worked example, extended with a gradient: x = [2, -1, 3], rank 1, s = 0.5, D = [0.4, -0.2]."""
    return dict(
        D=np.array([[0.4, -0.2]]),
        X=np.array([[2.0, -1.0, 3.0]]),
        W=np.array([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]),
        A=np.array([[1.0], [0.0], [1.0]]),
        B=np.array([[0.2, -0.1]]),
        s=0.5,
    )


# Scales for which 1, s and s² are all different, so a missing or doubled scale always shows.
_SCALES = (0.5, 2.0, 4.0, 0.25, 3.0)


def _case(rng: np.random.Generator, n: int, d: int, m: int, r: int) -> dict:
    return dict(
        D=rng.standard_normal((n, m)),
        X=rng.standard_normal((n, d)),
        W=rng.standard_normal((d, m)),
        A=rng.standard_normal((d, r)),
        B=rng.standard_normal((r, m)),  # nonzero B: with B = 0, dA = 0 hides every mistake in dA
        s=float(rng.choice(_SCALES)),
    )


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(5)
    return [
        Case(worked_example(), "lesson 02's worked example, one token, D = [0.4, -0.2], s = 0.5"),
        Case(_case(rng, n=4, d=3, m=2, r=1), "four tokens, the worked example's sizes"),
        Case(_case(rng, n=3, d=5, m=4, r=2), "rectangular: n = 3, d = 5, m = 4, r = 2"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(6):
        n, d, m = (int(v) for v in rng.integers(2, 7, size=3))
        r = int(rng.integers(1, 5))
        if i == 0:
            m = d  # a square W: D W instead of D Wᵀ fits the shape, only the values tell
        if i == 1:
            r = max(r, 2)
            m = r  # a square B (r ≥ 2, so B ≠ Bᵀ): B instead of Bᵀ fits the shape
        cases.append(Case(_case(rng, n=n, d=d, m=m, r=r)))
    return cases


# p3: one entry of ∇A from G = Xᵀ D alone (the gradient W would get), A, B and s (printed in the notebook).
# G is Xᵀ D of the two tokens X = [[1, 2, 1], [0, -1, 1]], D = [[1, -1], [0.5, 2]]; the student sees only G.
P3_CASE = dict(
    G=np.array([[1.0, -1.0], [1.5, -4.0], [1.5, 1.0]]),
    A=np.array([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]),
    B=np.array([[0.5, 1.0], [0.0, -1.0]]),
    s=2.0,
)
P3_INDEX = (1, 1)


def _p3_expected() -> float:
    # ∇A = Xᵀ dZ = Xᵀ (s D Bᵀ) = s (Xᵀ D) Bᵀ = s G Bᵀ; tests/test_lesson05_items.py measures it with autograd
    # on two batches whose Xᵀ D is G.
    G, B, s = (P3_CASE[k] for k in ("G", "B", "s"))
    return float((s * G @ B.T)[P3_INDEX])


def _p3_mistakes() -> list[Mistake]:
    G, A, B, s = (P3_CASE[k] for k in ("G", "A", "B", "s"))
    i, j = P3_INDEX
    return [
        Mistake("missing s", (G @ B.T)[i, j], f"the scale is missing: dZ = s D Bᵀ carries s = {s:g}, so ∇A = s G Bᵀ. " + READ_FOUR),
        Mistake("s twice", (s * s * G @ B.T)[i, j], "the scale is applied twice: s is in dZ, and ∇A = Xᵀ dZ takes no second s. " + READ_FOUR),
        Mistake("B not transposed", (s * G @ B)[i, j], "you used B where Bᵀ belongs: dZ = s D Bᵀ, so ∇A = s Xᵀ D Bᵀ = s G Bᵀ. " + READ_SHAPES),
        Mistake("G itself", G[i, j], "that is an entry of G, the gradient W would get; the adapter's A sees G only through the "
                "other factor: ∇A = Xᵀ dZ = s (Xᵀ D) Bᵀ. " + READ_FOUR),
        Mistake("dB", (s * A.T @ G)[i, j], "that is the entry of ∇B = s Zᵀ D = s Aᵀ (Xᵀ D) = s Aᵀ G, the other factor's "
                "gradient; ∇A = Xᵀ dZ brings in Bᵀ. " + READ_FOUR),
    ]


#: P6's learning rate: one plain SGD step on W alone, as if W were trainable.
P6_LR = 0.1


def _y(ex: dict, W: np.ndarray) -> np.ndarray:
    return lora.lora_forward(ex["X"], W, ex["A"], ex["B"], ex["s"])[0]


def _dY_example() -> np.ndarray:
    """How the worked example's output y changes after one SGD step on W alone: ΔY = x ΔW = −η x xᵀ D = −η ‖x‖² D."""
    ex = worked_example()
    dW = ex["X"].T @ ex["D"]
    return _y(ex, ex["W"] - P6_LR * dW) - _y(ex, ex["W"])


def _dY_mistakes() -> list[Mistake]:
    ex = worked_example()
    X, D, W, s, lr = ex["X"], ex["D"], ex["W"], ex["s"], P6_LR
    dW = X.T @ D
    return [
        Mistake("dW itself", dW, "that is ∇W = xᵀ D itself (W's shape, d × m). The step changes W by ΔW = −η ∇W, and y by "
                                  "x ΔW, which has y's shape. " + READ_FOUR),
        Mistake("scaled", X @ (-lr * s * dW), "the base path has no scale: s multiplies only the adapter path, so ∇W = xᵀ D "
                                               "with no s. " + READ_FROZEN),
        Mistake("ascent", X @ (lr * dW), "that moves y along D: a descent step subtracts η ∇W, so y moves against D. "
                                         + READ_FOUR),
        Mistake("no learning rate", X @ (-dW), "that is the change for η = 1; the step is ΔW = −η ∇W with η = 0.1. " + READ_FOUR),
        Mistake("new output", _y(ex, W - lr * dW), "that is the new output y; the question asks for the change, new y minus "
                                                    "old y. " + READ_FOUR),
    ]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 10

ITEMS = {
    "w1": Choice(
        "the shape of ∇A",
        0,
        key="d",
        explain={
            "a": "r × d is Aᵀ's shape (and how PEFT stores lora_A.weight). The gradient of a scalar loss with respect to A has A's own shape, d × r. Reread 'Shapes force the transposes' in Know this.",
            "b": "d × m is W's shape; ∇A must have A's shape, d × r. Reread 'Shapes force the transposes' in Know this.",
            "c": "n × r is the shape of Z = XA and of dZ, the gradient arriving at Z; ∇A = Xᵀ dZ sums over the n tokens and is d × r. Reread 'Shapes force the transposes' in Know this.",
            "d": "L is a scalar, so its gradient with respect to any tensor has that tensor's own shape: ∇A has A's shape, d × r. The product that gives it, ∇A = Xᵀ dZ = (d × n)(n × r), sums every token's contribution over n. (Lesson 05, 'Shapes force the transposes'.)",
        },
    ),
    "w2": Choice(
        "a frozen W and the gradient reaching X",
        0,
        key="a",
        explain={
            "a": "Freezing only means autograd forms no ∇W = Xᵀ D (W.grad stays None). XW is still in the graph, so its share D Wᵀ of ∇X = D Wᵀ + dZ Aᵀ still flows back to X and to every layer below. (Lesson 05, 'Frozen is not detached'.)",
            "b": "Freezing stops the optimizer from updating W; it does not cut the graph. The base path D Wᵀ still reaches X. Reread 'Frozen is not detached' in Know this.",
            "c": "Frozen weights still pass gradient: with the adapter path alone, every layer below would see only a small correction of its true gradient. Reread 'Frozen is not detached' in Know this.",
            "d": "No gradient for W is formed at all (W.grad stays None); the frozen weight is used, not updated. Reread 'Frozen is not detached' in Know this.",
        },
    ),
    "w3": Choice(
        "the gradient of Z in Y = Z B",
        0,
        key="c",
        explain={
            "a": "D B does not multiply: D is n × m and B is r × m, the inner sizes m and r disagree. Reread 'Shapes force the transposes' in Know this.",
            "b": "Bᵀ D is (m × r)(n × m): it needs r = n and would not give Z's shape n × r. Reread 'Shapes force the transposes' in Know this.",
            "c": "For a product Y = P Q with upstream gradient D, ∂L/∂P = D Qᵀ; here P = Z and Q = B, so ∂L/∂Z = D Bᵀ. The shapes confirm it: (n × m)(m × r) = n × r, Z's own shape, and in the adapted layer the scale adds a factor s, dZ = s D Bᵀ. (Lesson 05, 'Shapes force the transposes'.)",
            "d": "Dᵀ B is (m × n)(r × m): it needs n = r, and the gradient of Z must have Z's shape n × r. Reread 'Shapes force the transposes' in Know this.",
        },
    ),
    "p1": Function(
        "implement lora_backward",
        4,
        name="lora_backward",
        reference=backward,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("dX", "dA", "dB"),
        mistakes=backward_mistakes,
    ),
    "p2": Choice(
        "which r × d matrix PEFT's lora_A.weight.grad is for a batch",
        1,
    ),
    "p3": Numeric(
        f"∇A[{P3_INDEX[0]}, {P3_INDEX[1]}] from G = Xᵀ D, A, B and s alone",
        1,
        name="dA[1, 1]",
        reread=READ_FOUR,
        expected=_p3_expected,
        rtol=1e-9,
        atol=1e-12,
        mistakes=_p3_mistakes,
    ),
    "p4": Choice(
        "what is zero at the first step when A = 0 and B is random",
        2,
        options="abcde",
        multi=True,
    ),
    "p5": Choice(
        "W.grad and X.grad when the base path is X @ W.detach()",
        1,
    ),
    "p6": Array(
        "the change of the worked example's y after one SGD step on W, if W were trainable",
        1,
        name="dY",
        reread=READ_FOUR,
        expected=_dY_example,
        rtol=1e-9,
        atol=1e-12,
        mistakes=_dY_mistakes,
    ),
    "p7": Choice(
        "what doubling s does to the gradients",
        1,
    ),
}
