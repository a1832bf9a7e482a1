"""coursekit.grading.lora_mistakes through check_function: each classic LoRA mistake is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from coursekit.grading import Case, check_function
from coursekit.grading.lora_mistakes import backward_mistakes, forward_mistakes, merge_mistakes
from coursekit.lora import lora_backward, lora_forward, merge, scaling

# --------------------------------------------------------------------------- reference adapters


def ref_forward(X, W, A, B, lora_alpha, r):
    return lora_forward(X, W, A, B, scaling(lora_alpha, r))[0]


def ref_backward(X, W, A, B, D, lora_alpha, r):
    _, cache = lora_forward(X, W, A, B, scaling(lora_alpha, r))
    return lora_backward(D, cache)


def _cases(with_D: bool):
    """Sizes all different (n=3, d=4, m=5, r=2 and n=2, d=5, m=3, r=4) so a transpose never fits,
    nonzero B so the adapter path matters, and s ∉ {1, α, r/α, α/√r} so wrong scales are told apart."""
    rng = np.random.default_rng(2024)
    out = []
    for (n, d, m, r), alpha in (((3, 4, 5, 2), 16.0), ((2, 5, 3, 4), 8.0)):
        kw = dict(X=rng.standard_normal((n, d)), W=rng.standard_normal((d, m)), A=rng.standard_normal((d, r)),
                  B=rng.standard_normal((r, m)))
        if with_D:
            kw["D"] = rng.standard_normal((n, m))
        kw.update(lora_alpha=alpha, r=r)
        out.append(Case(kw, f"n={n}, d={d}, m={m}, r={r}"))
    return out


def grade_forward(fn):
    return check_function(fn, _cases(False), ref_forward, 3, "lora_forward", ("Y",), mistakes=forward_mistakes)


def grade_backward(fn):
    return check_function(fn, _cases(True), ref_backward, 3, "lora_backward", ("dX", "dA", "dB"),
                          mistakes=backward_mistakes)


def _mistake_lines(fb):
    return [l.strip() for l in fb.lines if "Likely mistake:" in l]


def _assert_named(fb, *words, per_case=True):
    """Below full, and every failing case's feedback carries a 'Likely mistake' line with all the words."""
    assert not fb.full and fb.points < fb.max_points, fb.text()
    found = _mistake_lines(fb)
    assert found, fb.text()
    matching = [l for l in found if all(w.lower() in l.lower() for w in words)]
    assert matching, fb.text()
    if per_case:
        failed_cases = sum(l.startswith("✗") for l in fb.lines)
        assert len(matching) >= failed_cases == 2, fb.text()


# --------------------------------------------------------------------------- forward


def fwd_right(X, W, A, B, lora_alpha, r):
    s = lora_alpha / r
    return X @ W + s * (X @ A) @ B


def fwd_missing_s(X, W, A, B, lora_alpha, r):
    return X @ W + (X @ A) @ B


def fwd_alpha(X, W, A, B, lora_alpha, r):
    return X @ W + lora_alpha * (X @ A) @ B


def fwd_rslora(X, W, A, B, lora_alpha, r):
    return X @ W + lora_alpha / math.sqrt(r) * (X @ A) @ B


def fwd_transposed(X, W, A, B, lora_alpha, r):
    return fwd_right(X, W, A, B, lora_alpha, r).T


def fwd_no_base(X, W, A, B, lora_alpha, r):
    return lora_alpha / r * (X @ A) @ B


def fwd_torch(X, W, A, B, lora_alpha, r):
    X, W, A, B = (torch.tensor(v, requires_grad=True) for v in (X, W, A, B))
    return X @ W + (lora_alpha / r) * (X @ A) @ B


