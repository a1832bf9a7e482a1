"""coursekit.grading.checkers: scores as documented, never above max points, never raising, never printing."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit.grading import (
    Case,
    Feedback,
    Mistake,
    check_array,
    check_choice,
    check_function,
    check_multi,
    check_numeric,
    check_ordering,
)

FAST = settings(max_examples=40, deadline=None, derandomize=True)

OPTIONS = list("abcd")
EXPECTED = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]])


def _garbage():
    """Answers students actually submit by accident, plus a few hostile ones."""
    return [
        None, Ellipsis, "", "   ", "abc", "a,b", "1.5", "[[1, 2]]", 0, 1.5, -0.0, True, float("nan"), float("inf"),
        [], [[]], [[1, 2], [3]], [["a", "b"]], [[[1.0]]], {"a": 1}, {"a", "z"}, ("a", None), object(), 3 + 4j,
        np.array(np.nan), np.array(3.0), np.array([np.nan, 1.0]), np.ones((2, 3), dtype=np.float32),
        np.ones((3, 2)), np.array(["a", "b"]), np.array([1 + 2j, 3j]), np.zeros((2, 3), dtype=complex),
        np.zeros((2, 3), dtype=bool), np.array([None, 1.0], dtype=object), np.float64("nan"),
        torch.tensor(1.0), torch.tensor(float("nan")), torch.ones(2, 3), torch.ones(2, 3, requires_grad=True),
        torch.ones(2, 3, requires_grad=True) * 2, torch.tensor(2.0, requires_grad=True),
        torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.int64), torch.ones(2, 3, dtype=torch.float16),
    ]


GARBAGE = _garbage()
IDS = [f"{i}-{type(g).__name__}" for i, g in enumerate(GARBAGE)]

CHECKERS = {
    "choice": lambda a: check_choice(a, "b", 2, OPTIONS, {"a": "hint a"}),
    "multi": lambda a: check_multi(a, {"a", "c"}, 2, OPTIONS, {"b": "hint b"}),
    "numeric": lambda a: check_numeric(a, 3.5, 2, name="x", mistakes=[Mistake("half", 1.75, "you halved it")]),
    "array": lambda a: check_array(a, EXPECTED, 4, name="Y", dtype=np.float64,
                                   mistakes=[Mistake("double", 2 * EXPECTED, "doubled")]),
    "ordering": lambda a: check_ordering(a, ["a", "b", "c", "d"], 3, {"a": "first"}),
}


def _run_silently(capfd, fn, *args, **kwargs):
    """Call fn, assert it wrote nothing to stdout/stderr (Python or fd level) and warned nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fb = fn(*args, **kwargs)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    assert not caught, [str(w.message) for w in caught]
    return fb


def _valid(fb):
    assert isinstance(fb, Feedback)
    assert 0.0 <= fb.points <= fb.max_points
    assert fb.lines and all(isinstance(l, str) and l for l in fb.lines)
    fb.text("title")  # renders


# --------------------------------------------------------------------------- garbage never raises, never prints


@pytest.mark.parametrize("kind", list(CHECKERS))
@pytest.mark.parametrize("answer", GARBAGE, ids=IDS)
def test_garbage_never_raises_or_prints(kind, answer, capfd):
    fb = _run_silently(capfd, CHECKERS[kind], answer)
    _valid(fb)
    assert not fb.full


answers = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
              st.sampled_from(["a", "b", "c", "d", " C) ", "A"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.frozensets(st.sampled_from("abcdz"), max_size=4)),
    max_leaves=8,
)


@FAST
@given(answer=answers)
def test_generated_answers_never_raise_and_stay_in_range(answer):
    for check in CHECKERS.values():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning would reach the notebook's stderr
            fb = check(answer)
        _valid(fb)


def test_feedback_clamps_points():
    assert Feedback(5, 2).points == 2.0
    assert Feedback(-1, 2).points == 0.0
    assert Feedback(2, 2).full and not Feedback(1.999, 2).full
    assert Feedback(1, 2, ["line"]).text("T") == "T: 1 / 2 points\n  line"


# --------------------------------------------------------------------------- check_choice


@pytest.mark.parametrize("answer", ["b", "B", " b ", "b)", "B) "])
def test_choice_right(answer, capfd):
    fb = _run_silently(capfd, check_choice, answer, "b", 2, OPTIONS)
    assert fb.points == 2 and fb.full and "is right" in fb.lines[0]


def test_choice_wrong_gives_hint(capfd):
    fb = _run_silently(capfd, check_choice, "a", "b", 2, OPTIONS, {"a": "hint a"})
    assert fb.points == 0 and "hint a" in fb.lines[0]
    fb = _run_silently(capfd, check_choice, "c", "b", 2, OPTIONS)
    assert fb.points == 0 and "not right" in fb.lines[0]
    fb = _run_silently(capfd, check_choice, "e", "b", 2, OPTIONS)
    assert fb.points == 0 and "one letter" in fb.lines[0]
    fb = _run_silently(capfd, check_choice, None, "b", 2, OPTIONS)
    assert fb.points == 0 and "No answer yet" in fb.lines[0]


# --------------------------------------------------------------------------- check_multi


@pytest.mark.parametrize(
    "answer, points",
    [({"a", "c"}, 2.0), (["c", "a"], 2.0), ("a, c", 2.0), ("A C", 2.0), (("a", "c", "a"), 2.0),
     ({"a"}, 1.0), ({"a", "b", "c"}, 1.0), ({"a", "b"}, 0.0), ({"b", "d"}, 0.0), (set(), 0.0),
     ({"a", "b", "c", "d"}, 0.0), ({"a", "e"}, 0.0)],
)
def test_multi_partial_credit(answer, points, capfd):
    fb = _run_silently(capfd, check_multi, answer, {"a", "c"}, 2, OPTIONS, {"b": "hint b"})
    assert fb.points == pytest.approx(points)
    assert fb.full == (points == 2.0)
    if "b" in answer and "e" not in answer:
        assert any("(b) should not be chosen" in l and "hint b" in l for l in fb.lines)


