"""Comparing two models scored on the same tickets: paired tests, not overlapping intervals.

Two accuracies measured on the same n tickets are not independent: most tickets are right (or wrong) for both
models, and only the tickets where the two disagree carry information about which is better. Whether two
separate 95 % intervals overlap answers a different question, and gets this one wrong both ways: intervals can
overlap while one model is right on every ticket where they disagree, and two intervals that miss each other
can come from a difference that rests on a few clusters of tickets (a few symptoms), which an interval that
resamples whole clusters finds weak.

* :func:`mcnemar_exact`: McNemar's test in its exact form. Of the d discordant tickets, b are right only for
  model A and c only for model B; if the models were equally good, each discordant ticket would fall either way
  with probability 1/2, so b ~ Binomial(d, 1/2). The two-sided p-value is min(1, 2 · P(X ≤ min(b, c))) (McNemar
  1947, "Note on the sampling error of the difference between correlated proportions or percentages",
  Psychometrika 12:153; the exact binomial form, Fagerland, Lydersen and Laake 2013, "The McNemar test for binary
  matched-pairs data", BMC Medical Research Methodology 13:91).
* :func:`paired_bootstrap_interval`: a percentile interval of the difference acc(A) − acc(B) that resamples whole
  groups (the tickets of one symptom) with both models' answers on them, so that it is paired and clustered at
  once (Efron and Tibshirani, "An Introduction to the Bootstrap", 1993). McNemar's test assumes independent
  tickets; three phrasings of one symptom are not, so the clustered interval is the more cautious of the two.
* :func:`paired_loss_interval`: the same resampling for a mean loss instead of an accuracy: the difference of two
  models' token-weighted mean losses (nats per token) on the same tickets, whole groups resampled with both
  models' losses on them.
* :func:`compare`: both, and a verdict. A direction is stated only when both agree: McNemar's p below ``alpha``
  and a clustered interval that excludes 0. Otherwise the comparison cannot tell the two apart at this n.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

__all__ = ["MIN_GROUPS", "mcnemar_exact", "paired_bootstrap_interval", "paired_loss_interval", "correct_by_id", "compare",
           "describe"]

#: Fewest groups (symptoms, or tickets when ungrouped) for which :func:`compare` states a direction. A bootstrap
#: that resamples a handful of clusters has only a handful of distinct replicates, and its interval is too narrow
#: (with one cluster it has zero width); below this count the comparison reports its numbers and no verdict.
MIN_GROUPS = 10


def _as_bools(name: str, values: Sequence[Any]) -> list[bool]:
    if values is None:
        raise TypeError(f"{name} must be a sequence of booleans, got None")
    out = list(values)
    if not all(isinstance(v, (bool, np.bool_)) or v in (0, 1) for v in out):
        raise ValueError(f"{name} must hold booleans (right or wrong per ticket)")
    return [bool(v) for v in out]


def mcnemar_exact(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> dict[str, Any]:
    """McNemar's exact test on paired right/wrong outcomes of two models on the same items.

    a_correct, b_correct: one bool per item, in the same item order (length n ≥ 1).
    Returns ``{"n", "a_only", "b_only", "p_value"}``: a_only counts items right for A and wrong for B, b_only the
    reverse; p_value is the two-sided exact binomial p of a_only among the a_only + b_only discordant items under
    p = 1/2 (1.0 when there are none). Raises ValueError for unequal lengths, no items or non-boolean values."""
    a, b = _as_bools("a_correct", a_correct), _as_bools("b_correct", b_correct)
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same items for both models and at least one; got {len(a)} and {len(b)}")
    a_only = sum(x and not y for x, y in zip(a, b))
    b_only = sum(y and not x for x, y in zip(a, b))
    d = a_only + b_only
    tail = sum(math.comb(d, i) for i in range(min(a_only, b_only) + 1)) / 2 ** d  # 1 when d = 0: p = 1
    return {"n": len(a), "a_only": a_only, "b_only": b_only, "p_value": min(1.0, 2 * tail)}


def paired_bootstrap_interval(a_correct: Sequence[bool], b_correct: Sequence[bool], groups: Sequence[Any],
                              n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of acc(A) − acc(B) (a fraction in [−1, 1]) resampling whole groups.

    Each of ``n_boot`` replicates draws as many groups as there are, with replacement, keeps both models' answers
    on every item of a drawn group, and takes the difference of the two accuracies over those items.
    Deterministic for a ``seed``. Raises TypeError for groups None (pass the item ids to resample single items), and
    ValueError for unequal lengths, no items, a level outside (0, 1) or an n_boot that is not a positive integer."""
    a, b = _as_bools("a_correct", a_correct), _as_bools("b_correct", b_correct)
    if groups is None:
        raise TypeError("groups must give one group per item (pass the item ids to resample single items), got None")
    groups = list(groups)
    if not (len(a) == len(b) == len(groups)) or not a:
        raise ValueError(f"need one group per item, the same items for both models and at least one; got "
                         f"{len(a)}, {len(b)} and {len(groups)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if isinstance(n_boot, (bool, np.bool_)) or not isinstance(n_boot, numbers.Integral) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    n_boot = int(n_boot)
    index = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    diff = np.zeros(len(index))
    size = np.zeros(len(index))
    for x, y, g in zip(a, b, groups):
        diff[index[g]] += int(x) - int(y)
        size[index[g]] += 1
    draws = np.random.default_rng(seed).integers(0, len(index), size=(n_boot, len(index)))
    boot = diff[draws].sum(axis=1) / size[draws].sum(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def paired_loss_interval(a_loss: Sequence[float], b_loss: Sequence[float], tokens: Sequence[int], groups: Sequence[Any],
                         n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean loss(A) − mean loss(B) (nats per token) resampling whole groups.

    a_loss, b_loss: each item's summed next-token loss (nats) under models A and B, on the same items in the same
    order; tokens: the number of tokens each item's sums run over (the same tokens for both models, ≥ 1); groups: one
    group per item (the items themselves for an unclustered interval). The mean loss over a set of items is
    Σ loss / Σ tokens (token-weighted, as perplexity is), so the difference is Σ (a − b) / Σ tokens. Each of
    ``n_boot`` replicates draws as many groups as there are, with replacement, and recomputes that ratio over the
    drawn groups' items (Efron and Tibshirani, "An Introduction to the Bootstrap", 1993; the ratio of sums is their
    ratio estimator). Deterministic for a ``seed``. Raises TypeError for groups None, and ValueError for unequal
    lengths, no items, a non-finite loss, a token count below 1, a level outside (0, 1) or an n_boot that is not a
    positive integer."""
    if groups is None:
        raise TypeError("groups must give one group per item (pass the item ids to resample single items), got None")
    a, b = np.asarray(a_loss, dtype=np.float64).reshape(-1), np.asarray(b_loss, dtype=np.float64).reshape(-1)
    n = np.asarray(tokens, dtype=np.float64).reshape(-1)
    groups = list(groups)
    if not (a.size == b.size == n.size == len(groups)) or a.size == 0:
        raise ValueError(f"need one loss per item for both models, one token count and one group per item, and at least "
                         f"one item; got {a.size}, {b.size}, {n.size} and {len(groups)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a loss is NaN or infinite; a summed next-token loss is a finite number of nats")
    if not (n >= 1).all() or not (n == np.round(n)).all():
        raise ValueError("every item's token count must be a whole number ≥ 1 (the tokens its loss sums over)")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if isinstance(n_boot, (bool, np.bool_)) or not isinstance(n_boot, numbers.Integral) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    index = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    at = np.array([index[g] for g in groups])
    diff = np.bincount(at, weights=a - b, minlength=len(index))
    size = np.bincount(at, weights=n, minlength=len(index))
    draws = np.random.default_rng(seed).integers(0, len(index), size=(int(n_boot), len(index)))
    boot = diff[draws].sum(axis=1) / size[draws].sum(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def correct_by_id(result: dict[str, Any]) -> dict[str, bool]:
    """``{ticket id: right?}`` from a result of :func:`coursekit.evaluate.evaluate`. Raises ValueError when a ticket
    id occurs twice (two answers for one ticket cannot be paired)."""
    out = {p["id"]: p["pred"] == p["label"] for p in result["predictions"]}
    if len(out) != len(result["predictions"]):
        raise ValueError(f"{len(result['predictions']) - len(out)} ticket ids occur more than once in the predictions")
    return out


def compare(a: dict[str, Any], b: dict[str, Any], groups: dict[str, Any] | None = None, alpha: float = 0.05,
            n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Paired comparison of two results (:func:`coursekit.evaluate.evaluate`) on the same tickets.

    groups: ``{ticket id: group}`` (e.g. the symptom) for the clustered interval; None treats every ticket as its
    own group. Returns ``{"n", "difference" (acc A − acc B, a fraction), "a_only", "b_only", "p_value",
    "interval" (clustered bootstrap interval of the difference at level 1 − alpha), "grouped" (whether ``groups``
    was given), "n_groups" (how many groups the interval resampled), "winner"}`` where winner is ``"a"`` or ``"b"`` only
    when McNemar's p < alpha, the interval excludes 0 and there are at least :data:`MIN_GROUPS` groups, else
    ``None`` (cannot tell apart). Raises ValueError when the two results are not on the same tickets (other ids, or
    one ticket with two different true labels), a ticket has no group, or alpha is outside (0, 1)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    ca, cb = correct_by_id(a), correct_by_id(b)
    if set(ca) != set(cb):
        raise ValueError(f"the two results are not on the same tickets ({len(ca)} and {len(cb)} ids, "
                         f"{len(set(ca) ^ set(cb))} in only one)")
    la = {p["id"]: p["label"] for p in a["predictions"]}
    lb = {p["id"]: p["label"] for p in b["predictions"]}
    clash = [i for i in la if la[i] != lb[i]]
    if clash:
        raise ValueError(f"the two results give {len(clash)} tickets different true labels, e.g. {clash[0]!r}: "
                         f"{la[clash[0]]!r} and {lb[clash[0]]!r}; they are not the same tickets")
    ids = list(ca)
    if groups is not None:
        lost = [i for i in ids if i not in groups]
        if lost:
            raise ValueError(f"{len(lost)} tickets have no group, e.g. {lost[0]!r}")
    x, y = [ca[i] for i in ids], [cb[i] for i in ids]
    test = mcnemar_exact(x, y)
    grouping = [groups[i] for i in ids] if groups is not None else ids
    lo, hi = paired_bootstrap_interval(x, y, grouping, n_boot=n_boot, level=1 - alpha, seed=seed)
    n_groups = len(set(grouping))
    winner = None
    if test["p_value"] < alpha and (lo > 0 or hi < 0) and n_groups >= MIN_GROUPS:
        winner = "a" if lo > 0 else "b"
    return {**test, "difference": (sum(x) - sum(y)) / len(ids), "interval": [lo, hi], "grouped": groups is not None,
            "n_groups": n_groups, "winner": winner}


def describe(comparison: dict[str, Any], name_a: str, name_b: str) -> str:
    """One sentence that reads a :func:`compare` result: the discordant counts, the p-value, the clustered interval
    in percentage points (what it resampled: whole symptoms, or single tickets when ungrouped), and the verdict (a
    direction only where :func:`compare` found one; with fewer than :data:`MIN_GROUPS` groups it says why not)."""
    c = comparison
    lo, hi = (100 * v for v in c["interval"])
    unit = "whole symptoms" if c.get("grouped", True) else "tickets"
    head = (f"{name_a} vs {name_b}, {c['n']} tickets: {100 * c['difference']:+.1f} points; right only for {name_a} on "
            f"{c['a_only']}, only for {name_b} on {c['b_only']} (McNemar exact p = {c['p_value']:.2g}); "
            f"interval resampling {unit} [{lo:+.1f}, {hi:+.1f}]: ")
    if c["winner"] == "a":
        return head + f"{name_a} is better."
    if c["winner"] == "b":
        return head + f"{name_b} is better."
    if c.get("n_groups", MIN_GROUPS) < MIN_GROUPS:
        return head + (f"only {c['n_groups']} {'symptoms' if c.get('grouped', True) else 'tickets'}, too few to resample "
                       f"(at least {MIN_GROUPS}): no verdict.")
    return head + "this test cannot tell them apart."
