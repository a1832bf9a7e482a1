"""coursekit.mlp: SiLU and SiLU′ values, the gated MLP against finite differences and torch autograd, errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit.gradcheck import check_vjp
from coursekit.mlp import (
    MLPDtypeError,
    MLPShapeError,
    mlp_backward,
    mlp_forward,
    mlp_param_count,
    sigmoid,
    silu,
    silu_grad,
    swiglu_backward,
    swiglu_forward,
)

FAST = settings(max_examples=25, deadline=None, derandomize=True)


def _torch_silu_grad(x: np.ndarray) -> np.ndarray:
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.silu(t).sum().backward()
    return t.grad.numpy()


# --------------------------------------------------------------------------- element-wise functions


def test_silu_grad_quoted_values():
    np.testing.assert_allclose(silu_grad(0.0), 0.5, rtol=0, atol=1e-15)
    np.testing.assert_allclose(silu_grad(2.0), 1.0907842, atol=5e-7)
    np.testing.assert_allclose(silu_grad(-3.0), -0.0881041, atol=5e-7)


def test_silu_grad_is_not_sigmoid_or_its_derivative():
    x = np.array([-3.0, 2.0])
    s = sigmoid(x)
    assert np.all(np.abs(silu_grad(x) - s) > 0.05)
    assert np.all(np.abs(silu_grad(x) - s * (1 - s)) > 0.05)


@FAST
@given(st.lists(st.floats(-30, 30), min_size=1, max_size=20))
def test_silu_and_grad_match_torch(values):
    x = np.array(values, dtype=np.float64)
    np.testing.assert_allclose(silu(x), torch.nn.functional.silu(torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(silu_grad(x), _torch_silu_grad(x), rtol=1e-12, atol=1e-15)


@FAST
@given(st.floats(-20, 20))
def test_silu_grad_matches_central_difference(x):
    eps = 1e-6
    num = (silu(x + eps) - silu(x - eps)) / (2 * eps)
    np.testing.assert_allclose(silu_grad(x), num, rtol=1e-7, atol=1e-9)


@FAST
@given(st.floats(-50, 50))
def test_silu_grad_symmetry(x):
    # SiLU(x) − SiLU(−x) = x, so SiLU′(x) + SiLU′(−x) = 1.
    np.testing.assert_allclose(silu_grad(x) + silu_grad(-x), 1.0, atol=1e-12)


def test_large_inputs_are_stable():
    x = np.array([-1e4, -800.0, -40.0, 40.0, 800.0, 1e4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warnings
        s, a, g = sigmoid(x), silu(x), silu_grad(x)
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(a)) and np.all(np.isfinite(g))
    np.testing.assert_allclose(s, [0, 0, np.exp(-40) / (1 + np.exp(-40)), 1 / (1 + np.exp(-40)), 1, 1], rtol=1e-12)
    np.testing.assert_allclose(a[3:], x[3:], rtol=1e-15)
    np.testing.assert_allclose(a[:3], [0, 0, -40 * np.exp(-40)], rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(g, _torch_silu_grad(x), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(g[-2:], 1.0) and np.testing.assert_allclose(g[:2], 0.0)


def test_silu_minimum_and_float32_dtype_kept():
    x = np.linspace(-3, 0, 300_001)
    i = int(np.argmin(silu(x)))
    np.testing.assert_allclose(x[i], -1.278464, atol=1e-5)
    lo, hi = -2.0, -1.0  # bisection on SiLU′ = 0 (SiLU′(−2) < 0 < SiLU′(−1))
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if silu_grad(mid) < 0 else (lo, mid)
    np.testing.assert_allclose(lo, x[i], atol=1e-5)
    np.testing.assert_allclose(silu(lo), lo + 1, atol=1e-12)  # at the minimum, x σ(x) = x + 1
    assert silu(np.float32([1.0])).dtype == np.float32
    assert silu_grad([1, 2]).dtype == np.float64


def test_elementwise_rejects_non_numbers():
    with pytest.raises(MLPDtypeError, match="torch"):
        silu(torch.zeros(2))
    with pytest.raises(MLPDtypeError, match="real numbers"):
        silu_grad(np.array(["a"]))


# --------------------------------------------------------------------------- the gate


def test_swiglu_worked_example():
    G = np.array([[0.0, 2.0, -3.0]])
    U = np.array([[1.0, -1.0, 2.0]])
    H, cache = swiglu_forward(G, U)
    np.testing.assert_allclose(H, [[0.0, -2 * sigmoid(2.0), -6 * sigmoid(-3.0)]], rtol=1e-14)
    dH = np.array([[1.0, 1.0, 1.0]])
    dG, dU = swiglu_backward(dH, cache)
    np.testing.assert_allclose(dG, [[0.5, -1.0907842, -0.1762082]], atol=5e-7)
    np.testing.assert_allclose(dU, silu(G), rtol=1e-15)


@FAST
@given(n=st.integers(1, 5), f=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_swiglu_backward_gradcheck(n, f, seed):
    rng = np.random.default_rng(seed)
    G, U, dH = (rng.standard_normal((n, f)) * 2 for _ in range(3))
    _, cache = swiglu_forward(G, U)
    dG, dU = swiglu_backward(dH, cache)
    rep = check_vjp(swiglu_forward, {"G": G, "U": U}, {"G": dG, "U": dU}, dH)
    assert rep.ok, str(rep)


def test_swiglu_backward_accepts_a_cache_without_silu():
    rng = np.random.default_rng(4)
    G, U, dH = (rng.standard_normal((2, 3)) for _ in range(3))
    _, cache = swiglu_forward(G, U)
    for a, b in zip(swiglu_backward(dH, cache), swiglu_backward(dH, {"G": G, "U": U})):
        np.testing.assert_array_equal(a, b)


def test_swiglu_errors():
    with pytest.raises(MLPShapeError, match=r"U must have shape \(2, 3\)"):
        swiglu_forward(np.zeros((2, 3)), np.zeros((3, 2)))
    _, cache = swiglu_forward(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(MLPShapeError, match="dH must have shape"):
        swiglu_backward(np.zeros((2, 4)), cache)
    with pytest.raises(MLPDtypeError, match="G must be floating"):
        swiglu_forward(np.zeros((2, 3), dtype=int), np.zeros((2, 3)))


# --------------------------------------------------------------------------- the whole MLP


def _mlp_case(rng, n, d, f, d_out=None, scale=1.0):
    d_out = d if d_out is None else d_out
    X = rng.standard_normal((n, d))
    Wg, Wu = rng.standard_normal((d, f)) * scale, rng.standard_normal((d, f)) * scale
    Wd = rng.standard_normal((f, d_out)) * scale
    dY = rng.standard_normal((n, d_out))
    return X, Wg, Wu, Wd, dY


@FAST
@given(n=st.integers(1, 4), d=st.integers(1, 5), f=st.integers(1, 6), d_out=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_mlp_backward_gradcheck(n, d, f, d_out, seed):
    X, Wg, Wu, Wd, dY = _mlp_case(np.random.default_rng(seed), n, d, f, d_out)
    _, cache = mlp_forward(X, Wg, Wu, Wd)
    g = mlp_backward(dY, cache)
    assert set(g) == {"dX", "dW_gate", "dW_up", "dW_down"}
    rep = check_vjp(mlp_forward, {"X": X, "W_gate": Wg, "W_up": Wu, "W_down": Wd},
                    {"X": g["dX"], "W_gate": g["dW_gate"], "W_up": g["dW_up"], "W_down": g["dW_down"]}, dY)
    assert rep.ok, str(rep)


@FAST
@given(n=st.integers(1, 6), d=st.integers(1, 8), f=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_mlp_matches_torch_autograd(n, d, f, seed):
    X, Wg, Wu, Wd, dY = _mlp_case(np.random.default_rng(seed), n, d, f)
    Y, cache = mlp_forward(X, Wg, Wu, Wd)
    g = mlp_backward(dY, cache)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in {"X": X, "Wg": Wg, "Wu": Wu, "Wd": Wd}.items()}
    F = torch.nn.functional
    Yt = (F.silu(t["X"] @ t["Wg"]) * (t["X"] @ t["Wu"])) @ t["Wd"]
    Yt.backward(torch.tensor(dY))
    np.testing.assert_allclose(Y, Yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for ours, theirs in (("dX", "X"), ("dW_gate", "Wg"), ("dW_up", "Wu"), ("dW_down", "Wd")):
        np.testing.assert_allclose(g[ours], t[theirs].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=ours)


def test_mlp_matches_torch_with_large_preactivations():
    # Weights scaled by 50 push |G| into the hundreds: σ saturates, nothing overflows.
    X, Wg, Wu, Wd, dY = _mlp_case(np.random.default_rng(7), 3, 4, 6, scale=50.0)
    _, cache = mlp_forward(X, Wg, Wu, Wd)
    assert np.max(np.abs(cache["G"])) > 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = mlp_backward(dY, cache)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in {"X": X, "Wg": Wg, "Wu": Wu, "Wd": Wd}.items()}
    ((torch.nn.functional.silu(t["X"] @ t["Wg"]) * (t["X"] @ t["Wu"])) @ t["Wd"]).backward(torch.tensor(dY))
    np.testing.assert_allclose(g["dX"], t["X"].grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(g["dW_gate"], t["Wg"].grad.numpy(), rtol=1e-10, atol=1e-9)


def test_dx_needs_both_branches():
    X, Wg, Wu, Wd, dY = _mlp_case(np.random.default_rng(3), 3, 4, 5)
    _, cache = mlp_forward(X, Wg, Wu, Wd)
    g = mlp_backward(dY, cache)
    dG, dU = swiglu_backward(dY @ Wd.T, cache)
    np.testing.assert_allclose(g["dX"], dG @ Wg.T + dU @ Wu.T, rtol=1e-14)
    assert np.max(np.abs(g["dX"] - dG @ Wg.T)) > 1e-3  # the gate branch alone is not the gradient


def test_mlp_errors_name_the_argument():
    X, Wg, Wu, Wd, _ = _mlp_case(np.random.default_rng(0), 3, 4, 5)
    with pytest.raises(MLPShapeError, match=r"W_gate must have 4 rows.*transposed"):
        mlp_forward(X, Wg.T, Wu, Wd)
    with pytest.raises(MLPShapeError, match=r"W_up must have shape \(4, 5\)"):
        mlp_forward(X, Wg, Wu[:, :3], Wd)
    with pytest.raises(MLPShapeError, match=r"W_down must have 5 rows"):
        mlp_forward(X, Wg, Wu, Wd[:4])
    with pytest.raises(MLPShapeError, match="X must be 2-D"):
        mlp_forward(X[0], Wg, Wu, Wd)
    with pytest.raises(MLPDtypeError, match="share one dtype"):
        mlp_forward(X.astype(np.float32), Wg, Wu, Wd)
    with pytest.raises(MLPDtypeError, match="W_up must be a NumPy array"):
        mlp_forward(X, Wg, Wu.tolist(), Wd)
    _, cache = mlp_forward(X, Wg, Wu, Wd)
    with pytest.raises(MLPShapeError, match=r"dY must have shape \(3, 4\)"):
        mlp_backward(np.zeros((4, 3)), cache)


def test_param_count():
    assert mlp_param_count(576, 1536) == 2_654_208
    with pytest.raises(ValueError, match="f must be a positive integer"):
        mlp_param_count(576, 0)