def test_multi_messages(capfd):
    fb = _run_silently(capfd, check_multi, {"a"}, {"a", "c"}, 2, OPTIONS)
    assert any("One true statement is missing" in l for l in fb.lines)
    fb = _run_silently(capfd, check_multi, {"b"}, {"a", "c", "d"}, 3, OPTIONS)
    assert any("3 true statements are missing" in l for l in fb.lines)
    fb = _run_silently(capfd, check_multi, set(), {"a", "c", "d"}, 3, OPTIONS)
    assert fb.points == 0 and "choose at least one" in fb.lines[0]
    fb = _run_silently(capfd, check_multi, {"a", "c"}, {"a", "c"}, 2, OPTIONS)
    assert fb.lines == ["All right."]


# --------------------------------------------------------------------------- check_numeric


@pytest.mark.parametrize("answer", [3.5, 7 / 2, np.float64(3.5), np.float32(3.5), np.array(3.5), np.array([3.5]),
                                    torch.tensor(3.5), torch.tensor(3.5, requires_grad=True), 3.5 * (1 + 1e-7)])
def test_numeric_right(answer, capfd):
    fb = _run_silently(capfd, check_numeric, answer, 3.5, 2, "x")
    assert fb.points == 2 and "is right" in fb.lines[0]


def test_numeric_wrong_and_mistakes(capfd):
    ms = [Mistake("half", 1.75, "you halved it")]
    fb = _run_silently(capfd, check_numeric, 1.75, 3.5, 2, "x", 1e-6, 0.0, ms)
    assert fb.points == 0 and "Likely mistake: you halved it" in fb.lines[0]
    fb = _run_silently(capfd, check_numeric, 3.6, 3.5, 2, "x", 1e-6, 0.0, ms)
    assert fb.points == 0 and "Likely mistake" not in fb.lines[0] and "tolerance" in fb.lines[0]
    fb = _run_silently(capfd, check_numeric, 3.6, 3.5, 2, "x", 0.0, 0.2)
    assert fb.points == 2  # within atol
    fb = _run_silently(capfd, check_numeric, float("nan"), 3.5, 2, "x")
    assert fb.points == 0 and "finite" in fb.lines[0]
    fb = _run_silently(capfd, check_numeric, [3.5, 3.5], 3.5, 2, "x")
    assert fb.points == 0 and "single number" in fb.lines[0]
    fb = _run_silently(capfd, check_numeric, True, 1.0, 2, "x")
    assert fb.points == 0  # a bool is not a number answer


# --------------------------------------------------------------------------- check_array


@pytest.mark.parametrize("answer", [EXPECTED, torch.tensor(EXPECTED), torch.tensor(EXPECTED, requires_grad=True) * 1.0])
def test_array_right(answer, capfd):
    fb = _run_silently(capfd, check_array, answer, EXPECTED, 4, "Y", 1e-6, 1e-9, np.float64)
    assert fb.points == 4 and fb.full
    fb = _run_silently(capfd, check_array, answer, EXPECTED, 4, "Y")
    assert fb.points == 4 and fb.lines == ["Y matches (shape (2, 3))."]


def test_array_list_has_no_dtype(capfd):
    fb = _run_silently(capfd, check_array, EXPECTED.tolist(), EXPECTED, 4, "Y")
    assert fb.full
    fb = _run_silently(capfd, check_array, EXPECTED.tolist(), EXPECTED, 4, "Y", dtype=np.float64)
    assert fb.points == 3.0 and "dtype list" in fb.lines[-1]


def test_array_answer_never_reveals_the_key_nor_pays_for_shape_alone(capfd):
    wrong = EXPECTED.copy()
    wrong[1, 2] = 0.0
    fb = _run_silently(capfd, check_array, wrong, EXPECTED, 4, "Y")
    assert fb.points == 0
    assert "Y[1, 2] = 0 is not right" in fb.lines[0] and "1 of 6 entries are off" in fb.lines[0]
    assert "6.5" not in " ".join(fb.lines), "the expected value is the key"
    fb = _run_silently(capfd, check_array, np.zeros_like(EXPECTED), EXPECTED, 4, "Y")
    assert fb.points == 0

    fb = _run_silently(capfd, check_array, EXPECTED.astype(np.float32), EXPECTED, 4, "Y", 1e-6, 1e-9, np.float64)
    assert fb.points == 3.0 and "dtype float32" in fb.lines[-1]
    fb = _run_silently(capfd, check_array, EXPECTED.astype(np.float32), EXPECTED, 4, "Y")
    assert fb.points == 4.0  # no dtype required: float32 with the right values is right

    fb = _run_silently(capfd, check_array, EXPECTED.T, EXPECTED, 4, "Y")
    assert fb.points == 0 and "shape (3, 2)" in fb.lines[0] and any("transpose" in l for l in fb.lines)

    fb = _run_silently(capfd, check_array, 2 * EXPECTED, EXPECTED, 4, "Y", mistakes=[Mistake("d", 2 * EXPECTED, "doubled")])
    assert fb.points == 1.0 and "Likely mistake: doubled" in fb.lines  # a known mistake: 1/4

    nan = EXPECTED.copy()
    nan[0, 1] = np.nan
    fb = _run_silently(capfd, check_array, nan, EXPECTED, 4, "Y")
    assert fb.points == 0 and "Y[0, 1] is nan" in fb.lines[0]


# --------------------------------------------------------------------------- check_ordering


