"""Graded items of lesson 08, "Attention backward"."""

from __future__ import annotations

import math

import numpy as np

from ... import attention as att
from ... import lora
from ... import rope
from ..checkers import Case, Mistake, _quotes_numbers, worded
from .. import Array, Choice, Function, Numeric

READ_BWD = "Reread 'Backward, one rule per product' in Know this."
READ_SOFTMAX = "Reread 'The softmax step' in Know this."
READ_MASK = "Reread 'Masked means zero: probability and gradient' in Know this."
READ_LORA = "Reread 'Where LoRA fits' in Know this."
READ_GQA = "Reread 'Grouped-query attention: shared keys, summed gradients' in Know this."
READ_ROPE = "Reread 'Rotary positions: a rotation between the projection and the scores' in Know this."
#: How a dQ or dK mistake that comes from a wrong dS begins (P2, and P10 through it).
DS_WRONG = "{name} is off because dS is wrong (check the softmax step, P1): "
#: How P10 names a mistake of one head's backward (P2's list), made in every query head.
ONE_HEAD = "the same slip as in one head (P2's attention_backward): "


def _not_right(mistakes, right) -> list[Mistake]:
    """The mistakes whose value differs from the right answer: on small or degenerate cases (T = 1, uniform rows)
    several wrong formulas coincide with the right one, and such a "mistake" must not be reported."""
    return [m for m in mistakes
            if not (np.shape(m.value) == right.shape and np.allclose(m.value, right, rtol=1e-9, atol=1e-12))]


# --------------------------------------------------------------------------- references


def _T(x):
    """The last two axes swapped: queries × keys <-> keys × queries."""
    return np.swapaxes(np.asarray(x, dtype=np.float64), -1, -2)


def softmax_backward_kq(Pt, dPt):
    """Reference for p1: the softmax step in the keys × queries layout, ``dSᵀ`` from ``Pᵀ`` and ``dPᵀ``
    (Pt[..., u, t] = P[..., t, u]): each query's softmax runs over its keys, axis −2 here."""
    return _T(att.softmax_backward(_T(Pt), _T(dPt)))


def attention_backward(dC, Q, K, V, P):
    """Reference for p2: ``(dQ, dK, dV)`` of causal heads given their probabilities P, with any leading
    (batch, head) axes: Q, K (..., T, d_h), V, dC (..., T, d_v), P (..., T, T)."""
    Q, K, V, P, dC = (np.asarray(a, dtype=np.float64) for a in (Q, K, V, P, dC))
    scale = 1.0 / math.sqrt(Q.shape[-1])
    dV = _T(P) @ dC
    dS = att.softmax_backward(P, dC @ _T(V))
    return (dS @ K) * scale, (_T(dS) @ Q) * scale, dV


# --------------------------------------------------------------------------- p1: cases and mistakes


def _probs(rng: np.random.Generator, lead: tuple, T: int, drop_key: int | None = None) -> np.ndarray:
    """Causal probabilities (..., T, T) from random scores; ``drop_key`` masks one key column for every query."""
    allowed = att.causal_mask(T)
    if drop_key is not None:
        allowed = allowed.copy()
        allowed[:, drop_key] = False
    S = 1.5 * rng.standard_normal(lead + (T, T))
    return att.softmax_forward(S, allowed)


