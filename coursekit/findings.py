"""Sentences lesson 19 prints from its own results, each with its direction chosen by the numbers.

A lesson that states a result in typed prose is right only on the machine it was written on. These functions
read the results of a run (``coursekit.capstone``) and return the sentences, so that a student's run, or another
CPU, gets the sentences its own numbers support. Every function takes plain result dicts and returns a list of
strings; nothing here computes a model.
"""

from __future__ import annotations

from typing import Any

from . import data as cdata

__all__ = ["search_findings", "few_shot_bias", "peak_difference"]


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


def _direction(mean: float, up: int, down: int, n: int) -> str:
    if up == n:
        return f"raised accuracy in every layout (by {100 * mean:.1f} points on average)"
    if down == n:
        return f"lowered accuracy in every layout (by {100 * -mean:.1f} points on average)"
    return f"raised accuracy in {up} of {n} layouts and lowered it in {down} ({100 * mean:+.1f} points on average)"


def search_findings(search: dict[str, dict[str, dict]], layout_names: dict[str, str], rule_names: dict[str, str],
                    chosen: tuple[str, str]) -> list[str]:
    """What the baseline search (``coursekit.capstone.prompt_search``: ``{layout: {rule: result}}``) found: the
    generation readings, the effect of each reading of label scoring against the plain sum over the label and the
    end-of-turn token, and the chosen pair with its n and 95 % Wilson interval. Raises KeyError when a layout lacks
    one of the rules ``generate``, ``with_end``, ``label_only``, ``label_mean``, ``calibrated``."""
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
        mean, up, down = _effect(search, rule, "with_end" if rule == "label_only" else "label_only")
        base = "label + end" if rule == "label_only" else "label only"
        out.append(f"{what} ({rule_names[rule]} against {base}) {_direction(mean, up, down, n_layouts)}.")
    layout, rule = chosen
    best = search[layout][rule]
    lo, hi = best["interval"]
    out.append(f"best on the {best['n']} training tickets: {layout_names[layout]}, {rule_names[rule]}, "
               f"{_pct(best['accuracy'])} [{100 * lo:.1f}, {100 * hi:.1f}].")
    return out


def few_shot_bias(result: dict[str, Any], last_shot_label: str) -> str:
    """One sentence on a few-shot generation result: how many answers are the most common one, and whether that is
    the label of the last solved ticket in the prompt (a recency bias, Zhao et al. 2021)."""
    answers = [p.get("answer", p["pred"]) for p in result["predictions"]]
    common = max(dict.fromkeys(answers), key=answers.count)
    same = common.strip().lower().strip(".") == last_shot_label
    return (f"{answers.count(common)} of {len(answers)} few-shot answers are {common!r}; the last solved ticket in the "
            f"prompt is a {last_shot_label!r} ticket" + (": the model repeats the last answer it saw." if same else "."))


def peak_difference(qlora_mb: float, lora_mb: float) -> str:
    """One sentence comparing the two peaks of resident memory (MB), with the direction the numbers give."""
    diff = lora_mb - qlora_mb
    if diff == 0:
        return "QLoRA's peak equals LoRA's on bf16."
    return (f"QLoRA's peak is {abs(diff):.0f} MB {'lower' if diff > 0 else 'higher'} than LoRA's on bf16 "
            f"({100 * abs(diff) / lora_mb:.1f} % of it)")