def test_ordering(capfd):
    key = ["a", "b", "c", "d"]
    fb = _run_silently(capfd, check_ordering, ["a", "b", "c", "d"], key, 3)
    assert fb.points == 3 and fb.full
    fb = _run_silently(capfd, check_ordering, ("A ", "b", "c", "d"), key, 3)
    assert fb.full
    fb = _run_silently(capfd, check_ordering, ["b", "a", "c", "d"], key, 3, {"b": "second"})
    assert 0 < fb.points < 3 and fb.points == pytest.approx(3 * 5 / 6 * 0.999)
    assert "position 1: 'b' (second)" in fb.lines[0] and "5 of 6 pairs" in fb.lines[0]
    fb = _run_silently(capfd, check_ordering, ["d", "c", "b", "a"], key, 3)
    assert fb.points == 0
    fb = _run_silently(capfd, check_ordering, ["a", "b", "c"], key, 3)
    assert fb.points == 0 and "missing ['d']" in fb.lines[0]
    fb = _run_silently(capfd, check_ordering, ["a", "b", "c", "c"], key, 3)
    assert fb.points == 0 and "['c']" in fb.lines[0]
    fb = _run_silently(capfd, check_ordering, "abcd", key, 3)
    assert fb.points == 0 and "Expected a list" in fb.lines[0]


def test_ordering_with_a_critical_step(capfd):
    """A critical step's place is all or nothing: an order that puts it on the other side of a step than every right
    order does earns 0 points, with the relation named; a relation the right orders disagree on is free, and a mistake
    elsewhere keeps the share of pairs it has right. Without ``critical`` nothing changes."""
    key, also = ["a", "b", "c", "d", "e"], [["a", "c", "b", "d", "e"]]   # b and c in either order
    reasons = {x: f"why {x}" for x in key}
    fb = _run_silently(capfd, check_ordering, ["a", "b", "d", "c", "e"], key, 2, {"d": "the fourth"}, reasons, also, ["d"])
    assert fb.points == 0 and not fb.full
    assert ("Where 'd' (the fourth) goes is all or nothing in this item: every right order puts it after 'c', and this "
            "one does not, so the order earns no points.") in fb.lines
    assert fb.lines[-1].startswith("The step most out of place is '")               # the explanation stays last
    fb = _run_silently(capfd, check_ordering, ["d", "a", "b", "c", "e"], key, 2, {}, reasons, also, ["d"])
    assert fb.points == 0 and "every right order puts it after 'c'" in fb.text()  # the neighbour it jumped, not 'a'
    fb = _run_silently(capfd, check_ordering, ["b", "a", "c", "d", "e"], key, 2, {}, reasons, also, ["d"])
    assert fb.points == pytest.approx(2 * 9 / 10 * 0.999) and "all or nothing" not in fb.text()   # d kept its place
    fb = _run_silently(capfd, check_ordering, ["a", "b", "d", "c", "e"], key, 2, {}, reasons, also)
    assert fb.points == pytest.approx(2 * 9 / 10 * 0.999)                          # no critical step: pairs as before
    # a critical step whose relation the right orders leave free: b after c is right in one order, so only the
    # relations all of them share count
    fb = _run_silently(capfd, check_ordering, ["a", "c", "b", "e", "d"], key, 2, {}, reasons, also, ["b"])
    assert fb.points > 0 and "all or nothing" not in fb.text()


def test_ordering_with_a_critical_pair(capfd):
    """A critical pair [a, b] makes only that relation all or nothing: reversing it earns 0 with the relation named;
    misplacing the same step against another step keeps the share of pairs, as without it."""
    key, reasons = ["a", "b", "c", "d", "e"], {x: f"why {x}" for x in "abcde"}
    fb = _run_silently(capfd, check_ordering, ["a", "d", "b", "c", "e"], key, 2, {}, reasons, (), [["d", "b"]])
    assert fb.points == 0 and "every right order puts it after 'b'" in fb.text()
    fb = _run_silently(capfd, check_ordering, ["a", "b", "d", "c", "e"], key, 2, {}, reasons, (), [["d", "b"]])
    assert fb.points == pytest.approx(2 * 9 / 10 * 0.999) and "all or nothing" not in fb.text()   # d before c: free
    fb = _run_silently(capfd, check_ordering, ["a", "b", "d", "c", "e"], key, 2, {}, reasons, (), ["d"])
    assert fb.points == 0                                                            # the whole step: not free


@FAST
@given(st.permutations(["a", "b", "c", "d", "e"]))
def test_ordering_full_only_when_exact(perm):
    key = ["a", "b", "c", "d", "e"]
    fb = check_ordering(perm, key, 2)
    assert fb.full == (list(perm) == key)
    assert 0 <= fb.points <= 2


# --------------------------------------------------------------------------- check_function


def _ref(X, W):
    return X @ W


def _cases():
    rng = np.random.default_rng(0)
    return [Case({"X": rng.standard_normal((2, 3)), "W": rng.standard_normal((3, 4))}, "2 × 3 by 3 × 4"),
            Case({"X": rng.standard_normal((1, 3)), "W": rng.standard_normal((3, 2))}, "one token")]


def _grade(fn, outputs=("Y",), ref=_ref):
    return check_function(fn, _cases(), ref, 2, "project", outputs)


def test_function_right_scores_full_and_is_silent(capfd):
    fb = _run_silently(capfd, _grade, lambda X, W: X @ W)
    assert fb.points == 2 and fb.lines == ["✓ public case 1 (2 × 3 by 3 × 4)", "✓ public case 2 (one token)"]


def test_function_float32_and_torch_outputs_accepted(capfd):
    fb = _run_silently(capfd, _grade, lambda X, W: (X @ W).astype(np.float32))
    assert fb.full
    fb = _run_silently(capfd, _grade, lambda X, W: torch.tensor(X, requires_grad=True) @ torch.tensor(W))
    assert fb.full


def test_function_mutating_its_input_fails_and_cannot_change_the_reference(capfd):
    def mutating(X, W):
        X += 1.0
        return (X - 1.0) @ W  # right values, but X was changed in place

    fb = _run_silently(capfd, _grade, mutating)
    assert fb.points == 0 and "changed its input `X`" in fb.text()

    def corrupting(X, W):
        out = X @ W
        X[...] = 0.0  # would make a shared reference compute X W = 0
        return out

    fb = _run_silently(capfd, _grade, corrupting)
    assert "expected" not in fb.text() or "got 0" not in fb.text()
    assert all("changed its input `X`" in l or not l.startswith("    ") for l in fb.lines)

    import torch

    def torch_corrupting(X, W):
        X = torch.as_tensor(X)
        return (X @ torch.as_tensor(W)).numpy()

    fb = _run_silently(capfd, _grade, torch_corrupting)
    assert fb.full


