"""Graded items of lesson 03, "What low rank restricts"."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ... import lora, lowrank
from .. import Array, Choice, Function, Numeric
from ..checkers import Case, Feedback, Mistake, as_array

READ_RANK = "Reread 'Rank of a product' in Know this."
READ_SVD = "Reread 'The best rank-k approximation' in Know this."
READ_SCALE = "Reread 'The scale when r changes' in Know this."
READ_PATTERN = "Reread 'Per-module ranks in PEFT' in Know this."

SEED_SPECTRUM = (4.0, 2.0, 1.0, 0.5)  # the lesson's synthetic target update


# --------------------------------------------------------------------------- P1: best_rank_k


def best_rank_k_reference(M, k):
    """Reference for p1 (coursekit.lowrank.best_rank_k)."""
    return lowrank.best_rank_k(M, k)


def _terms(M: np.ndarray):
    U, S, Vt = np.linalg.svd(np.asarray(M, dtype=np.float64), full_matrices=False)
    return U, S, Vt


def _kept_directions(M: np.ndarray, got: Any) -> list[int] | None:
    """If ``got`` is a sum of whole SVD terms S[i] u_i v_iᵀ of M, the indices i it kept; else None.

    Works because the u_i (and v_i) are orthonormal: the coefficient of term i in G is u_iᵀ G v_i / S[i].
    Needs distinct nonzero singular values, which every graded case has.
    """
    G = as_array(got)
    if G is None or G.shape != M.shape or not np.all(np.isfinite(G)):
        return None
    U, S, Vt = _terms(M)
    if np.any(S <= 1e-9) or np.any(np.diff(S) > -1e-9):
        return None
    c = np.einsum("di,dm,im->i", U, G, Vt) / S
    rounded = np.round(c)
    if not np.allclose(c, rounded, atol=1e-6) or np.any((rounded != 0) & (rounded != 1)):
        return None
    if not np.allclose((U * (S * rounded)) @ Vt, G, rtol=1e-6, atol=1e-8):
        return None
    return [int(i) for i in np.flatnonzero(rounded)]


def best_rank_k_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    """Known wrong values of M_k: a wrong set of singular directions (named from the student's answer),
    U or Vt cut to a k × k block, the transpose of a square answer."""
    M, k = np.asarray(kw["M"], dtype=np.float64), int(kw["k"])
    U, S, Vt = _terms(M)
    p = S.size
    right = (U[:, :k] * S[:k]) @ Vt[:k]
    out: list[Mistake] = []
    g = (got or {}).get("M_k")
    kept = _kept_directions(M, g)
    if kept is not None and kept != list(range(k)):
        shown = ", ".join(f"{S[i]:.3g}" for i in kept) or "none"
        top = ", ".join(f"{S[i]:.3g}" for i in range(k))
        if kept == list(range(p - k, p)) and k < p:
            values = "value" if k == 1 else "values"
            msg = (f"you kept the {k} smallest singular {values} ({shown}) instead of the {k} largest ({top}): "
                   f"the best rank-k approximation keeps the first k of the decreasing order"
                   + (" (with 2k = min(d, m) this is also the residual M − M_k)" if 2 * k == p else "") + f". {READ_SVD}")
            # the same words whatever the case's shape: a note only when 2k = min(d, m) would tell the shape
            hint = (f"you kept the k smallest singular values instead of the k largest: the best rank-k approximation "
                    f"keeps the first k of the decreasing order (where 2k = min(d, m) that is also what returning the "
                    f"residual M − M_k gives: return M_k itself). {READ_SVD}")
        elif kept == list(range(k, p)):
            msg = (f"you returned the residual M − M_k (the directions with singular values {shown}); return the "
                   f"approximation M_k itself, the part that keeps the {k} largest. {READ_SVD}")
            hint = (f"you returned the residual M − M_k; return the approximation M_k itself, the part that keeps the "
                    f"k largest singular values. {READ_SVD}")
        elif len(kept) != k:
            msg = (f"your answer keeps {len(kept)} singular directions ({shown}), but a rank-{k} approximation keeps "
                   f"exactly k = {k}: check the slice bounds (U[:, :k], S[:k], Vt[:k]). {READ_SVD}")
            hint = (f"your answer keeps a different number of singular directions than k: a rank-k approximation keeps "
                    f"exactly k, so check the slice bounds (U[:, :k], S[:k], Vt[:k]). {READ_SVD}")
        else:
            msg = (f"you kept {k} singular directions, but not the largest ones: yours have singular values {shown}, "
                   f"the best have {top}. Sort in decreasing order before you truncate (np.linalg.eig and eigh "
                   f"do not return the order np.linalg.svd does). {READ_SVD}")
            hint = (f"you kept k singular directions, but not the largest ones. Sort in decreasing order before you "
                    f"truncate (np.linalg.eig and eigh do not return the order np.linalg.svd does). {READ_SVD}")
        out.append(Mistake("wrong directions", g, msg, hint=hint))
    if k < p:
        out.append(Mistake("smallest", (U[:, p - k:] * S[p - k:]) @ Vt[p - k:],
                           f"you kept the {k} smallest singular {'value' if k == 1 else 'values'} instead of the {k} largest. {READ_SVD}",
                           hint=f"you kept the k smallest singular values instead of the k largest. {READ_SVD}"))
    out.append(Mistake("squared S", (U[:, :k] * S[:k] ** 2) @ Vt[:k],
                       "you scaled by the squared singular values (the eigenvalues of MᵀM): M_k = U_k diag(S_k) V_kᵀ uses "
                       "the singular values themselves, as np.linalg.svd returns them. " + READ_SVD))
    out.append(Mistake("no S", U[:, :k] @ Vt[:k],
                       "you left out the singular values: M_k = U_k diag(S_k) V_kᵀ, so scale column i of U_k by S[i] "
                       "(U[:, :k] * S[:k]) before the product. " + READ_SVD))
    out.append(Mistake("residual", M - right, "you returned the residual M − M_k; return the approximation M_k itself. " + READ_SVD))
    out.append(Mistake("Vt cut", (U[:, :k] * S[:k]) @ Vt[:k, :k],
                       "your M_k is d × k: you cut Vt[:k] to k columns as well. Keep the first k *rows* of Vt and all "
                       "m columns, Vt[:k, :], so that M_k has M's shape d × m. " + READ_SVD))
    out.append(Mistake("U cut", (U[:k, :k] * S[:k]) @ Vt[:k],
                       "your M_k is k × m: you cut U to k rows as well. Keep all d rows and the first k *columns* of U, "
                       "U[:, :k], so that M_k has M's shape d × m. " + READ_SVD))
    if M.shape[0] == M.shape[1]:
        out.append(Mistake("transposed", right.T, "your M_k is transposed: it has M's layout, d × m, not m × d."))
    return {"M_k": out, "result": out}


class _FactorsAwareFunction(Function):
    """A Function item that also names the mistake of returning the SVD factors instead of their product."""

    def check(self, answer: Any, ctx) -> Feedback:
        fb = super().check(answer, ctx)
        if any("got tuple" in l or "got list" in l or "(a tuple of" in l for l in fb.lines):
            fb.lines.append("Likely mistake: you returned the factors (U, S, Vt) or a list; best_rank_k returns one d × m "
                            "array, the product U[:, :k] · diag(S[:k]) · Vt[:k, :]. " + READ_SVD)
        return fb


def _distinct_spectrum(rng: np.random.Generator, p: int) -> np.ndarray:
    """p well-separated singular values in decreasing order, so every truncation is unique."""
    return np.sort(rng.uniform(0.5, 1.5, size=p).cumsum())[::-1]


def _p1_case(rng: np.random.Generator, d: int, m: int, k: int) -> dict:
    sigma = _distinct_spectrum(rng, min(d, m))
    return dict(M=lowrank.with_singular_values(sigma, d, m, rng), k=k)


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(31)
    return [
        Case(dict(M=lowrank.with_singular_values(SEED_SPECTRUM, 4, 4, np.random.default_rng(3)), k=1),
             "singular values [4, 2, 1, 0.5], k = 1"),
        Case(_p1_case(rng, 6, 3, 2), "tall 6 × 3, k = 2"),
        Case(_p1_case(rng, 3, 5, 1), "wide 3 × 5, k = 1"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for i in range(6):
        d, m = int(rng.integers(3, 8)), int(rng.integers(3, 8))
        p = min(d, m)
        k = p if i == 5 else int(rng.integers(1, p))  # the last one keeps everything: M_k = M
        out.append(Case(_p1_case(rng, d, m, k)))
    return out


# --------------------------------------------------------------------------- P6: residual_curve


def residual_curve_reference(sigma):
    """Reference for p6 (coursekit.lowrank.residual_curve)."""
    return lowrank.residual_curve(sigma)


def _tails(values: np.ndarray) -> np.ndarray:
    return np.concatenate([np.cumsum(values[::-1])[::-1], [0.0]])


def residual_curve_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    s_in = np.asarray(kw["sigma"], dtype=np.float64)
    s = np.sort(s_in)[::-1]
    right = np.sqrt(_tails(s ** 2))
    # "from k = 1" and "no k = p" quote only the curve's fixed layout (entry 0 is k = 0, len(sigma) + 1 entries)
    starts_late = ("your curve starts at k = 1: entry 0 is k = 0 (nothing kept), where the residual is ||M||_F; the "
                   "array has len(sigma) + 1 entries.")
    stops_early = ("your curve stops before k = len(sigma): the last entry (everything kept) is 0; the array has "
                   "len(sigma) + 1 entries.")
    out = [
        Mistake("unsorted", np.sqrt(_tails(s_in ** 2)),
                "you truncated sigma in the order it was given: sort it in decreasing order first, the best rank-k "
                "approximation drops the smallest values. " + READ_SVD),
        Mistake("ascending", np.sqrt(_tails(np.sort(s_in) ** 2)),
                "you sorted in increasing order, so rank k keeps the smallest values: sort in decreasing order. " + READ_SVD),
        Mistake("no sqrt", right ** 2, "you returned the squared residuals: the Frobenius norm is the square root of the "
                "sum of the squared discarded singular values. " + READ_SVD),
        Mistake("plain sum", _tails(s), "you summed the discarded singular values; the Frobenius residual is "
                "sqrt(sum of their squares). " + READ_SVD),
        Mistake("spectral", np.concatenate([s, [0.0]]), "that is the spectral-norm residual (the largest discarded value); "
                "the question asks for the Frobenius norm. " + READ_SVD),
        Mistake("from k = 1", right[1:], starts_late, hint=f"{starts_late} {READ_SVD}"),
        Mistake("no k = p", right[:-1], stops_early, hint=f"{stops_early} {READ_SVD}"),
    ]
    return {"residuals": out, "result": out}


def _p6_public() -> list[Case]:
    return [
        Case(dict(sigma=np.array(SEED_SPECTRUM)), "sigma = [4, 2, 1, 0.5]"),
        Case(dict(sigma=np.array([1.0, 3.0, 0.5, 2.0])), "unsorted sigma = [1, 3, 0.5, 2]"),
    ]


def _p6_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for _ in range(5):
        s = np.round(rng.uniform(0.1, 5.0, size=int(rng.integers(3, 8))), 3)
        out.append(Case(dict(sigma=rng.permutation(s))))
    return out


# --------------------------------------------------------------------------- P2: a diagonal target with a negative entry

# The lesson's plot already shows every residual of the spectrum [4, 2, 1, 0.5]; P2 asks for one it has not printed.
# The singular values of a diagonal matrix are the absolute values of its entries, sorted largest first (the signs go
# into U), so the best rank-2 approximation keeps -4 and 3, not the first two entries and not the two largest signed.
P2_DIAG = (1.0, -4.0, 0.0, 3.0, 2.0)


def _diag_residual(keep, norm: str = "fro") -> float:
    """||M - M_keep|| for M = diag(P2_DIAG) and M_keep the diagonal matrix that keeps only the entries at ``keep``."""
    d = np.array(P2_DIAG)
    kept = np.zeros_like(d)
    kept[list(keep)] = d[list(keep)]
    return float(np.linalg.norm(np.diag(d) - np.diag(kept), 2 if norm == "2" else None))


def p2_expected() -> float:
    return lowrank.rank_k_residual(lowrank.singular_values(np.diag(P2_DIAG)), 2)


def p2_mistakes() -> list[Mistake]:
    d = np.array(P2_DIAG)
    by_size = np.argsort(-np.abs(d))
    dropped = np.abs(d)[by_size[2:]]
    read_pieces = "Reread 'SVD: a matrix as a sum of rank-one pieces' in Know this."
    return [
        Mistake("signed", _diag_residual(np.argsort(-d)[:2]),
                "you kept the two largest entries by signed value (3 and 2). Singular values are never negative: the sign of "
                "-4 goes into a singular vector, and its strength is 4, the largest. " + read_pieces),
        Mistake("in order", _diag_residual([0, 1]),
                "you kept the first two diagonal entries in the order they are written; the best rank-2 approximation keeps "
                "the two largest singular values wherever they sit. " + read_pieces),
        Mistake("no sqrt", p2_expected() ** 2, "that is the squared residual: take the square root. " + READ_SVD),
        Mistake("plain sum", float(dropped.sum()), "you added the discarded singular values; the Frobenius residual is the "
                "square root of the sum of their squares. " + READ_SVD),
        Mistake("rank 1", _diag_residual(by_size[:1]), "that is the rank-1 residual; rank 2 keeps two singular values. " + READ_SVD),
        Mistake("spectral", _diag_residual(by_size[:2], norm="2"),
                "that is the spectral-norm residual (the largest discarded singular value); the question asks for the "
                "Frobenius norm. " + READ_SVD),
        Mistake("relative", p2_expected() / float(np.linalg.norm(d)),
                "that is the residual relative to ||M||_F; the question asks for the absolute residual. " + READ_SVD),
    ]


# --------------------------------------------------------------------------- P4: the update's size when r grows

# Factors drawn as in the lesson's plot (x and B with N(0, 1) entries, A with N(0, 1/d) entries): the sum over r
# independent directions makes the mean of ||xAB||^2 grow exactly like r, so the root-mean-square update
# ||s xAB|| grows like s(r) sqrt(r). Plain LoRA (s = lora_alpha / r) turns that into 1/sqrt(r). The lesson prints
# the fitted slopes (-1/2 and 0); P4 asks for the factor between two ranks the student has to work out.
GROWTH = dict(lora_alpha=16, r_from=4, r_to=64)


def _rms_ratio(scale=lambda alpha, r: lora.scaling(alpha, r), grows: bool = True) -> float:
    """The root-mean-square of ||s xAB|| at r_to over the same at r_from, for a scale rule ``scale(lora_alpha, r)``;
    ``grows=False`` leaves out the sqrt(r) growth of ||xAB|| (a mistaken variant)."""
    a, r0, r1 = GROWTH["lora_alpha"], GROWTH["r_from"], GROWTH["r_to"]
    size = (lambda r: math.sqrt(r)) if grows else (lambda r: 1.0)
    return scale(a, r1) * size(r1) / (scale(a, r0) * size(r0))


def growth_expected() -> float:
    return _rms_ratio()


def _plot_estimate() -> float:
    """The same ratio read off the lesson's plot: its code (seed 7, d = m = 256, ranks 1, 2, 4, ..., 256 drawn in that
    order), whose root-mean-square over only 20 draws per rank is a noisy estimate of the typical size."""
    g = np.random.default_rng(7)
    d, m, alpha = 256, 256, GROWTH["lora_alpha"]
    sizes = {}
    for r in 2 ** np.arange(0, 9):
        r = int(r)
        sq = [np.linalg.norm(g.standard_normal((1, d)) @ (g.standard_normal((d, r)) / math.sqrt(d)) @ g.standard_normal((r, m))) ** 2
              for _ in range(20)]
        sizes[r] = lora.scaling(alpha, r) * math.sqrt(np.mean(sq))
    return sizes[GROWTH["r_to"]] / sizes[GROWTH["r_from"]]


def growth_mistakes() -> list[Mistake]:
    r0, r1 = GROWTH["r_from"], GROWTH["r_to"]
    return [
        Mistake("s only", _rms_ratio(grows=False),
                f"that is how much s = lora_alpha / r shrinks alone. The update xAB also grows: it adds up r independent "
                f"directions, so its size grows like sqrt(r), sqrt({r1} / {r0}) = {math.sqrt(r1 / r0):g} times. " + READ_SCALE),
        Mistake("fixed s", _rms_ratio(scale=lambda alpha, r: alpha),
                f"that is how xAB grows (like sqrt(r)) with the scale held fixed, as if s were lora_alpha; s = lora_alpha / r "
                f"shrinks {r1 // r0} times at the same time, and that wins. " + READ_SCALE),
        Mistake("rslora", _rms_ratio(scale=lambda alpha, r: lora.scaling(alpha, r, use_rslora=True)),
                "that is the rsLoRA scale lora_alpha / sqrt(r), which keeps the update flat; PEFT's default "
                "lora_alpha / r makes it shrink like 1 / sqrt(r). " + READ_SCALE),
        Mistake("s upside down", _rms_ratio(scale=lambda alpha, r: r / alpha, grows=False),
                "s = lora_alpha / r is divided by r: a larger r gives a smaller s, not a larger one, and the update's "
                "growth like sqrt(r) comes on top. " + READ_SCALE),
        Mistake("20 draws", _plot_estimate(),
                "that is the ratio of the plot's two points, each a root-mean-square over only 20 random draws: an "
                "estimate that scatters from draw to draw. The question asks for the typical size itself, the value the "
                "estimate approaches with many draws: work it out from how s and the mean of ||xAB||^2 depend on r. " + READ_SCALE),
    ]


# --------------------------------------------------------------------------- P5: per-module scaling

P5_CONFIG = dict(r=8, lora_alpha=16, rank_pattern={"v_proj": 32}, alpha_pattern={"layers.0.attn.v_proj": 32})
P5_MODULES = ("layers.0.attn.q_proj", "layers.0.attn.v_proj", "layers.1.attn.v_proj")


def _scalings(r, lora_alpha, rank_pattern, alpha_pattern, use_rslora=False) -> np.ndarray:
    return np.array([lowrank.module_lora_settings(n, r, lora_alpha, rank_pattern, alpha_pattern, use_rslora)["scaling"]
                     for n in P5_MODULES])


def p5_expected() -> np.ndarray:
    return _scalings(**P5_CONFIG)


def p5_mistakes() -> list[Mistake]:
    c = P5_CONFIG
    every_v = {"v_proj": c["alpha_pattern"]["layers.0.attn.v_proj"]}
    return [
        Mistake("no patterns", _scalings(c["r"], c["lora_alpha"], {}, {}),
                "you used the defaults for every module: rank_pattern and alpha_pattern override r and lora_alpha "
                "for the modules whose names they match. " + READ_PATTERN),
        Mistake("no alpha_pattern", _scalings(c["r"], c["lora_alpha"], c["rank_pattern"], {}),
                "you applied rank_pattern but not alpha_pattern: 'layers.0.attn.v_proj' matches block 0's v_proj, "
                "so its lora_alpha is overridden too. " + READ_PATTERN),
        Mistake("no rank_pattern", _scalings(c["r"], c["lora_alpha"], {}, c["alpha_pattern"]),
                "you applied alpha_pattern but not rank_pattern: the key 'v_proj' matches every module named …v_proj, "
                "so those adapters have r = 32. " + READ_PATTERN),
        Mistake("alpha on every v_proj", _scalings(c["r"], c["lora_alpha"], c["rank_pattern"], every_v),
                "the alpha_pattern key names block 0 only ('layers.0.attn.v_proj'); block 1's v_proj keeps the "
                "default lora_alpha, so its s = lora_alpha / 32. " + READ_PATTERN),
        Mistake("rslora", _scalings(**c, use_rslora=True),
                "that is the rsLoRA scale lora_alpha / sqrt(r); this config uses plain LoRA, s = lora_alpha / r. " + READ_SCALE),
        Mistake("alpha", np.array([lowrank.module_lora_settings(n, c["r"], c["lora_alpha"], c["rank_pattern"], c["alpha_pattern"])["lora_alpha"]
                                   for n in P5_MODULES]),
                "those are the lora_alpha values; the scaling is lora_alpha / r for each module. " + READ_SCALE),
    ]


# --------------------------------------------------------------------------- items

W1_SHAPES = dict(d=4096, r=16, m=4096)
# W3: two adapters of the same rank on one square weight, their updates added (A₁B₁ + A₂B₂ = [A₁ A₂][B₁; B₂]).
W3 = dict(adapters=2, r=4, d=576, m=576)

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 10

ITEMS = {
    "w1": Numeric(
        f"the largest possible rank of A B, A {W1_SHAPES['d']} × {W1_SHAPES['r']}, B {W1_SHAPES['r']} × {W1_SHAPES['m']}",
        0,
        name="max_rank",
        expected=lambda: min(W1_SHAPES.values()),
        rtol=0,
        mistakes=lambda: [
            Mistake("dense", W1_SHAPES["d"], "A B is 4096 × 4096, but every column of A B is a combination of A's 16 columns: "
                    "rank(A B) <= r. " + READ_RANK),
            Mistake("2r", 2 * W1_SHAPES["r"], "the two factors do not add their ranks: rank(A B) <= min(rank A, rank B) <= r. " + READ_RANK),
            Mistake("params", lora.param_count(W1_SHAPES["d"], W1_SHAPES["m"], W1_SHAPES["r"]),
                    "that is the parameter count r (d + m), not a rank. " + READ_RANK),
        ],
    ),
    "w2": Choice(
        "which matrix has rank 1",
        0,
        key="a",
        explain={
            "a": "The second row [2, 4] is 2 times the first row [1, 2], and the second column is 2 times the first, so all columns lie along one direction: rank 1. It is the outer product [1, 2]ᵀ[1, 2], a single rank-one piece. (Lesson 03, 'Rank of a product'.)",
            "b": "The identity's two columns point in different directions: rank 2. Reread 'Rank of a product' in Know this.",
            "c": "diag(1, −1) has two independent columns (one per axis): rank 2. Reread 'Rank of a product' in Know this.",
            "d": "A permutation matrix has full rank: its columns are distinct unit vectors. Reread 'When low rank fails' in Know this.",
        },
    ),
    "w3": Numeric(
        f"the rank of A₁B₁ + A₂B₂: {W3['adapters']} rank-{W3['r']} adapters with random factors on one "
        f"{W3['d']} × {W3['m']} weight, their updates added",
        0,
        name="rank",
        expected=lambda: min(W3["adapters"] * W3["r"], W3["d"], W3["m"]),
        rtol=0,
        mistakes=lambda: [
            Mistake("one adapter", W3["r"], "each update has rank 4, but the two adapters have their own directions and the sum "
                    "keeps both: A₁B₁ + A₂B₂ = [A₁ A₂][B₁; B₂], one product whose inner width is 4 + 4 = 8. No rank-4 "
                    "adapter can represent it; one rank-8 adapter can. " + READ_RANK),
            Mistake("ranks multiplied", W3["r"] * W3["r"], "the ranks of a sum add at most, they do not multiply: "
                    "A₁B₁ + A₂B₂ = [A₁ A₂][B₁; B₂] has inner width 4 + 4 = 8. " + READ_RANK),
            Mistake("dense", min(W3["d"], W3["m"]), "that is the rank of a full 576 × 576 matrix; the sum is one product "
                    "[A₁ A₂][B₁; B₂] with inner width 8, so its rank is at most 8. " + READ_RANK),
            Mistake("params", W3["adapters"] * lora.param_count(W3["d"], W3["m"], W3["r"]),
                    "that is the two adapters' parameter count, 2 r (d + m), not a rank. " + READ_RANK),
        ],
    ),
    "p1": _FactorsAwareFunction(
        "implement best_rank_k",
        3,
        name="best_rank_k",
        reference=best_rank_k_reference,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("M_k",),
        mistakes=best_rank_k_mistakes,
        rtol=1e-6,
        atol=1e-8,
    ),
    "p2": Numeric(
        f"the Frobenius residual of the best rank-2 approximation of diag{P2_DIAG}",
        1,
        name="residual",
        expected=p2_expected,
        rtol=1e-4,
        mistakes=p2_mistakes,
    ),
    "p3": Choice(
        "what r = 8 counts in a 30-block model with adapters on q_proj and v_proj",
        1,
    ),
    "p4": Numeric(
        f"the factor by which the typical update size ||s x A B|| changes from r = {GROWTH['r_from']} to r = {GROWTH['r_to']} "
        f"at lora_alpha = {GROWTH['lora_alpha']}, s = lora_alpha / r",
        1,
        name="factor",
        expected=growth_expected,
        rtol=0.05,
        mistakes=growth_mistakes,
    ),
    "p5": Array(
        "PEFT scaling of " + ", ".join(P5_MODULES) + " under rank_pattern / alpha_pattern",
        2,
        name="scalings",
        expected=p5_expected,
        rtol=1e-6,
        mistakes=p5_mistakes,
    ),
    "p6": Function(
        "implement residual_curve",
        2,
        name="residual_curve",
        reference=residual_curve_reference,
        public=_p6_public,
        hidden=_p6_hidden,
        outputs=("residuals",),
        mistakes=residual_curve_mistakes,
    ),
}
