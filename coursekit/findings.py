"""Sentences lesson 19 prints from its own results, each with its direction chosen by the numbers.

A lesson that states a result in typed prose is right only on the machine it was written on. These functions
read the results of a run (``coursekit.capstone``) and return the sentences, so that a student's run, or another
CPU, gets the sentences its own numbers support. Every function takes plain result dicts and returns a list of
strings; nothing here computes a model.
"""

from __future__ import annotations

from typing import Any

from . import data as cdata
from .paired import mcnemar_exact

__all__ = ["search_findings", "few_shot_bias", "peak_difference", "cue_words", "merge_findings", "merge_paired_findings"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _top_share(result: dict[str, Any]) -> tuple[str, float]:
    """The most predicted label of a result and the share of tickets it takes."""
    preds = [p["pred"] for p in result["predictions"]]
    top = max(dict.fromkeys(preds), key=preds.count)
    return top, preds.count(top) / len(preds)


def _effect(search: dict[str, dict[str, dict]], rule: str, against: str) -> tuple[float, int, int]:
    """Mean accuracy change (fraction) from reading ``against`` to reading ``rule`` over the layouts, and in how many
    layouts it rose and fell."""
    d = [by[rule]["accuracy"] - by[against]["accuracy"] for by in search.values()]
    return _mean(d), sum(x > 0 for x in d), sum(x < 0 for x in d)


def _paired(search: dict[str, dict[str, dict]], rule: str, against: str) -> str:
    """In how many layouts McNemar's exact test (``paired.mcnemar_exact``) on the same tickets, matched by id, gives
    p < 0.05 for reading ``rule`` against reading ``against``. Raises ValueError when the two results of a layout
    hold different tickets."""
    hits, n = 0, 0
    for layout, by in search.items():
        right = [{p["id"]: p["pred"] == p["label"] for p in by[r]["predictions"]} for r in (rule, against)]
        if set(right[0]) != set(right[1]):
            raise ValueError(f"{layout}: {rule} and {against} were scored on different tickets")
        ids = sorted(right[0])
        n = len(ids)
        hits += mcnemar_exact([right[0][i] for i in ids], [right[1][i] for i in ids])["p_value"] < 0.05
    return (f"McNemar's exact test on the same {n} tickets gives p < 0.05 in {hits} of {len(search)} layout"
            f"{'s' * (len(search) != 1)}")


def _direction(mean: float, up: int, down: int, n: int) -> str:
    if up == down == 0:
        return "left accuracy unchanged in every layout"
    if up == n:
        return f"raised accuracy in every layout (by {100 * mean:.1f} points on average)"
    if down == n:
        return f"lowered accuracy in every layout (by {100 * -mean:.1f} points on average)"
    same = n - up - down
    return (f"raised accuracy in {up} of {n} layouts and lowered it in {down}"
            + (f", leaving {same} unchanged" if same else "") + f" ({100 * mean:+.1f} points on average)")


def search_findings(search: dict[str, dict[str, dict]], layout_names: dict[str, str], rule_names: dict[str, str],
                    chosen: tuple[str, str]) -> list[str]:
    """What the baseline search (``coursekit.capstone.prompt_search``: ``{layout: {rule: result}}``) found: the
    generation readings, the effect of each reading of label scoring against the plain sum over the label and the
    end-of-turn token (with how many layouts' McNemar exact test on the same tickets gives p < 0.05; it counts the
    tickets as independent, so it is, if anything, too ready to find a difference), and the chosen pair with its n and
    95 % Wilson interval. Raises ValueError for an empty search
    or a result without predictions, and KeyError when a layout lacks one of the rules ``generate``, ``with_end``,
    ``label_only``, ``label_mean``, ``calibrated``."""
    if not search:
        raise ValueError("the search holds no layouts: nothing to report")
    empty = [(layout, rule) for layout, by in search.items() for rule in rule_names
             if rule in by and not by[rule].get("predictions")]
    if empty:
        raise ValueError(f"{empty[0][0]}, {empty[0][1]}: a result with no predictions (n = 0) has no accuracy to report")
    n_layouts = len(search)
    out = []
    gen = {layout: by["generate"] for layout, by in search.items()}
    as_label = {layout: sum(p["pred"] in cdata.LABELS for p in r["predictions"]) / r["n"] for layout, r in gen.items()}
    out.append("generation: " + "; ".join(f"{layout_names[layout]} {_pct(r['accuracy'])} right, "
                                          f"{_pct(as_label[layout])} of first words a label"
                                          for layout, r in gen.items()) + ".")
    tops = {layout: _top_share(by["with_end"]) for layout, by in search.items()}
    tops_only = {layout: _top_share(by["label_only"]) for layout, by in search.items()}
    out.append("with the end-of-turn token scored, the most predicted label takes "
               + ", ".join(f"{_pct(share)} ({label})" for label, share in tops.values())
               + f" of the tickets in the table's {n_layouts} rows, in order; without it "
               + ", ".join(f"{_pct(share)} ({label})" for label, share in tops_only.values()) + ".")
    for rule, what in (("label_only", "dropping the end-of-turn token"),
                       ("label_mean", "dividing the label-only score by the label's number of tokens"),
                       ("calibrated", "subtracting the label-only scores after a content-free ticket")):
        against = "with_end" if rule == "label_only" else "label_only"
        mean, up, down = _effect(search, rule, against)
        base = "label + end" if rule == "label_only" else "label only"
        out.append(f"{what} ({rule_names[rule]} against {base}) {_direction(mean, up, down, n_layouts)}; "
                   f"{_paired(search, rule, against)}.")
    layout, rule = chosen
    best = search[layout][rule]
    lo, hi = best["interval"]
    out.append(f"best on the {best['n']} training tickets: {layout_names[layout]}, {rule_names[rule]}, "
               f"{_pct(best['accuracy'])} [{100 * lo:.1f}, {100 * hi:.1f}].")
    return out


def few_shot_bias(result: dict[str, Any], last_shot_label: str) -> str:
    """One sentence on a few-shot generation result: how many answers (read by their first word) are the most common
    one, and whether that is also the label of the last solved ticket in the prompt. It states the coincidence, not
    its cause: the same answer could be the model's own preference (Zhao et al. 2021 separate the two by
    reordering the examples)."""
    answers = [p["pred"] for p in result["predictions"]]
    common = max(dict.fromkeys(answers), key=answers.count)
    return (f"{answers.count(common)} of {len(answers)} few-shot answers are {common!r}; the last solved ticket in the "
            f"prompt is a {last_shot_label!r} ticket" + (", the same label." if common == last_shot_label else "."))


def peak_difference(qlora_mb: float, lora_mb: float) -> str:
    """One sentence comparing the two peaks of resident memory (MB), with the direction the numbers give."""
    diff = lora_mb - qlora_mb
    if diff == 0:
        return "QLoRA's peak equals LoRA's on bf16."
    return (f"QLoRA's peak is {abs(diff):.0f} MB {'lower' if diff > 0 else 'higher'} than LoRA's on bf16 "
            f"({100 * abs(diff) / lora_mb:.1f} % of it).")


def cue_words(named: dict[str, tuple[int, int]], right: dict[str, tuple[int, int]],
              intervals: dict[str, tuple[float, float]] | None = None) -> list[str]:
    """Which categories fail on unseen symptoms, beside how often their training symptoms name them.

    named: ``{label: (training symptoms containing the label's word, training symptoms)}``; right: ``{label: (right
    unseen-symptom tickets, tickets)}``; intervals (optional): ``{label: (low, high)}``, a 95 % interval of each
    category's accuracy as fractions (lesson 19 takes the wider of ``evaluate.cluster_bootstrap_interval``, resampling
    whole symptoms, and ``evaluate.wilson_interval``).
    Returns the weakest and the strongest category, each with its word count (and interval), and the categories
    whose every training symptom names them. It does not compare the two intervals: whether two intervals overlap
    is not a test of their difference (Schenker and Gentleman, "On judging the significance of differences by
    examining the overlap between confidence intervals", The American Statistician, 2001), and the two were picked
    from all the categories after looking. Raises ValueError for different label sets or an interval that does not hold
    its category's accuracy."""
    if set(named) != set(right) or not named or (intervals is not None and set(intervals) != set(right)):
        raise ValueError(f"need the same labels in each, got {sorted(named)} and {sorted(right)}"
                         + ("" if intervals is None else f" and {sorted(intervals)}"))
    share = {k: r / n for k, (r, n) in right.items()}
    bad = [k for k, (lo, hi) in (intervals or {}).items() if not lo - 1e-12 <= share[k] <= hi + 1e-12]
    if bad:
        raise ValueError(f"{bad[0]}: the interval {intervals[bad[0]]} does not hold its accuracy {share[bad[0]]:.3f}")
    worst, best = min(share, key=share.get), max(share, key=share.get)

    def ci(label: str) -> str:
        lo, hi = intervals[label]
        return f", [{100 * lo:.1f}, {100 * hi:.1f}] %"

    def one(label: str) -> str:
        (r, n), (k, m) = right[label], named[label]
        return f"{label} ({r} of {n} right{ci(label) if intervals else ''}; its word in {k} of {m} training symptoms)"

    out = [f"weakest on unseen symptoms: {one(worst)}; strongest: {one(best)}."]
    always = [k for k, (c, m) in named.items() if c == m]
    if always:
        out.append("named by every training symptom: " + ", ".join(
            f"{k} ({right[k][0]} of {right[k][1]} right)" for k in always) + ".")
    return out


def merge_findings(merge: dict[str, Any]) -> list[str]:
    """What ``coursekit.capstone.merge_comparison`` measured, read in three sentences: the NF4 merge (codes changed,
    no-label answers, the untrained base's first token), and which 16-bit merge stays closer to the trained
    function by label agreement and by mean logit difference (saying so when the two measures disagree)."""
    names = list(merge["merges"])
    w16, dq, nf4 = (merge["merges"][n] for n in names[:3])
    out = [f"into NF4: {100 * merge['nf4_codes_changed']:.4f} % of the 4-bit codes changed; the merged model gives no "
           f"label on {_pct(nf4['no_label'])} of the tickets and the untrained base's first token on "
           f"{_pct(nf4['same_token_as_base'])}, and agrees with the trained function on {_pct(nf4['agreement'])}."]
    for name, r in ((names[0], w16), (names[1], dq)):
        out.append(f"{name}: the same label as the trained function on {_pct(r['agreement'])} of the tickets, mean "
                   f"|Δlogit| {r['mean_abs_diff']:.3f}.")
    by_agree = names[1] if dq["agreement"] > w16["agreement"] else names[0] if w16["agreement"] > dq["agreement"] else None
    by_logit = names[1] if dq["mean_abs_diff"] < w16["mean_abs_diff"] else names[0]
    if by_agree in (None, by_logit):
        ratio = max(w16["mean_abs_diff"], dq["mean_abs_diff"]) / max(min(w16["mean_abs_diff"], dq["mean_abs_diff"]), 1e-12)
        out.append(f"closer to the trained function: {by_logit} (its logits move {ratio:.1f} times less"
                   + (", and as many labels agree)." if by_agree is None else ", and more labels agree)."))
    else:
        out.append(f"the two measures disagree: {by_agree} keeps more labels, {by_logit} moves the logits less.")
    return out


def _acc(r: dict[str, Any]) -> str:
    lo, hi = r["interval"]
    return f"{100 * r['accuracy']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def merge_paired_findings(merge: dict[str, Any]) -> list[str]:
    """Each merged model of ``coursekit.capstone.merge_comparison`` against the trained function, read from its paired
    test on the same tickets (``row["paired"]``, ``coursekit.paired.compare`` with the merge as A and the trained
    function as B): its accuracy with n and Wilson interval, the tickets it loses (right only for the trained function)
    and gains (right only for the merge), McNemar's exact p, and the verdict: a direction only where ``compare``
    names a winner (McNemar's p and the interval resampling whole symptoms agree), otherwise that this test cannot
    tell the two apart, with the share of tickets the merge still answers differently."""
    ref = merge["reference"]
    out = [f"the trained function: {_acc(ref)} on {ref['n']} tickets (95 % Wilson interval)."]
    for name, r in merge["merges"].items():
        c = r["paired"]
        lost, gained = c["b_only"], c["a_only"]
        lo, hi = (100 * v for v in c["interval"])
        head = (f"{name}: {_acc(r)} on {r['n']}; it loses {lost} ticket{'s' * (lost != 1)} the trained function got "
                f"right and gains {gained} (McNemar exact p = {c['p_value']:.2g}; interval resampling whole symptoms "
                f"[{lo:+.1f}, {hi:+.1f}] points): ")
        if c["winner"] == "b":
            out.append(head + "worse than the trained function; the test and the interval agree.")
        elif c["winner"] == "a":
            out.append(head + "better than the trained function; the test and the interval agree.")
        elif lost == gained == 0:
            out.append(head + "right on exactly the tickets the trained function gets right"
                       + ("." if r["agreement"] == 1 else f", though it answers {_pct(1 - r['agreement'])} of them "
                                                          f"with another label."))
        else:
            out.append(head + "this test cannot tell it from the trained function"
                       + ("." if r["agreement"] == 1 else f", though it answers {_pct(1 - r['agreement'])} of the "
                                                          f"tickets with another label."))
    return out