def test_function_with_other_parameter_names_is_graded_by_position(capfd):
    def project(inputs, weight):
        return inputs @ weight

    fb = _run_silently(capfd, _grade, project)
    assert fb.full and "graded by position" in fb.lines[0].lower()


def test_stub_in_a_helper_is_named(capfd):
    def helper(X):
        raise NotImplementedError()

    def project(X, W):
        return helper(X) @ W

    fb = _run_silently(capfd, _grade, project)
    assert fb.points == 0 and "project calls helper, which still raises NotImplementedError" in fb.lines[0]


def test_function_raising(capfd):
    def broken(X, W):
        return X @ W.T  # inner sizes disagree

    fb = _run_silently(capfd, _grade, broken)
    assert fb.points == 0
    assert "project raised ValueError" in fb.lines[0] and "matmul" in fb.lines[0]
    assert any("inner sizes disagree" in l for l in fb.lines)


def test_function_raising_in_one_case_only(capfd):
    def sometimes(X, W):
        if X.shape[0] == 1:
            raise ZeroDivisionError("one row")
        return X @ W

    fb = _run_silently(capfd, _grade, sometimes)
    assert fb.points == 1.0
    assert fb.lines[0].startswith("✓") and "ZeroDivisionError: one row" in fb.lines[1]


def test_function_not_implemented(capfd):
    def stub(X, W):
        raise NotImplementedError

    fb = _run_silently(capfd, _grade, stub)
    assert fb.points == 0 and "NotImplementedError" in fb.lines[0]


def test_function_wrong_number_of_outputs(capfd):
    ref = lambda X, W: (X @ W, X.sum())  # noqa: E731
    for student in (lambda X, W: X @ W, lambda X, W: (X @ W,), lambda X, W: (X @ W, X.sum(), 0)):
        fb = _run_silently(capfd, _grade, student, ("Y", "total"), ref)
        assert fb.points == 0 and "should return 2 values (Y, total)" in fb.lines[0]
    fb = _run_silently(capfd, _grade, lambda X, W: [X @ W, X.sum()], ("Y", "total"), ref)
    assert fb.full  # a list is as good as a tuple


def test_function_transposed_result(capfd):
    fb = _run_silently(capfd, _grade, lambda X, W: (X @ W).T)
    assert fb.points == 0
    assert any("Y has shape (4, 2); expected (2, 4)" in l for l in fb.lines)
    assert any("transpose of the right one" in l for l in fb.lines)


def test_function_wrong_values_names_index(capfd):
    fb = _run_silently(capfd, _grade, lambda X, W: X @ W + np.eye(*(X @ W).shape))
    assert fb.points == 0 and any("Y[" in l and "expected" in l and "got" in l for l in fb.lines)


@pytest.mark.parametrize("fn", [None, "def f(): pass", 3, torch.ones(2), np.ones(2)])
def test_function_not_a_function(fn, capfd):
    fb = _run_silently(capfd, _grade, fn)
    assert fb.points == 0 and "should be a function" in fb.lines[0]


@pytest.mark.parametrize("result", GARBAGE, ids=IDS)
def test_function_garbage_results(result, capfd):
    fb = _run_silently(capfd, _grade, lambda X, W: result)
    _valid(fb)
    assert fb.points == 0
    fb = _run_silently(capfd, _grade, lambda X, W: (result, result), ("Y", "total"), lambda X, W: (X @ W, X.sum()))
    _valid(fb)
    assert fb.points == 0


def test_function_stderr_goes_to_stdout_not_stderr(capfd):
    def chatty(X, W):
        print("debugging: shapes", X.shape, W.shape, file=sys.stderr)
        return X @ W

    fb = _grade(chatty)
    out, err = capfd.readouterr()
    assert err == "" and out == ""  # captured into the feedback, which grade() prints to stdout
    text = "\n".join(fb.lines)
    assert "shown here, not graded" in text and "debugging: shapes" in text
    assert text.count("debugging: shapes (2, 3) (3, 4)") == 1  # each distinct line once
    assert fb.full


def test_function_stderr_before_raising_still_shown_on_stdout(capfd):
    def chatty_then_broken(X, W):
        print("about to fail", file=sys.stderr)
        raise RuntimeError("boom")

    fb = _grade(chatty_then_broken)
    out, err = capfd.readouterr()
    assert err == "" and "about to fail" in "\n".join(fb.lines)
    assert fb.points == 0 and "RuntimeError: boom" in fb.lines[0]
    assert sys.stderr is not None and "StringIO" not in type(sys.stderr).__name__  # stderr restored


def test_function_warning_goes_to_stdout(capfd):
    def warns(X, W):
        warnings.warn("float32 is lossy here", RuntimeWarning)
        return X @ W

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fb = _grade(warns)
    out, err = capfd.readouterr()
    assert err == "" and not caught  # the warning did not escape to the notebook's stderr
    assert "RuntimeWarning: float32 is lossy here" in "\n".join(fb.lines)
    assert fb.full


def test_function_numpy_runtime_warning_goes_to_stdout(capfd):
    def divides(X, W):
        _ = np.array([1.0]) / np.array([0.0])
        return X @ W

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fb = _grade(divides)
    out, err = capfd.readouterr()
    assert err == "" and not caught and "RuntimeWarning" in "\n".join(fb.lines) and fb.full


def test_numeric_accepts_a_bfloat16_tensor(capfd):
    import torch

    one = torch.tensor(1.0, dtype=torch.bfloat16)
    spacing = torch.nextafter(one, torch.tensor(2.0, dtype=torch.bfloat16)) - one
    fb = _run_silently(capfd, check_numeric, spacing, 2.0**-7, 1, "spacing")
    assert fb.full, fb.lines


