"""coursekit.attention: causal attention forward/backward against torch SDPA, torch autograd and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit.attention import (
    AttentionDtypeError,
    AttentionShapeError,
    attention_backward,
    attention_forward,
    causal_mask,
    merge_heads,
    mha_backward,
    mha_forward,
    softmax_backward,
    softmax_forward,
    split_heads,
)
from coursekit.gradcheck import check_vjp

FAST = settings(max_examples=25, deadline=None, derandomize=True)
FEW = settings(max_examples=8, deadline=None, derandomize=True)

shapes = dict(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
    T=st.integers(1, 6),
    dh=st.integers(1, 5),
    dv=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)


def _qkv(lead, T, dh, dv, seed):
    rng = np.random.default_rng(seed)
    Q, K = rng.standard_normal(lead + (T, dh)), rng.standard_normal(lead + (T, dh))
    V, dC = rng.standard_normal(lead + (T, dv)), rng.standard_normal(lead + (T, dv))
    return Q, K, V, dC


def _torch_sdpa(Q, K, V, dC, **kw):
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (Q, K, V))
    C = F.scaled_dot_product_attention(tq, tk, tv, **kw)
    C.backward(torch.tensor(dC))
    return C.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


# --------------------------------------------------------------------------- the causal mask


def test_causal_mask_is_lower_triangle():
    m = causal_mask(4)
    assert m.dtype == bool and m.shape == (4, 4)
    assert m[2, 0] and m[2, 2] and not m[2, 3] and not m[0, 1]
    assert int(m.sum()) == 4 * 5 // 2
    np.testing.assert_array_equal(m, torch.ones(4, 4, dtype=torch.bool).tril().numpy())
    assert causal_mask(1).tolist() == [[True]]


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, None, "3"])
def test_causal_mask_rejects_bad_length(bad):
    with pytest.raises(ValueError, match="T must be a positive integer"):
        causal_mask(bad)


# --------------------------------------------------------------------------- single head against torch


@FAST
@given(**shapes)
def test_forward_and_backward_match_torch_sdpa(lead, T, dh, dv, seed):
    Q, K, V, dC = _qkv(lead, T, dh, dv, seed)
    C, cache = attention_forward(Q, K, V)
    dQ, dK, dV = attention_backward(dC, cache)
    tC, tdQ, tdK, tdV = _torch_sdpa(Q, K, V, dC, is_causal=True)
    np.testing.assert_allclose(C, tC, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dQ, tdQ, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dK, tdK, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dV, tdV, rtol=1e-9, atol=1e-12)
    assert dQ.shape == Q.shape and dK.shape == K.shape and dV.shape == V.shape
    P = cache["P"]
    np.testing.assert_allclose(P.sum(-1), 1.0, rtol=1e-12)
    # masked positions: exactly zero probability
    assert np.all(P[..., ~causal_mask(T)] == 0.0)


@FEW
@given(**shapes)
def test_backward_matches_central_differences(lead, T, dh, dv, seed):
    Q, K, V, dC = _qkv(lead, T, dh, dv, seed)
    _, cache = attention_forward(Q, K, V)
    dQ, dK, dV = attention_backward(dC, cache)
    rep = check_vjp(attention_forward, {"Q": Q, "K": K, "V": V}, {"Q": dQ, "K": dK, "V": dV}, dC, tol=1e-6)
    for c in rep.checks:
        # where an entry is ~0, cancellation limits the relative error; the absolute one stays tiny
        assert c.ok or c.max_abs_error < 1e-8, str(rep)


@FAST
@given(lead=shapes["lead"], Tq=st.integers(1, 5), Tk=st.integers(1, 5), dh=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_cross_attention_without_causal_mask(lead, Tq, Tk, dh, seed):
    rng = np.random.default_rng(seed)
    Q, K, V = rng.standard_normal(lead + (Tq, dh)), rng.standard_normal(lead + (Tk, dh)), rng.standard_normal(lead + (Tk, 3))
    dC = rng.standard_normal(lead + (Tq, 3))
    C, cache = attention_forward(Q, K, V, causal=False)
    assert cache["allowed"] is None
    got = (C,) + attention_backward(dC, cache)
    for a, b in zip(got, _torch_sdpa(Q, K, V, dC)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_one_position_attends_to_itself_only():
    rng = np.random.default_rng(1)
    Q, K, V, dC = (rng.standard_normal((1, 3)) for _ in range(4))
    C, cache = attention_forward(Q, K, V)
    assert cache["P"].tolist() == [[1.0]]
    np.testing.assert_array_equal(C, V)
    dQ, dK, dV = attention_backward(dC, cache)
    # with one key the softmax is constant: no gradient reaches the scores
    assert np.all(dQ == 0) and np.all(dK == 0)
    np.testing.assert_array_equal(dV, dC)


def test_large_scores_do_not_overflow():
    Q = np.array([[30.0, 0.0], [0.0, 40.0], [50.0, 50.0]])
    K = 40 * Q
    V = np.eye(3, 2)
    C, cache = attention_forward(Q, K, V)  # scores reach ~1e5: exp would overflow without the max
    assert np.all(np.isfinite(C)) and np.all(np.isfinite(cache["P"]))
    dQ, dK, dV = attention_backward(np.ones_like(C), cache)
    assert all(np.all(np.isfinite(g)) for g in (dQ, dK, dV))


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("col", [1, 2, 4])
def test_fully_masked_key_column_gets_no_probability_and_no_gradient(col):
    rng = np.random.default_rng(col)
    T, dh = 5, 3
    Q, K, V, dC = (rng.standard_normal((2, T, dh)) for _ in range(4))
    keep = np.ones((T, T), dtype=bool)
    keep[:, col] = False  # e.g. a padding key nobody may see
    C, cache = attention_forward(Q, K, V, mask=keep)
    dQ, dK, dV = attention_backward(dC, cache)
    assert np.all(cache["P"][..., col] == 0.0)
    assert np.all(dK[:, col] == 0.0) and np.all(dV[:, col] == 0.0)
    both = torch.tensor(keep & causal_mask(T))
    for a, b in zip((C, dQ, dK, dV), _torch_sdpa(Q, K, V, dC, attn_mask=both)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    rep = check_vjp(lambda Q, K, V: attention_forward(Q, K, V, mask=keep), {"Q": Q, "K": K, "V": V},
                    {"Q": dQ, "K": dK, "V": dV}, dC, tol=1e-6)
    assert all(c.ok or c.max_abs_error < 1e-8 for c in rep.checks), str(rep)


def test_masking_key_zero_leaves_query_zero_with_nothing_to_see():
    """Key 0 masked: query 0 may see no key at all. Its row of P and C is zero (not NaN), and so are its gradients."""
    rng = np.random.default_rng(7)
    T = 4
    Q, K, V, dC = (rng.standard_normal((T, 2)) for _ in range(4))
    keep = np.ones((T, T), dtype=bool)
    keep[:, 0] = False
    C, cache = attention_forward(Q, K, V, mask=keep)
    dQ, dK, dV = attention_backward(dC, cache)
    assert np.all(cache["P"][0] == 0) and np.all(C[0] == 0) and np.all(dQ[0] == 0)
    assert np.all(np.isfinite(dK)) and np.all(dK[0] == 0) and np.all(dV[0] == 0)
    # torch's SDPA makes the same choice (a zero row, not NaN)
    both = torch.tensor(keep & causal_mask(T))
    for a, b in zip((C, dQ, dK, dV), _torch_sdpa(Q, K, V, dC, attn_mask=both)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    rep = check_vjp(lambda Q, K, V: attention_forward(Q, K, V, mask=keep), {"Q": Q, "K": K, "V": V},
                    {"Q": dQ, "K": dK, "V": dV}, dC, tol=1e-6)
    assert all(c.ok or c.max_abs_error < 1e-8 for c in rep.checks), str(rep)


def test_per_batch_mask_broadcasts_over_heads():
    rng = np.random.default_rng(3)
    Bn, H, T, dh = 2, 3, 4, 2
    Q, K, V, dC = (rng.standard_normal((Bn, H, T, dh)) for _ in range(4))
    keep = np.ones((Bn, 1, T, T), dtype=bool)
    keep[1, :, :, 1] = False  # second sequence: key 1 is padding
    C, cache = attention_forward(Q, K, V, mask=keep)
    assert np.all(cache["P"][1, :, :, 1] == 0) and np.any(cache["P"][0, :, 1:, 1] > 0)
    both = torch.tensor(keep & causal_mask(T))
    for a, b in zip((C,) + attention_backward(dC, cache), _torch_sdpa(Q, K, V, dC, attn_mask=both)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- the softmax step


@FAST
@given(lead=shapes["lead"], T=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_softmax_backward_is_the_jacobian_product(lead, T, seed):
    rng = np.random.default_rng(seed)
    S, dP = rng.standard_normal(lead + (T, T)), rng.standard_normal(lead + (T, T))
    P = softmax_forward(S, causal_mask(T))
    dS = softmax_backward(P, dP)
    # row by row: dS = dP (diag(p) − p pᵀ), the softmax Jacobian is symmetric
    for idx in np.ndindex(*lead, T):
        p = P[idx]
        np.testing.assert_allclose(dS[idx], (np.diag(p) - np.outer(p, p)) @ dP[idx], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(dS.sum(-1), 0.0, atol=1e-12)  # adding a constant to a row changes nothing
    assert np.all(dS[..., ~causal_mask(T)] == 0.0)
    # and autograd agrees
    tS = torch.tensor(S, requires_grad=True)
    tP = torch.softmax(tS.masked_fill(~torch.tensor(causal_mask(T)), -math.inf), dim=-1)
    tP.backward(torch.tensor(dP))
    np.testing.assert_allclose(dS, tS.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_softmax_backward_rejects_mismatched_shapes():
    with pytest.raises(AttentionShapeError, match=r"dP must have the shape of P \(3, 3\), got \(3, 2\)"):
        softmax_backward(np.full((3, 3), 1 / 3), np.zeros((3, 2)))
    with pytest.raises(AttentionDtypeError, match="P must be floating point"):
        softmax_backward(np.ones((2, 2), dtype=int), np.zeros((2, 2)))


# --------------------------------------------------------------------------- heads


@FAST
@given(lead=shapes["lead"], T=st.integers(1, 5), H=st.integers(1, 4), dh=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_split_and_merge_heads_round_trip_and_match_torch_layout(lead, T, H, dh, seed):
    X = np.random.default_rng(seed).standard_normal(lead + (T, H * dh))
    Xh = split_heads(X, H)
    assert Xh.shape == lead + (H, T, dh)
    np.testing.assert_array_equal(Xh[..., 0, :, :], X[..., :dh])  # head 0 = the first d_h columns
    np.testing.assert_array_equal(Xh, torch.tensor(X).view(*lead, T, H, dh).transpose(-2, -3).numpy())
    np.testing.assert_array_equal(merge_heads(Xh), X)


def test_split_heads_errors():
    with pytest.raises(AttentionShapeError, match="d = 6 must be divisible by n_heads = 4"):
        split_heads(np.zeros((3, 6)), 4)
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        split_heads(np.zeros((3, 6)), 0)
    with pytest.raises(AttentionShapeError, match=r"\(\.\.\., T, d\)"):
        split_heads(np.zeros(6), 2)
    with pytest.raises(AttentionShapeError, match="n_heads, T, d_h"):
        merge_heads(np.zeros((3, 6)))


def _mha_problem(lead, T, H, dh, seed, m=3):
    rng = np.random.default_rng(seed)
    d = 4
    X = rng.standard_normal(lead + (T, d))
    Wq, Wk, Wv = (rng.standard_normal((d, H * dh)) / math.sqrt(d) for _ in range(3))
    Wo = rng.standard_normal((H * dh, m)) / math.sqrt(H * dh)
    dY = rng.standard_normal(lead + (T, m))
    return X, Wq, Wk, Wv, Wo, dY


@FAST
@given(lead=st.lists(st.integers(1, 2), max_size=1).map(tuple), T=st.integers(1, 5), H=st.integers(1, 3),
       dh=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_mha_matches_torch_autograd(lead, T, H, dh, seed):
    X, Wq, Wk, Wv, Wo, dY = _mha_problem(lead, T, H, dh, seed)
    Y, cache = mha_forward(X, Wq, Wk, Wv, Wo, n_heads=H)
    g = mha_backward(dY, cache)
    assert set(g) == {"dX", "dWq", "dWk", "dWv", "dWo"}

    t = {k: torch.tensor(v, requires_grad=True) for k, v in dict(X=X, Wq=Wq, Wk=Wk, Wv=Wv, Wo=Wo).items()}

    def heads(Z):
        return Z.view(*lead, T, H, dh).transpose(-2, -3)

    Ch = F.scaled_dot_product_attention(heads(t["X"] @ t["Wq"]), heads(t["X"] @ t["Wk"]), heads(t["X"] @ t["Wv"]), is_causal=True)
    tY = Ch.transpose(-2, -3).reshape(*lead, T, H * dh) @ t["Wo"]
    tY.backward(torch.tensor(dY))
    np.testing.assert_allclose(Y, tY.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k in t:
        assert g["d" + k].shape == t[k].shape
        np.testing.assert_allclose(g["d" + k], t[k].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg="d" + k)


def test_mha_backward_matches_central_differences():
    X, Wq, Wk, Wv, Wo, dY = _mha_problem((), 4, 2, 3, 11)
    Y, cache = mha_forward(X, Wq, Wk, Wv, Wo, 2)
    g = mha_backward(dY, cache)
    rep = check_vjp(lambda **kw: mha_forward(n_heads=2, **kw), dict(X=X, Wq=Wq, Wk=Wk, Wv=Wv, Wo=Wo),
                    {k[1:]: v for k, v in g.items()}, dY, tol=1e-6)
    assert [c.name for c in rep.checks] == ["X", "Wq", "Wk", "Wv", "Wo"]
    assert all(c.ok or c.max_abs_error < 1e-8 for c in rep.checks), str(rep)


def test_mha_intermediates_are_each_projections_upstream_gradient():
    X, Wq, Wk, Wv, Wo, dY = _mha_problem((2,), 3, 2, 2, 5)
    Y, cache = mha_forward(X, Wq, Wk, Wv, Wo, 2)
    g = mha_backward(dY, cache, return_intermediates=True)
    # lesson 05's rule per projection: ∇W = Xᵀ D, summed over batch and tokens
    Xf = X.reshape(-1, X.shape[-1])
    for w, D in (("dWq", "dQ"), ("dWk", "dK"), ("dWv", "dV")):
        np.testing.assert_allclose(g[w], Xf.T @ g[D].reshape(-1, g[D].shape[-1]), rtol=1e-12)
    np.testing.assert_allclose(g["dWo"], cache["C"].reshape(-1, 4).T @ dY.reshape(-1, 3), rtol=1e-12)
    np.testing.assert_allclose(g["dC"], dY @ Wo.T, rtol=1e-12)
    np.testing.assert_allclose(g["dX"], g["dQ"] @ Wq.T + g["dK"] @ Wk.T + g["dV"] @ Wv.T, rtol=1e-12)


def test_torch_inputs_stay_torch():
    X, Wq, Wk, Wv, Wo, dY = _mha_problem((), 4, 2, 2, 9)
    Y, cache = mha_forward(X, Wq, Wk, Wv, Wo, 2)
    g = mha_backward(dY, cache)
    tY, tcache = mha_forward(*(torch.tensor(a) for a in (X, Wq, Wk, Wv, Wo)), n_heads=2)
    tg = mha_backward(torch.tensor(dY), tcache)
    assert isinstance(tY, torch.Tensor) and tY.dtype == torch.float64
    np.testing.assert_allclose(tY.numpy(), Y, rtol=1e-12)
    for k in g:
        assert isinstance(tg[k], torch.Tensor)
        np.testing.assert_allclose(tg[k].numpy(), g[k], rtol=1e-10, atol=1e-14)


# --------------------------------------------------------------------------- bad input


def test_attention_rejects_bad_shapes_and_dtypes():
    Q = np.zeros((3, 2))
    with pytest.raises(AttentionShapeError, match=r"K must have Q's head width d_h = 2"):
        attention_forward(Q, np.zeros((3, 4)), np.zeros((3, 2)))
    with pytest.raises(AttentionShapeError, match="V must have one row per key"):
        attention_forward(Q, Q, np.zeros((2, 2)))
    with pytest.raises(AttentionShapeError, match="leading"):
        attention_forward(np.zeros((2, 3, 2)), np.zeros((3, 3, 2)), np.zeros((3, 3, 2)))
    with pytest.raises(AttentionShapeError, match="at least 2 dimensions"):
        attention_forward(np.zeros(2), np.zeros(2), np.zeros(2))
    with pytest.raises(AttentionShapeError, match="causal mask needs as many queries as keys"):
        attention_forward(np.zeros((2, 2)), Q, Q)
    with pytest.raises(AttentionDtypeError, match="Q must be floating point"):
        attention_forward(np.zeros((3, 2), dtype=int), Q, Q)
    with pytest.raises(AttentionDtypeError, match="mixed NumPy arrays and torch tensors"):
        attention_forward(Q, torch.zeros(3, 2, dtype=torch.float64), Q)
    with pytest.raises(AttentionDtypeError, match="share one dtype"):
        attention_forward(Q, Q.astype(np.float32), Q)
    with pytest.raises(AttentionDtypeError, match="NumPy array or a torch tensor"):
        attention_forward([[0.0, 0.0]], Q, Q)


def test_attention_rejects_bad_masks_and_upstream_gradients():
    Q = np.zeros((3, 2))
    with pytest.raises(AttentionDtypeError, match="mask must be a boolean array"):
        attention_forward(Q, Q, Q, mask=np.ones((3, 3)))
    with pytest.raises(AttentionShapeError, match=r"mask must have shape \(Tq, Tk\) = \(3, 3\)"):
        attention_forward(Q, Q, Q, mask=np.ones((3, 2), dtype=bool))
    with pytest.raises(AttentionShapeError, match="mask's leading shape"):
        attention_forward(Q, Q, Q, mask=np.ones((2, 3, 3), dtype=bool))
    _, cache = attention_forward(Q, Q, Q)
    with pytest.raises(AttentionShapeError, match=r"dC must have the shape of C, \(\.\.\., T, d_v\) = \(3, 2\), got \(2, 3\)"):
        attention_backward(np.zeros((2, 3)), cache)


def test_mha_rejects_bad_weights():
    X, Wq, Wk, Wv, Wo, dY = _mha_problem((), 3, 2, 2, 0)
    with pytest.raises(AttentionShapeError, match=r"Wq must have d = 4 rows.*transposed"):
        mha_forward(X, np.zeros((3, 4)), Wk, Wv, Wo, 2)  # out × in, as nn.Linear stores it
    with pytest.raises(AttentionShapeError, match="Wk must have Wq's shape"):
        mha_forward(X, Wq, np.zeros((4, 2)), Wv, Wo, 2)
    with pytest.raises(AttentionShapeError, match="divisible by n_heads = 3"):
        mha_forward(X, Wq, Wk, Wv, Wo, 3)
    with pytest.raises(AttentionShapeError, match="Wo must have 4 rows"):
        mha_forward(X, Wq, Wk, Wv, np.zeros((3, 3)), 2)
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        mha_forward(X, Wq, Wk, Wv, Wo, 0)
    _, cache = mha_forward(X, Wq, Wk, Wv, Wo, 2)
    with pytest.raises(AttentionShapeError, match="dY must have the shape of Y"):
        mha_backward(dY[:, :2], cache)
