"""Graded items of lesson 07, "Gradient checking"."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ... import gradcheck as gc
from ... import lora
from ...gradcheck import entry_name, numeric_gradient, relative_errors
from ..checkers import Case, Mistake, worded
from .. import Choice, Function, Numeric, Ordering

READ_CD = "Reread 'Central differences, entry by entry' in Know this."
READ_REL = "Reread 'Relative error and its bands' in Know this."
READ_F32 = "Reread 'float32 needs other tolerances' in Know this."
READ_SWEEP = "Reread 'The ε sweep' in Know this."


# --------------------------------------------------------------------------- references


def central_difference(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float) -> np.ndarray:
    """Reference for p1: ``(f(x + ε e_i) − f(x − ε e_i)) / 2ε`` for every entry i (x restored)."""
    return numeric_gradient(f, np.array(x, dtype=np.float64), eps)


def rel_error(a, n) -> float:
    """Reference for p2: the worst ``|a − n| / max(|a|, |n|, 1e-12)`` over all entries."""
    return float(np.max(relative_errors(a, n, denominator="max", tiny=1e-12)))


# --------------------------------------------------------------------------- p1: the functions under difference


def _cubic(c: np.ndarray) -> Callable[[np.ndarray], float]:
    """Σ x³ + (c·x)²: entries interact, so a perturbation left in place changes later entries' slopes."""
    def f(x):
        v = np.asarray(x, dtype=np.float64).ravel()
        return float(np.sum(v**3) + (c @ v) ** 2)
    return f


def _logsumexp(M: np.ndarray) -> Callable[[np.ndarray], float]:
    """log Σ exp(M x), the loss shape of a softmax."""
    def f(x):
        z = M @ np.asarray(x, dtype=np.float64)
        zmax = np.max(z)
        return float(zmax + np.log(np.sum(np.exp(z - zmax))))
    return f


def _lora_cross_entropy(X, W, B, s, targets) -> Callable[[np.ndarray], float]:
    """Mean cross-entropy of softmax(X W + s (X A) B) against integer targets, as a function of A."""
    def f(A):
        Y = lora.lora_forward(X, W, np.asarray(A, dtype=np.float64), B, s)[0]
        Y = Y - Y.max(axis=1, keepdims=True)
        logp = Y - np.log(np.exp(Y).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(len(targets)), targets].mean())
    return f


def _cubic_case(rng: np.random.Generator, eps: float) -> dict:
    k = int(rng.integers(3, 6))
    return dict(f=_cubic(rng.standard_normal(k)), x=rng.standard_normal(k), eps=eps)


def _logsumexp_case(rng: np.random.Generator, eps: float) -> dict:
    k, j = int(rng.integers(3, 6)), int(rng.integers(2, 5))
    return dict(f=_logsumexp(rng.standard_normal((k, j))), x=rng.standard_normal(j), eps=eps)