def test_low_precision_hint_only_when_rounding_could_explain_the_miss():
    from coursekit.grading.checkers import compare_arrays

    expected = np.array([1.0 + 1e-7, 2.0, 3.0])
    _, near = compare_arrays(expected.astype(np.float32), expected, "Y", rtol=1e-9, atol=0.0)
    assert any("machine epsilon" in l for l in near), near
    _, wrong = compare_arrays((2 * expected).astype(np.float32), expected, "Y", rtol=1e-9, atol=0.0)
    assert not any("machine epsilon" in l for l in wrong), wrong


def test_low_precision_hint_not_given_when_the_right_answer_is_a_number_of_that_dtype():
    """An answer in bf16 (or float32) whose right value is itself on that dtype's grid misses by its arithmetic, not by
    its dtype: "compute in float64" would be wrong advice (lesson 13's P1 wants the bf16 weight bf16 arithmetic leaves).
    The advice still comes where the right value is off the answer's grid."""
    import torch

    from coursekit.grading.checkers import compare_arrays

    right = torch.tensor([1.0, 1.5, -3.0], dtype=torch.bfloat16)
    one_off = right.clone()
    one_off[0] = torch.nextafter(right[0], torch.tensor(2.0, dtype=torch.bfloat16))      # one bf16 spacing off
    kind, lines = compare_arrays(one_off, right.double().numpy(), "weight", rtol=0.0, atol=0.0)
    assert kind == "values" and not any("float64" in l or "machine epsilon" in l for l in lines), lines
    on_f32 = np.array([1.0, 2.0**-20, 3.0])
    _, lines = compare_arrays(np.float32(on_f32 * (1 + 2.0**-23)), on_f32, "Y", rtol=1e-9, atol=0.0)
    assert not any("machine epsilon" in l for l in lines), lines
    off = np.array([1.0 + 1e-3, 2.0, 3.0])                                                   # not a bf16 number
    _, lines = compare_arrays(torch.tensor(off).bfloat16(), off, "Y", rtol=1e-6, atol=0.0)
    assert any("machine epsilon" in l and "Compute in float64" in l for l in lines), lines


# --------------------------------------------------------------------------- hidden cases do not leak their inputs

import re  # noqa: E402

from coursekit.grading.lora_mistakes import backward_mistakes, forward_mistakes  # noqa: E402
from coursekit.lora import lora_backward, lora_forward  # noqa: E402

# A hidden case with distinctive numbers: s = 48.5693 / 13 = 3.7361, X 11 × 17, W 17 × 19.
HIDDEN_S, HIDDEN_ALPHA, HIDDEN_R = 3.7361, 48.5693, 13
HIDDEN_DIMS = (11, 17, 19)


def _lora_cases(scale_by: str, with_D: bool = False):
    rng = np.random.default_rng(7)
    out = []
    for (n, d, m, r), alpha, hidden in (((2, 3, 4, 2), 3.0, False), ((*HIDDEN_DIMS, HIDDEN_R), HIDDEN_ALPHA, True)):
        kw = dict(X=rng.standard_normal((n, d)), W=rng.standard_normal((d, m)), A=rng.standard_normal((d, r)),
                  B=rng.standard_normal((r, m)))
        if with_D:
            kw["D"] = rng.standard_normal((n, m))
        if scale_by == "s":
            kw["s"] = round(alpha / r, 4)
        else:
            kw.update(lora_alpha=alpha, r=r)
        out.append(Case(kw, f"n={n}, d={d}" if not hidden else "", hidden=hidden))
    assert round(HIDDEN_ALPHA / HIDDEN_R, 4) == HIDDEN_S
    return out


def _scale_of(kw):
    return kw["s"] if "s" in kw else kw["lora_alpha"] / kw["r"]


def _ref_forward(**kw):
    return lora_forward(kw["X"], kw["W"], kw["A"], kw["B"], _scale_of(kw))[0]


def _ref_backward(**kw):
    _, cache = lora_forward(kw["X"], kw["W"], kw["A"], kw["B"], _scale_of(kw))
    return lora_backward(kw["D"], cache)


def _hidden_part(fb) -> str:
    """The feedback lines of the hidden case (from its ✗/✓ line to the next case or the printed-output summary)."""
    text, keep = [], False
    for line in fb.lines:
        if line.startswith(("✗", "✓")):
            keep = "hidden case" in line
        elif not line.startswith(" "):
            keep = False  # the summary of what the code printed, public cases' included
        if keep:
            text.append(line)
    return "\n".join(text)


def _assert_no_hidden_numbers(fb, *extra_values):
    """Neither s, lora_alpha, r nor any hidden size (nor a value given) appears anywhere in the feedback."""
    text = fb.text()
    hidden = _hidden_part(fb)
    assert "hidden case 2" in text
    for v in ("3.7361", "3.736", "48.5693", "48.57", *extra_values):
        assert v not in text, (v, text)
    for n in (HIDDEN_R, *HIDDEN_DIMS, HIDDEN_S ** 2, HIDDEN_ALPHA / HIDDEN_R):
        for form in {f"{n:g}", f"{n:.4g}", str(n)}:
            assert not re.search(rf"(?<![\d.]){re.escape(form)}(?![\d])", text), (form, text)
    assert not re.search(r"\[\d+(, \d+)*\]", hidden), hidden  # no index into a hidden array
    assert not re.search(r"\(\d+, \d+\)", hidden), hidden  # no hidden shape
    return text, hidden


@pytest.mark.parametrize("scale_by", ["s", "alpha"])
def test_hidden_case_mistake_is_named_without_its_inputs(scale_by, capfd):
    def forgets_s(X, W, A, B, **scale):
        return X @ W + (X @ A) @ B

    fb = _run_silently(capfd, check_function, forgets_s, _lora_cases(scale_by), _ref_forward, 2, "lora_forward", ("Y",),
                       mistakes=forward_mistakes)
    assert fb.points == 0
    text, hidden = _assert_no_hidden_numbers(fb)
    # The public case quotes its own s (public inputs); the hidden case names the mistake, in words.
    assert "public case 1" in text and "= 1.5" in text
    assert "Likely mistake: 'missing s'. The scale" in hidden and "is missing" in hidden
    assert "(hidden inputs are not shown.)" in hidden
    assert "expected" not in hidden and "got" not in hidden  # no expected/actual value of a hidden case


