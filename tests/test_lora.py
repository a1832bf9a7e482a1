"""coursekit.lora: lesson 02's worked example, identities, PEFT scaling, and checks against torch autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit.gradcheck import check_vjp
from coursekit.lora import (
    LoRADtypeError,
    LoRAShapeError,
    adapter_fraction,
    dense_param_count,
    from_linear_weight,
    lora_backward,
    lora_forward,
    merge,
    param_count,
    scaling,
    unmerge,
)

FAST = settings(max_examples=25, deadline=None, derandomize=True)


# --------------------------------------------------------------------------- lesson 02's worked example


@pytest.fixture
def worked_example():
    """Lesson 02's worked example: one token x of width 3, a 3 × 2 base, rank 1, s = 0.5."""
    X = np.array([[2.0, -1.0, 3.0]])
    W = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]])
    A = np.array([[1.0], [0.0], [1.0]])
    B = np.array([[0.2, -0.1]])
    D = np.array([[0.4, -0.2]])
    return X, W, A, B, 0.5, D


def test_seed_forward(worked_example):
    X, W, A, B, s, _ = worked_example
    Y, cache = lora_forward(X, W, A, B, s)
    np.testing.assert_allclose(Y, [[5.5, -4.25]], rtol=0, atol=1e-12)
    np.testing.assert_allclose(cache["Z"], [[5.0]], atol=1e-12)
    assert cache["s"] == s and cache["B"] is B


def test_seed_backward(worked_example):
    X, W, A, B, s, D = worked_example
    _, cache = lora_forward(X, W, A, B, s)
    dX, dA, dB = lora_backward(D, cache)
    np.testing.assert_allclose(dB, [[1.0, -0.5]], atol=1e-12)
    np.testing.assert_allclose(dA, [[0.1], [-0.05], [0.15]], atol=1e-12)
    np.testing.assert_allclose(dX, [[0.45, -0.2, 0.65]], atol=1e-12)
    assert dX.shape == X.shape and dA.shape == A.shape and dB.shape == B.shape


def test_seed_backward_passes_gradcheck(worked_example):
    X, W, A, B, s, D = worked_example
    _, cache = lora_forward(X, W, A, B, s)
    dX, dA, dB = lora_backward(D, cache)
    rep = check_vjp(lambda X, A, B: lora_forward(X, W, A, B, s), {"X": X, "A": A, "B": B},
                    {"X": dX, "A": dA, "B": dB}, D)
    assert rep.ok, str(rep)


# --------------------------------------------------------------------------- identities


def _rand(rng, *shape):
    return rng.standard_normal(shape)


@FAST
@given(n=st.integers(1, 6), d=st.integers(1, 6), m=st.integers(1, 6), r=st.integers(1, 6),
       s=st.floats(-4, 4, allow_nan=False), seed=st.integers(0, 2**32 - 1))
def test_merged_equals_forward_and_unmerge_round_trips(n, d, m, r, s, seed):
    rng = np.random.default_rng(seed)
    X, W, A, B = _rand(rng, n, d), _rand(rng, d, m), _rand(rng, d, r), _rand(rng, r, m)
    Y, _ = lora_forward(X, W, A, B, s)
    W_merged = merge(W, A, B, s)
    assert W_merged.shape == W.shape
    np.testing.assert_allclose(X @ W_merged, Y, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(unmerge(W_merged, A, B, s), W, rtol=1e-10, atol=1e-10)
    # merge returns a new array: the frozen W is not modified in place.
    assert not np.shares_memory(W_merged, W)


def test_merge_rejects_mismatched_factors():
    W, A = np.zeros((3, 2)), np.zeros((3, 1))
    with pytest.raises(LoRAShapeError, match=r"B.*\(1, 2\).*\(2, 1\)"):
        merge(W, A, np.zeros((2, 1)), 1.0)
    with pytest.raises(LoRAShapeError, match=r"A.*\(3, 1\).*\(4, 1\)"):
        merge(W, np.zeros((4, 1)), np.zeros((1, 2)), 1.0)


# --------------------------------------------------------------------------- sizes and scaling


def test_param_count_worked_example():
    assert param_count(4096, 4096, 16) == 131_072
    assert dense_param_count(4096, 4096) == 4096 * 4096
    assert adapter_fraction(4096, 4096, 16) == 0.0078125
    assert isinstance(param_count(np.int64(8), 4, 2), int)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None, "16"])
