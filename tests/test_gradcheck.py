"""coursekit.gradcheck: central differences, relative error and its bands, and check_vjp catching broken backwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from coursekit.gradcheck import GradReport, band, check_vjp, numeric_gradient, relative_error
from coursekit.lora import lora_backward, lora_forward

FAST = settings(max_examples=25, deadline=None, derandomize=True)


# --------------------------------------------------------------------------- numeric_gradient


@FAST
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                  elements=st.floats(-3, 3, allow_nan=False)))
def test_numeric_gradient_of_cube_sum(x):
    x0 = x.copy()
    g = numeric_gradient(lambda v: np.sum(v**3), x)
    assert g.shape == x.shape and g.dtype == np.float64
    np.testing.assert_allclose(g, 3 * x0**2, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x, x0)  # perturbed in place, then restored


def test_numeric_gradient_known_functions():
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(numeric_gradient(lambda v: np.sum(np.sin(v)), x), np.cos(x), rtol=1e-8)
    np.testing.assert_allclose(numeric_gradient(lambda v: float(v @ v), x), 2 * x, rtol=1e-8)
    M = np.array([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_allclose(numeric_gradient(lambda v: np.prod(v), M), [[24.0, 12.0], [8.0, 6.0]], rtol=1e-7)


def test_numeric_gradient_rejects_non_float():
    with pytest.raises(TypeError, match="floating NumPy array"):
        numeric_gradient(np.sum, np.arange(3))
    with pytest.raises(TypeError, match="floating NumPy array"):
        numeric_gradient(np.sum, [1.0, 2.0])


# --------------------------------------------------------------------------- relative_error and band


def test_relative_error_values():
    assert relative_error([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert relative_error(1.0, 1.1) == pytest.approx(0.1 / 2.1)
    assert relative_error([1.0, 0.0], [1.0, 1e-3]) == pytest.approx(1.0)  # worst entry, not the mean
    assert relative_error(np.zeros(3), np.zeros(3)) == 0.0
    assert relative_error(np.zeros((0, 2)), np.zeros((0, 2))) == 0.0
    assert relative_error(-2.0, 2.0) == pytest.approx(1.0)


def test_relative_error_shape_mismatch_is_inf():
    assert relative_error(np.zeros((2, 3)), np.zeros((3, 2))) == float("inf")
    assert relative_error(np.zeros(3), np.zeros((3, 1))) == float("inf")


def test_relative_error_accepts_torch():
    t = torch.ones(2, requires_grad=True) * 2
    assert relative_error(t, np.array([2.0, 2.0])) == 0.0


@pytest.mark.parametrize(
    "err, expected",
    [(0.0, "right"), (1e-9, "right"), (9.99e-8, "right"), (1e-7, "look closer"), (1e-5, "look closer"),
     (1e-4, "look closer"), (1.01e-4, "wrong"), (0.5, "wrong"), (float("inf"), "wrong"), (float("nan"), "wrong")],
)
def test_band_thresholds(err, expected):
    assert band(err) == expected


# --------------------------------------------------------------------------- check_vjp on LoRA, right and broken


def _problem(n=3, d=4, m=3, r=3, seed=0, s=0.5):
    rng = np.random.default_rng(seed)
    X, W, A, B, D = (rng.standard_normal(sh) for sh in ((n, d), (d, m), (d, r), (r, m), (n, m)))
    return X, W, A, B, s, D


def _right(D, cache):
    return lora_backward(D, cache)


def _dA_missing_s(D, cache):
    dX, _, dB = lora_backward(D, cache)
    return dX, cache["X"].T @ D @ cache["B"].T, dB


def _dB_transposed(D, cache):
    dX, dA, dB = lora_backward(D, cache)
    return dX, dA, dB.T


def _dX_no_adapter(D, cache):
    _, dA, dB = lora_backward(D, cache)
    return D @ cache["W"].T, dA, dB


def _check(backward, X, W, A, B, s, D):
    _, cache = lora_forward(X, W, A, B, s)
    dX, dA, dB = backward(D, cache)
    return check_vjp(lambda X, A, B: lora_forward(X, W, A, B, s), {"X": X, "A": A, "B": B},
                     {"X": dX, "A": dA, "B": dB}, D)


def test_check_vjp_passes_right_backward():
    rep = _check(_right, *_problem())
    assert isinstance(rep, GradReport) and rep.ok, str(rep)
    for c in rep.checks:
        # "look closer" is possible where an entry is near zero and round-off dominates; never "wrong".
        assert band(c.rel_error) != "wrong" and c.max_abs_error < 1e-8, str(rep)
    assert "FAIL" not in str(rep)


@pytest.mark.parametrize("broken, culprit", [(_dA_missing_s, "A"), (_dB_transposed, "B"), (_dX_no_adapter, "X")])
def test_check_vjp_names_the_broken_tensor(broken, culprit):
    X, W, A, B, s, D = _problem()  # r == m: a transposed dB has the right shape and only wrong values
    rep = _check(broken, X, W, A, B, s, D)
    assert not rep.ok
    assert rep.worst.name == culprit
    bad = rep[culprit]
    assert not bad.ok and bad.rel_error > 1e-4 and band(bad.rel_error) == "wrong"
    shape = {"X": X.shape, "A": A.shape, "B": B.shape}[culprit]
    assert bad.shape == shape
    assert len(bad.worst_index) == len(shape) and all(0 <= i < n for i, n in zip(bad.worst_index, shape))
    # the reported pair is the analytic value at that index and a numeric value that differs from it
    _, cache = lora_forward(X, W, A, B, s)
    analytic = dict(zip("XAB", broken(D, cache)))[culprit]
    assert bad.analytic == pytest.approx(analytic[bad.worst_index])
    assert bad.analytic != pytest.approx(bad.numeric)
    for other in set("XAB") - {culprit}:
        assert rep[other].ok, str(rep)
    line = next(l for l in str(rep).splitlines() if l.startswith("FAIL"))
    assert f"d{culprit}" in line and f"{culprit}{list(bad.worst_index)}" in line and "wrong" in line


def test_check_vjp_shape_mismatch_is_a_failure():
    X, W, A, B, s, D = _problem(r=2)
    _, cache = lora_forward(X, W, A, B, s)
    dX, dA, dB = lora_backward(D, cache)
    rep = check_vjp(lambda X, A, B: lora_forward(X, W, A, B, s), {"X": X, "A": A, "B": B},
                    {"X": dX, "A": dA.T, "B": dB}, D)
    assert not rep.ok and rep["A"].rel_error == float("inf") and rep["X"].ok and rep["B"].ok


def test_check_vjp_wrt_and_errors():
    X, W, A, B, s, D = _problem()
    _, cache = lora_forward(X, W, A, B, s)
    dX, dA, dB = lora_backward(D, cache)
    fwd = lambda X, A, B: lora_forward(X, W, A, B, s)  # noqa: E731
    rep = check_vjp(fwd, {"X": X, "A": A, "B": B}, {"X": dX, "A": dA, "B": dB}, D, wrt=["B"])
    assert [c.name for c in rep.checks] == ["B"] and rep.ok
    with pytest.raises(KeyError):
        rep["A"]
    with pytest.raises(KeyError, match="W"):
        check_vjp(fwd, {"X": X, "A": A, "B": B}, {"W": dX}, D)
    with pytest.raises(ValueError, match="forward returned shape"):
        check_vjp(fwd, {"X": X, "A": A, "B": B}, {"X": dX}, D[:, :2])


def test_check_vjp_does_not_touch_the_callers_inputs():
    X, W, A, B, s, D = _problem()
    before = [v.copy() for v in (X, A, B)]
    _check(_right, X, W, A, B, s, D)
    for v, b in zip((X, A, B), before):
        np.testing.assert_array_equal(v, b)


# --------------------------------------------------------------------------- agreement with torch.autograd.gradcheck


def _torch_fn(backward):
    class LoRA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X, A, B, W, s):
            Y, cache = lora_forward(X, W, A, B, s)
            ctx.cache = cache
            return Y

        @staticmethod
        def backward(ctx, D):
            dX, dA, dB = backward(D.contiguous(), ctx.cache)
            return dX, dA, dB, None, None

    return LoRA.apply


@pytest.mark.parametrize("backward", [_right, _dA_missing_s, _dB_transposed, _dX_no_adapter])
def test_torch_gradcheck_agrees_with_check_vjp(backward):
    X, W, A, B, s, D = _problem(n=2, d=3, m=2, r=2)
    ours = _check(backward, X, W, A, B, s, D).ok
    Xt, At, Bt = (torch.tensor(v, requires_grad=True) for v in (X, A, B))
    theirs = torch.autograd.gradcheck(_torch_fn(backward), (Xt, At, Bt, torch.tensor(W), s),
                                      eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=False)
    assert ours == theirs
    assert ours == (backward is _right)


# --------------------------------------------------------------------------- dtype-aware bands, step choice, ε sweeps

from coursekit.gradcheck import (  # noqa: E402
    BANDS, default_step, epsilon_sweep, error_model, optimal_step, relative_errors, unit_roundoff)


@pytest.mark.parametrize(
    "err, dtype, expected",
    [(5e-4, "float32", "right"), (5e-4, np.float32, "right"), (5e-3, torch.float32, "look closer"),
     (2e-2, "float32", "wrong"), (5e-4, "float64", "wrong"), (5e-4, np.dtype("float64"), "wrong"),
     (float("nan"), "float32", "wrong")],
)
def test_band_by_dtype(err, dtype, expected):
    assert band(err, dtype) == expected


def test_band_rejects_other_dtypes():
    for bad in ("float16", torch.bfloat16, np.int64):
        with pytest.raises(ValueError, match="dtype must be one of"):
            band(1e-3, bad)
    assert BANDS["float64"] == (1e-7, 1e-4)


def test_roundoff_and_steps():
    assert unit_roundoff() == 2.0**-53 and unit_roundoff("float32") == 2.0**-24
    assert default_step() == 1e-6 and default_step(np.float32) == 1e-3
    assert optimal_step() == pytest.approx((3 * 2.0**-53) ** (1 / 3))
    assert 5e-6 < optimal_step() < 1e-5 and 4e-3 < optimal_step("float32") < 7e-3
    assert optimal_step(f_scale=8.0) == pytest.approx(2 * optimal_step())
    with pytest.raises(ValueError, match="positive"):
        optimal_step(d3_scale=0.0)


def test_error_model_is_minimal_at_the_optimal_step():
    eps = np.logspace(-9, -2, 701)
    for dtype in ("float64", "float32"):
        model = error_model(eps, dtype, f_scale=3.0, d3_scale=0.5)
        best = eps[np.argmin(model)]
        assert best == pytest.approx(optimal_step(dtype, 3.0, 0.5), rel=0.03)
    # truncation ∝ ε² at large ε, round-off ∝ 1/ε at small ε
    big, small = error_model([1e-1, 1e-2]), error_model([1e-12, 1e-13])
    assert big[0] / big[1] == pytest.approx(100, rel=1e-6) and small[1] / small[0] == pytest.approx(10, rel=1e-6)
    with pytest.raises(ValueError, match="positive"):
        error_model([1e-3, 0.0])


def test_relative_errors_max_and_sum():
    a, n = np.array([1.0, 0.0, -2.0, 0.0]), np.array([1.1, 1e-3, 2.0, 0.0])
    np.testing.assert_allclose(relative_errors(a, n), [0.1 / 1.1, 1.0, 2.0, 0.0])
    np.testing.assert_allclose(relative_errors(a, n, "sum"), [0.1 / 2.1, 1.0, 1.0, 0.0])
    assert relative_errors(a, n, "sum").max() == relative_error(a, n)
    assert np.all(relative_errors(a, n, "sum") <= relative_errors(a, n) + 1e-15)
    with pytest.raises(ValueError, match="shape"):
        relative_errors(np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match="denominator"):
        relative_errors(a, n, "mean")


def _logsumexp_problem():
    rng = np.random.default_rng(3)
    M = rng.standard_normal((5, 4)) / 2
    x = rng.standard_normal(4)

    def f(v, dtype=np.float64):
        z = M.astype(dtype) @ v.astype(dtype)
        return float(np.log(np.sum(np.exp(z))))

    p = np.exp(M @ x - np.log(np.sum(np.exp(M @ x))))
    return f, x, M.T @ p


def test_epsilon_sweep_shows_truncation_roundoff_and_the_minimum():
    f, x, g = _logsumexp_problem()
    x0 = x.copy()
    eps = np.logspace(-1, -11, 21)
    err = epsilon_sweep(f, x, g, eps)
    np.testing.assert_array_equal(x, x0)
    assert err.shape == eps.shape and err.dtype == np.float64
    best = eps[np.argmin(err)]
    assert 1e-7 <= best <= 1e-4 and err.min() < 1e-8
    slope_big = np.polyfit(np.log10(eps[:5]), np.log10(err[:5]), 1)[0]
    assert 1.8 < slope_big < 2.2  # truncation ∝ ε²
    assert err[-1] > 100 * err.min()  # round-off grows again at small ε
    err32 = epsilon_sweep(lambda v: f(v, np.float32), x, g, eps, reduce="median")
    assert eps[np.argmin(err32)] > best and err32.min() > 1e3 * err.min()


def test_epsilon_sweep_errors():
    f, x, g = _logsumexp_problem()
    with pytest.raises(ValueError, match="positive"):
        epsilon_sweep(f, x, g, [1e-3, -1e-3])
    with pytest.raises(ValueError, match="positive"):
        epsilon_sweep(f, x, g, [])
    with pytest.raises(ValueError, match="shape"):
        epsilon_sweep(f, x, g[:2], [1e-3])
    with pytest.raises(ValueError, match="reduce"):
        epsilon_sweep(f, x, g, [1e-3], reduce="mean")
    with pytest.raises(TypeError, match="floating"):
        epsilon_sweep(f, np.arange(4), g, [1e-3])


@pytest.mark.parametrize("index, named", [((), "s"), ((2,), "s[2]"), ((np.int64(0), np.intp(1)), "s[0, 1]")])
def test_entries_are_named_without_numpy_reprs_or_empty_brackets(index, named):
    from coursekit.gradcheck import entry_name

    assert entry_name("s", index) == named
