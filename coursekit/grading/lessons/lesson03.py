"""Graded items of lesson 03, "What low rank restricts"."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ... import lora, lowrank
from .. import Array, Choice, Function, Numeric, point_to_section
from ..checkers import Case, Feedback, Mistake, as_array, formative

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


# --------------------------------------------------------------------------- P2: a diagonal target with one entry free

# The lesson computes a residual from given singular values with one call (lowrank.rank_k_residual); P2 runs the rule
# backwards. M = diag(1, -4, 0, 3, x) with x >= 0 free: its singular values are the absolute values of the entries,
# sorted largest first (the signs go into U), so while x <= 3 the best rank-2 approximation keeps 4 and 3 and leaves
# sqrt(1 + x^2); past 3 it keeps x instead of 3 and leaves sqrt(3^2 + 1^2) = sqrt(10) > 3.1. The largest x whose
# residual stays within 3.1 is sqrt(3.1^2 - 1). Each named mistake is the same search with the mistaken residual.
P2_DIAG = (1.0, -4.0, 0.0, 3.0)  # the fifth diagonal entry is x
P2_BOUND = 3.1
P2_X_MAX = 10.0  # every residual rule here exceeds P2_BOUND there


def _p2_matrix(x: float) -> np.ndarray:
    return np.diag([*P2_DIAG, x])


def _largest_x(residual: Callable[[float], float]) -> float:
    """The largest x in [0, P2_X_MAX] with residual(x) <= P2_BOUND, for a residual that never decreases as x grows
    (each rule here), found by bisection to within 1e-12."""
    lo, hi = 0.0, P2_X_MAX
    if not residual(lo) <= P2_BOUND < residual(hi):
        raise ValueError("the residual must stay within the bound at x = 0 and exceed it at P2_X_MAX")
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if residual(mid) <= P2_BOUND else (lo, mid)
    return lo


def _rank2_residual(x: float) -> float:
    return lowrank.rank_k_residual(lowrank.singular_values(_p2_matrix(x)), 2)


def p2_expected() -> float:
    return _largest_x(_rank2_residual)


def p2_mistakes() -> list[Mistake]:
    read_pieces = "Reread 'SVD: a matrix as a sum of rank-one pieces' in Know this."

    def in_order(x: float) -> float:  # M_2 taken as the first two diagonal entries, 1 and -4
        M = _p2_matrix(x)
        kept = np.zeros_like(M)
        kept[:2, :2] = M[:2, :2]
        return float(np.linalg.norm(M - kept))

    def plain_sum(x: float) -> float:  # the discarded singular values added instead of their squares
        return float(np.sum(lowrank.singular_values(_p2_matrix(x))[2:]))

    return [
        Mistake("in order", _largest_x(in_order),
                "you kept the first two diagonal entries in the order they are written (1 and -4); the best rank-2 "
                "approximation keeps the two largest singular values wherever they sit: 4 and 3 while x <= 3. " + read_pieces),
        Mistake("no sqrt", _largest_x(lambda x: _rank2_residual(x) ** 2),
                "you bounded the squared residual 1 + x² by 3.1; the residual itself, sqrt(1 + x²), must stay within "
                "3.1. " + READ_SVD),
        Mistake("plain sum", _largest_x(plain_sum),
                "you added the discarded singular values (1 + x); the Frobenius residual is the square root of the sum of "
                "their squares, sqrt(1 + x²). " + READ_SVD),
    ]


# --------------------------------------------------------------------------- P4: the update's size when r grows

# The lesson's plot draws x and B with N(0, 1) entries and A with N(0, 1/d) entries: the mean of ||xAB||^2 is
# m · r · var(B), so with var(B) = 1 it grows like r and plain LoRA's s = lora_alpha / r leaves 1/sqrt(r) (the printed
# slope -1/2). P4 changes the configuration the plot did not draw: B scaled by its own fan-in, var(B) = 1/r, so
# ||xAB|| no longer grows with r and only s's change is left. The student has to redo the plot's argument.
GROWTH = dict(lora_alpha=16, r_from=4, r_to=64)


def _rms_ratio(scale=lambda alpha, r: lora.scaling(alpha, r), b_var=lambda r: 1.0 / r) -> float:
    """The root-mean-square of ||s xAB|| at r_to over the same at r_from, for a scale rule ``scale(lora_alpha, r)`` and
    B's entry variance ``b_var(r)`` (the item's: 1/r), x ~ N(0, 1) and A ~ N(0, 1/d): mean ||xAB||^2 = m r var(B)."""
    a, r0, r1 = GROWTH["lora_alpha"], GROWTH["r_from"], GROWTH["r_to"]
    size = lambda r: math.sqrt(r * b_var(r))  # noqa: E731
    return scale(a, r1) * size(r1) / (scale(a, r0) * size(r0))


def growth_expected() -> float:
    return _rms_ratio()


def growth_mistakes() -> list[Mistake]:
    r0, r1 = GROWTH["r_from"], GROWTH["r_to"]
    return [
        Mistake("sqrt(r) growth kept", _rms_ratio(b_var=lambda r: 1.0),
                f"that is the plot's configuration, B with N(0, 1) entries, where ||xAB|| grows like sqrt(r). Here B's "
                f"entries have variance 1/r: the mean of ||xAB||^2 is m · r · var(B), the same at every r, so ||xAB|| "
                f"stays flat and only s = lora_alpha / r changes. " + READ_SCALE),
        Mistake("fixed s", _rms_ratio(scale=lambda alpha, r: alpha),
                f"that is how xAB changes with the scale held fixed, as if s were lora_alpha; s = lora_alpha / r "
                f"shrinks {r1 // r0} times from r = {r0} to r = {r1}. " + READ_SCALE),
        Mistake("std for variance", _rms_ratio(b_var=lambda r: 1.0 / r ** 2),
                "that takes 1/r as the standard deviation of B's entries; N(0, 1/r) names the variance, so the mean of "
                "||xAB||^2 = m · r · (1/r) stays flat instead of falling like 1/r. " + READ_SCALE),
        Mistake("s upside down", _rms_ratio(scale=lambda alpha, r: r / alpha),
                "s = lora_alpha / r is divided by r: a larger r gives a smaller s, not a larger one. " + READ_SCALE),
    ]


# --------------------------------------------------------------------------- P5: write the per-module patterns

# P5 is the inverse of reading a LoraConfig: the student writes the rank_pattern and alpha_pattern that give SmolLM2's
# adapters the ranks and scalings of a table, and the check builds that LoraConfig with PEFT itself, on a skeleton with
# SmolLM2-135M's module names, and reads r, lora_alpha and scaling off every adapter. No single run answers it; it takes
# the rules of 'Per-module ranks in PEFT': scaling = lora_alpha / r, so a new r needs a new lora_alpha to keep a scaling
# and a new scaling at the same r needs one too; a key is a regular expression that must match the end of a module's
# name, from its start or just after a dot; the first key that matches, in the dict's order, wins, so layer 1's
# exception must come before the key of its whole projection, in alpha_pattern as well, where layer 1 needs its default
# lora_alpha given back. tests/test_lesson03_items.py runs every mistaken variant the feedback names through PEFT.
P5 = dict(r=8, lora_alpha=16, targets=("q_proj", "v_proj", "up_proj"), layers=30, layer=1)
#: The table P5 asks for: (row, its projection (None: every target), in layer P5["layer"] (True) or outside it, r, scaling).
P5_ROWS = (
    ("q_proj outside layer 1", "q_proj", False, 8, 1.0),
    ("v_proj outside layer 1", "v_proj", False, 16, 2.0),
    ("up_proj outside layer 1", "up_proj", False, 32, 0.5),
    ("q_proj, v_proj and up_proj of layer 1", None, True, 4, 4.0),
)
# What a key may be. The grading process matches the student's keys (regular expressions) against module names with
# Python's re, which backtracks: a key such as "(.|.)*Z" tries every way to split a name, twice as long with each
# character (0.7 s on a 20-character name here, so some 25 minutes on model.layers.0.self_attn.q_proj). A key here
# repeats only single characters or classes (.*, \d+, [0-9]{1,2}), at most P5_MAX_REPEATS times, and has at most
# P5_MAX_CHOICES ways to split a name among its alternatives and optional parts: about a millisecond per match at worst
# (tests/test_lesson03_items.py times the worst keys allowed).
P5_MAX_KEYS = 12
P5_MAX_KEY_CHARS = 200
P5_MAX_REPEATS = 2
P5_MAX_CHOICES = 16
P5_MAX_RANK = 1024  # lora_A is r × 2 on the skeleton: a rank of 10**9 would take gigabytes
_P5_NAME = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")
_ATOMS = {"LITERAL", "NOT_LITERAL", "ANY", "IN", "CATEGORY"}


def _p5_skeleton():
    """A module named as SmolLM2-135M is when get_peft_model sees it (a LlamaForCausalLM: model.layers.N.self_attn.q_proj
    … model.layers.N.mlp.down_proj, N < 30), every projection a 2 → 2 Linear: only the names matter to rank_pattern and
    alpha_pattern (tests/test_lesson03_items.py checks them against a LlamaForCausalLM with SmolLM2-135M's config)."""
    from torch import nn

    def holder(names):
        m = nn.Module()
        for n in names:
            setattr(m, n, nn.Linear(2, 2, bias=False))
        return m

    layers = nn.ModuleList()
    for _ in range(P5["layers"]):
        layer = nn.Module()
        layer.self_attn = holder(("q_proj", "k_proj", "v_proj", "o_proj"))
        layer.mlp = holder(("gate_proj", "up_proj", "down_proj"))
        layers.append(layer)
    root, root.model = nn.Module(), nn.Module()
    root.model.layers = layers
    return root


def _regex_problem(key: str) -> str | None:
    """Why ``key`` is refused as a pattern key here (see P5_MAX_REPEATS), or None."""
    from re import _parser  # Python's own parser of regular expressions (sre_parse before 3.11)

    if len(key) > P5_MAX_KEY_CHARS:
        return f"is longer than {P5_MAX_KEY_CHARS} characters"
    try:
        re.compile(rf"(.*\.)?({key})$")  # what PEFT's get_pattern_key matches
        tree = _parser.parse(key)
    except (re.error, RecursionError, OverflowError, ValueError) as e:
        return f"is not a regular expression Python accepts ({e})"
    repeats, choices = 0, 1

    def walk(items) -> str | None:
        nonlocal repeats, choices
        for op, av in items:
            kind = str(op)
            if kind in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                low, high, body = av
                if high > 1:
                    repeats += 1
                    if len(body) != 1 or str(body[0][0]) not in _ATOMS:
                        return "repeats a group; repeat single characters or classes only (.*, \\d+, [0-9]+)"
                    continue
                choices *= 2 if low == 0 else 1
                why = walk(body)
            elif kind == "SUBPATTERN":
                why = walk(av[-1])
            elif kind == "ATOMIC_GROUP":
                why = walk(av)
            elif kind == "BRANCH":
                choices *= len(av[1])
                why = next((w for w in map(walk, av[1]) if w), None)
            elif kind in ("ASSERT", "ASSERT_NOT"):
                why = walk(av[1])
            elif kind in ("GROUPREF", "GROUPREF_EXISTS"):
                return "refers back to a group; a module name needs no backreference"
            else:
                why = None
            if why:
                return why
        return None

    why = walk(tree)
    if why:
        return why
    if repeats > P5_MAX_REPEATS:
        return f"repeats {repeats} times (.*, +, {{m,n}}); a module name needs at most {P5_MAX_REPEATS}"
    if choices > P5_MAX_CHOICES:
        return f"has {choices} ways to split a name among its alternatives and optional parts; at most {P5_MAX_CHOICES} are allowed here"
    return None


def _p5_form(answer: Any) -> tuple[dict, dict] | str:
    """The answer's rank_pattern and alpha_pattern (ranks as int, alphas as float, keys in the answer's order), or why
    it is not one."""
    shape = ("answer_p5 should be a dict with two entries, {'rank_pattern': {key: r, ...}, 'alpha_pattern': "
             "{key: lora_alpha, ...}}")
    if not isinstance(answer, Mapping):
        return f"{shape}; got {type(answer).__name__}."
    extra, missing = sorted(map(str, set(answer) - {"rank_pattern", "alpha_pattern"})), \
        [k for k in ("rank_pattern", "alpha_pattern") if k not in answer]
    if missing or extra:
        fixed = " (r, lora_alpha and target_modules are fixed by the question)" if set(extra) & {"r", "lora_alpha", "target_modules"} else ""
        return (f"{shape}; yours " + "; ".join(x for x in (f"has no {', '.join(missing)}" if missing else "",
                                                              f"also has {', '.join(extra)}" if extra else "") if x) + f"{fixed}.")
    out = []
    for which in ("rank_pattern", "alpha_pattern"):
        d = answer[which]
        if not isinstance(d, Mapping):
            return f"{which} should be a dict from key to {'r' if which == 'rank_pattern' else 'lora_alpha'}; got {type(d).__name__}."
        if len(d) > P5_MAX_KEYS:
            return f"{which} has {len(d)} keys; the table needs a few (at most {P5_MAX_KEYS} are read)."
        clean = {}
        for k, v in d.items():
            if not isinstance(k, str):
                return f"{which}'s key {k!r} is not a string: keys are module names or regular expressions."
            why = _regex_problem(k)
            if why:
                return f"{which}'s key {k[:80]!r} {why}."
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                return f"{which}[{k!r}] should be a number; got {type(v).__name__}."
            if which == "rank_pattern":
                if not float(v).is_integer() or isinstance(v, (float, np.floating)):
                    return f"rank_pattern[{k!r}] = {v!r}: a rank is a whole number (an int), the width r of the adapter."
                if not 1 <= v <= P5_MAX_RANK:
                    return f"rank_pattern[{k!r}] = {v!r}: a rank here is a whole number from 1 to {P5_MAX_RANK}."
                clean[k] = int(v)
            else:
                if not math.isfinite(float(v)):
                    return f"alpha_pattern[{k!r}] = {v!r}: lora_alpha must be a finite number."
                clean[k] = float(v)
        out.append(clean)
    return out[0], out[1]


def p5_build(rank_pattern: Mapping[str, int], alpha_pattern: Mapping[str, float]) -> tuple[dict, list[str]]:
    """Build ``LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], rank_pattern=...,
    alpha_pattern=...)`` with PEFT on :func:`_p5_skeleton` and read every adapter: ``{name: (r, lora_alpha, scaling)}``
    in the model's order, and the texts of the warnings PEFT gave. Global torch RNG state, warnings and stderr are left
    as they were (the check also runs in the student's notebook). Raises what PEFT raises."""
    import contextlib
    import io
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(record=True) as caught, \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("always")
        config = LoraConfig(r=P5["r"], lora_alpha=P5["lora_alpha"], target_modules=list(P5["targets"]),
                            rank_pattern=dict(rank_pattern), alpha_pattern=dict(alpha_pattern))
        model = get_peft_model(_p5_skeleton(), config)
    table = {name: (int(m.r["default"]), float(m.lora_alpha["default"]), float(m.scaling["default"]))
             for name, m in model.base_model.model.named_modules()
             if isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling}
    return table, [str(w.message) for w in caught if "pattern" in str(w.message)]


def _p5_row(name: str) -> int | None:
    """The row of P5_ROWS an adapter belongs to."""
    m = _P5_NAME.match(name)
    if not m:
        return None
    in_layer, proj = int(m.group(1)) == P5["layer"], m.group(2)
    return next((i for i, (_, p, special, _, _) in enumerate(P5_ROWS)
                 if special == in_layer and (p is None or p == proj)), None)


def _layers_text(layers: Sequence[int]) -> str:
    """[10, 11, ..., 19] → 'layers 10–19'; [2, 5] → 'layers 2 and 5'."""
    layers = sorted(set(layers))
    runs, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}–{a}")
            start = b
    return ("layer " if len(layers) == 1 else "layers ") + (", ".join(runs[:-1]) + " and " + runs[-1] if len(runs) > 1 else runs[0])