def test_param_count_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="positive integer"):
        param_count(4096, 4096, bad)
    with pytest.raises(ValueError):
        dense_param_count(bad, 4096)


def test_scaling_lora_and_rslora():
    assert scaling(16, 8) == 2.0
    assert scaling(32, 16) == 2.0
    assert scaling(16, 16, use_rslora=True) == 4.0
    assert scaling(8, 2, use_rslora=True) == pytest.approx(8 / math.sqrt(2), rel=1e-15)
    assert scaling(16, np.int64(4)) == 4.0
    assert isinstance(scaling(16, 8), float)


@pytest.mark.parametrize("r", [0, -4, 2.5, True, False, None, "8"])
def test_scaling_rejects_bad_rank(r):
    with pytest.raises(ValueError, match="r must be a positive integer"):
        scaling(16, r)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf")])
def test_scaling_rejects_non_finite_alpha(alpha):
    with pytest.raises(ValueError, match="lora_alpha"):
        scaling(alpha, 8)


# --------------------------------------------------------------------------- against torch autograd and check_vjp


shapes = dict(n=st.integers(1, 6), d=st.integers(1, 6), m=st.integers(1, 6), r=st.integers(1, 6),
              seed=st.integers(0, 2**32 - 1))


def _problem(n, d, m, r, seed):
    rng = np.random.default_rng(seed)
    s = float(rng.uniform(0.25, 4.0))
    return _rand(rng, n, d), _rand(rng, d, m), _rand(rng, d, r), _rand(rng, r, m), s, _rand(rng, n, m)


@FAST
@given(**shapes)
def test_backward_matches_torch_autograd(n, d, m, r, seed):
    X, W, A, B, s, D = _problem(n, d, m, r, seed)
    Y, cache = lora_forward(X, W, A, B, s)
    dX, dA, dB = lora_backward(D, cache)

    Xt, At, Bt = (torch.tensor(v, requires_grad=True) for v in (X, A, B))
    Wt = torch.tensor(W)  # frozen
    Yt = Xt @ Wt + s * (Xt @ At) @ Bt
    Yt.backward(torch.tensor(D))
    np.testing.assert_allclose(Y, Yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dX, Xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dA, At.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dB, Bt.grad.numpy(), rtol=1e-10, atol=1e-12)


@FAST
@given(**shapes)
def test_backward_matches_check_vjp(n, d, m, r, seed):
    X, W, A, B, s, D = _problem(n, d, m, r, seed)
    _, cache = lora_forward(X, W, A, B, s)
    dX, dA, dB = lora_backward(D, cache)
    rep = check_vjp(lambda X, A, B: lora_forward(X, W, A, B, s), {"X": X, "A": A, "B": B},
                    {"X": dX, "A": dA, "B": dB}, D, tol=1e-5)
    assert [c.name for c in rep.checks] == ["X", "A", "B"]
    for c in rep.checks:
        # f is linear in each input, so central differences are exact up to round-off (~1e-9 absolute);
        # a relative error can exceed tol only where the gradient entry itself is near zero.
        assert c.ok or c.max_abs_error < 1e-7, str(rep)