def test_hidden_case_scale_mistakes_in_every_backward_output_stay_numberless(capfd):
    def alpha_not_s(X, W, A, B, D, lora_alpha, r):
        Z = X @ A
        dZ = lora_alpha * D @ B.T
        return D @ W.T + dZ @ A.T, X.T @ dZ, lora_alpha * Z.T @ D

    fb = _run_silently(capfd, check_function, alpha_not_s, _lora_cases("alpha", with_D=True), _ref_backward, 3,
                       "lora_backward", ("dX", "dA", "dB"), mistakes=backward_mistakes)
    text, hidden = _assert_no_hidden_numbers(fb)
    for where in ("In ∇B = s Zᵀ D", "In ∇A = s Xᵀ D Bᵀ", "In the adapter path of ∇X"):
        assert f"'alpha'. {where}: you scaled by lora_alpha instead of s = lora_alpha / r." in hidden, hidden
    assert "lora_alpha = 3 instead of s = lora_alpha / r = 1.5" in text  # the public case keeps its numbers


def test_hidden_case_updated_B_mistake_hides_the_step_size(capfd):
    def updated_B(X, W, A, B, D, lora_alpha, r):
        s = lora_alpha / r
        dB = s * (X @ A).T @ D
        dZ = s * D @ B.T
        B_new = B - 0.0737 * dB
        return D @ W.T + dZ @ A.T, s * X.T @ D @ B_new.T, dB

    fb = _run_silently(capfd, check_function, updated_B, _lora_cases("alpha", with_D=True), _ref_backward, 3,
                       "lora_backward", ("dX", "dA", "dB"), mistakes=backward_mistakes)
    hidden = _hidden_part(fb)
    assert "B − 0.0737·∇B" in fb.text()  # public case: the step size is the student's, computed on public inputs
    assert "0.0737" not in hidden and "B already updated (B − η·∇B" in hidden


def test_hidden_case_without_a_hint_reuses_the_public_message_or_only_the_name(capfd):
    """A lesson's own Mistake (no hint) whose message quotes numbers: the hidden case repeats what the public case
    said, or gives only the name when no public case had the mistake."""
    def mistakes(kw, got):
        X, W = kw["X"], kw["W"]
        listed = kw["listed"] or X.shape[0] > 5  # the public case lists "doubled" only when asked to
        return {"Y": [Mistake("doubled", 2 * X @ W, f"you doubled it: 2 × {X.shape[0]} rows")] * listed
                + [Mistake("words only", 3 * X @ W, "you tripled it, in words")]}

    def cases(public_lists: bool):
        rng = np.random.default_rng(1)
        return [Case({"X": rng.standard_normal((2, 3)), "W": rng.standard_normal((3, 4)), "k": 2.0, "listed": public_lists}),
                Case({"X": rng.standard_normal(HIDDEN_DIMS[:2]), "W": rng.standard_normal(HIDDEN_DIMS[1:]), "k": 2.0,
                      "listed": False}, hidden=True),
                Case({"X": rng.standard_normal(HIDDEN_DIMS[:2]), "W": rng.standard_normal(HIDDEN_DIMS[1:]), "k": 3.0,
                      "listed": False}, hidden=True)]

    ref = lambda X, W, k, listed: X @ W  # noqa: E731
    # Each student makes its mistake on every case: a mistake is named only when it explains the failures
    # (checkers.MISTAKE_SHARE), so k × XW, which is "doubled" where k = 2 and "tripled" where k = 3, would name
    # "tripled" on none of its cases.
    doubles = lambda X, W, k, listed: 2 * X @ W  # noqa: E731
    triples = lambda X, W, k, listed: 3 * X @ W  # noqa: E731
    fb = _run_silently(capfd, check_function, doubles, cases(True), ref, 3, "project", ("Y",), mistakes=mistakes)
    assert "Likely mistake: you doubled it: 2 × 2 rows" in fb.text()
    assert ("Likely mistake: as explained with the inputs of public case 1: you doubled it: 2 × 2 rows "
            "(hidden inputs are not shown.)") in _hidden_part(fb)
    assert "11 rows" not in fb.text()
    fb = _run_silently(capfd, check_function, triples, cases(True), ref, 3, "project", ("Y",), mistakes=mistakes)
    assert "Likely mistake: you tripled it, in words" in _hidden_part(fb)  # no number: shown as it is
    assert "11 rows" not in fb.text()
    fb = _run_silently(capfd, check_function, doubles, cases(False), ref, 3, "project", ("Y",), mistakes=mistakes)
    assert "Likely mistake: 'doubled'. Its explanation quotes this case's inputs" in _hidden_part(fb)
    assert "11 rows" not in fb.text()


def test_hidden_case_exception_does_not_quote_hidden_sizes(capfd):
    def transposes(X, W, A, B, **scale):
        if X.shape[0] > 5:
            n = len(X)
            raise ValueError(f"my own check: X has {n} rows, s = {scale}")
        return X @ W.T  # public: a matmul error with public sizes

    fb = _run_silently(capfd, check_function, transposes, _lora_cases("alpha"), _ref_forward, 2, "lora_forward", ("Y",))
    text, hidden = _assert_no_hidden_numbers(fb)
    assert "lora_forward raised ValueError: matmul" in text  # public: the full message
    assert "lora_forward raised ValueError (line" in hidden and "its message quotes the hidden inputs" in hidden

    def wrong_params(X, W, A, B, s):  # the hidden case passes lora_alpha and r: a TypeError at the call
        return X @ W

    cases = _lora_cases("alpha")
    fb = _run_silently(capfd, check_function, wrong_params, cases, _ref_forward, 2, "lora_forward", ("Y",))
    assert "could not be called: TypeError" in _hidden_part(fb)