def _p5_diagnose(table: dict, patterns: dict) -> list[tuple[str, str]]:
    """The known mistakes (label, message) that explain the wrong adapters of ``table`` (see p5_build), read off which
    key of ``patterns`` ({"rank_pattern": ..., "alpha_pattern": ...}) PEFT applied to each, with PEFT's own
    get_pattern_key. Each label is the mistaken variant of tests/test_lesson03_items.py that produces it."""
    from peft.utils.other import get_pattern_key

    seen: dict[tuple[str, str], bool] = {}

    def matches(k: str, name: str) -> bool:
        if (k, name) not in seen:
            seen[k, name] = re.match(rf"(.*\.)?({k})$", name) is not None
        return seen[k, name]

    def key_of(which: str, name: str) -> str | None:
        k = get_pattern_key(list(patterns[which]), name)
        return k if k in patterns[which] and matches(k, name) else None

    names = [n for n in table if _p5_row(n) is not None]
    last = len(P5_ROWS) - 1
    special = [n for n in names if _p5_row(n) == last]
    others = [n for n in names if _p5_row(n) != last]
    general = lambda k: any(matches(k, n) for n in others)  # noqa: E731  (the key reaches beyond layer 1)
    what = {"rank_pattern": "r", "alpha_pattern": "lora_alpha"}

    def lost(which: str) -> list[str]:  # the keys that match no adapter: PEFT warns that it ignored them
        return [x for x in patterns[which] if not any(matches(x, n) for n in names)]

    def nothing(which: str, key: str, name: str, value: float) -> str:
        return (f"your {which} key '{key}' matches no module (PEFT warns that it ignored it), so {name} gets "
                f"{what[which]} {value:g}. A key must match the end of a module's name, from its start or just after a "
                f"dot (PEFT tries re.match(rf\"(.*\\.)?({{key}})$\", name)): a beginning such as 'layers.1' matches "
                f"nothing, nor does 'attn.v_proj' (the name ends in 'self_attn.v_proj'), and '^' ties the key to the "
                f"start of the full name, 'model.layers.…'. " + READ_PATTERN)

    found: dict[str, str] = {}
    wide: dict[tuple[str, str], list[int]] = {}
    for name in names:
        _, _, in_layer, r_want, s_want = P5_ROWS[_p5_row(name)]
        r, alpha, s = table[name]
        if r == r_want and math.isclose(s, s_want, rel_tol=1e-9):
            continue
        which = "rank_pattern" if r != r_want else "alpha_pattern"
        k = key_of(which, name)
        value = r if which == "rank_pattern" else alpha
        if which == "alpha_pattern" and alpha == s_want != s_want * r_want:
            found.setdefault("alpha as scaling", (
                f"{name} has lora_alpha {alpha:g}, the scaling its row wants, so its scaling is {alpha:g} / {r} = {s:g}: "
                f"PEFT computes scaling = lora_alpha / r, so lora_alpha must be the scaling times r. " + READ_SCALE))
            continue
        if not in_layer:
            # a key meant for layer 1 that reaches this layer too: it matches layer 1, and not every module of this projection
            suffix = "." + name.rsplit(".", 1)[1]
            for w in ("rank_pattern", "alpha_pattern"):
                kw = key_of(w, name)
                if (kw is not None and any(matches(kw, n) for n in special)
                        and not all(matches(kw, n) for n in others if n.endswith(suffix))):
                    wide.setdefault((w, kw), []).append(int(_P5_NAME.match(name).group(1)))
                    break
            else:
                if k is None and lost(which):
                    found.setdefault("key matches nothing", nothing(which, lost(which)[0], name, value))
                elif which == "alpha_pattern" and k is None:
                    found.setdefault("no alpha", (
                        f"{name} keeps the default lora_alpha {P5['lora_alpha']:g} (no alpha_pattern key matches it), so "
                        f"its scaling is {alpha:g} / {r} = {s:g}: rank_pattern sets r alone, and scaling = lora_alpha / r. "
                        f"A row whose scaling is not {P5['lora_alpha']:g} / r needs an alpha_pattern key as well. " + READ_PATTERN))
            continue
        # layer 1: a key for its whole projection first, a key meant for it that matches nothing, or its lora_alpha not given back
        keys = list(patterns[which])
        later = [x for x in keys[keys.index(k) + 1:] if matches(x, name) and not general(x)] if k is not None else []
        lost1 = sorted(lost(which), key=lambda x: "1" not in x)  # a key that names layer 1 first
        if k is not None and general(k) and later:
            found.setdefault("general key first", (
                f"{name} takes {what[which]} {value:g} from your {which} key '{k}', which comes before '{later[0]}', the "
                f"key you meant for layer 1: PEFT gives a module the first key that matches it, in the dict's order, so "
                f"the key for layer 1 must come before the key for its whole projection. " + READ_PATTERN))
        elif lost1:
            found.setdefault("key matches nothing", nothing(which, lost1[0], name, value))
        elif which == "alpha_pattern" and k is not None and general(k):
            found.setdefault("alpha not given back", (
                f"{name} takes lora_alpha {alpha:g} from your alpha_pattern key '{k}', meant for the other layers, so its "
                f"scaling is {alpha:g} / {r} = {s:g}. A module whose name a key matches loses the default lora_alpha "
                f"{P5['lora_alpha']:g}: give layer 1 an alpha_pattern key of its own, before '{k}'. " + READ_PATTERN))
    for (which, k), layers in wide.items():
        found.setdefault("too wide", (
            f"your {which} key '{k}', meant for layer 1, also matches {_layers_text(layers)}: a key is a regular "
            f"expression, where '.' is any character and '.*' any run of them. Escape a dot you mean literally (\\.) or give the names in full. " + READ_PATTERN))
    order = ("too wide", "key matches nothing", "general key first", "alpha not given back", "no alpha", "alpha as scaling")
    return [(label, found[label]) for label in order if label in found]


