"""The capstone's results as the README's markdown, written by the command that measured them.

``coursekit capstone --markdown FILE`` writes :func:`markdown` of its report to FILE, and ``--readme README.md``
puts the same text between the README's two markers for the dtype the run computed in (:func:`begin`,
:func:`end`: one block for the bf16 path, one for the float32 path), so that every number in the README's
capstone section, times included, comes from one run of the command and none is typed or copied from another
line. A test checks that each README block equals its committed results file (``docs/capstone-results-<dtype>.md``).
"""

from __future__ import annotations

from typing import Any

from . import data as cdata
from . import paired
from .cheap import FOLDS
from .capstone import CHEAP_LABELS, RUN_LABELS, SCORING_LABELS, paired_comparisons

__all__ = ["begin", "end", "markdown", "splice", "block"]


def begin(dtype: str) -> str:
    """The line that opens the README's results block of a run computing in ``dtype`` ("bfloat16", "float32")."""
    return f"<!-- capstone results, {dtype}: begin (written by `coursekit capstone --readme`; do not edit by hand) -->"


def end(dtype: str) -> str:
    """The line that closes that block."""
    return f"<!-- capstone results, {dtype}: end -->"


def _pct(res: dict[str, Any]) -> str:
    lo, hi = res["interval"]
    return f"{100 * res['accuracy']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def markdown(report: dict[str, Any]) -> str:
    """The report of ``coursekit.capstone.run`` as markdown: how it was run (dtype, threads, cold or warm, wall
    time), held-out accuracies with 95 % Wilson intervals (the untrained baselines, the cheap rungs of
    ``coursekit.cheap`` when the report has them, the adapters), the paired comparisons, the cost tables and the
    merges. Raises KeyError for a report without those parts."""
    splits = cdata.HELDOUT_SPLITS
    n = {s: len(cdata.load_split(s)) for s in splits}
    st = report["store"]
    state = ("cold: every result computed" if st["read"] == 0 else
             "warm: every result read from the store" if st["computed"] == 0 else
             f"{st['computed']} results computed, {st['read']} read from the store")
    lines = [f"`coursekit capstone`, matmuls in {report['matmul']}, {report['threads']} torch threads "
             f"({report['usable_cpus']} usable CPUs), {state}: **{_duration(report['wall_seconds'])}**.", "",
             "| model | " + " | ".join(f"{s.replace('_', ' ')} (n = {n[s]})" for s in splits) + " |",
             "|---|" + "---|" * len(splits)]
    for name, by_split in report["ladder"].items():
        lines.append(f"| untrained, {name} | " + " | ".join(_pct(by_split[s]) for s in splits) + " |")
    cheap = (report.get("cheap") or {}).get("rungs", {})
    for name, r in cheap.items():
        lines.append(f"| cheap: {CHEAP_LABELS[name]} | " + " | ".join(_pct(r[s]) for s in splits) + " |")
    for run, by_scoring in report["heldout"].items():
        for scoring, by_split in by_scoring.items():
            name = "**QLoRA**" if run == "qlora" else RUN_LABELS.get(run, run)
            lines.append(f"| {name}, {SCORING_LABELS[scoring]} | " + " | ".join(_pct(by_split[s]) for s in splits) + " |")
    lines += ["", "Paired comparisons on the same tickets (McNemar's exact test on the tickets where the two disagree, "
                  "and a 95 % interval of the difference resampling whole symptoms; a winner only where both agree):", ""]
    for split, a, b, c in paired_comparisons(report):
        lines.append(f"- {split.replace('_', ' ')}: " + paired.describe(c, a, b))
    runs = report["runs"]
    if "qlora" in runs and "lora_bf16" in runs:
        qm, lm = runs["qlora"].get("memory") or {}, runs["lora_bf16"].get("memory") or {}

        def mb(mem: dict, key: str) -> str:
            return "-" if mem.get(key) is None else f"{mem[key]:.0f} MB"

        when = "measured in the same run" if st["read"] == 0 else "as measured when each result was computed"
        lines += ["", f"| cost, {when} | QLoRA (NF4 base) | LoRA (bf16 base, Q4_1 decoded) |", "|---|---:|---:|",
                  f"| seconds per step (8 tickets, {len(runs['qlora']['losses'])} steps) | "
                  f"{runs['qlora']['seconds_per_step']:.2f} | {runs['lora_bf16']['seconds_per_step']:.2f} |",
                  f"| peak resident memory, fresh process, freed blocks returned | {mb(qm, 'peak_rss_mb')} | {mb(lm, 'peak_rss_mb')} |",
                  f"| parameters and buffers | {runs['qlora']['footprint_mb']:.0f} MB | {runs['lora_bf16']['footprint_mb']:.0f} MB |",
                  f"| activations saved for one step's backward | {mb(qm, 'saved_activations_mb')} | {mb(lm, 'saved_activations_mb')} |"]
    if cheap:
        c = report["cheap"]
        lines += ["", f"| cheap rung: chosen by {FOLDS}-fold CV grouped by symptom on the {c['n_train']} "
                      f"training tickets | chosen | CV accuracy | search s | fit and predict CPU s | what a deployment keeps |",
                  "|---|---|---:|---:|---:|---:|"]
        for name, r in cheap.items():
            chosen = ", ".join(f"{k} {v}" for k, v in r["chosen"].items() if k != "cv_accuracy")
            cost = r["cost"]
            lines.append(f"| {CHEAP_LABELS[name]} | {chosen} | {100 * r['chosen']['cv_accuracy']:.1f} % | "
                         f"{cost['search_seconds']:.0f} | {cost['fit_predict_cpu_seconds']:.2f} | {cost['kept_mb']:.2f} MB"
                         f"{' + the base' if cost['needs_base'] else ''} |")
        lines += ["", f"The frozen base's features for kNN and the probe: one pass over every ticket, "
                      f"{c['features_seconds']:.0f} s ({c['features_cpu_seconds']:.0f} CPU s)."]
    m = report.get("merge")
    if m:
        def paired_cells(r: dict) -> str:  # accuracy with n and interval; the paired test against the trained function
            c = r["paired"]
            return (f"{_pct(r)} (n={r['n']}) | {c['b_only']} / {c['a_only']} | {c['p_value']:.2g} |")

        lines += ["", f"| merged model against the trained function (NF4 + adapter, {_pct(m['reference'])}, "
                      f"n={m['reference']['n']}) | same greedy label | accuracy, 95 % Wilson | loses / gains | "
                      f"McNemar exact p |", "|---|---:|---:|---:|---:|",
                  f"| reload on a fresh NF4 base: largest logit difference {m['reload_max_abs_diff']:g} | | | | |",
                  f"| the untrained base, no adapter (what a merge that changed nothing gives) | "
                  f"{100 * m['base']['agreement']:.1f} % | {paired_cells(m['base'])}"]
        for name, r in m["merges"].items():
            extra = (f" ({100 * m['nf4_codes_changed']:.4f} % of the 4-bit codes change)"
                     if name.startswith("into NF4") else "")
            lines.append(f"| merged {name}{extra} | {100 * r['agreement']:.1f} % | {paired_cells(r)}")
        lines.append("\nloses / gains: tickets right only for the trained function / only for the merged model (the "
                     "discordant tickets McNemar's exact test reads).")
    return "\n".join(lines) + "\n"


