"""Lesson 07 ("Gradient checking"): graded items score right answers fully, typical wrong answers less, with
the diagnostics a student needs; the notebook's test cells agree with the item registry."""

from pathlib import Path

import numpy as np
import pytest

from coursekit import gradcheck as gc
from coursekit import lora
from coursekit.grading import check
from coursekit.grading.lessons import lesson07
from coursekit.grading.lessons.lesson07 import ITEMS

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- student-style implementations


def central_difference(f, x, eps):
    grad = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        fp = f(x)
        x[idx] = old - eps
        fm = f(x)
        x[idx] = old
        grad[idx] = (fp - fm) / (2 * eps)
    return grad


def central_on_copies(f, x, eps):
    grad = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        e = np.zeros(x.shape)
        e[idx] = eps
        grad[idx] = (f(x + e) - f(x - e)) / (2 * eps)
    return grad


def forward_difference(f, x, eps):
    grad, f0 = np.zeros(x.shape), f(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        grad[idx] = (f(x) - f0) / eps
        x[idx] = old
    return grad


def backward_difference(f, x, eps):
    grad, f0 = np.zeros(x.shape), f(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old - eps
        grad[idx] = (f0 - f(x)) / eps
        x[idx] = old
    return grad


def divided_by_eps(f, x, eps):
    return 2 * central_difference(f, x, eps)


def not_restored(f, x, eps):
    grad = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        x[idx] += eps
        fp = f(x)
        x[idx] -= 2 * eps
        grad[idx] = (fp - f(x)) / (2 * eps)
    return grad


def changes_x(f, x, eps):
    grad = central_on_copies(f, x, eps)
    x *= 2
    return grad


# The public answers, computed here: coursekit's numeric_gradient, which the reference calls, is withheld while
# the student's function runs.
PUBLIC_P1 = [(case.kwargs["x"].copy(), lesson07.central_difference(**case.kwargs)) for case in lesson07._p1_public()]


def hard_coded(f, x, eps):
    # The public answers, whatever the case: passes the public cases, fails the hidden ones.
    for x_public, answer in PUBLIC_P1:
        if x_public.shape == x.shape and np.allclose(x_public, x):
            return answer
    return np.zeros(x.shape)


def rel_error(a, n):
    a, n = np.asarray(a, dtype=float), np.asarray(n, dtype=float)
    return float(np.max(np.abs(a - n) / np.maximum(np.maximum(np.abs(a), np.abs(n)), 1e-12)))


RIGHT = {"w1": "b", "w2": 76, "w3": "d", "p1": central_difference, "p2": rel_error, "p3": {"b", "c"}, "p4": {"b", "c", "d"},
         "p5": "b", "p6": ["central_float64", "forward_float64", "central_float32", "forward_float32"], "p7": 2.107e-8,
         "p8": {"a", "b"}}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"07.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_another_correct_central_difference_scores_full():
    assert check("07.p1", central_on_copies, hidden=True).full


@pytest.mark.parametrize("item_id, fn, name", [
    ("p1", gc.numeric_gradient, "gradcheck.numeric_gradient"),
    ("p1", lesson07.central_difference, "gradcheck.numeric_gradient"),  # the grader's reference calls it
    ("p2", lambda a, n: float(gc.relative_errors(a, n).max()), "gradcheck.relative_errors"),
])
def test_handing_in_coursekits_own_function_fails_here_as_when_graded(item_id, fn, name):
    """The grader's runner withholds the functions the item asks the student to write; the notebook's check runs the
    answer the same way (coursekit.grading.checkers.withheld_here), so it says now what grading will say."""
    fb = check(f"07.{item_id}", fn, hidden=True)
    assert fb.points == 0 and f"coursekit's {name} is withheld" in fb.text()


def test_hidden_cases_are_deterministic_and_random_in_shape():
    a = check("07.p1", central_difference, hidden=True).text()
    assert a == check("07.p1", central_difference, hidden=True).text() and a.count("hidden case") == 6
    shapes = {c.kwargs["x"].shape for c in lesson07._p1_hidden(np.random.default_rng(0))}
    assert len(shapes) > 2


def test_hidden_cases_defeat_a_hard_coded_answer():
    assert check("07.p1", hard_coded, hidden=False).full
    fb = check("07.p1", hard_coded, hidden=True)
    assert fb.points == pytest.approx(3 * 3 / 9) and "hidden case" in fb.text()


def test_references_agree_with_coursekit():
    case = lesson07._p1_public()[2].kwargs
    np.testing.assert_allclose(lesson07.central_difference(**case), gc.numeric_gradient(case["f"], case["x"].copy(), case["eps"]))
    a, n = np.array([1.0, 0.0, -2.0]), np.array([1.5, 0.0, -2.0])
    assert lesson07.rel_error(a, n) == pytest.approx(1 / 3)


# --------------------------------------------------------------------------- wrong answers: p1


@pytest.mark.parametrize(
    "fn, text",
    [
        (forward_difference, "forward difference"),
        (backward_difference, "backward difference"),
        (divided_by_eps, "not by ε"),
        (not_restored, "forgot to restore"),
        (changes_x, "changed its input"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_central_difference_mistakes_are_named(fn, text, hidden):
    fb = check("07.p1", fn, hidden=hidden)
    assert fb.points == 0, fb.text()
    assert text in fb.text() and "Central differences, entry by entry" in fb.text()


def test_central_difference_stub_and_not_a_function():
    def stub(f, x, eps):
        raise NotImplementedError()

    assert "NotImplementedError" in check("07.p1", stub).text()
    assert check("07.p1", "central_difference").points == 0


# --------------------------------------------------------------------------- wrong answers: p2


def _re(den=None, agg=np.max, guard=True):
    def fn(a, n):
        a, n = np.asarray(a, dtype=float), np.asarray(n, dtype=float)
        d = den(a, n) if den else np.maximum(np.abs(a), np.abs(n))
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(agg(np.abs(a - n) / (np.maximum(d, 1e-12) if guard else d)))
    return fn


@pytest.mark.parametrize(
    "fn, text",
    [
        (_re(den=lambda a, n: np.abs(a) + np.abs(n)), "divided by |a| + |n|"),
        (_re(agg=np.mean), "the mean over entries"),
        (_re(den=lambda a, n: np.ones_like(a)), "absolute error"),
        (_re(den=lambda a, n: np.abs(a)), "divided by |a| alone"),
        (_re(den=lambda a, n: np.abs(n)), "divided by |n| alone"),
        (lambda a, n: np.abs(a - n) / np.maximum(np.maximum(np.abs(a), np.abs(n)), 1e-12), "return one number"),
    ],
)
def test_rel_error_mistakes_are_named(fn, text):
    fb = check("07.p2", fn)
    assert fb.points < 2 and text in fb.text(), fb.text()
    assert "Relative error and its bands" in fb.text()


def test_rel_error_without_tiny_guard_fails_the_zero_case():
    fb = check("07.p2", _re(guard=False))
    assert 0 < fb.points < 2 and "is nan" in fb.text() and "tiny guard" in fb.text()


# --------------------------------------------------------------------------- choices, numbers, ordering


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "forward difference"),
        ("w1", "c", "2ε apart"),
        ("w3", "a", "Speed is not the reason"),
        ("w3", "c", "the same in float32 and float64"),
        ("p5", "a", "scales only the analytic dA"),
        ("p5", "c", "the formula of the CS231n notes"),
        ("p5", "d", "never exceeds 1"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"07.{item_id}", answer)
    assert fb.points == 0 and text in fb.text() and "Reread" in fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w2", 38, "two, f(x + ε) and f(x − ε)"),
        ("w2", 40, "also checks every entry of X"),
        ("w2", 124, "W is frozen"),
        ("p7", 1.0, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"07.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_ordering_partial_credit_names_the_first_misplaced_check():
    fb = check("07.p6", ["central_float64", "central_float32", "forward_float64", "forward_float32"])
    assert 0 < fb.points < 2 and "position 2: 'central_float32'" in fb.text() and "u^(2/3)" in fb.text()
    assert check("07.p6", ["forward_float32", "central_float32", "forward_float64", "central_float64"]).points == 0
    assert check("07.p6", ["central_float64", "forward_float64", "central_float32"]).points == 0


def test_multi_choice_partial_credit_and_hints():
    fb = check("07.p3", {"a", "d"})
    assert fb.points == 0 and "compares 0 with 0" in fb.text() and "8 / √64 = 1" in fb.text()
    fb = check("07.p3", {"c"})
    assert 0 < fb.points < 1 and "contains no X" in fb.text()
    fb = check("07.p4", {"a", "b", "c", "d"})
    assert 0 < fb.points < 1 and "With one token" not in fb.text() and "one token in disguise" in fb.text()
    fb = check("07.p4", {"c"})
    assert 0 < fb.points < 1 and "three times as large" in fb.text() and "other tokens' z" in fb.text()
    fb = check("07.p8", {"a", "b", "c"})
    assert fb.points == pytest.approx(1.0) and "covered by rtol" in fb.text()
    fb = check("07.p8", {"a"})
    assert fb.points == pytest.approx(1.0) and "still reports 1/3" in fb.text()
    fb = check("07.p8", {"c", "d"})
    assert fb.points == 0 and "absolute tolerance cannot see" in fb.text() and "tiny floor" in fb.text()


def _case(n, r, s, zero_B=False, same_rows=False, one_row_D=False, one_row_X=False, d=5, symmetric_W=False, seed=0,
          zero_A=False, zero_X=False):
    rng = np.random.default_rng(seed)
    X, A, D = rng.standard_normal((n, d)), rng.standard_normal((d, r)), rng.standard_normal((n, 4))
    W, B = rng.standard_normal((d, 4)), np.zeros((r, 4)) if zero_B else rng.standard_normal((r, 4))
    if zero_A:
        A = np.zeros_like(A)
    if zero_X:
        X = np.zeros_like(X)
    if symmetric_W:
        W = (W + W.T) / 2
    if same_rows:
        X = np.repeat(X[:1], n, axis=0)
    if one_row_D:
        D[1:] = 0.0
    if one_row_X:
        X[1:] = 0.0
    return X, W, A, B, s, D


def _check_fails(backward, case):
    X, W, A, B, s, D = case
    _, cache = lora.lora_forward(X, W, A, B, s)
    return not gc.check_vjp(lambda X, A, B: lora.lora_forward(X, W, A, B, s)[0], dict(X=X, A=A, B=B),
                            dict(zip("XAB", backward(D, cache))), D).ok


@pytest.mark.parametrize("seed", range(3))
def test_p3_and_p4_keys_are_the_cases_whose_check_fails(seed):
    """P3's and P4's keys measured: the gradient check of each broken backward fails in exactly the keyed cases."""
    def without_s(D, cache):
        return lora.lora_backward(D, {**cache, "s": 1.0})

    def tokens_summed_first(D, cache):
        dX, dA, _ = lora.lora_backward(D, cache)
        return dX, dA, cache["s"] * np.outer(cache["Z"].sum(axis=0), D.sum(axis=0))

    p3 = {"a": _case(3, 2, lora.scaling(4, 2), zero_A=True, zero_B=True, seed=seed),
          "b": _case(3, 2, lora.scaling(4, 2), zero_X=True, seed=seed),
          "c": _case(3, 16, lora.scaling(16, 16, use_rslora=True), seed=seed),
          "d": _case(3, 64, lora.scaling(8, 64, use_rslora=True), seed=seed)}
    assert {k for k, c in p3.items() if _check_fails(without_s, c)} == RIGHT["p3"]
    # None of P3's cases is a row of the lesson's table (B = 0 alone, n = 1, s = 1, d = m, all four): the hints' reasons
    # hold, B = 0 alone and A = 0 alone (B random) do expose the missing s at s = 2.
    assert _check_fails(without_s, _case(3, 2, 2.0, zero_B=True, seed=seed))
    assert _check_fails(without_s, _case(3, 2, 2.0, zero_A=True, seed=seed))
    p4 = {"a": _case(3, 2, 2.0, one_row_X=True, one_row_D=True, seed=seed),
          "b": _case(3, 2, 2.0, same_rows=True, seed=seed),
          "c": _case(2, 2, 1.0, d=4, symmetric_W=True, seed=seed), "d": _case(3, 2, 2.0, one_row_D=True, seed=seed)}
    assert {k for k, c in p4.items() if _check_fails(tokens_summed_first, c)} == {"b", "c", "d"}


def _lesson_layer(seed=None):
    """The layer of the lesson's 'The vector–Jacobian check' (seed 7, n = 3, d = 5, m = 4, r = 2, lora_alpha = 4), or
    another draw of the same shapes."""
    rng = np.random.default_rng(7 if seed is None else seed)
    n, d, m, r = 3, 5, 4, 2
    X, W, A, B, D = (rng.standard_normal(shape) for shape in ((n, d), (d, m), (d, r), (r, m), (n, m)))
    return X, W, A, B, lora.scaling(4, r), D


def _scaled_verdicts(backward, c, layer):
    """(check_vjp's verdict, torch.autograd.gradcheck's verdict) on the layer whose output is multiplied by c, the
    backward receiving c·D, with the lesson's settings for both checkers."""
    import torch

    X, W, A, B, s, D = layer
    _, cache = lora.lora_forward(X, W, A, B, s)
    grads = dict(zip("XAB", backward(c * D, cache)))
    ours = gc.check_vjp(lambda X, A, B: c * lora.lora_forward(X, W, A, B, s)[0], dict(X=X, A=A, B=B), grads, D).ok

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X, A, B, W, s):
            Y, ctx.cache = lora.lora_forward(X, W, A, B, s)
            return c * Y

        @staticmethod
        def backward(ctx, D):
            return (*backward(c * D.contiguous(), ctx.cache), None, None)

    Xt, At, Bt = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (X, A, B))
    theirs = torch.autograd.gradcheck(Scaled.apply, (Xt, At, Bt, torch.tensor(W), s), eps=1e-6, atol=1e-6, rtol=1e-5,
                                      raise_exception=False)
    return ours, theirs


@pytest.mark.parametrize("seed", [None, 0, 1])
def test_p8_key_is_measured_with_both_checkers_on_a_scaled_output(seed):
    """P8's key measured: with the layer's output multiplied by c = 1e-8 gradcheck's atol lets the backward without s
    pass while check_vjp fails it and passes the right one; at c = 1e8 gradcheck still passes the right backward.
    At c = 1 both flag the bug, as the lesson prints."""
    def without_s(D, cache):
        return lora.lora_backward(D, {**cache, "s": 1.0})

    layer = _lesson_layer(seed)
    assert _scaled_verdicts(without_s, 1.0, layer) == (False, False)
    ours_bug, theirs_bug = _scaled_verdicts(without_s, 1e-8, layer)
    ours_right, theirs_right = _scaled_verdicts(lora.lora_backward, 1e-8, layer)
    _, theirs_right_big = _scaled_verdicts(lora.lora_backward, 1e8, layer)
    statements = {"a": theirs_bug, "b": not ours_bug, "c": not theirs_right_big, "d": not ours_right}
    assert {k for k, holds in statements.items() if holds} == RIGHT["p8"] and check("07.p8", RIGHT["p8"]).full
    assert theirs_right  # gradcheck passes the right backward at c = 1e-8 too: it passes everything there


def test_p8_hint_numbers_are_measured():
    """The hints quote 1/3 for the missing s on dA at c = 1e-8 (as at c = 1) and gradients of order 1e-8."""
    X, W, A, B, s, D = _lesson_layer()
    c = 1e-8
    _, cache = lora.lora_forward(X, W, A, B, s)
    bad = lora.lora_backward(c * D, {**cache, "s": 1.0})
    rep = gc.check_vjp(lambda X, A, B: c * lora.lora_forward(X, W, A, B, s)[0], dict(X=X, A=A, B=B),
                       dict(zip("XAB", bad)), D)
    assert rep["A"].rel_error == pytest.approx(1 / 3, rel=1e-6)
    right = lora.lora_backward(c * D, cache)
    scale = max(np.abs(g).max() for g in right)
    assert 1e-9 < scale < 1e-6   # "of order 1e-8": far above the tiny floor 1e-12, far below atol 1e-6
    # b) "the largest [difference] stays far above 1e-10" at c = 1e-8, and "it takes a c of about 1e-11 or less to hide
    # them all" (the lesson shows the pass at 1e-12)
    assert max(ch.max_abs_error for ch in rep.checks) > 100 * 1e-10 and not rep.ok

    def verdict(c):
        bad_c = lora.lora_backward(c * D, {**cache, "s": 1.0})
        return gc.check_vjp(lambda X, A, B: c * lora.lora_forward(X, W, A, B, s)[0], dict(X=X, A=A, B=B),
                            dict(zip("XAB", bad_c)), D).ok

    passes = [c for c in 10.0 ** -np.arange(6, 16) if verdict(c)]
    assert max(passes) == pytest.approx(1e-11) and all(verdict(c) for c in 10.0 ** -np.arange(11, 16))


def test_check_vjps_absolute_floor_is_the_1e_10_the_lesson_states():
    """The lesson (and P8's hints) say check_vjp counts an entry whose |a − n| is below 1e-10 as agreeing, whatever its
    ratio, and that an analytic 0 against a numeric 3e-11 has a relative error of 1 without that rule."""
    def floor_case(slope):   # f(v) = slope · v, checked against an analytic gradient of 0
        return gc.check_vjp(lambda v: slope * v, dict(v=np.array([0.5])), dict(v=np.zeros(1)), np.ones(1))

    near, far = floor_case(3e-11), floor_case(3e-10)
    assert near.ok and near["v"].rel_error == 0.0 and 0 < near["v"].max_abs_error < 1e-10   # counted as agreeing
    assert not far.ok and far["v"].rel_error == pytest.approx(1.0) and far["v"].max_abs_error > 1e-10
    np.testing.assert_allclose(gc.relative_errors(np.zeros(1), np.array([3e-11]), denominator="sum"), 1.0)


# --------------------------------------------------------------------------- P5, P6 and P7 measured


def s_twice_in_dA(D, cache):
    dX, dA, dB = lora.lora_backward(D, cache)
    return dX, cache["s"] * dA, dB


def _dA_report(backward, s, seed):
    X, W, A, B, _, D = _case(3, lesson07.P5["r"], s, seed=seed)
    _, cache = lora.lora_forward(X, W, A, B, s)
    grads = dict(zip("XAB", backward(D, cache)))
    numeric = gc.numeric_gradient(lambda A_: float(np.sum(lora.lora_forward(X, W, A_, B, s)[0] * D)), A.copy())
    rep = gc.check_vjp(lambda X, A, B: lora.lora_forward(X, W, A, B, s)[0], dict(X=X, A=A, B=B), grads, D)
    return rep["A"].rel_error, grads["A"], numeric


@pytest.mark.parametrize("seed", range(3))
def test_p5_key_and_wrong_options_are_measured(seed):
    """P5's options, measured: check_vjp's dA error for s twice at s = 4 / 16 = 1/4 is option b; the others are the
    mistakes, each run."""
    options = {"a": 0.0, "b": 0.6, "c": 0.75, "d": 3.0}
    s = lora.scaling(lesson07.P5["lora_alpha"], lesson07.P5["r"])
    assert s == 0.25
    reported, a, n = _dA_report(s_twice_in_dA, s, seed)
    closest = min(options, key=lambda k: abs(options[k] - reported))
    assert closest == "b" and check("07.p5", closest).full
    np.testing.assert_allclose(reported, options["b"], rtol=1e-6)
    # the same 3/5 as the inverse factor s = 4 (the key's explanation says so)
    np.testing.assert_allclose(_dA_report(s_twice_in_dA, 4.0, seed)[0], 3 / 5, rtol=1e-6)
    # a) what a relative error ignores is a factor on both values: the same s-scaled dA against the numeric
    # gradient of the loss scaled by s (the loss × 1000 of the lesson) passes
    X, W, A, B, _, D = _case(3, lesson07.P5["r"], s, seed=seed)
    _, cache = lora.lora_forward(X, W, A, B, s)
    both = gc.check_vjp(lambda X, A, B: s * lora.lora_forward(X, W, A, B, s)[0], dict(X=X, A=A, B=B),
                        {k: s * g for k, g in zip("XAB", lora.lora_backward(D, cache))}, D)
    np.testing.assert_array_equal(s * lora.lora_backward(D, cache)[1], s_twice_in_dA(D, cache)[1])
    assert both.ok and both["A"].rel_error <= 1e-6
    # c) the notes' denominator max(|a|, |n|) instead of check_vjp's |a| + |n|
    np.testing.assert_allclose(gc.relative_errors(a, n, denominator="max").max(), options["c"], rtol=1e-6)
    # d) relative to the analytic value alone
    np.testing.assert_allclose(np.max(np.abs(a - n) / np.abs(a)), options["d"], rtol=1e-6)
    for wrong in "acd":
        assert check("07.p5", wrong).points == 0


# --------------------------------------------------------------------------- P9 and P10's model answers, measured


def _sweep_layer():
    """The layer, targets and analytic dA of the lesson's 'The ε sweep' (seed 0)."""
    rng = np.random.default_rng(0)
    n, d, m, r, s = 4, 6, 5, 2, 2.0
    X = rng.standard_normal((n, d))
    W = rng.standard_normal((d, m)) / np.sqrt(d)
    A = rng.standard_normal((d, r)) / np.sqrt(d)
    B = rng.standard_normal((r, m)) / np.sqrt(r)
    targets = rng.integers(0, m, n)

    def cross_entropy(A_):
        Y = lora.lora_forward(X, W, A_, B, s)[0]
        Y = Y - Y.max(axis=1, keepdims=True)
        return float(-(Y - np.log(np.exp(Y).sum(axis=1, keepdims=True)))[np.arange(n), targets].mean())

    Y, cache = lora.lora_forward(X, W, A, B, s)
    P = np.exp(Y - Y.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    dA = lora.lora_backward((P - np.eye(m)[targets]) / n, cache)[1]
    return dict(X=X, W=W, A=A, B=B, s=s, f=cross_entropy, dA=dA)


def test_p9_model_answer_is_the_measured_sweep():
    """P9's model answer: × 1000 moves nothing; + 10⁶ moves the best ε up about 70× (to a few 1e-4), the minimum up a
    few thousand times (to about 1e-7), and makes a right kernel fail check_vjp at ε = 1e-6 (median error about 2e-5)."""
    lay = _sweep_layer()
    f, A, dA = lay["f"], lay["A"], lay["dA"]
    np.testing.assert_allclose(f(A), 2.92, atol=0.005)                   # "about 2.9", printed by the sweep cell
    grid = np.logspace(-1, -14, 53)
    plain = gc.epsilon_sweep(f, A.copy(), dA, grid, reduce="median")
    times = gc.epsilon_sweep(lambda A_: 1000 * f(A_), A.copy(), 1000 * dA, grid, reduce="median")
    plus = gc.epsilon_sweep(lambda A_: f(A_) + 1e6, A.copy(), dA, grid, reduce="median")
    best = {k: grid[np.argmin(v)] for k, v in (("plain", plain), ("times", times), ("plus", plus))}
    assert best["times"] == best["plain"] and 5e-6 <= best["plain"] <= 7e-6          # "near 6e-6"
    np.testing.assert_allclose(times.min(), plain.min(), rtol=0.2)
    assert 3e-11 <= plain.min() <= 7e-11                                              # "near 5e-11"
    assert 1e-4 <= best["plus"] <= 6e-4 and 30 <= best["plus"] / best["plain"] <= 150  # "a few times 1e-4", "about 70×"
    assert 1e3 <= plus.min() / plain.min() <= 1e4 and 5e-8 <= plus.min() <= 2e-7     # "a few thousand", "about 1e-7"
    np.testing.assert_allclose(1e6 / f(A), 3.4e5, rtol=0.02)                         # "about 3·10⁵-fold"
    np.testing.assert_allclose((1e6 / f(A)) ** (1 / 3), 70, rtol=0.02)              # ε* moves by the cube root
    at_1e6 = plus[np.argmin(np.abs(grid - 1e-6))]
    assert 1.5e-5 <= at_1e6 <= 3e-5 and gc.band(at_1e6) == "look closer"            # "about 2e-5"

    def verdict(loss, grad):   # check_vjp of a scalar loss (D = 1) at its default ε = 1e-6 and tol = 1e-6
        return gc.check_vjp(lambda A: np.array([loss(A)]), dict(A=A.copy()), dict(A=grad), np.ones(1)).ok

    assert verdict(f, dA) and verdict(lambda A_: 1000 * f(A_), 1000 * dA)
    assert not verdict(lambda A_: f(A_) + 1e6, dA)


@pytest.mark.parametrize("target_seed", [None, 2])
def test_p10_model_answer_is_the_measured_sweep(target_seed):
    """P10's model answer: for ½ Σ (Y − T)² as a function of A the central difference is exact up to round-off at every
    ε (no truncation line), the forward difference has a truncation line of slope 1, about 0.1 at ε = 0.1."""
    lay = _sweep_layer()
    X, W, A, B, s = (lay[k] for k in "XWABs")
    Y, cache = lora.lora_forward(X, W, A, B, s)
    T = np.zeros_like(Y) if target_seed is None else np.random.default_rng(target_seed).standard_normal(Y.shape)

    def loss(A_):
        return float(0.5 * np.sum((lora.lora_forward(X, W, A_, B, s)[0] - T) ** 2))

    grad = lora.lora_backward(Y - T, cache)[1]
    grid = np.logspace(-1, -5, 9)
    central = gc.epsilon_sweep(loss, A.copy(), grad, grid, reduce="median")
    forward = np.array([np.median(gc.relative_errors(grad, np.array(
        [[(loss(A + eps * np.eye(1, A.size, k).reshape(A.shape)) - loss(A)) / eps for k in range(A.size)]]).reshape(A.shape)))
        for eps in grid])
    assert central[0] < 1e-13 and central.max() < 1e-10                             # no truncation at any ε ...
    assert np.polyfit(np.log10(grid), np.log10(central), 1)[0] < -0.5                # ... only round-off, growing as ε shrinks
    assert 0.9 < np.polyfit(np.log10(grid), np.log10(forward), 1)[0] < 1.1            # slope 1
    assert 0.05 < forward[0] < 0.2                                                     # "about 0.1 at ε = 0.1"


def _sweep(method, dtype, grid, seed=0):
    """Median relative error of forward or central differences of exp (|f| = |f″| = |f‴|), loss evaluated in dtype."""
    x = np.random.default_rng(seed).uniform(-0.5, 0.5, 200)

    def f(v):
        return np.exp(v.astype(dtype)).astype(np.float64)   # x ± ε rounded to dtype inside f, as in the lesson

    out = []
    for eps in grid:
        g = (f(x + eps) - f(x - eps)) / (2 * eps) if method == "central" else (f(x + eps) - f(x)) / eps
        out.append(np.median(np.abs(g - np.exp(x)) / np.exp(x)))
    return np.array(out)


GRID = np.logspace(-1, -12, 45)


def test_p6_key_is_the_order_of_the_measured_sweep_minima():
    """P6 measured: the bottom of each sweep (central / forward, float64 / float32) orders as the key, and follows
    the scalings the hints quote: u^(2/3) for central and √u for forward differences, within a factor 10."""
    best = {f"{m}_{dt}": _sweep(m, np.dtype(dt).type, GRID).min() for m in ("central", "forward") for dt in ("float64", "float32")}
    assert sorted(best, key=best.get) == RIGHT["p6"] and check("07.p6", RIGHT["p6"]).full
    for dt in ("float64", "float32"):
        u = gc.unit_roundoff(dt)
        assert u ** (2 / 3) / 10 < best[f"central_{dt}"] < 10 * u ** (2 / 3)
        assert np.sqrt(u) / 10 < best[f"forward_{dt}"] < 10 * np.sqrt(u)
    assert best["forward_float64"] * 100 < best["central_float32"]


def _argmin_model(truncation, roundoff):
    grid = np.logspace(-20, 0, 200_001)
    return grid[np.argmin(truncation(grid) + roundoff(grid))]


def test_p7_key_minimises_the_forward_error_bound_and_matches_the_sweep():
    u = gc.unit_roundoff("float64")
    key = ITEMS["p7"].expected()
    np.testing.assert_allclose(_argmin_model(lambda e: e / 2, lambda e: 2 * u / e), key, rtol=1e-3)
    # the same bound's argmin gives the lesson's central ε* (the check of the method)
    np.testing.assert_allclose(_argmin_model(lambda e: e**2 / 6, lambda e: u / e), gc.optimal_step(), rtol=1e-3)
    errors = _sweep("forward", np.float64, np.logspace(-6, -10, 33))
    measured = np.logspace(-6, -10, 33)[np.argmin(errors)]
    assert key / 3 < measured < 3 * key
    assert gc.optimal_step() > 100 * key
    assert check("07.p7", 2 * np.sqrt(1.1e-16)).full and check("07.p7", key * 1.02).points == 0


def test_p7_mistakes_are_the_mistaken_derivations():
    """Each named wrong answer of P7 is the argmin of the mistaken bound (or the mistaken unit round-off)."""
    u64, u32 = gc.unit_roundoff("float64"), gc.unit_roundoff("float32")
    variants = [
        (_argmin_model(lambda e: e / 2, lambda e: u64 / e), "you counted the rounding of one value of f"),
        (np.sqrt(u64), "the rule of thumb"),   # Nocedal & Wright's "close to optimal" ε = √u, half the minimiser
        (_argmin_model(lambda e: e**2 / 6, lambda e: u64 / e), "the central difference's ε*"),
        (_argmin_model(lambda e: e / 2, lambda e: 2 * 2.0**-52 / e), "machine epsilon"),
        (_argmin_model(lambda e: e / 2, lambda e: 2 * u32 / e), "float32's u"),
        (_argmin_model(lambda e: e / 2, lambda e: 2 * u64 / e) ** 2, "take its square root"),
    ]
    for answer, text in variants:
        fb = check("07.p7", answer)
        assert fb.points == 0 and text in fb.text(), fb.text()
