"""Lesson 08 ("Attention backward"): graded items score right answers fully, typical wrong answers less, with
the diagnostics a student needs; the notebook's test cells agree with the item registry."""

import json
import math
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from coursekit import attention as att
from coursekit.grading import check
from coursekit.grading.lessons import lesson08
from coursekit.grading.lessons.lesson08 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "08-attention-backward" / "08-attention-backward.ipynb"


# --------------------------------------------------------------------------- student-style implementations


def softmax_backward(P, dP):
    """The softmax step in the usual queries × keys layout (what P2 and P10 need inside)."""
    return P * (dP - (dP * P).sum(axis=-1, keepdims=True))


def _T(M):
    return np.swapaxes(M, -1, -2)


def softmax_backward_kq(Pt, dPt):
    """Right for P1: keys × queries, so each query's sum runs over axis -2."""
    return Pt * (dPt - (dPt * Pt).sum(axis=-2, keepdims=True))


def softmax_backward_kq_via_transpose(Pt, dPt):
    """Right too: back to queries × keys, the formula of Know this, and back."""
    return _T(softmax_backward(_T(Pt), _T(dPt)))


def softmax_backward_torch(Pt, dPt):
    """Right, via autograd: returns a torch tensor (the checker accepts tensors)."""
    S = torch.log(torch.tensor(_T(Pt))).requires_grad_()  # softmax(log P) = P on each row (−inf where P = 0)
    torch.softmax(S, dim=-1).backward(torch.tensor(_T(dPt)))
    return torch.nan_to_num(S.grad, nan=0.0).transpose(-1, -2)


def softmax_backward_loop(Pt, dPt):
    """Right, query by query (a column of Pt) with the explicit Jacobian diag(p) − p pᵀ."""
    out = np.zeros_like(Pt)
    for idx in np.ndindex(Pt.shape[:-2]):
        for t in range(Pt.shape[-1]):
            p = Pt[idx][:, t]
            out[idx][:, t] = (np.diag(p) - np.outer(p, p)) @ dPt[idx][:, t]
    return out


def attention_backward(dC, Q, K, V, P):
    """Right for P2, any leading (batch, head) axes."""
    scale = 1 / math.sqrt(Q.shape[-1])
    dS = softmax_backward(P, dC @ _T(V))
    return dS @ K * scale, _T(dS) @ Q * scale, _T(P) @ dC


def _bwd(sm=softmax_backward, scale=lambda dh: 1 / math.sqrt(dh), dK_T=True, dV_T=True):
    def fn(dC, Q, K, V, P):
        c = scale(Q.shape[-1])
        dS = sm(P, dC @ _T(V))
        dK = (_T(dS) if dK_T else dS) @ Q * c
        return dS @ K * c, dK, (_T(P) if dV_T else P) @ dC
    return fn


def _bwd_sqrt_dv(dC, Q, K, V, P):
    c = 1 / math.sqrt(V.shape[-1])  # the value width where the key width belongs
    dS = softmax_backward(P, dC @ _T(V))
    return dS @ K * c, _T(dS) @ Q * c, _T(P) @ dC


def _bwd_dot_T(dC, Q, K, V, P):
    """Know this's five lines copied: .T reverses every axis of a stack of heads."""
    scale = 1 / math.sqrt(Q.shape[-1])
    dS = softmax_backward(P, dC @ V.T)
    return dS @ K * scale, dS.T @ Q * scale, P.T @ dC


# The public answers, computed here: the reference calls coursekit's softmax_backward, withheld while the
# student's function runs.
PUBLIC_P1 = [(c.kwargs["Pt"].copy(), c.kwargs["dPt"].copy(), lesson08.softmax_backward_kq(**c.kwargs)) for c in lesson08._p1_public()]


def hard_coded_softmax(Pt, dPt):
    for Pt_public, dPt_public, answer in PUBLIC_P1:
        if Pt_public.shape == Pt.shape and np.allclose(Pt_public, Pt) and np.allclose(dPt_public, dPt):
            return answer
    return np.zeros_like(Pt)