@pytest.mark.parametrize("fn", [fwd_right, fwd_torch])
def test_forward_right_scores_full(fn, capfd):
    fb = grade_forward(fn)
    assert fb.full and fb.points == 3, fb.text()
    assert not _mistake_lines(fb)
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize(
    "fn, words",
    [
        (fwd_missing_s, ("scale is missing", "lora_alpha / r")),
        (fwd_alpha, ("scaled by lora_alpha", "instead of s")),
        (fwd_rslora, ("rsLoRA", "sqrt(r)")),
        (fwd_transposed, ("Y is transposed", "n × m")),
        (fwd_no_base, ("only the adapter path", "X @ W")),
    ],
)
def test_forward_mistake_is_named(fn, words, capfd):
    fb = grade_forward(fn)
    assert fb.points == 0
    _assert_named(fb, *words)
    assert capfd.readouterr() == ("", "")


def test_forward_scale_values_are_quoted():
    fb = grade_forward(fwd_alpha)
    text = fb.text()
    assert "lora_alpha = 16 instead of s = lora_alpha / r = 8" in text
    assert "lora_alpha = 8 instead of s = lora_alpha / r = 2" in text


# --------------------------------------------------------------------------- backward


def bwd_right(X, W, A, B, D, lora_alpha, r):
    s = lora_alpha / r
    Z = X @ A
    dB = s * Z.T @ D
    dZ = s * D @ B.T
    return D @ W.T + dZ @ A.T, X.T @ dZ, dB


def bwd_missing_s(X, W, A, B, D, lora_alpha, r):
    Z = X @ A
    dZ = D @ B.T
    return D @ W.T + dZ @ A.T, X.T @ dZ, Z.T @ D


def bwd_alpha(X, W, A, B, D, lora_alpha, r):
    Z = X @ A
    dZ = lora_alpha * D @ B.T
    return D @ W.T + dZ @ A.T, X.T @ dZ, lora_alpha * Z.T @ D


def bwd_no_adapter_in_dX(X, W, A, B, D, lora_alpha, r):
    _, dA, dB = bwd_right(X, W, A, B, D, lora_alpha, r)
    return D @ W.T, dA, dB


def bwd_updated_B(X, W, A, B, D, lora_alpha, r, lr=0.1):
    s = lora_alpha / r
    dX, _, dB = bwd_right(X, W, A, B, D, lora_alpha, r)
    B_new = B - lr * dB  # the optimizer step taken too early
    return dX, s * X.T @ D @ B_new.T, dB


def bwd_dA_transposed(X, W, A, B, D, lora_alpha, r):
    dX, dA, dB = bwd_right(X, W, A, B, D, lora_alpha, r)
    return dX, dA.T, dB


def bwd_dB_transposed(X, W, A, B, D, lora_alpha, r):
    dX, dA, dB = bwd_right(X, W, A, B, D, lora_alpha, r)
    return dX, dA, dB.T


def bwd_torch(X, W, A, B, D, lora_alpha, r):
    X, W, A, B, D = (torch.tensor(v) for v in (X, W, A, B, D))
    return bwd_right(X, W, A, B, D, lora_alpha, r)


@pytest.mark.parametrize("fn", [bwd_right, bwd_torch])
def test_backward_right_scores_full(fn, capfd):
    fb = grade_backward(fn)
    assert fb.full and fb.points == 3, fb.text()
    assert not _mistake_lines(fb)
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize(
    "fn, words",
    [
        (bwd_missing_s, ("scale is missing",)),
        (bwd_alpha, ("scaled by lora_alpha", "instead of s")),
        (bwd_no_adapter_in_dX, ("∇X is missing the adapter path",)),
        (bwd_updated_B, ("∇A with B already updated", "B − 0.1·∇B")),
        (bwd_dA_transposed, ("∇A has the shape of Aᵀ", "d × r")),
        (bwd_dB_transposed, ("∇B is transposed", "r × m")),
    ],
)
def test_backward_mistake_is_named(fn, words, capfd):
    fb = grade_backward(fn)
    assert fb.points == 0
    _assert_named(fb, *words)
    assert capfd.readouterr() == ("", "")