def _lora_case(rng: np.random.Generator, eps: float) -> dict:
    n, d, m, r = int(rng.integers(2, 4)), int(rng.integers(3, 5)), int(rng.integers(2, 5)), 2
    X, W = rng.standard_normal((n, d)), rng.standard_normal((d, m)) / np.sqrt(d)
    A, B = rng.standard_normal((d, r)) / np.sqrt(d), rng.standard_normal((r, m))
    return dict(f=_lora_cross_entropy(X, W, B, 2.0, rng.integers(0, m, n)), x=A, eps=eps)


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(71)
    return [
        Case(_cubic_case(rng, 1e-3), "f(x) = Σ x³ + (c·x)², a vector, ε = 1e-3"),
        Case(_logsumexp_case(rng, 1e-4), "log Σ exp(M x), ε = 1e-4"),
        Case(_lora_case(rng, 1e-4), "cross-entropy of a LoRA layer as a function of the matrix A, ε = 1e-4"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    makers = (_cubic_case, _logsumexp_case, _lora_case)
    return [Case(makers[i % 3](rng, float(rng.choice([1e-3, 1e-4])))) for i in range(6)]


def _one_sided(f, x, eps, forward: bool) -> np.ndarray:
    x = np.array(x, dtype=np.float64)
    f0 = float(f(x))
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps if forward else old - eps
        g[i] = (float(f(x)) - f0) / eps if forward else (f0 - float(f(x))) / eps
        x[i] = old
    return g


def _not_restored(f, x, eps) -> np.ndarray:
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        x[i] += eps
        fp = float(f(x))
        x[i] -= 2 * eps
        g[i] = (fp - float(f(x))) / (2 * eps)  # and x[i] stays at old − ε
    return g


def _p1_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    f, x, eps = kw["f"], kw["x"], kw["eps"]
    right = central_difference(f, x, eps)
    out = [
        Mistake("2eps", 2 * right, f"every entry is twice the slope: divide f(x + ε) − f(x − ε) by 2ε, not by ε (the two points are 2ε apart). {READ_CD}"),
        Mistake("half", right / 2, f"every entry is half the slope: the two points are 2ε apart, divide by 2ε, not by 4ε. {READ_CD}"),
        Mistake("forward", _one_sided(f, x, eps, True), f"this is the forward difference (f(x + ε) − f(x)) / ε, whose error shrinks only like ε; use the central difference (f(x + ε) − f(x − ε)) / 2ε. {READ_CD}"),
        Mistake("backward", _one_sided(f, x, eps, False), f"this is the backward difference (f(x) − f(x − ε)) / ε, first-order accurate; use the central difference (f(x + ε) − f(x − ε)) / 2ε. {READ_CD}"),
        Mistake("restore", _not_restored(f, x, eps), f"you forgot to restore each entry after perturbing it: x[i] stays at x[i] − ε, so every later entry is differentiated at the wrong point. Put x[i] back to its old value. {READ_CD}"),
    ]
    # The messages quote only the formula's constants (2ε, 4ε), never the case's x or ε: each is its own hint.
    return {"grad": worded(out)}


def _p1_x_untouched(fn, case: Case) -> list[str] | None:
    x = np.array(case.kwargs["x"], dtype=np.float64)
    before = x.copy()
    fn(f=case.kwargs["f"], x=x, eps=case.kwargs["eps"])
    if np.array_equal(x, before):
        return None
    idx = tuple(int(i) for i in np.argwhere(x != before)[0])
    return [f"your gradient is right, but central_difference changed its input: {entry_name('x', idx)} was {before[idx]!r} and is now "
            f"{x[idx]!r}. Restore every entry you perturb (x[idx] = old), or perturb a copy; a caller's parameters must "
            f"come back unchanged. {READ_CD}"]


# --------------------------------------------------------------------------- p2: rel_error


def _p2_public() -> list[Case]:
    return [
        Case(dict(a=np.array([1.0, -2.0, 0.5]), n=np.array([1.0, -1.9998, 0.5])), "one entry off by 2e-4"),
        Case(dict(a=np.array([[0.2, 3.0], [-1.0, 4.0]]), n=np.array([[0.25, 3.0], [-1.0, 4.5]])), "a matrix, |n| > |a|"),
        Case(dict(a=np.array([0.0, 1.0, 0.0]), n=np.array([0.0, 1.0, 1e-3])), "zeros: 0 against 0, and 0 against 1e-3 (0/0 needs the tiny guard)"),
        Case(dict(a=np.array([2.0, -1.0]), n=np.array([-2.0, -1.0])), "opposite signs"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(6):
        shape = (int(rng.integers(2, 5)),) if i % 2 else (int(rng.integers(2, 4)), int(rng.integers(2, 4)))
        a = rng.standard_normal(shape)
        n = a * (1 + 10.0 ** rng.uniform(-8, -1, shape) * rng.choice([-1, 1], shape))
        flat_a, flat_n = a.reshape(-1), n.reshape(-1)
        if i % 3 == 0:  # an entry where both are zero
            flat_a[0] = flat_n[0] = 0.0
        if i % 3 == 1:  # an entry where |n| > |a|
            flat_n[-1] = 3 * flat_a[-1]
        cases.append(Case(dict(a=a, n=n)))
    return cases


def _p2_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    a, n = np.asarray(kw["a"], dtype=np.float64), np.asarray(kw["n"], dtype=np.float64)
    err = relative_errors(a, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        only_a = np.abs(a - n) / np.abs(a)
        only_n = np.abs(a - n) / np.abs(n)
    out = [
        Mistake("sum", float(np.max(relative_errors(a, n, "sum"))), f"you divided by |a| + |n| (CS231n's code, and coursekit's relative_error); this item asks for max(|a|, |n|, tiny), as in the CS231n notes. The two differ by up to a factor 2. {READ_REL}"),
        Mistake("mean", float(np.mean(err)), f"that is the mean over entries; a gradient check reports the worst entry (np.max), since one wrong entry is a bug. {READ_REL}"),
        Mistake("absolute", float(np.max(np.abs(a - n))), f"that is the absolute error max |a − n|, with no denominator; divide by max(|a|, |n|, tiny) so the check does not depend on the gradient's scale. {READ_REL}"),
        Mistake("elementwise", err, f"you returned every entry's error; return one number, the largest (np.max). {READ_REL}"),
    ]
    if np.all(np.isfinite(only_a)):
        out.append(Mistake("only a", float(np.max(only_a)), f"you divided by |a| alone; use max(|a|, |n|, tiny), which is symmetric in a and n and finite when a = 0. {READ_REL}"))
    if np.all(np.isfinite(only_n)):
        out.append(Mistake("only n", float(np.max(only_n)), f"you divided by |n| alone; use max(|a|, |n|, tiny), which is symmetric in a and n and finite when n = 0. {READ_REL}"))
    # The messages quote only the definition's constants (a factor 2, a = 0), never the case's arrays: each is its own hint.
    return {"rel_err": worded(out)}


# --------------------------------------------------------------------------- numbers

W2_SHAPE = dict(n=3, d=6, m=4, r=2)
P5 = dict(lora_alpha=4, r=16)   # s_twice_in_dA checked at s = lora_alpha / r = 1/4: an extra factor below 1


def _w2_expected() -> float:
    n, d, m, r = (W2_SHAPE[k] for k in ("n", "d", "m", "r"))
    return 2 * (n * d + d * r + r * m)


def _w2_mistakes() -> list[Mistake]:
    n, d, m, r = (W2_SHAPE[k] for k in ("n", "d", "m", "r"))
    return [
        Mistake("one each", n * d + d * r + r * m, "that is one evaluation per entry; a central difference needs two, f(x + ε) and f(x − ε). " + READ_CD),
        Mistake("no X", 2 * (d * r + r * m), "that checks A and B only; the question also checks every entry of X (n × d). " + READ_CD),
        Mistake("with W", 2 * (n * d + d * r + r * m + d * m), "W is frozen: its gradient is never formed, so nothing to check there. " + READ_CD),
    ]


def _p7_expected() -> float:
    # The forward difference's error bound ε/2·|f″| + 2u·|f|/ε (f(x + ε) and f(x) each rounded, the difference
    # divided by ε) is smallest at ε* = 2·√(u·|f| / |f″|); with |f| ≈ |f″| in float64, 2·√u (Nocedal & Wright,
    # section 8.1). tests/test_lesson07_items.py minimises the bound numerically and runs the sweep.
    return 2 * np.sqrt(gc.unit_roundoff("float64"))


def _p7_mistakes() -> list[Mistake]:
    u = gc.unit_roundoff("float64")
    return [
        Mistake("one rounding", np.sqrt(2 * u), "you counted the rounding of one value of f. Both f(x + ε) and f(x) are "
                "rounded, each by up to u·|f|, so their difference is off by up to 2u·|f| and the round-off of the "
                "quotient is 2u·|f|/ε. " + READ_SWEEP),
        Mistake("rule of thumb", np.sqrt(u), "√u ≈ 1.05e-8 is the rule of thumb (Nocedal & Wright call it close to "
                "optimal), not the minimiser the question asks for: set the derivative of ε/2 · |f″| + 2u·|f|/ε to zero, "
                "which gives ε* = 2·√(u·|f|/|f″|), twice √u. " + READ_SWEEP),
        Mistake("central", gc.optimal_step("float64"), "that is the central difference's ε*, which balances a "
                "second-order truncation ε²/6 · |f‴|. The forward difference's truncation is first order, ε/2 · |f″| "
                "(the table in 'Central differences, entry by entry'): minimise ε/2 · |f″| + 2u·|f|/ε instead. " + READ_SWEEP),
        Mistake("machine epsilon", 2 * np.sqrt(2 * u), "2⁻⁵² ≈ 2.2e-16 is the gap between 1 and the next float64 "
                "(machine epsilon); the rounding error of one value is at most half of it, the unit round-off "
                "u = 2⁻⁵³ ≈ 1.1e-16. " + READ_SWEEP),
        Mistake("float32", 2 * np.sqrt(gc.unit_roundoff("float32")), "that uses float32's u = 2⁻²⁴; the loss is "
                "evaluated in float64, whose u = 2⁻⁵³ ≈ 1.1e-16. " + READ_F32),
        Mistake("no square root", 4 * u, "that is 4u·|f|/|f″|, ε*²: take its square root. " + READ_SWEEP),
    ]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 5

ITEMS = {
    "w1": Choice(
        "the central-difference formula",
        0,
        key="b",
        explain={
            "a": "That is the forward difference: it works, but its error shrinks only like ε, not ε². Reread 'Central differences, entry by entry' in Know this.",
            "b": "The Taylor expansions of f(x + ε) and f(x − ε) share their even terms, so their difference is 2ε f′(x) + ε³/3 · f‴(x); dividing by the 2ε between the two points leaves f′(x) with an error of only ε²/6 · f‴(x), second order. For sin at x = 1 and ε = 1e-3 that is about 9.0e-8, against 4.2e-4 for the forward difference. (Lesson 07, 'Central differences, entry by entry'.)",
            "c": "The two points x + ε and x − ε are 2ε apart: dividing by ε doubles the slope. Reread 'Central differences, entry by entry' in Know this.",
            "d": "That is the average of the two values: it measures the function's level near x, not its slope; a derivative needs a difference, divided by the 2ε between the points. Reread 'Central differences, entry by entry' in Know this.",
        },
    ),
    "w2": Numeric(
        f"loss evaluations for a full central-difference check of X, A and B (n = {W2_SHAPE['n']}, d = {W2_SHAPE['d']}, "
        f"m = {W2_SHAPE['m']}, r = {W2_SHAPE['r']})",
        0,
        name="n_evals",
        expected=_w2_expected,
        rtol=0,
        mistakes=_w2_mistakes,
    ),
    "w3": Choice(
        "why gradient checks run in float64",
        0,
        key="d",
        explain={
            "a": "Speed is not the reason: float64 is slower on most hardware. The reason is round-off, which is divided by ε. Reread 'float32 needs other tolerances' in Know this.",
            "b": "Adapters are trained in float32 or bf16; the check uses float64 only to keep round-off below the bug signal. Reread 'float32 needs other tolerances' in Know this.",
            "c": "The truncation error ε²/6 · |f‴| comes from the Taylor expansion, not from the arithmetic: it is the same in float32 and float64. What the precision changes is the round-off in f(x ± ε), which the difference divides by ε. Reread 'float32 needs other tolerances' in Know this.",
            "d": "float32 keeps 24 bits (unit round-off about 6.0e-8), so each of f(x ± ε) is off by roughly 1e-7·|f|, and the central difference carries a round-off error of about 1e-7·|f| / ε: at ε = 1e-6 that is 0.1·|f|, and the estimate is noise. In float64 (u ≈ 1.1e-16) the same term is about 1e-10·|f|, far below the signal of a real bug, so the check runs there and the same code is then trusted in float32. (Lesson 07, 'float32 needs other tolerances'.)",
        },
    ),
    "p1": Function(
        "implement central_difference",
        3,
        name="central_difference",
        reference=central_difference,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("grad",),
        mistakes=_p1_mistakes,
        extra=_p1_x_untouched,
    ),
    "p2": Function(
        "implement rel_error",
        2,
        name="rel_error",
        reference=rel_error,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("rel_err",),
        mistakes=_p2_mistakes,
    ),
    "p3": Choice(
        "the untabled cases (A = B = 0, X = 0, rsLoRA) that expose a backward without s",
        1,
        options="abcd",
        multi=True,
    ),
    "p4": Choice(
        "the cases that expose dB = s · outer(Z.sum(0), D.sum(0))",
        1,
        options="abcd",
        multi=True,
    ),
    "p5": Choice(
        f"check_vjp's dA error for s applied twice in dA, lora_alpha = {P5['lora_alpha']}, r = {P5['r']}",
        1,
    ),
    "p6": Ordering(
        "the smallest error of central and forward differences in float64 and float32, most accurate first",
        2,
        labels={
            "central_float32": "central difference, loss evaluated in float32",
            "central_float64": "central difference, loss evaluated in float64",
            "forward_float32": "forward difference, loss evaluated in float32",
            "forward_float64": "forward difference, loss evaluated in float64",
        },
    ),
    "p7": Numeric(
        "float64's best forward-difference step ε* (|f| ≈ |f″|)",
        1,
        name="eps_star",
        reread=READ_SWEEP,
        expected=_p7_expected,
        rtol=1e-2,  # the prompt says within 1 %: u = 1.1e-16 for 2⁻⁵³ passes
        mistakes=_p7_mistakes,
    ),
    "p8": Choice(
        "gradcheck's atol and check_vjp's relative error when every gradient is scaled by c",
        2,
        options="abcd",
        multi=True,
    ),
}