@FAST
@given(**shapes)
def test_torch_inputs_keep_autograd(n, d, m, r, seed):
    X, W, A, B, s, D = _problem(n, d, m, r, seed)
    Xt, At, Bt = (torch.tensor(v, requires_grad=True) for v in (X, A, B))
    Wt, Dt = torch.tensor(W), torch.tensor(D)
    Yt, cache = lora_forward(Xt, Wt, At, Bt, s)
    assert isinstance(Yt, torch.Tensor) and Yt.dtype == torch.float64 and Yt.requires_grad
    Yt.backward(Dt)
    with torch.no_grad():
        dX, dA, dB = lora_backward(Dt, cache)
    assert all(isinstance(g, torch.Tensor) for g in (dX, dA, dB))
    torch.testing.assert_close(dX, Xt.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dA, At.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dB, Bt.grad, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(Yt.detach().numpy(), lora_forward(X, W, A, B, s)[0], rtol=1e-12, atol=1e-12)


def test_torch_backward_grads_requiring_grad_go_through_check_vjp():
    X, W, A, B, s, D = _problem(3, 4, 2, 2, seed=1)
    Xt, At, Bt = (torch.tensor(v, requires_grad=True) for v in (X, A, B))
    _, cache = lora_forward(Xt, torch.tensor(W), At, Bt, s)
    dX, dA, dB = lora_backward(torch.tensor(D), cache)  # these carry autograd history
    rep = check_vjp(lambda X, A, B: lora_forward(X, W, A, B, s), {"X": Xt, "A": At, "B": Bt},
                    {"X": dX, "A": dA, "B": dB}, D, tol=1e-5)
    assert all(c.ok or c.max_abs_error < 1e-7 for c in rep.checks), str(rep)


def test_float32_torch_works():
    X, W, A, B, s, D = _problem(2, 3, 4, 2, seed=2)
    t = [torch.tensor(v, dtype=torch.float32) for v in (X, W, A, B, D)]
    Y, cache = lora_forward(*t[:4], s)
    dX, dA, dB = lora_backward(t[4], cache)
    assert Y.dtype == dX.dtype == dA.dtype == dB.dtype == torch.float32
    np.testing.assert_allclose(Y.numpy(), lora_forward(X, W, A, B, s)[0], rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- nn.Linear layout


def test_from_linear_weight_matches_nn_linear():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3, bias=False).double()
    x = torch.randn(4, 5, dtype=torch.float64)
    W = from_linear_weight(lin.weight)
    assert tuple(W.shape) == (5, 3)
    with torch.no_grad():
        torch.testing.assert_close(x @ W, lin(x))


def test_from_linear_weight_builds_peft_factors():
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 4, bias=False).double()
    lora_A = torch.nn.Linear(6, 2, bias=False).double()
    lora_B = torch.nn.Linear(2, 4, bias=False).double()
    s = scaling(16, 2)
    x = torch.randn(3, 6, dtype=torch.float64)
    with torch.no_grad():
        peft_style = base(x) + lora_B(lora_A(x)) * s
        Y, _ = lora_forward(x, from_linear_weight(base.weight), from_linear_weight(lora_A.weight),
                            from_linear_weight(lora_B.weight), s)
    torch.testing.assert_close(Y, peft_style)


def test_from_linear_weight_rejects_non_2d():
    with pytest.raises(LoRAShapeError, match=r"weight.*\(3,\)"):
        from_linear_weight(np.zeros(3))


def test_transposed_nn_linear_weight_is_diagnosed():
    lin = torch.nn.Linear(5, 3, bias=False).double()
    x = torch.randn(2, 5, dtype=torch.float64)
    A, B = torch.zeros(5, 1, dtype=torch.float64), torch.zeros(1, 3, dtype=torch.float64)
    with pytest.raises(LoRAShapeError, match="transposed"):
        lora_forward(x, lin.weight.detach(), A, B, 1.0)  # out × in, not in × out


# --------------------------------------------------------------------------- clear errors


def _ok():
    X, W, A, B, s, D = _problem(4, 3, 2, 2, seed=3)
    return dict(X=X, W=W, A=A, B=B), D


def _shape(x):
    return str(tuple(x.shape))