def test_backward_missing_s_is_named_in_every_output():
    lines = _mistake_lines(grade_backward(bwd_missing_s))
    for where in ("∇B = s Zᵀ D", "∇A = s Xᵀ D Bᵀ", "adapter path of ∇X"):
        assert sum(where in l and "scale is missing" in l for l in lines) == 2, lines


def test_backward_mistake_points_at_the_right_output():
    """The updated-B mistake only touches dA: dX and dB are reported right (not listed as wrong)."""
    fb = grade_backward(bwd_updated_B)
    text = fb.text()
    assert "dA[" in text and "dX[" not in text and "dB[" not in text
    fb = grade_backward(bwd_no_adapter_in_dX)
    text = fb.text()
    assert "dX[" in text and "dA[" not in text and "dB[" not in text


@pytest.mark.parametrize("lr", [0.05, 1e-3])
def test_updated_B_step_size_is_recovered(lr):
    fb = grade_backward(lambda **kw: bwd_updated_B(**kw, lr=lr))
    _assert_named(fb, "B already updated", f"B − {lr:g}·∇B")


def test_one_wrong_case_gives_half():
    def right_on_first_only(X, W, A, B, D, lora_alpha, r):
        return (bwd_right if r == 2 else bwd_no_adapter_in_dX)(X, W, A, B, D, lora_alpha, r)

    fb = grade_backward(right_on_first_only)
    assert fb.points == pytest.approx(1.5)
    _assert_named(fb, "adapter path", per_case=False)


# --------------------------------------------------------------------------- garbage outputs never break the mistake search


@pytest.mark.parametrize(
    "dA",
    [torch.ones(4, 2, requires_grad=True) * 1.0, torch.ones(2, 4, requires_grad=True) * 1.0, [[1.0, 2.0], [3.0]],
     None, "dA", np.full((4, 2), np.nan), np.ones((4, 2), dtype=complex), np.ones((4, 2), dtype=np.float32)],
)
def test_backward_garbage_dA_never_raises(dA, capfd):
    def student(X, W, A, B, D, lora_alpha, r):
        dX, _, dB = bwd_right(X, W, A, B, D, lora_alpha, r)
        return dX, dA, dB

    fb = grade_backward(student)
    assert fb.points == 0 and 0 <= fb.points <= fb.max_points
    assert capfd.readouterr() == ("", "")


# --------------------------------------------------------------------------- merge and direct calls


def test_merge_mistakes():
    cases = [Case(dict(W=c.kwargs["W"], A=c.kwargs["A"], B=c.kwargs["B"], lora_alpha=c.kwargs["lora_alpha"],
                       r=c.kwargs["r"])) for c in _cases(False)]
    ref = lambda W, A, B, lora_alpha, r: merge(W, A, B, scaling(lora_alpha, r))  # noqa: E731
    grade = lambda fn: check_function(fn, cases, ref, 1, "merge", ("W_merged",), mistakes=merge_mistakes)  # noqa: E731
    assert grade(lambda W, A, B, lora_alpha, r: W + lora_alpha / r * A @ B).full
    _assert_named(grade(lambda W, A, B, lora_alpha, r: lora_alpha / r * A @ B), "only the update")
    _assert_named(grade(lambda W, A, B, lora_alpha, r: W + A @ B), "scale is missing")


def test_scale_list_drops_coincident_wrong_scales():
    """With lora_alpha = r, s = 1: 'missing s' would be the right answer, so it must not be listed."""
    rng = np.random.default_rng(0)
    kw = dict(X=rng.standard_normal((2, 3)), W=rng.standard_normal((3, 4)), A=rng.standard_normal((3, 2)),
              B=rng.standard_normal((2, 4)), lora_alpha=2.0, r=2)
    labels = [m.label for m in forward_mistakes(kw)["Y"]]
    assert "missing s" not in labels and "alpha" in labels
    kw2 = dict(kw, s=0.5)
    del kw2["lora_alpha"], kw2["r"]
    assert [m.label for m in forward_mistakes(kw2)["Y"]][0] == "missing s"