def gqa_backward(dC, Q, K, V, P):
    """Right: per query head with P2's function, each KV head summing the heads that read it."""
    n_rep = Q.shape[0] // K.shape[0]
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for h in range(Q.shape[0]):
        dq, dk, dv = attention_backward(dC[h], Q[h], K[h // n_rep], V[h // n_rep], P[h])
        dQ[h], dK[h // n_rep], dV[h // n_rep] = dq, dK[h // n_rep] + dk, dV[h // n_rep] + dv
    return dQ, dK, dV


def gqa_backward_torch(dC, Q, K, V, P):
    """Right, by autograd through transformers' repeat layout (P is not needed)."""
    n_rep = Q.shape[0] // K.shape[0]
    Qt, Kt, Vt = (torch.tensor(a, requires_grad=True) for a in (Q, K, V))
    C = torch.nn.functional.scaled_dot_product_attention(Qt, Kt.repeat_interleave(n_rep, 0), Vt.repeat_interleave(n_rep, 0),
                                                         is_causal=True)
    C.backward(torch.tensor(dC))
    return Qt.grad, Kt.grad, Vt.grad


def _gqa_wrong(kind):
    def fn(dC, Q, K, V, P):
        H, n_kv = Q.shape[0], K.shape[0]
        n_rep = H // n_kv
        parts = [attention_backward(dC[h], Q[h], K[h // n_rep], V[h // n_rep], P[h]) for h in range(H)]
        dQ = np.stack([p[0] for p in parts])
        dKr, dVr = np.stack([p[1] for p in parts]), np.stack([p[2] for p in parts])
        if kind == "not summed":
            return dQ, dKr, dVr
        if kind == "mean":
            return dQ, dKr.reshape(n_kv, n_rep, *dKr.shape[1:]).mean(1), dVr.reshape(n_kv, n_rep, *dVr.shape[1:]).mean(1)
        if kind == "interleaved":  # the wrong sharing: K[h % n_kv] in the forward as well
            parts = [attention_backward(dC[h], Q[h], K[h % n_kv], V[h % n_kv], P[h]) for h in range(H)]
            dK, dV = np.zeros_like(K), np.zeros_like(V)
            for h, (_, dk, dv) in enumerate(parts):
                dK[h % n_kv] += dk
                dV[h % n_kv] += dv
            return np.stack([p[0] for p in parts]), dK, dV
        return dQ, dKr[::n_rep], dVr[::n_rep]  # first only
    return fn


RIGHT = {"w1": "b", "w2": "a", "w3": "d", "p1": softmax_backward_kq, "p2": attention_backward, "p3": 10, "p4": "a",
         "p5": {"a", "b"}, "p6": lesson08._p6_expected(), "p7": "c", "p10": gqa_backward, "p11": None}


def rope_backward(dy, cos, sin):
    """A student's closed form: the rotation by −θ, with their own rotate_half."""
    h = dy.shape[-1] // 2
    return dy * cos - np.concatenate((-dy[..., h:], dy[..., :h]), axis=-1) * sin


def rope_backward_matrices(dy, cos, sin):
    """Another right answer: build each R_t as a matrix from the forward and multiply by its transpose."""
    d = dy.shape[-1]
    h = d // 2
    eye = np.eye(d)
    rot = lambda x: x * cos + np.concatenate((-x[..., h:], x[..., :h]), axis=-1) * sin
    R = np.transpose(rot(np.broadcast_to(eye[:, None, :], (d, cos.shape[0], d))), (1, 2, 0))
    return np.einsum("tji,...tj->...ti", R, dy)


RIGHT["p11"] = rope_backward


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def _nbgrader_cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]


def test_notebook_p6_case_is_the_graded_one():
    """The P6 arrays printed in the notebook are the ones the item grades against."""
    nb, _ = _nbgrader_cells()
    src = next(c.source for c in nb.cells if c.source.startswith("# The P6 case."))
    ns = {"np": np}
    exec(src, ns)
    for name in ("X", "A", "B", "R", "dQ_rot", "dK_rot", "dC"):
        np.testing.assert_array_equal(ns[f"{name}_p6"], lesson08.P6_CASE[name], err_msg=name)
    assert ns["s_p6"] == lesson08.P6_CASE["s"]


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"08.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


@pytest.mark.parametrize("fn", [softmax_backward_loop, softmax_backward_torch, softmax_backward_kq_via_transpose])
def test_other_correct_softmax_backwards_score_full(fn):
    fb = check("08.p1", fn, hidden=True)
    assert fb.full, fb.text()


def test_references_agree_with_coursekit_and_torch():
    for case in lesson08._p2_public() + list(lesson08._p2_hidden(np.random.default_rng(0))):
        kw = case.kwargs
        mask = kw["P"] > 0
        _, cache = att.attention_forward(kw["Q"], kw["K"], kw["V"], mask=mask)
        np.testing.assert_allclose(cache["P"], kw["P"], rtol=1e-12, atol=1e-15)
        for mine, ref in zip(lesson08.attention_backward(**kw), att.attention_backward(kw["dC"], cache)):
            np.testing.assert_allclose(mine, ref, rtol=1e-12, atol=1e-15)


def test_hidden_cases_are_deterministic_and_cover_shapes_masks_and_one_token():
    a = check("08.p1", softmax_backward_kq, hidden=True).text()
    assert a == check("08.p1", softmax_backward_kq, hidden=True).text() and a.count("hidden case") == 6
    cases = lesson08._p1_hidden(np.random.default_rng(0))
    shapes = {c.kwargs["Pt"].shape for c in cases}
    assert len({s[:-2] for s in shapes}) >= 3                      # different leading (batch/head) dims
    assert any(s[-1] == 2 for s in shapes)                         # the smallest nontrivial head
    # a fully masked key (the causal mask alone always leaves P[u, u] > 0): a zero row of Pt
    assert any(np.any(np.all(c.kwargs["Pt"] == 0, axis=-1)) for c in cases)
    p2 = lesson08._p2_public() + list(lesson08._p2_hidden(np.random.default_rng(0)))
    assert all(c.kwargs["Q"].shape[-1] >= 2 for c in p2)           # a missing 1/√d_h always shows
    assert any(c.kwargs["Q"].shape[-2] == 1 for c in p2)            # T = 1: dQ = dK = 0, dV = dC
    assert sum(c.kwargs["Q"].ndim > 2 for c in p2) >= 6             # heads stacked on leading axes
    assert any(c.kwargs["Q"].ndim == 2 for c in p2)                 # and the single head


def test_hidden_cases_defeat_a_hard_coded_answer():
    assert check("08.p1", hard_coded_softmax, hidden=False).full
    fb = check("08.p1", hard_coded_softmax, hidden=True)
    assert fb.points == pytest.approx(4 * 4 / 10) and "hidden case" in fb.text()


# --------------------------------------------------------------------------- wrong answers: p1


@pytest.mark.parametrize(
    "fn, text",
    [
        (lambda Pt, dPt: Pt * dPt, "forgot to subtract the sum over each query's keys"),
        # Know this's line copied as it stands: in this layout axis -1 runs over the queries
        (lambda Pt, dPt: Pt * (dPt - (dPt * Pt).sum(axis=-1, keepdims=True)), "summed over the wrong axis"),
        (lambda Pt, dPt: Pt * (dPt - (dPt * Pt).sum()), "over every entry"),
        (lambda Pt, dPt: softmax_backward(Pt, dPt), "summed over the wrong axis"),
        (lambda Pt, dPt: softmax_backward(_T(Pt), _T(dPt)), "queries × keys layout"),
        (lambda Pt, dPt: Pt * ((dPt * Pt).sum(-2, keepdims=True) - dPt), "sign is flipped"),
        (lambda Pt, dPt: dPt - (dPt * Pt).sum(-2, keepdims=True), "factor Pᵀ in front is missing"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_softmax_backward_mistakes_are_named(fn, text, hidden):
    fb = check("08.p1", fn, hidden=hidden)
    assert fb.points < 4 * 0.3, fb.text()
    assert text in fb.text() and "Reread" in fb.text(), fb.text()


def test_copy_without_keepdims_is_named():
    fb = check("08.p1", lambda Pt, dPt: Pt * (dPt - (dPt * Pt).sum(axis=-1)))
    assert fb.points == 0, fb.text()
    assert "dropped the axis" in fb.text() and "keepdims=True" in fb.text()


def test_softmax_backward_stub_and_not_a_function():
    def stub(Pt, dPt):
        raise NotImplementedError()

    assert "NotImplementedError" in check("08.p1", stub).text()
    assert check("08.p1", "softmax_backward_kq").points == 0


def test_float32_answer_gets_the_precision_hint():
    fb = check("08.p1", lambda Pt, dPt: softmax_backward_kq(Pt.astype(np.float32), dPt.astype(np.float32)))
    assert fb.points < 4 and "float32" in fb.text()


# --------------------------------------------------------------------------- wrong answers: p2


@pytest.mark.parametrize(
    "fn, text",
    [
        (_bwd(scale=lambda dh: 1.0), "missing the factor 1/√d_h"),
        (_bwd(scale=lambda dh: 1 / dh), "you divided by d_h"),
        (_bwd(scale=lambda dh: math.sqrt(dh)), "multiplied by √d_h"),
        (_bwd(dK_T=False), "dK needs dSᵀ"),
        (_bwd(dV_T=False), "dV = Pᵀ dC"),
        (_bwd(sm=lambda P, dP: P * dP), "dQ is off because dS is wrong (check the softmax step, P1): you forgot to subtract the row sum"),
        # P1's function called without transposing back: dS comes out transposed, which is dQ = dSᵀ K / √d_h
        (_bwd(sm=lambda P, dP: softmax_backward_kq(_T(P), _T(dP))), "dQ uses dS itself, not dSᵀ"),
        (_bwd(sm=lambda P, dP: dP), "you used dP where dS belongs"),
        (_bwd_sqrt_dv, "you divided by √d_v, the width of the values"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_attention_backward_mistakes_are_named(fn, text, hidden):
    fb = check("08.p2", fn, hidden=hidden)
    assert fb.points < 4 * (0.5 if fn is _bwd_sqrt_dv else 0.3), fb.text()  # right where d_v = d_h
    assert text in fb.text(), fb.text()


def test_copying_the_single_head_lines_fails_on_stacked_heads():
    fb = check("08.p2", _bwd_dot_T)
    assert 0 < fb.points < 4 * 0.5, fb.text()    # right on the single head only
    assert "public case 1" in fb.text() and "public case 2" in fb.text()


def test_attention_backward_wrong_arity_is_explained():
    fb = check("08.p2", lambda dC, Q, K, V, P: attention_backward(dC, Q, K, V, P)[:2])
    assert fb.points == 0 and "should return 3 values (dQ, dK, dV)" in fb.text()


# --------------------------------------------------------------------------- choices, numbers, arrays


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "T × d_h is the shape of Q"),
        ("w1", "d", "T × d_v"),
        ("w2", "b", "look at the future"),
        ("w2", "c", "keeps the diagonal"),
        ("w3", "a", "leaves its softmax unchanged"),
        ("w3", "b", "with or without the subtraction"),
        ("p4", "b", "Added to a column, it reaches row t's sum only as c·P[t, 2]"),
        ("p4", "c", "rowsum(dP ⊙ P) changes too"),
        ("p4", "d", "In rows 0 and 1 key 2 is masked"),
        ("p7", "a", "removes a constant from each row"),
        ("p7", "b", "dV = Pᵀ dC is not zero"),
        ("p7", "d", "Nothing reaches the queries"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"08.{item_id}", answer)
    assert fb.points == 0 and text in fb.text() and "Reread" in fb.text(), fb.text()


def test_p7s_key_a_repeated_token_trains_only_the_v_and_o_adapters():
    """P7's key (c) measured with autograd: one causal layer with RoPE, T = 8, every row of X the same vector (one token
    repeated), trained adapters (A, B ≠ 0) on q, k, v and o: the q and k adapters' gradients are zero up to rounding, the
    v and o adapters' are not. The same layer on eight different rows trains all four, so the repetition, not the
    layer, is what stops the q and k adapters."""
    from coursekit import rope

    def adapter_grads(repeated: bool) -> dict:
        gen = torch.Generator().manual_seed(7)
        d, H, T = 8, 2, 8
        rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
        X = rnd(1, d).expand(T, d) if repeated else rnd(T, d)
        dY = rnd(T, d)
        W = {n: rnd(d, d) / math.sqrt(d) for n in "qkvo"}
        ad = {n: (rnd(d, 2).requires_grad_(), rnd(2, d).requires_grad_()) for n in "qkvo"}
        proj = lambda n, x: x @ W[n] + 2.0 * (x @ ad[n][0]) @ ad[n][1]
        heads = lambda Z: Z.reshape(T, H, d // H).transpose(0, 1)
        cos, sin = (torch.from_numpy(t) for t in rope.rope_cos_sin(T, d // H, 10_000.0))
        rot = lambda Z: Z * cos + torch.cat((-Z[..., d // H // 2:], Z[..., : d // H // 2]), -1) * sin
        C = torch.nn.functional.scaled_dot_product_attention(rot(heads(proj("q", X))), rot(heads(proj("k", X))),
                                                             heads(proj("v", X)), is_causal=True)
        proj("o", C.transpose(0, 1).reshape(T, d)).backward(dY)
        return {n: max(float(t.grad.abs().max()) for t in ad[n]) for n in "qkvo"}

    rep = adapter_grads(repeated=True)
    assert min(rep["v"], rep["o"]) > 1e-2, rep
    assert max(rep["q"], rep["k"]) < 1e-12 * max(rep["v"], rep["o"]), rep     # zero up to rounding
    trained = {n for n, g in rep.items() if g > 1e-9 * max(rep.values())}
    assert trained == {"v", "o"}
    distinct = adapter_grads(repeated=False)
    assert min(distinct.values()) > 1e-3, distinct                           # all four learn from distinct tokens
    keys = json.loads((ROOT / "autograder" / "keys" / "08.json").read_text())["keys"]
    assert keys["p7"] == RIGHT["p7"] == "c"


def test_p4s_key_a_constant_on_column_2_of_dP_changes_the_rows_that_see_key_2():
    """P4's key (a) measured: one causal head, T = 6, random scores, c added to every entry of column 2 of dP (masked
    entries included). dS changes in every entry that queries 2 to 5 see and nowhere else. Each distractor is the
    mistaken computation run: b treats the column like a row (nothing changes), c leaves rowsum(dP ⊙ P) as it was
    (only column 2 changes), d lets every row's rowsum rise by c, as for a row (rows 0 and 1 change too)."""
    rng = np.random.default_rng(4)
    T, u = 6, 2
    allowed = att.causal_mask(T)
    for trial in range(5):
        _, cache = att.attention_forward(*(rng.standard_normal((T, 5)) for _ in range(3)))
        P, dP = cache["P"], rng.standard_normal((T, T))
        dS = att.softmax_backward(P, dP)
        rowsum = (dP * P).sum(-1, keepdims=True)
        for c in (1.0, -3.5, 1e3):
            shifted = dP.copy()
            shifted[:, u] += c
            tol = 1e-12 * max(1.0, abs(c))
            changed = np.abs(att.softmax_backward(P, shifted) - dS) > tol
            key = allowed & (np.arange(T)[:, None] >= u)                  # rows 2 to 5, entries their query sees
            assert np.array_equal(changed, key), (trial, c, changed.astype(int))
            # c: rowsum(dP ⊙ P) kept as it was: only column 2 of rows 2 to 5 changes
            col_only = np.abs(P * (shifted - rowsum) - dS) > tol
            assert np.array_equal(col_only, key & (np.arange(T)[None, :] == u)) and not np.array_equal(col_only, changed)
            # d: every row's rowsum raised by c, as for a row: rows 0 and 1 change too
            as_row = np.abs(P * (shifted - rowsum - c) - dS) > tol
            assert as_row[0].any() and as_row[1].any() and not changed[:2].any()
            # b: nothing changes, as after a constant added to a row (which does cancel)
            row_shift = dP.copy()
            row_shift[3] += c
            assert np.abs(att.softmax_backward(P, row_shift) - dS).max() < tol and changed.any()
    keys = json.loads((ROOT / "autograder" / "keys" / "08.json").read_text())["keys"]
    assert keys["p4"] == RIGHT["p4"] == "a"


def test_multi_choice_partial_credit_and_hints():
    fb = check("08.p5", {"a", "b", "e"})
    assert fb.points == pytest.approx(1.0)
    assert "value u now receives gradient from queries t < u" in fb.text()
    fb = check("08.p5", {"a"})
    assert fb.points == pytest.approx(1.0) and "missing" in fb.text()
    fb = check("08.p5", {"c", "d"})
    assert fb.points == 0 and "flattens each row of P" in fb.text()


def test_p5s_key_measured_dv_under_each_change():
    """P5's key ({a, b}) measured: one causal head, T = 5, and dV = Pᵀ dC recomputed after each change of the forward:
    exactly equal after a and b, different after c, d and e."""
    rng = np.random.default_rng(5)
    T, d_h = 5, 4
    Q, K, V, dC = (rng.standard_normal((T, d_h)) for _ in range(4))
    causal = att.causal_mask(T)
    padded = causal.copy()
    padded[:, 2] = False

    def dV(Q=Q, K=K, V=V, scale=1 / math.sqrt(d_h), mask=causal):
        S = np.where(mask, Q @ K.T * scale, -np.inf)
        P = np.exp(S - S.max(-1, keepdims=True))
        P /= P.sum(-1, keepdims=True)
        return P.T @ dC

    ref = dV()
    np.testing.assert_allclose(ref, att.attention_backward(dC, att.attention_forward(Q, K, V)[1])[2], rtol=1e-12)
    changed = {"a": dV(Q=-Q, K=-K), "b": dV(V=10 * V), "c": dV(scale=1 / d_h), "d": dV(mask=padded),
               "e": dV(mask=np.ones((T, T), dtype=bool))}
    same = {k for k, v in changed.items() if np.array_equal(v, ref)}
    assert same == {"a", "b"} == RIGHT["p5"]
    assert all(np.abs(changed[k] - ref).max() > 1e-3 for k in "cde")
    keys = json.loads((ROOT / "autograder" / "keys" / "08.json").read_text())["keys"]
    assert set(keys["p5"]) == RIGHT["p5"]


@pytest.mark.parametrize(
    "answer, text",
    [
        (9, "a softmax over one entry is the constant 1"),
        (6, "the padding keys' rows of dK and dV only"),
        (7, "not NaN"),
        (4, "dQ's zero rows only"),
        (11, "key 3's row of dK is not zero"),
        (512 * 511 // 2 + 509, "not right (tolerance"),
    ],
)
def test_p3_mistakes_are_recognised(answer, text):
    fb = check("08.p3", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def _p3_head(seed):
    """A causal head of T = 512 with keys 0, 1, 2 padded, random Q, K, V and dC: (P, dQ, dK, dV)."""
    T = 512
    rng = np.random.default_rng(seed)
    keep = np.ones((T, T), dtype=bool)
    keep[:, :lesson08.P3_PAD] = False
    _, cache = att.attention_forward(*(rng.standard_normal((T, 8)) for _ in range(3)), mask=keep)
    return (cache["P"],) + tuple(att.attention_backward(rng.standard_normal((T, 8)), cache))


def _zero_rows(M):
    return {int(i) for i in np.flatnonzero(np.all(M == 0.0, axis=-1))}


@pytest.mark.parametrize("seed", range(3))
def test_p3_key_is_the_count_of_zero_rows_of_a_real_padded_head(seed):
    """P3's key measured: in a causal head of T = 512 with keys 0, 1, 2 padded, the rows of dQ, dK and dV that are
    exactly 0 are dQ's 0 to 3 (no visible key, then a single one) and dK's and dV's 0 to 2, ten in all; no other entry of
    them is zero. Each named mistake leaves out (or adds) one of these kinds of row, measured here."""
    P, dQ, dK, dV = _p3_head(seed)
    rows = {"dQ": _zero_rows(dQ), "dK": _zero_rows(dK), "dV": _zero_rows(dV)}
    assert rows == {"dQ": {0, 1, 2, 3}, "dK": {0, 1, 2}, "dV": {0, 1, 2}}
    assert sum((M == 0.0).sum() for M in (dQ, dK, dV)) == 10 * dQ.shape[-1]      # no stray zero entry elsewhere
    n = sum(len(r) for r in rows.values())
    assert n == ITEMS["p3"].expected() == RIGHT["p3"] == 10 and check("08.p3", n).points == ITEMS["p3"].points
    empty = _zero_rows(P)                                      # queries with no visible key
    single = {int(t) for t in np.flatnonzero((P > 0).sum(axis=-1) == 1)}
    assert empty == {0, 1, 2} and single == {3}
    named = {m.label: m.value for m in lesson08._p3_mistakes()}
    assert named["one key"] == len(rows["dQ"] - single) + len(rows["dK"]) + len(rows["dV"])
    assert named["empty rows"] == len(rows["dQ"] - empty) + len(rows["dK"]) + len(rows["dV"])
    assert named["padding keys only"] == len(rows["dK"]) + len(rows["dV"])
    assert named["dQ only"] == len(rows["dQ"])
    assert named["key 3"] == n + 1 and np.abs(dK[3]).max() > 0


def _p6_grad_A(D, s=None):
    c = lesson08.P6_CASE
    return (c["s"] if s is None else s) * c["X"].T @ D @ c["B"].T


def _p6_back(dy, R=None):
    """R_tᵀ dy_t at every position, one 2 × 2 product at a time (a student's loop)."""
    R = lesson08.P6_CASE["R"] if R is None else R
    return np.stack([R[t].T @ dy[t] for t in range(len(dy))])


@pytest.mark.parametrize(
    "label, answer, text",
    [
        ("no rotation", lambda c: _p6_grad_A(c["dQ_rot"]), "rotated back first"),
        ("forward rotation", lambda c: _p6_grad_A(np.stack([c["R"][t] @ c["dQ_rot"][t] for t in range(3)])),
         "the transpose, D_t = R_tᵀ dQ_rot_t"),
        ("dC", lambda c: _p6_grad_A(c["dC"]), "you used dC"),
        ("dK", lambda c: _p6_grad_A(_p6_back(c["dK_rot"])), "belongs to k_proj"),
        ("dK unrotated", lambda c: _p6_grad_A(c["dK_rot"]), "belongs to k_proj"),
        ("missing s", lambda c: _p6_grad_A(_p6_back(c["dQ_rot"]), s=1.0), "scale s = 2 is missing"),
    ],
)
def test_p6_mistakes_are_recognised(label, answer, text):
    fb = check("08.p6", answer(lesson08.P6_CASE))
    assert fb.points < ITEMS["p6"].points and text in fb.text() and label in fb.mistakes, fb.text()


def test_p6_transposed_answer_is_named():
    fb = check("08.p6", lesson08._p6_expected().T)
    assert fb.points == 0 and "shape of Aᵀ" in fb.text()


def test_p6_rotations_are_ropes_and_the_key_is_autograds():
    """P6's R_t are RoPE's rotations at positions 0, 1, 2 for d_h = 2 (coursekit.rope, any base: the one frequency is 1), and
    its key is what autograd gives A through transformers' apply_rotary_pos_emb: the key is measured, not typed."""
    from transformers.models.llama import modeling_llama

    from coursekit import rope

    c = lesson08.P6_CASE
    cos, sin = rope.rope_cos_sin(3, 2, 100_000.0)
    q = np.random.default_rng(6).standard_normal((3, 2))
    np.testing.assert_allclose(np.einsum("tij,tj->ti", c["R"], q), rope.rope_forward(q, cos, sin), rtol=0, atol=1e-15)

    W = torch.tensor(np.random.default_rng(7).standard_normal((3, 2)))          # any base weight: it does not enter ∇A
    X, B = torch.tensor(c["X"]), torch.tensor(c["B"])
    A = torch.tensor(c["A"], requires_grad=True)
    Q = X @ W + c["s"] * (X @ A) @ B                                             # q_proj with its adapter, T × d_h
    K = torch.zeros_like(Q)
    cos_t, sin_t = torch.tensor(cos)[None], torch.tensor(sin)[None]
    Q_rot, _ = modeling_llama.apply_rotary_pos_emb(Q[None, None], K[None, None], cos_t, sin_t)
    Q_rot[0, 0].backward(torch.tensor(c["dQ_rot"]))
    np.testing.assert_allclose(lesson08._p6_expected(), A.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lesson08._p6_expected(), _p6_grad_A(_p6_back(c["dQ_rot"])), rtol=1e-12)
    assert check("08.p6", A.grad.numpy()).full


# --------------------------------------------------------------------------- p10: grouped-query attention


def test_p10_reference_agrees_with_autograd_and_coursekit():
    for case in lesson08._p10_public() + list(lesson08._p10_hidden(np.random.default_rng(1))):
        for mine, ref in zip(lesson08.gqa_backward(**case.kwargs), gqa_backward_torch(**case.kwargs)):
            np.testing.assert_allclose(mine, ref.numpy(), rtol=1e-10, atol=1e-12)
    assert check("08.p10", gqa_backward_torch, hidden=True).full


def test_p10_cases_cover_smollm2s_grouping_and_several_group_sizes():
    cases = lesson08._p10_public() + list(lesson08._p10_hidden(np.random.default_rng(0)))
    groups = {(c.kwargs["Q"].shape[0], c.kwargs["K"].shape[0]) for c in cases}
    assert (9, 3) in groups and len({h // kv for h, kv in groups}) >= 3 and any(kv > 1 for _, kv in groups)


@pytest.mark.parametrize("kind, says", [
    ("not summed", "collects the sum of their gradients"),
    ("mean", "not their mean"),
    ("interleaved", "h // n_rep"),
    ("first only", "only the first query head of each group"),
])
@pytest.mark.parametrize("hidden", [False, True])
def test_p10_mistakes_are_named(kind, says, hidden):
    fb = check("08.p10", _gqa_wrong(kind), hidden=hidden)
    assert not fb.full and says in fb.text(), fb.text()


def _gqa_on(head_backward):
    """A gqa_backward that sums the right groups but is built on ``head_backward``, one head's (dQ, dK, dV)."""
    def fn(dC, Q, K, V, P):
        n_kv = K.shape[0]
        n_rep = Q.shape[0] // n_kv
        parts = [head_backward(dC[h], Q[h], K[h // n_rep], V[h // n_rep], P[h]) for h in range(Q.shape[0])]
        dKr, dVr = np.stack([p[1] for p in parts]), np.stack([p[2] for p in parts])
        return (np.stack([p[0] for p in parts]), dKr.reshape(n_kv, n_rep, *dKr.shape[1:]).sum(1),
                dVr.reshape(n_kv, n_rep, *dVr.shape[1:]).sum(1))
    return fn


def _head_with(softmax_step=None, scale=True, divide=None, transpose_dQ=False, dQ_sign=1.0):
    def head(dC, Q, K, V, P):
        dP = dC @ V.T
        dS = softmax_step(P, dP) if softmax_step else P * (dP - (dP * P).sum(-1, keepdims=True))
        c = 1 / np.sqrt(Q.shape[-1]) if scale else 1.0 / (divide(Q) if divide else 1.0)
        return dQ_sign * (dS.T if transpose_dQ else dS) @ K * c, dS.T @ Q * c, P.T @ dC
    return head


ONE = "same slip as in one head (P2's attention_backward): "


@pytest.mark.parametrize("head, label, says", [
    (_head_with(scale=False), "no scale", ONE + "dQ is missing the factor 1/√d_h"),
    (_head_with(lambda P, dP: P * dP), "no rowsum", ONE + "dQ is off because dS is wrong (check the softmax step, P1): "
                                                    "you forgot to subtract the row sum"),
    (_head_with(lambda P, dP: P * (dP - (dP * P).sum(-2, keepdims=True))), "column sums",
     ONE + "dQ is off because dS is wrong (check the softmax step, P1): you summed over the wrong axis"),
    (_head_with(scale=False, divide=lambda Q: Q.shape[-1]), "1/d_h", ONE + "you divided by d_h"),
    (_head_with(transpose_dQ=True), "dS transposed", ONE + "dQ uses dS itself, not dSᵀ"),
])
@pytest.mark.parametrize("hidden", [False, True])
def test_p10_names_the_one_head_mistake_it_inherits(head, label, says, hidden):
    """A gqa_backward whose grouping is right but whose single-head step is wrong (it calls the student's own
    attention_backward or softmax_backward, or repeats their slip) is told which one, not only that dQ is off."""
    fb = check("08.p10", _gqa_on(head), hidden=hidden)
    assert not fb.full and says in fb.text(), fb.text()
    assert fb.mistakes == [label], fb.mistakes
    assert check("08.p10", _gqa_on(_head_with()), hidden=hidden).full  # the helper itself is right


@pytest.mark.parametrize("hidden", [False, True])
def test_p10_a_slip_in_dq_alone_is_not_blamed_on_ds(hidden):
    """dQ and dK both come from dS: a sign slip in dQ alone, with dK right, equals the value of a wrong dS ("sign") on
    dQ, but dS was right, and the feedback must not send the student to softmax_backward."""
    fb = check("08.p10", _gqa_on(_head_with(dQ_sign=-1.0)), hidden=hidden)
    assert not fb.full and "sign" not in fb.mistakes and "dS is wrong" not in fb.text(), fb.text()
    fb2 = check("08.p2", lambda dC, Q, K, V, P: _head_with(dQ_sign=-1.0)(dC, Q, K, V, P), hidden=hidden)
    assert not fb2.full and "sign" not in fb2.mistakes and "dS is wrong" not in fb2.text(), fb2.text()


# --------------------------------------------------------------------------- p11: RoPE's backward


def test_p11_reference_is_the_vjp_of_transformers_rotary_code():
    """The reference equals autograd through transformers' apply_rotary_pos_emb, on every public and hidden case."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    for case in lesson08._p11_public() + list(lesson08._p11_hidden(np.random.default_rng(3))):
        kw = case.kwargs
        x = torch.zeros(kw["dy"].shape, dtype=torch.float64, requires_grad=True)
        cos, sin = torch.from_numpy(kw["cos"]), torch.from_numpy(kw["sin"])
        y, _ = apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)
        y.backward(torch.from_numpy(kw["dy"]).expand(y.shape))
        np.testing.assert_allclose(lesson08.rope_backward(**kw), x.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_p11_other_right_answers_score_full():
    assert check("08.p11", rope_backward_matrices, hidden=True).full


def test_p11_hidden_cases_use_positions_beyond_zero_and_real_head_widths():
    cases = list(lesson08._p11_hidden(np.random.default_rng(0)))
    assert any(c.kwargs["dy"].shape[-1] == 64 for c in cases)
    assert any(not np.allclose(c.kwargs["cos"][0], 1.0) for c in cases)   # a window that does not start at position 0


@pytest.mark.parametrize("answer, says", [
    (lambda dy, cos, sin: dy * cos + np.concatenate((-dy[..., dy.shape[-1] // 2:], dy[..., :dy.shape[-1] // 2]), -1) * sin,
     "you rotated dy forward, by +θ"),
    (lambda dy, cos, sin: dy, "you returned dy unchanged"),
    (lambda dy, cos, sin: lesson08._interleaved(np.asarray(dy), cos, sin, -1.0), "neighbouring pairs"),
    (lambda dy, cos, sin: dy * cos, "you kept only the cos term"),
])
@pytest.mark.parametrize("hidden", [False, True])
def test_p11_mistakes_are_named(answer, says, hidden):
    fb = check("08.p11", answer, hidden=hidden)
    assert not fb.full and says in fb.text(), fb.text()


def test_p11_withholds_coursekits_rotation():
    assert set(ITEMS["p11"].withheld) == {"coursekit.rope:rope_backward", "coursekit.rope:rope_forward"}


# --------------------------------------------------------------------------- the check-yourself cells compare with what they name


def _assigned(source: str) -> set[str]:
    """The names a code cell binds in the notebook's namespace (assignments, tuple unpacking, for targets), not inside
    the functions it defines."""
    import ast

    names, todo = set(), list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
        for t in targets:
            names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        todo += list(ast.iter_child_nodes(node))
    return names


@pytest.mark.parametrize("marker, names", [
    ("mine_g = attention_backward(", ("dC_g", "Q_g", "K_g", "V_g", "n_rep", "cache_g", "dQ_g", "dK_rep", "dV_rep", "dC", "Q", "K",
                                      "V", "P")),
    ("mine = gqa_backward(", ("dC_g", "Q_g", "K_g", "V_g", "n_rep", "cache_g")),
    ("mine = rope_backward(", ("dq_rot", "cos_q", "sin_q", "q_in")),
])
def test_check_yourself_cells_read_the_know_this_values_they_name(marker, names):
    """A check-yourself cell compares the student's function with values of Know this (the grouped heads, the single
    head, the rotated queries): each of those names is bound in one cell only before it, so no later cell has
    replaced it. (The layer-0 cell once rebound dK_rep, and P2's check told a right answer its dK had the wrong shape.)"""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    at = next(i for i, src in enumerate(code) if marker in src)
    for name in names:
        binders = [i for i, src in enumerate(code[:at]) if name in _assigned(src)]
        assert len(binders) == 1, f"{name} is bound in {len(binders)} cells before the check ({marker!r})"