def test_hidden_case_error_message_without_numbers_is_shown(capfd):
    def raises(X, W, A, B, **scale):
        raise KeyError("no such adapter")

    fb = _run_silently(capfd, check_function, raises, _lora_cases("s"), _ref_forward, 2, "lora_forward", ("Y",))
    assert "lora_forward raised KeyError: 'no such adapter'" in _hidden_part(fb)


def test_hidden_case_wrong_shape_nan_and_values_name_the_output_only(capfd):
    def transposed(X, W, A, B, lora_alpha, r):
        return (X @ W + lora_alpha / r * (X @ A) @ B).T

    fb = _run_silently(capfd, check_function, transposed, _lora_cases("alpha"), _ref_forward, 2, "lora_forward", ("Y",),
                       mistakes=forward_mistakes)
    text, hidden = _assert_no_hidden_numbers(fb)
    assert "Y has shape (4, 2); expected (2, 4)." in text  # public shapes are public
    assert "Y has the wrong shape (hidden inputs and the shapes they give are not shown" in hidden
    assert "transpose of the right one" in hidden

    def nan_at_the_end(X, W, A, B, lora_alpha, r):
        Y = X @ W + lora_alpha / r * (X @ A) @ B
        Y[-1, -1] = np.nan
        return Y

    fb = _run_silently(capfd, check_function, nan_at_the_end, _lora_cases("alpha"), _ref_forward, 2, "lora_forward", ("Y",))
    text, hidden = _assert_no_hidden_numbers(fb)
    assert "Y[1, 3] is nan" in text and "Y has a NaN entry; every entry should be finite." in hidden

    def one_entry_off(X, W, A, B, lora_alpha, r):
        Y = X @ W + lora_alpha / r * (X @ A) @ B
        Y[-1, -1] += 1.0
        return Y

    fb = _run_silently(capfd, check_function, one_entry_off, _lora_cases("alpha"), _ref_forward, 2, "lora_forward", ("Y",))
    text, hidden = _assert_no_hidden_numbers(fb)
    assert "Y[1, 3]: expected" in text
    assert "Y is not right: some entries are off" in hidden and "expected" not in hidden


def test_hidden_case_in_place_change_names_the_input_not_the_entry(capfd):
    def scribbles(X, W, A, B, lora_alpha, r):
        Y = X @ W + lora_alpha / r * (X @ A) @ B
        X[-1, -1] = 0.0
        return Y

    fb = _run_silently(capfd, check_function, scribbles, _lora_cases("alpha"), _ref_forward, 2, "lora_forward", ("Y",))
    text, hidden = _assert_no_hidden_numbers(fb)
    assert "changed its input `X` (entry [1, 2]) in place" in text
    assert "changed its input `X` in place" in hidden


def test_hidden_case_prints_and_extra_lines_that_quote_numbers_are_withheld(capfd):
    def chatty(X, W, A, B, lora_alpha, r):
        print("shapes", X.shape, "r =", r, "alpha", lora_alpha)
        print("checking my forward")
        return X @ W + lora_alpha / r * (X @ A) @ B

    def extra(fn, case):
        return ["a further check failed:", f"at X[{case.kwargs['X'].shape[0] - 1}, 0]: {case.kwargs['lora_alpha']:g}"]

    fb = _run_silently(capfd, check_function, chatty, _lora_cases("alpha"), _ref_forward, 2, "lora_forward", ("Y",),
                       extra=extra)
    text, hidden = _assert_no_hidden_numbers(fb)
    assert "at X[1, 0]: 3" in text  # the public case's line
    assert "a further check failed:" in hidden and "(1 line of this check not shown: it quotes values of the hidden inputs.)" in hidden
    assert "shapes (2, 3)" in text and "checking my forward" in text  # public prints are shown
    # the hidden case's two printed lines travel in one summary that quotes its shapes: both are withheld
    assert "(2 lines printed or warned during hidden cases not shown: they quote numbers, which may be hidden inputs.)" in text
    assert "(11, 17)" not in text


def test_hidden_case_withholds_numbers_glued_to_letters(capfd):
    # a student's own message can print a hidden shape as "m11_d17"; names like float64 or Q4_1 stay readable
    def raises(X, W, A, B, **scale):
        raise ValueError(f"weight is m{len(X)}_d{len(W)}, not float64 or Q4_1")

    fb = _run_silently(capfd, check_function, raises, _lora_cases("s"), _ref_forward, 2, "lora_forward", ("Y",))
    _assert_no_hidden_numbers(fb)
    assert "raised ValueError: weight is m2_d3" in fb.text()  # public: shown whole
    assert "its message quotes the hidden inputs" in _hidden_part(fb)

    def names_only(X, W, A, B, **scale):
        raise KeyError("no float64 or Q4_1 adapter")

    fb = _run_silently(capfd, check_function, names_only, _lora_cases("s"), _ref_forward, 2, "lora_forward", ("Y",))
    assert "lora_forward raised KeyError: 'no float64 or Q4_1 adapter'" in _hidden_part(fb)


def test_hidden_case_withholds_a_message_even_when_a_public_case_printed_the_same_words(capfd):
    # the same words on a hidden case would tell that its value equals the public one
    cases = [Case({"x": 0.5, "step": 0.2}), Case({"x": 0.7, "step": 0.2}, hidden=True)]

    def fails(x, step):
        print(f"using step {step}")
        raise ValueError(f"bad step {step}")

    fb = _run_silently(capfd, check_function, fails, cases, lambda x, step: x, 1, "f", ("y",))
    assert "f raised ValueError: bad step 0.2" in fb.text()  # the public case
    assert fb.text().count("bad step 0.2") == 1 and "its message quotes the hidden inputs" in _hidden_part(fb)
    assert fb.text().count("using step 0.2") == 1 and "1 line printed or warned during hidden cases not shown" in fb.text()


# --------------------------------------------------------------------------- 0-d outputs are named without an index