def _kq(P: np.ndarray, dP: np.ndarray) -> dict:
    """A p1 case: the probabilities and their gradient, both laid out keys × queries."""
    return dict(Pt=_T(P), dPt=_T(dP))


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(81)
    S = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, -0.5, 1.0]])
    P_small = att.softmax_forward(S, att.causal_mask(3))
    dP_small = np.array([[1.0, -1.0, 2.0], [0.5, 2.0, -1.0], [-1.0, 0.0, 3.0]])
    return [
        Case(_kq(P_small, dP_small), "one head, T = 3: Pt_small and dPt_small printed above"),
        Case(_kq(_probs(rng, (), 5), rng.standard_normal((5, 5))), "one head, T = 5"),
        Case(_kq(_probs(rng, (2, 3), 4), rng.standard_normal((2, 3, 4, 4))), "batch 2 × 3 heads × T = 4: shape (2, 3, 4, 4)"),
        Case(_kq(_probs(rng, (2,), 5, drop_key=2), rng.standard_normal((2, 5, 5))), "2 heads, T = 5, key 2 masked for every query"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    leads = [(), (3,), (2, 2), (), (2,), (1, 3)]
    for i, lead in enumerate(leads):
        # T = 2 is the smallest causal case with a nonzero dS (at T = 1, dS = 0 for any dP: zeros would pass)
        T = 2 if i == 3 else int(rng.integers(3, 7))
        drop = int(rng.integers(1, T)) if i in (1, 4) else None
        cases.append(Case(_kq(_probs(rng, lead, T, drop), rng.standard_normal(lead + (T, T)))))
    return cases


def _sm_mistakes(P: np.ndarray, dP: np.ndarray) -> list[Mistake]:
    """The classic wrong versions of dS = P ⊙ (dP − rowsum(dP ⊙ P)), as the values they produce (queries × keys,
    as P2 and P10 form dS)."""
    P, dP = np.asarray(P, dtype=np.float64), np.asarray(dP, dtype=np.float64)
    G = dP * P
    PT = P.swapaxes(-1, -2)
    right = P * (dP - G.sum(-1, keepdims=True))
    out = [
        Mistake("no rowsum", P * dP, "you forgot to subtract the row sum: dS = P ⊙ dP is what an elementwise exp would give, "
                "but each probability also depends on every score of its row through the normalisation. "
                "dS = P ⊙ (dP − rowsum(dP ⊙ P)). " + READ_SOFTMAX),
        Mistake("column sums", P * (dP - G.sum(-2, keepdims=True)), "you summed over the wrong axis: rowsum runs over the keys, "
                "the last axis of dS (axis=-1), one number per query row; axis=-2 sums each key's column. " + READ_SOFTMAX),
        Mistake("no keepdims", P * (dP - G.sum(-1)[..., None, :]), "your row sums were broadcast along the wrong axis: "
                "(dP * P).sum(axis=-1) has shape (..., T), which NumPy lines up with the key axis, so query u's sum is "
                "subtracted in column u. Keep the axis: .sum(axis=-1, keepdims=True). " + READ_SOFTMAX),
        Mistake("total sum", P * (dP - G.sum()), "you subtracted the sum of dP ⊙ P over every entry; the sum is per query "
                "row (axis=-1, keepdims=True): each row is its own softmax. " + READ_SOFTMAX),
        Mistake("matrix sum", P * (dP - G.sum(axis=(-2, -1), keepdims=True)), "you subtracted one sum per whole T × T matrix; "
                "the sum is per query row (axis=-1, keepdims=True): each row is its own softmax. " + READ_SOFTMAX),
        Mistake("transposed result", right.swapaxes(-1, -2), "your dS is the transpose of the right one: rows are queries, "
                "columns are keys, as in P (P1's function returns dSᵀ: transpose it back); the masked entries belong above "
                "the diagonal. " + READ_SOFTMAX),
        Mistake("P transposed in rowsum", P * (dP - (dP * PT).sum(-1, keepdims=True)), "you used Pᵀ inside the row sum: "
                "rowsum(dP ⊙ P) pairs each dP entry with the probability at the same (query, key) position. " + READ_SOFTMAX),
        Mistake("P transposed", PT * (dP - (dP * PT).sum(-1, keepdims=True)), "you used Pᵀ where P belongs: P is queries × keys "
                "(lower triangular for a causal head), and dS has P's layout. " + READ_SOFTMAX),
        Mistake("sign", P * (G.sum(-1, keepdims=True) - dP), "the sign is flipped: dS = P ⊙ (dP − rowsum(dP ⊙ P)), "
                "dP first. " + READ_SOFTMAX),
        Mistake("no P factor", dP - G.sum(-1, keepdims=True), "the factor P in front is missing: dS = P ⊙ (dP − rowsum(dP ⊙ P)). "
                "Without it masked entries get gradient (they must get exactly zero). " + READ_MASK),
    ]
    # The messages quote only axis numbers and formulas (axis=-1, T × T), never a case's values or sizes: each is also
    # the hint a hidden case shows.
    out = worded(out)
    return _not_right(out, right)


def _sm_kq_mistakes(Pt: np.ndarray, dPt: np.ndarray) -> list[Mistake]:
    """P1's wrong answers in its keys × queries layout, as the values they produce. The copy of Know this's line,
    ``P * (dP - (dP * P).sum(axis=-1, keepdims=True))``, applied to Pt and dPt, is "column sums": there axis −1 held
    the keys, here it holds the queries."""
    Pt, dPt = np.asarray(Pt, dtype=np.float64), np.asarray(dPt, dtype=np.float64)
    G = dPt * Pt
    right = Pt * (dPt - G.sum(-2, keepdims=True))
    out = [
        Mistake("no rowsum", Pt * dPt, "you forgot to subtract the sum over each query's keys: every probability also "
                "depends on every score of its query's softmax through the normalisation, so dSᵀ = Pᵀ ⊙ (dPᵀ − each "
                "query's sum of dP ⊙ P over its keys). " + READ_SOFTMAX),
        Mistake("column sums", Pt * (dPt - G.sum(-1, keepdims=True)), "you summed over the wrong axis: in this layout axis −1 "
                "runs over the queries, so .sum(axis=-1) adds entries of different softmaxes. Each query's softmax runs "
                "over its keys, which are axis −2 here: .sum(axis=-2, keepdims=True), one number per query, broadcast down "
                "its column. Know this's line sums over axis −1 because there the keys come last. " + READ_SOFTMAX),
        Mistake("no keepdims", Pt * (dPt - G.sum(-1)[..., None, :]), "you summed over axis −1, which runs over the queries in "
                "this layout, and dropped the axis, so NumPy lined the sums up with the wrong axis too. Each query's sum "
                "runs over its keys, axis −2 here: .sum(axis=-2, keepdims=True). " + READ_SOFTMAX),
        Mistake("queries × keys result", _T(right), "your result is dS in the queries × keys layout; return dSᵀ, laid out like "
                "the Pt and dPt you were given (keys in axis −2, queries in axis −1). " + READ_SOFTMAX),
        Mistake("total sum", Pt * (dPt - G.sum()), "you subtracted the sum of dP ⊙ P over every entry; the sum is one per "
                "query, over its keys (axis −2 in this layout): each query has its own softmax. " + READ_SOFTMAX),
        Mistake("matrix sum", Pt * (dPt - G.sum(axis=(-2, -1), keepdims=True)), "you subtracted one sum per whole T × T "
                "matrix; the sum is one per query, over its keys (axis −2 in this layout). " + READ_SOFTMAX),
        Mistake("sign", Pt * (G.sum(-2, keepdims=True) - dPt), "the sign is flipped: dP first, then minus the query's sum: "
                "dSᵀ = Pᵀ ⊙ (dPᵀ − the sum over the keys). " + READ_SOFTMAX),
        Mistake("no P factor", dPt - G.sum(-2, keepdims=True), "the factor Pᵀ in front is missing: dSᵀ = Pᵀ ⊙ (dPᵀ − the sum "
                "over the keys). Without it masked entries get gradient (they must get exactly zero). " + READ_MASK),
    ]
    return _not_right(worded(out), right)


def _p1_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    return {"dSt": _sm_kq_mistakes(kw["Pt"], kw["dPt"])}


# --------------------------------------------------------------------------- p2: one head's backward


def _head_case(rng: np.random.Generator, T: int, dh: int, dv: int, drop_key: int | None = None, lead: tuple = ()) -> dict:
    Q, K = rng.standard_normal(lead + (T, dh)), rng.standard_normal(lead + (T, dh))
    V = rng.standard_normal(lead + (T, dv))
    mask = None
    if drop_key is not None:
        mask = np.ones((T, T), dtype=bool)
        mask[:, drop_key] = False
    _, cache = att.attention_forward(Q, K, V, mask=mask)
    return dict(dC=rng.standard_normal(lead + (T, dv)), Q=Q, K=K, V=V, P=cache["P"])


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(82)
    return [
        Case(_head_case(rng, 3, 4, 4), "one head, T = 3, d_h = d_v = 4"),
        Case(_head_case(rng, 5, 2, 3, lead=(2,)), "2 heads: Q, K (2, 5, 2), V, dC (2, 5, 3), P (2, 5, 5)"),
        Case(_head_case(rng, 4, 4, 2, drop_key=1, lead=(2, 3)),
             "batch 2 × 3 heads, T = 4, d_h = 4, d_v = 2, key 1 masked for every query (a padding key)"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    leads = [(2,), (3,), (2, 2), (), (1, 3), (2,)]
    for i, lead in enumerate(leads):
        T = 1 if i == 5 else int(rng.integers(3, 7))
        dh = int(rng.choice([2, 3, 4, 8]))  # d_h ≥ 2: with d_h = 1 a missing 1/√d_h cannot show
        dv = dh if i == 0 else int(rng.integers(1, 5))  # d_v = d_h: dK and dV shapes coincide
        drop = int(rng.integers(1, T)) if i == 2 else None
        cases.append(Case(_head_case(rng, T, dh, dv, drop, lead=lead)))
    return cases


def _p2_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    dC, Q, K, V, P = (np.asarray(kw[k], dtype=np.float64) for k in ("dC", "Q", "K", "V", "P"))
    dh = Q.shape[-1]
    scale = 1.0 / math.sqrt(dh)
    dP = dC @ _T(V)
    dS = att.softmax_backward(P, dP)
    dQ, dK = dS @ K * scale, _T(dS) @ Q * scale
    m_q, m_k, m_v = [], [], []
    dv = V.shape[-1]
    if dv not in (1, dh):  # the value width in place of the key width (with d_v = 1 it is the same as no scale)
        m_q.append(Mistake("sqrt d_v", dS @ K / math.sqrt(dv), "you divided by √d_v, the width of the values; the scores "
                           "were divided by √d_h, the width of the queries and keys: dQ = dS K / √d_h. " + READ_BWD))
        m_k.append(Mistake("sqrt d_v", _T(dS) @ Q / math.sqrt(dv), "you divided by √d_v, the width of the values; the scores "
                           "were divided by √d_h, the width of the queries and keys: dK = dSᵀ Q / √d_h. " + READ_BWD))
    if dh > 1:
        # d_h comes from the case's shapes: the hints name the factor without its value
        m_q += [Mistake("no scale", dS @ K, f"dQ is missing the factor 1/√d_h = {scale:g}: the forward divided the scores by √d_h, "
                        "so dQ = dS K / √d_h. " + READ_BWD,
                        hint="dQ is missing the factor 1/√d_h: the forward divided the scores by √d_h, so dQ = dS K / √d_h. "
                             + READ_BWD),
                Mistake("1/d_h", dS @ K / dh, f"you divided by d_h = {dh}; the scores were divided by √d_h = {math.sqrt(dh):g}, "
                        "so dQ = dS K / √d_h. " + READ_BWD,
                        hint="you divided by d_h; the scores were divided by √d_h, so dQ = dS K / √d_h. " + READ_BWD),
                Mistake("times sqrt", dS @ K * math.sqrt(dh), "you multiplied by √d_h; the forward divided the scores by √d_h, "
                        "so the backward divides too: dQ = dS K / √d_h. " + READ_BWD)]
        m_k += [Mistake("no scale", _T(dS) @ Q, f"dK is missing the factor 1/√d_h = {scale:g}: dK = dSᵀ Q / √d_h. " + READ_BWD,
                        hint="dK is missing the factor 1/√d_h: dK = dSᵀ Q / √d_h. " + READ_BWD),
                Mistake("1/d_h", _T(dS) @ Q / dh, f"you divided by d_h = {dh}, not √d_h = {math.sqrt(dh):g}: dK = dSᵀ Q / √d_h. " + READ_BWD,
                        hint="you divided by d_h, not √d_h: dK = dSᵀ Q / √d_h. " + READ_BWD),
                Mistake("times sqrt", _T(dS) @ Q * math.sqrt(dh), "you multiplied by √d_h; dK = dSᵀ Q / √d_h. " + READ_BWD)]
    m_k += [Mistake("dS not transposed", dS @ Q * scale, "dK needs dSᵀ: in S = Q Kᵀ / √d_h, K enters transposed, so the key "
                    "side sums over queries: dK = dSᵀ Q / √d_h. " + READ_BWD),
            Mistake("dQ formula", dS @ K * scale, "that is dQ's formula; dK = dSᵀ Q / √d_h. " + READ_BWD)]
    m_q.append(Mistake("dS transposed", _T(dS) @ K * scale, "dQ uses dS itself, not dSᵀ: row t of dS belongs to query t, "
                       "so dQ = dS K / √d_h. " + READ_BWD))
    m_v.append(Mistake("P not transposed", P @ dC, "dV = Pᵀ dC: value u collects from every query that attended to it "
                       "(column u of P), so P enters transposed. " + READ_BWD))
    for name, wrong in (("dQ", m_q), ("dK", m_k)):
        for sm in _sm_mistakes(P, dP):
            val = sm.value @ K * scale if name == "dQ" else _T(sm.value) @ Q * scale
            if np.shape(sm.value) == dS.shape:
                why = DS_WRONG.format(name=name)
                wrong.append(Mistake(sm.label, val, why + sm.message, hint=why + sm.hint))
    m_q += [Mistake("no softmax step", dP @ K * scale, "you used dP where dS belongs: the gradient must pass through the "
                    "softmax first, dS = P ⊙ (dP − rowsum(dP ⊙ P)). " + READ_SOFTMAX)]
    m_k += [Mistake("no softmax step", _T(dP) @ Q * scale, "you used dP where dS belongs: the gradient must pass through the "
                    "softmax first, dS = P ⊙ (dP − rowsum(dP ⊙ P)). " + READ_SOFTMAX)]

    right = {"dQ": dQ, "dK": dK, "dV": _T(P) @ dC}
    return _dS_only_if_both_off({"dQ": _not_right(m_q, dQ), "dK": _not_right(m_k, dK), "dV": _not_right(m_v, right["dV"])},
                                got, right)


def _dS_only_if_both_off(mistakes: dict[str, list[Mistake]], got: dict | None, right: dict) -> dict[str, list[Mistake]]:
    """dQ and dK both come from dS: when the answer's other one is right, its dS was right, and a wrong dQ (or dK)
    that happens to equal a wrong-dS value (a sign slip in dQ alone) is not that mistake."""
    if not got:
        return mistakes
    out = dict(mistakes)
    for name, other in (("dQ", "dK"), ("dK", "dQ")):
        try:
            fine = np.shape(got[other]) == np.shape(right[other]) and np.allclose(
                np.asarray(got[other], dtype=np.float64), right[other], rtol=1e-7, atol=1e-10)
        except Exception:  # not an array: nothing to learn from it
            fine = False
        if fine:
            out[name] = [m for m in mistakes.get(name, []) if DS_WRONG.format(name=name) not in m.message]
    return out


# --------------------------------------------------------------------------- p3: zero gradient rows under causal + left padding

P3_T = 512
#: Keys 0 … P3_PAD − 1 are left padding, masked for every query on top of the causal mask.
P3_PAD = 3


def _p3_allowed() -> np.ndarray:
    """True where query t may attend key u: u ≤ t, and u is not a padding key."""
    allowed = att.causal_mask(P3_T).copy()
    allowed[:, :P3_PAD] = False
    return allowed


def _p3_counts() -> dict[str, int]:
    """What each kind of zero row comes from: queries with no visible key (a zero row of P), queries with exactly one
    (a softmax over one entry is the constant 1), keys no query sees (a zero column of P, so of dS)."""
    allowed = _p3_allowed()
    visible = allowed.sum(axis=1)
    return dict(empty=int((visible == 0).sum()), single=int((visible == 1).sum()),
                unseen=int((allowed.sum(axis=0) == 0).sum()))


def _p3_expected() -> float:
    c = _p3_counts()
    return float(c["empty"] + c["single"] + 2 * c["unseen"])      # dQ's rows, then dK's and dV's


def _p3_mistakes() -> list[Mistake]:
    c = _p3_counts()
    e, one, k = c["empty"], c["single"], c["unseen"]
    return [
        Mistake("one key", e + 2 * k, "you missed the first real query: query 3 may see key 3 only, so its row of P is "
                "[0, …, 0, 1, 0, …] whatever its score, and a softmax over one entry is the constant 1: dS[3, 3] = 0 and its "
                "row of dQ is exactly zero, as for query 0 of a plain causal head. " + READ_MASK),
        Mistake("padding keys only", 2 * k, "that counts the padding keys' rows of dK and dV only. The queries are affected "
                "too: queries 0 to 2 have no key left to see, so their rows of P, hence of dS and dQ, are zero; and query 3 "
                "sees a single key. " + READ_MASK),
        Mistake("empty rows", one + 2 * k, "queries 0 to 2, which have no key left to see, get a zero row of P (not NaN, "
                "the convention of coursekit and PyTorch's scaled_dot_product_attention), so dS = P ⊙ (…) and their rows of "
                "dQ are exactly zero too. " + READ_MASK),
        Mistake("dQ only", e + one, "that counts dQ's zero rows only; the padding keys get no probability from any query, "
                "so their columns of P and dS are zero, and so are their rows of dK and dV. " + READ_MASK),
        Mistake("key 3", e + one + 2 * k + 1, "key 3's row of dK is not zero: only dS[3, 3] vanishes, and every later "
                "query sees key 3 with a nonzero dS[t, 3]. A gradient row vanishes only when its whole column (a key) or "
                "row (a query) of dS does. " + READ_MASK),
    ]


# --------------------------------------------------------------------------- p6: the adapter on q_proj, behind RoPE

#: RoPE's angles at positions 0, 1, 2 for a head of width d_h = 2: one pair, frequency base⁰ = 1, so θ_t = t (any base).
P6_THETA = np.array([0.0, 1.0, 2.0])


def _p6_rotations(theta: np.ndarray) -> np.ndarray:
    """R_t for every angle: the 2 × 2 rotation by θ_t, rope(q)_t = R_t q_t (transformers' half-split layout at d = 2)."""
    return np.array([[[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]] for a in theta])


P6_CASE = dict(
    X=np.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0], [1.0, 1.0, 0.0]]),
    A=np.array([[0.5], [-1.0], [0.0]]),
    B=np.array([[1.0, 2.0]]),
    s=2.0,
    R=_p6_rotations(P6_THETA),
    # the gradients at the rotated queries and keys (row 0 of dQ_rot is 0: a causal head's first query sees one key) and at C
    dQ_rot=np.array([[0.0, 0.0], [0.5, -0.5], [0.25, 1.0]]),
    dK_rot=np.array([[0.25, -0.5], [0.0, 1.0], [-0.25, -0.5]]),
    dC=np.array([[1.0, -1.0], [0.0, 2.0], [-1.0, 0.5]]),
)


def _p6_grad_A(D: np.ndarray, s: float | None = None) -> np.ndarray:
    """Lesson 05's ∇A = s Xᵀ D Bᵀ of P6's adapter for an upstream gradient D at q_proj's output."""
    c = P6_CASE
    W = np.zeros((3, 2))  # the base weight does not enter ∇A
    _, cache = lora.lora_forward(c["X"], W, c["A"], c["B"], c["s"] if s is None else s)
    return lora.lora_backward(D, cache)[1]


def _p6_rotate(dy: np.ndarray, back: bool = True) -> np.ndarray:
    """R_tᵀ dy_t (back) or R_t dy_t at every position, with P6's matrices."""
    R = P6_CASE["R"]
    return np.einsum("tji,tj->ti", R, dy) if back else np.einsum("tij,tj->ti", R, dy)


def _p6_expected() -> np.ndarray:
    return _p6_grad_A(_p6_rotate(P6_CASE["dQ_rot"]))


def _p6_mistakes() -> list[Mistake]:
    c = P6_CASE
    D = _p6_rotate(c["dQ_rot"])
    return [
        Mistake("no rotation", _p6_grad_A(c["dQ_rot"]), "you used dQ_rot as the adapter's D: that is the gradient at the rotated "
                "queries, but q_proj's output is rotated before the scores, so its gradient is rotated back first: "
                "D_t = R_tᵀ dQ_rot_t at every position t, then ∇A = s Xᵀ D Bᵀ. " + READ_ROPE),
        Mistake("forward rotation", _p6_grad_A(_p6_rotate(c["dQ_rot"], back=False)), "you rotated dQ_rot forward, R_t dQ_rot_t; "
                "the backward of y_t = R_t x_t is the transpose, D_t = R_tᵀ dQ_rot_t (the rotation by −θ_t). " + READ_ROPE),
        Mistake("dC", _p6_grad_A(c["dC"]), "you used dC, the gradient at the attention output; the q_proj adapter's D is "
                "the gradient at q_proj's own output, Rᵀ dQ_rot. " + READ_LORA),
        Mistake("dK", _p6_grad_A(_p6_rotate(c["dK_rot"])), "you used dK, which belongs to k_proj; the q_proj adapter's D is "
                "Rᵀ dQ_rot. " + READ_LORA),
        Mistake("dK unrotated", _p6_grad_A(c["dK_rot"]), "you used dK_rot, which belongs to k_proj (and still carries the "
                "rotation); the q_proj adapter's D is Rᵀ dQ_rot. " + READ_LORA),
        Mistake("missing s", _p6_grad_A(D, s=1.0), f"the scale s = {c['s']:g} is missing: ∇A = s Xᵀ D Bᵀ (lesson 05) with "
                "D = Rᵀ dQ_rot. " + READ_LORA),
        Mistake("transposed", _p6_expected().T, "your ∇A has the shape of Aᵀ: ∇A = s Xᵀ D Bᵀ is d × r, like A. " + READ_LORA),
    ]


# --------------------------------------------------------------------------- p10: grouped-query attention


def gqa_backward(dC, Q, K, V, P):
    """Reference for p10: ``(dQ, dK, dV)`` of causal grouped-query attention. Q, P, dC have H query heads;
    K, V have H_kv heads, and query head h reads KV head h // (H / H_kv)."""
    n_kv = K.shape[-3]
    n_rep = Q.shape[-3] // n_kv
    Kr, Vr = att.repeat_kv(K, n_rep), att.repeat_kv(V, n_rep)
    scale = 1.0 / math.sqrt(Q.shape[-1])
    dVr = np.swapaxes(P, -1, -2) @ dC
    dS = att.softmax_backward(P, dC @ np.swapaxes(Vr, -1, -2))
    dQ, dKr = (dS @ Kr) * scale, (np.swapaxes(dS, -1, -2) @ Q) * scale
    return dQ, att.repeat_kv_backward(dKr, n_kv), att.repeat_kv_backward(dVr, n_kv)


def _gqa_case(rng: np.random.Generator, n_kv: int, n_rep: int, T: int, dh: int, dv: int) -> dict:
    H = n_kv * n_rep
    Q, K, V = rng.standard_normal((H, T, dh)), rng.standard_normal((n_kv, T, dh)), rng.standard_normal((n_kv, T, dv))
    _, cache = att.attention_forward(Q, att.repeat_kv(K, n_rep), att.repeat_kv(V, n_rep))
    return dict(dC=rng.standard_normal((H, T, dv)), Q=Q, K=K, V=V, P=cache["P"])


def _p10_public() -> list[Case]:
    rng = np.random.default_rng(810)
    return [
        Case(_gqa_case(rng, 1, 2, 3, 2, 2), "2 query heads sharing 1 KV head, T = 3, d_h = d_v = 2"),
        Case(_gqa_case(rng, 3, 3, 4, 4, 3), "SmolLM2's grouping: 9 query heads, 3 KV heads, T = 4, d_h = 4, d_v = 3"),
        Case(_gqa_case(rng, 2, 2, 5, 2, 2), "4 query heads, 2 KV heads, T = 5"),
    ]


def _p10_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for n_kv, n_rep in ((2, 3), (3, 2), (1, 4), (4, 2)):
        cases.append(Case(_gqa_case(rng, n_kv, n_rep, int(rng.integers(2, 6)), int(rng.choice([2, 4])),
                                    int(rng.integers(1, 4)))))
    return cases


def _p10_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    dC, Q, K, V, P = (np.asarray(kw[k], dtype=np.float64) for k in ("dC", "Q", "K", "V", "P"))
    n_kv = K.shape[-3]
    n_rep = Q.shape[-3] // n_kv
    scale = 1.0 / math.sqrt(Q.shape[-1])
    Vr = att.repeat_kv(V, n_rep)
    dS = att.softmax_backward(P, dC @ np.swapaxes(Vr, -1, -2))
    dKr, dVr = (np.swapaxes(dS, -1, -2) @ Q) * scale, np.swapaxes(P, -1, -2) @ dC
    out: dict[str, list[Mistake]] = {}
    for name, rep in (("dK", dKr), ("dV", dVr)):
        grouped = rep.reshape(n_kv, n_rep, *rep.shape[1:])
        strided = rep.reshape(n_rep, n_kv, *rep.shape[1:])  # head h counted with KV head h % H_kv
        out[name] = [
            Mistake("not summed", rep, f"your {name} has one head per query head; a KV head that several query heads "
                    f"read collects the sum of their gradients: {name}[g] = Σ over the query heads h with "
                    f"h // n_rep = g. " + READ_GQA),
            Mistake("mean", grouped.mean(1), f"you averaged the query heads' gradients; a tensor used n_rep times "
                    f"collects the sum of the n_rep gradients, not their mean. " + READ_GQA),
            Mistake("interleaved", strided.sum(0), "you grouped query head h with KV head h % H_kv; transformers' "
                    "repeat_kv repeats each KV head n_rep times in a row, so query head h reads KV head h // n_rep. "
                    + READ_GQA),
            Mistake("first only", grouped[:, 0], f"you kept only the first query head of each group; every query head "
                    f"that reads a KV head adds its gradient to {name}. " + READ_GQA),
        ]

    # One head's mistakes (P2's list, P1's softmax step in it), made in every query head: what a gqa_backward gives
    # that is built on a wrong attention_backward or softmax_backward, or repeats their slip.
    Kr = att.repeat_kv(K, n_rep)
    right = {"dQ": (dS @ Kr) * scale, "dK": att.repeat_kv_backward(dKr, n_kv), "dV": att.repeat_kv_backward(dVr, n_kv)}
    per_head = {"dQ": right["dQ"], "dK": dKr, "dV": dVr}
    heads = [_p2_mistakes({"dC": dC[h], "Q": Q[h], "K": Kr[h], "V": Vr[h], "P": P[h]}) for h in range(Q.shape[-3])]
    out["dQ"] = []
    for name in ("dQ", "dK", "dV"):
        for label in dict.fromkeys(m.label for hm in heads for m in hm[name]):
            found = [next((m for m in hm[name] if m.label == label), None) for hm in heads]
            first = next(m for m in found if m is not None)
            value = np.stack([per_head[name][h] if m is None else m.value for h, m in enumerate(found)])
            value = value if name == "dQ" else att.repeat_kv_backward(value, n_kv)
            # P2's message, whole, is its hint when it quotes no number of the case (as on P2's own hidden cases)
            hint = first.hint or ("" if _quotes_numbers(first.message) else first.message)
            out[name].append(Mistake(label, value, ONE_HEAD + first.message, hint=ONE_HEAD + hint if hint else ""))

    return _dS_only_if_both_off({k: _not_right(out[k], right[k]) for k in ("dQ", "dK", "dV")}, got, right)


# --------------------------------------------------------------------------- p11: RoPE's backward


def rope_backward(dy, cos, sin):
    """Reference for p11: the gradient at RoPE's input, R_tᵀ dy = dy ⊙ cos − rotate_half(dy) ⊙ sin."""
    return rope.rope_backward(np.asarray(dy, dtype=np.float64), np.asarray(cos, dtype=np.float64),
                              np.asarray(sin, dtype=np.float64))


def _rope_case(rng: np.random.Generator, lead: tuple, T: int, d: int, base: float, start: int = 0) -> dict:
    cos, sin = rope.rope_cos_sin(T, d, base, start=start)
    return dict(dy=rng.standard_normal(lead + (T, d)), cos=cos, sin=sin)


def _p11_public() -> list[Case]:
    rng = np.random.default_rng(811)
    return [
        Case(_rope_case(rng, (), 3, 2, 10.0), "one head, T = 3, d = 2 (a single pair), base 10"),
        Case(_rope_case(rng, (2,), 4, 6, 100.0), "2 heads, T = 4, d = 6, base 100"),
        Case(_rope_case(rng, (1, 9), 5, 64, 100000.0), "SmolLM2's query heads: (1, 9, T = 5, 64), rope_theta = 100,000"),
    ]


def _p11_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for lead, d in (((), 4), ((3,), 8), ((2, 3), 6), ((1, 3), 64)):
        cases.append(Case(_rope_case(rng, lead, int(rng.integers(2, 7)), d, float(rng.choice([10.0, 1e4, 1e5])),
                                     start=int(rng.integers(0, 50)))))
    return cases


def _interleaved(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, sign: float) -> np.ndarray:
    """The rotation of neighbouring pairs (x[2i], x[2i+1]) by the angles of the half-split tables (sign −1: by −θ)."""
    h = x.shape[-1] // 2
    c, s = cos[..., :h], sign * sin[..., :h]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = even * c - odd * s, even * s + odd * c
    return out


def _p11_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    dy, cos, sin = (np.asarray(kw[k], dtype=np.float64) for k in ("dy", "cos", "sin"))
    right = rope.rope_backward(dy, cos, sin)
    wrong = [
        Mistake("forward rotation", rope.rope_forward(dy, cos, sin), "you rotated dy forward, by +θ: that is R dy, the forward "
                "map. The backward of a linear map is its transpose, and the transpose of a rotation is the rotation by −θ: "
                "cos(−θ) = cos θ, sin(−θ) = −sin θ, so dx = dy ⊙ cos − rotate_half(dy) ⊙ sin. " + READ_ROPE),
        Mistake("no rotation", dy, "you returned dy unchanged: the rotation sits between q_proj and the scores, so the gradient "
                "at q_proj's output is Rᵀ dy, not dy. " + READ_ROPE),
        Mistake("neighbouring pairs", _interleaved(dy, cos, sin, -1.0), "you rotated neighbouring pairs (x[2i], x[2i+1]), "
                "the RoFormer paper's layout; Llama-style models (transformers' rotate_half) pair x[i] with x[i + d/2], "
                "the first half against the second. " + READ_ROPE),
        Mistake("neighbouring pairs, forward", _interleaved(dy, cos, sin, 1.0), "you rotated neighbouring pairs (x[2i], "
                "x[2i+1]) and by +θ: Llama-style models pair x[i] with x[i + d/2], and the backward rotates by −θ. " + READ_ROPE),
        Mistake("cos only", dy * cos, "you kept only the cos term: the rotation mixes each pair, so the sin term "
                "−rotate_half(dy) ⊙ sin belongs to the backward too. " + READ_ROPE),
    ]
    return {"dx": _not_right(worded(wrong), right)}


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 8

ITEMS = {
    "w1": Choice(
        "the shape of P for one head",
        0,
        key="b",
        explain={
            "a": "T × d_h is the shape of Q, K and dQ; P holds one probability per (query, key) pair: T × T. Reread 'One head, forward' in Know this.",
            "b": "S = Q Kᵀ / √d_h multiplies a T × d_h matrix by a d_h × T one and contracts over d_h, so S, and P = softmax(S) row by row, are T × T: row t is query t's distribution over the T keys. (Lesson 08, 'One head, forward'.)",
            "c": "d_h × d_h would be Qᵀ K, which contracts over positions; attention compares positions, Q Kᵀ is T × T. Reread 'One head, forward' in Know this.",
            "d": "T × d_v is the shape of V and of the output C = P V; P itself is T × T. Reread 'One head, forward' in Know this.",
        },
    ),
    "w2": Choice(
        "which keys a causal query may attend",
        0,
        key="a",
        explain={
            "a": "The causal mask sets the score to −∞ wherever key u comes after query t (u > t), so query t keeps every earlier key and its own position on the diagonal: P is lower triangular, and the first query's row is a single 1 on key 0. (Lesson 08, 'One head, forward'.)",
            "b": "u ≥ t would let each query look at the future, the opposite of causal. Reread 'Masked means zero: probability and gradient' in Know this.",
            "c": "u < t would hide the query's own position; PyTorch's is_causal keeps the diagonal (u ≤ t). Reread 'Masked means zero: probability and gradient' in Know this.",
            "d": "That is bidirectional attention (an encoder); a decoder's causal mask hides every key after the query. Reread 'Masked means zero: probability and gradient' in Know this.",
        },
    ),
    "w3": Choice(
        "why the row maximum is subtracted",
        0,
        key="d",
        explain={
            "a": "Subtracting a constant from a row leaves its softmax unchanged: exp(s − m) / Σ exp(s − m) = exp(s) / Σ exp(s). Reread 'One head, forward' in Know this.",
            "b": "The division by the row's sum makes each row of P sum to one, with or without the subtraction: exp(s) / Σ exp(s) sums to one too. The subtraction guards against overflow of the large scores. Reread 'One head, forward' in Know this.",
            "c": "The gradient does not change either; the rowsum term in dS already makes each row of dS sum to zero. Reread 'The softmax step' in Know this.",
            "d": "Subtracting the row maximum m multiplies numerator and denominator by the same exp(−m), so exp(s − m) / Σ exp(s − m) = exp(s) / Σ exp(s) and P does not change. But the largest exponent becomes exp(0) = 1, so large scores no longer overflow (exp is inf above about 709.8 in float64, 88.7 in float32 or bf16). (Lesson 08, 'One head, forward'.)",
        },
    ),
    "p1": Function(
        "implement softmax_backward_kq: the softmax step with keys before queries",
        4,
        name="softmax_backward_kq",
        reference=softmax_backward_kq,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("dSt",),
        mistakes=_p1_mistakes,
        rtol=1e-7,
        atol=1e-10,
    ),
    "p2": Function(
        "implement attention_backward for causal heads with leading batch and head axes",
        4,
        name="attention_backward",
        reference=attention_backward,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("dQ", "dK", "dV"),
        mistakes=_p2_mistakes,
        rtol=1e-7,
        atol=1e-10,
    ),
    "p3": Numeric(
        f"exactly-zero rows of dQ, dK and dV for one causal head with T = {P3_T} and keys 0 to {P3_PAD - 1} padded",
        1,
        name="n_zero_rows",
        reread=READ_MASK,
        expected=_p3_expected,
        rtol=0,
        mistakes=_p3_mistakes,
    ),
    "p4": Choice(
        "what adding a constant to a column of dP does to dS",
        1,
    ),
    "p5": Choice(
        "which changes to the forward leave dV unchanged",
        2,
        options="abcde",
        multi=True,
    ),
    "p6": Array(
        "∇A of a LoRA adapter on q_proj, behind RoPE",
        2,
        name="dA",
        reread=READ_LORA,
        expected=_p6_expected,
        rtol=1e-9,
        atol=1e-12,
        mistakes=_p6_mistakes,
    ),
    "p7": Choice(
        "which adapters of a layer a sequence of one repeated token trains",
        1,
    ),
    "p10": Function(
        "implement gqa_backward: grouped-query attention's dQ, dK, dV",
        3,
        name="gqa_backward",
        reference=gqa_backward,
        public=_p10_public,
        hidden=_p10_hidden,
        outputs=("dQ", "dK", "dV"),
        mistakes=_p10_mistakes,
        rtol=1e-7,
        atol=1e-10,
    ),
    "p11": Function(
        "implement rope_backward: the gradient through the rotation before the scores",
        2,
        name="rope_backward",
        reference=rope_backward,
        public=_p11_public,
        hidden=_p11_hidden,
        outputs=("dx",),
        mistakes=_p11_mistakes,
        withheld=("coursekit.rope:rope_backward", "coursekit.rope:rope_forward"),  # forward with −sin is the backward
        rtol=1e-7,
        atol=1e-10,
    ),
}