def p5_check(answer: Any, points: float) -> Feedback:
    """P5's check: build the answer's LoraConfig with PEFT (p5_build), compare every adapter's r and scaling with its
    row of P5_ROWS (a row right: points / 4), and name the known mistakes behind the wrong ones."""
    form = _p5_form(answer)
    if isinstance(form, str):
        return Feedback(0, points, [form])
    rank_pattern, alpha_pattern = form
    try:
        table, warned = p5_build(rank_pattern, alpha_pattern)
    except Exception as e:  # noqa: BLE001  (whatever PEFT refuses, the student is told)
        return Feedback(0, points, [f"PEFT could not build this config: {type(e).__name__}: {str(e)[:300]}"])
    lines, right = [], 0
    for i, (label, _, _, r_want, s_want) in enumerate(P5_ROWS):
        members = [n for n in table if _p5_row(n) == i]
        wrong = [n for n in members if not (table[n][0] == r_want and math.isclose(table[n][2], s_want, rel_tol=1e-9))]
        if not wrong:
            right += 1
            lines.append(f"✓ {label} ({len(members)} adapters): r {r_want}, scaling {s_want:g}")
        else:
            r, alpha, s = table[wrong[0]]
            lines.append(f"✗ {label}: wanted r {r_want}, scaling {s_want:g}; {len(wrong)} of {len(members)} adapters "
                         f"differ, e.g. {wrong[0]}: r {r}, lora_alpha {alpha:g}, scaling {s:g}")
    named = _p5_diagnose(table, {"rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern})
    lines += [f"Likely mistake: {msg}" for _, msg in named] + [f"PEFT warned: {w}" for w in warned]
    credit = f"{right} of {len(P5_ROWS)} rows right, {points / len(P5_ROWS):g} points each" if 0 < right < len(P5_ROWS) else ""
    return Feedback(points * right / len(P5_ROWS), points, lines, credit=credit, mistakes=[label for label, _ in named])


@dataclass
class PatternConfig(Array):
    """P5: a value item whose answer is a config ({"rank_pattern": ..., "alpha_pattern": ...}), not an array: scored
    by building it with PEFT (p5_check). An Array, so that the grader handles it as data: a value, never code."""

    name: str = "answer_p5"
    expected: Callable[[], Any] = lambda: P5_ROWS

    def check(self, answer: Any, ctx: Any) -> Feedback:
        fb = p5_check(answer, self.points or 1)
        if not isinstance(_p5_form(answer), str):  # a well-formed config (a str is the message on its form)
            point_to_section(fb, self.reread)
        return fb if self.points else formative(fb)


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
        f"the largest x >= 0 for which the best rank-2 approximation of diag({', '.join(f'{v:g}' for v in P2_DIAG)}, x) "
        f"leaves a Frobenius residual of at most {P2_BOUND}",
        1,
        name="x",
        expected=p2_expected,
        rtol=1e-4,
        mistakes=p2_mistakes,
        reread=READ_SVD,
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
        reread=READ_SCALE,
    ),
    "p5": PatternConfig(
        "the rank_pattern and alpha_pattern that give SmolLM2's q_proj, v_proj and up_proj adapters the ranks and "
        "scalings of the table",
        2,
        reread=READ_PATTERN,
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