def test_zero_d_nan_is_named_without_empty_brackets(capfd):
    fb = _run_silently(capfd, check_array, np.array(np.nan), np.array(2.5), 1, "total_gb")
    assert fb.points == 0 and fb.lines == ["total_gb is nan; every entry should be finite."]
    fb = _run_silently(capfd, check_array, np.array(3.0), np.array(2.5), 1, "total_gb")
    assert fb.points == 0 and fb.lines[0].startswith("total_gb = 3 is not right")

    cases = [Case({"x": 1.0}), Case({"x": 2.0}, hidden=True)]
    fb = _run_silently(capfd, check_function, lambda x: np.float64("nan"), cases, lambda x: 2 * x, 2, "ledger", ("total_gb",))
    assert "    total_gb is nan; every entry should be finite." in fb.lines
    assert "    total_gb has a NaN entry; every entry should be finite." in fb.lines
    assert "[]" not in fb.text()
    fb = _run_silently(capfd, check_function, lambda x: (np.inf, 2 * x), cases, lambda x: (x, 2 * x), 2, "ledger",
                       ("total_gb", "n"))
    assert "    total_gb is inf; every entry should be finite." in fb.lines and "[]" not in fb.text()


@pytest.mark.parametrize("hint, shown", [
    ("you doubled it.", "You doubled it."),
    ("dQ is missing the factor 1/√d_h.", "dQ is missing the factor 1/√d_h."),   # a symbol keeps its case
    ("silu′ is missing.", "silu′ is missing."),
    ("x_hat is not rounded.", "x_hat is not rounded."),
])
def test_a_hint_is_capitalised_only_when_it_starts_with_a_word(hint, shown, capfd):
    from coursekit.grading.checkers import _hidden_mistake

    m = _hidden_mistake(Mistake("label", 0.0, "message with 1 number", hint), "Y", {})
    assert m.message.startswith(f"'label'. {shown}")


def test_outputs_in_the_wrong_order_are_named(capfd):
    cases = [Case({"x": np.array([1.0, 2.0])}), Case({"x": np.array([3.0, -1.0])}, hidden=True)]
    ref = lambda x: (2 * x, x.sum())  # noqa: E731
    fb = _run_silently(capfd, check_function, lambda x: (x.sum(), 2 * x), cases, ref, 2, "f", ("double", "total"))
    assert fb.points == 0
    assert fb.text().count("right but in the wrong order: you returned total where double belongs, "
                           "you returned double where total belongs. Return (double, total), in this order.") == 2
    # a wrong value is not called a swap
    fb = _run_silently(capfd, check_function, lambda x: (x.sum(), 3 * x), cases, ref, 2, "f", ("double", "total"))
    assert "wrong order" not in fb.text()


@pytest.mark.parametrize("wrap", [lambda y: (y,), lambda y: [y]])
def test_a_single_output_wrapped_in_a_tuple_or_list_is_named(wrap, capfd):
    cases = [Case({"x": np.array([1.0, 2.0])}), Case({"x": np.array([3.0, -1.0])}, hidden=True)]
    fb = _run_silently(capfd, check_function, lambda x: wrap(2 * x), cases, lambda x: 2 * x, 2, "f", ("Y",))
    assert fb.points == 0 and fb.text().count("f should return its Y itself; got a") == 2
    # an output that is itself one row is not mistaken for a wrapper
    fb = _run_silently(capfd, check_function, lambda x: [x.sum()], cases, lambda x: np.array([x.sum()]), 2, "f", ("Y",))
    assert fb.points == 2


def test_a_withheld_print_flood_on_hidden_cases_is_counted_in_lines(capfd):
    cases = [Case({"x": 1.0}), Case({"x": 2.0}, hidden=True)]

    def chatty(x):
        for i in range(300):
            print("step", i)
        return x

    fb = _run_silently(capfd, check_function, chatty, cases, lambda x: x, 1, "f")
    assert "(300 lines printed or warned during hidden cases not shown" in fb.text(), fb.text()


def test_partial_credit_is_explained_where_there_are_points_and_dropped_where_there_are_none():
    """A known mistake earns 1/4 and the feedback says so; the same answer to a 0-point warm-up says why it is
    wrong and nothing about points. Right values in the wrong dtype earn 3/4, with the dtype named."""
    from coursekit.grading.checkers import Mistake, formative

    want = np.array([1.0, 2.0])
    known = [Mistake("doubled", want * 2, "you doubled it.")]
    fb = check_array(want * 2, want, 4, name="Y", mistakes=known)
    assert fb.points == 1 and "(1/4 of the points: a known mistake, on the right track.)" in fb.text(), fb.text()
    warm = formative(fb)
    assert (warm.points, warm.max_points, warm.full) == (0, 0, False) and "you doubled it." in warm.text()
    assert "of the points" not in warm.text(), warm.text()
    fb = check_array(want.astype(np.float32), want, 4, name="Y", dtype=np.float64)
    assert fb.points == 3 and "Y has dtype float32; expected float64." in fb.text() and "(3/4 of the points.)" in fb.text()
    assert formative(fb).full is False and "of the points" not in formative(fb).text()


def test_feedback_carries_the_named_mistakes_as_data():
    """What the class report counts: the label of each known mistake an answer made, never parsed from the text."""
    from coursekit.grading.checkers import _consistent, check_choice, check_multi, check_numeric

    m = [Mistake("alpha", 32, "that is lora_alpha itself."), Mistake("r/alpha", 0.25, "upside down.")]
    assert check_numeric(32, 4.0, 1, mistakes=m).mistakes == ["alpha"]
    assert check_numeric(5, 4.0, 1, mistakes=m).mistakes == []  # wrong another way
    assert check_numeric(4.0, 4.0, 1, mistakes=m).mistakes == []
    assert check_choice("c", "b", 1, ["a", "b", "c"]).mistakes == ["(c)"]
    assert check_multi(["a", "c"], ["a", "b"], 1, ["a", "b", "c"]).mistakes == ["(c)"]
    # two mistakes that coincide on one case: the one every failed case shares is the mistake made
    assert _consistent([["no adapter"], ["floor", "no adapter"], ["no adapter"]]) == ["no adapter"]
    assert _consistent([["a"], ["b"]]) == ["a", "b"] and _consistent([]) == []