def splice(text: str, block: str, dtype: str) -> str:
    """``text`` with everything between :func:`begin` and :func:`end` of ``dtype`` replaced by ``block`` (a newline is
    added if it lacks its last one, so the end marker keeps its own line). Raises TypeError for a text or block
    that is not a str, and ValueError when the markers are missing, repeated or out of order, or when ``block``
    holds a results marker itself (splicing it in would leave a file no later run can splice)."""
    if not isinstance(text, str) or not isinstance(block, str):
        raise TypeError(f"text and block must be str, got {type(text).__name__} and {type(block).__name__}")
    if "<!-- capstone results, " in block:
        raise ValueError("the block holds a capstone results marker; pass the markdown of one run, without markers")
    if block and not block.endswith("\n"):
        block += "\n"
    b, e = begin(dtype), end(dtype)
    if text.count(b) != 1 or text.count(e) != 1 or text.index(b) > text.index(e):
        raise ValueError(f"the file needs exactly one capstone results block for {dtype}: a line {b} and, after it, {e}")
    head, rest = text.split(b, 1)
    _, tail = rest.split(e, 1)
    return f"{head}{b}\n{block}{e}{tail}"


def block(text: str, dtype: str) -> str:
    """The text between :func:`begin` and :func:`end` of ``dtype`` (without the marker lines' newline). Raises
    ValueError as :func:`splice`."""
    b, e = begin(dtype), end(dtype)
    if text.count(b) != 1 or text.count(e) != 1 or text.index(b) > text.index(e):
        raise ValueError(f"no single capstone results block for {dtype}")
    return text.split(b, 1)[1].split(e, 1)[0].removeprefix("\n")