@pytest.mark.parametrize(
    "name, bad",
    [
        ("W", np.zeros((2, 2))),      # d mismatch (X is 4 × 3)
        ("W", np.zeros((2, 3))),      # stored out × in
        ("A", np.zeros((4, 2))),      # d mismatch
        ("A", np.zeros((2, 3))),      # stored r × d, as PEFT does
        ("B", np.zeros((3, 2))),      # r mismatch
        ("B", np.zeros((2, 3))),      # m mismatch
        ("B", np.zeros((2, 2, 1))),   # 3-D
    ],
)
def test_shape_errors_name_argument_and_both_shapes(name, bad):
    args, _ = _ok()
    args[name] = bad
    with pytest.raises(LoRAShapeError) as info:
        lora_forward(**args, s=1.0)
    msg = str(info.value)
    assert msg.startswith(name + " "), msg
    assert _shape(bad) in msg, msg
    if bad.ndim == 2:
        # the expected size is stated with the shape it comes from
        if name == "B":
            assert "(2, 2)" in msg, msg
        else:
            assert _shape(args["X"]) in msg, msg


@pytest.mark.parametrize("name", ["X", "W", "A", "B"])
@pytest.mark.parametrize("ndim_shape", [(3,), (1, 4, 3), ()])
def test_ndim_errors_name_argument(name, ndim_shape):
    args, _ = _ok()
    args[name] = np.zeros(ndim_shape)
    with pytest.raises(LoRAShapeError, match=rf"^{name} must be 2-D") as info:
        lora_forward(**args, s=1.0)
    assert f"got shape {_shape(args[name])}" in str(info.value)


def test_backward_rejects_wrong_D_shape():
    args, D = _ok()
    _, cache = lora_forward(**args, s=1.0)
    with pytest.raises(LoRAShapeError) as info:
        lora_backward(D.T, cache)
    msg = str(info.value)
    assert msg.startswith("D ") and "(4, 2)" in msg and "(2, 4)" in msg, msg
    with pytest.raises(LoRAShapeError, match=r"^D must be 2-D"):
        lora_backward(D.ravel(), cache)


@pytest.mark.parametrize("name", ["X", "W", "A", "B"])
def test_integer_dtype_error_names_argument(name):
    args, _ = _ok()
    args[name] = args[name].astype(np.int64)
    with pytest.raises(LoRADtypeError, match=rf"^{name} must be floating point, got dtype int64"):
        lora_forward(**args, s=1.0)


@pytest.mark.parametrize("name", ["X", "W", "A", "B"])
def test_mixed_dtype_error_names_every_argument(name):
    args, _ = _ok()
    args[name] = args[name].astype(np.float32)
    with pytest.raises(LoRADtypeError) as info:
        lora_forward(**args, s=1.0)
    msg = str(info.value)
    assert f"'{name}': 'float32'" in msg and "float64" in msg, msg


@pytest.mark.parametrize("name", ["X", "W", "A", "B"])
def test_mixed_library_error_names_argument(name):
    args, _ = _ok()
    args[name] = torch.tensor(args[name])
    with pytest.raises(LoRADtypeError) as info:
        lora_forward(**args, s=1.0)
    msg = str(info.value)
    assert "mixed" in msg and f"'{name}': 'torch'" in msg, msg


@pytest.mark.parametrize("bad", [[[1.0, 2.0]], None, 3.0, "X"])
def test_non_array_error_names_argument(bad):
    args, _ = _ok()
    args["X"] = bad
    with pytest.raises(LoRADtypeError, match=r"^X must be a NumPy array or a torch tensor"):
        lora_forward(**args, s=1.0)


def test_backward_rejects_mixed_library_and_dtype():
    args, D = _ok()
    _, cache = lora_forward(**args, s=1.0)
    with pytest.raises(LoRADtypeError, match="mixed"):
        lora_backward(torch.tensor(D), cache)
    with pytest.raises(LoRADtypeError, match="'D': 'float32'"):
        lora_backward(D.astype(np.float32), cache)


def test_torch_integer_and_bool_tensors_rejected():
    args, _ = _ok()
    t = {k: torch.tensor(v) for k, v in args.items()}
    t["A"] = t["A"].long()
    with pytest.raises(LoRADtypeError, match="^A must be floating point, got dtype int64"):
        lora_forward(**t, s=1.0)
    t["A"] = t["A"].bool()
    with pytest.raises(LoRADtypeError, match="^A must be floating point, got dtype bool"):
        lora_forward(**t, s=1.0)
