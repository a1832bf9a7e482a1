"""Figures of a run's results, drawn with matplotlib: what lesson 19 plots from its own numbers.

Each function takes the results as data (as :mod:`coursekit.capstone` returns them), draws them, and returns a
``matplotlib.figure.Figure`` without showing it (a notebook cell that ends with the figure displays it).
``tests/test_plots.py`` draws each figure and checks its layout: which row is on top, that no label sits on a
title, and that no legend covers a bar.

* :func:`accuracy_intervals`: accuracy with its 95 % interval, one row per model, one panel per split, a dotted
  line at the accuracy of a random guess.
* :func:`run_costs`: two runs side by side: accuracy with its interval, seconds per step, and peak memory split
  into its parts (stacked bars, the legend beside the panel).
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["accuracy_intervals", "run_costs"]


def _percent(result: Mapping) -> tuple[float, float, float]:
    """(accuracy, low, high) in percent, from a result with ``accuracy`` and ``interval`` (fractions)."""
    lo, hi = result["interval"]
    return 100 * float(result["accuracy"]), 100 * float(lo), 100 * float(hi)


def accuracy_intervals(rows: Mapping[str, Mapping[str, Mapping]], n: Mapping[str, int], chance: float):
    """One panel per split (the keys of ``n``, in order), one row per model (the keys of ``rows``, the first at the
    top): accuracy as a point with its 95 % interval as a bar, in percent, and a dotted line at ``chance`` (a
    fraction: 1/6 for six labels) labelled "random guess" inside the first panel, at its bottom.

    rows: model name → split → a result with ``accuracy`` and ``interval`` (fractions, as
    :func:`coursekit.evaluate.evaluate` returns them). n: split → number of tickets (shown in the panel's title).
    Raises ValueError for no rows, no splits, a chance outside (0, 1), or a row without a split of ``n``."""
    import matplotlib.pyplot as plt

    names, splits = list(rows), list(n)
    if not names or not splits:
        raise ValueError("need at least one row and one split")
    if not 0 < chance < 1:
        raise ValueError(f"chance must be a fraction in (0, 1), got {chance!r}")
    missing = [(m, s) for m in names for s in splits if s not in rows[m]]
    if missing:
        raise ValueError(f"{missing[0][0]!r} has no result for split {missing[0][1]!r}")
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 0.45 * len(names) + 1.5), sharey=True,
                             squeeze=False)
    axes = axes[0]
    for ax, split in zip(axes, splits):
        acc, lo, hi = (list(v) for v in zip(*(_percent(rows[m][split]) for m in names)))
        ax.errorbar(acc, range(len(names)), xerr=[[a - l for a, l in zip(acc, lo)], [h - a for a, h in zip(acc, hi)]],
                    fmt="o", capsize=3)
        ax.axvline(100 * chance, ls=":", c="gray")
        ax.set_xlim(0, 103)  # a little room past 100 %, so a marker or interval cap at 99-100 % sits inside the frame
        ax.set_xticks(range(0, 101, 20))
        ax.set_xlabel("accuracy, % (95 % Wilson interval)")
        ax.set_title(f"{split} (n = {n[split]})")
    axes[0].set_yticks(range(len(names)), names)
    axes[0].set_ylim(len(names) - 0.5, -0.5)  # the first row at the top (the axis is shared: set it once)
    axes[0].text(100 * chance + 1, len(names) - 0.6, "random guess", color="gray", va="bottom", fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def run_costs(names: Sequence[str], accuracy: Sequence[Mapping], seconds_per_step: Sequence[float],
              memory: Mapping[str, Sequence[float]], accuracy_label: str = "accuracy, %"):
    """Three panels for the runs ``names``: accuracy with its 95 % interval (``accuracy``: one result per run, with
    ``accuracy`` and ``interval`` as fractions), seconds per training step, and peak resident memory in MB as
    stacked parts (``memory``: part name → one value per run, bottom part first), with the legend beside the
    panel, listed top part first like the stack, so that it covers no bar. The accuracy axis runs from 0 to 100;
    the speed panel says that each bar is one timing, taken when that run trained.
    Raises ValueError when a sequence does not have one value per run."""
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(names)
    lengths = {"accuracy": len(accuracy), "seconds_per_step": len(seconds_per_step),
               **{f"memory[{k!r}]": len(v) for k, v in memory.items()}}
    wrong = {k: v for k, v in lengths.items() if v != len(names)}
    if not names or wrong:
        raise ValueError(f"need one value per run ({len(names)} runs); got {wrong or 'no runs'}")
    acc, lo, hi = (np.array(v) for v in zip(*(_percent(a) for a in accuracy)))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    axes[0].bar(names, acc, yerr=[acc - lo, hi - acc], capsize=4)
    axes[0].set_ylabel(accuracy_label)
    axes[0].set_ylim(0, 100)  # an accuracy ends at 100 %, whatever the interval's cap
    axes[1].bar(names, list(seconds_per_step))
    axes[1].set_ylabel("seconds per step")
    # Each run's training was timed once, at its own moment: on a busy machine two such timings can differ more than
    # the runs do (`make bench` times them back to back).
    axes[1].set_title("each bar: one run, timed at its own moment", fontsize=8)
    bottom = np.zeros(len(names))
    for label, values in memory.items():
        axes[2].bar(names, list(values), bottom=bottom, label=label)
        bottom += np.array(values, dtype=float)
    axes[2].set_ylabel("peak resident memory, MB")
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, reverse=True)  # as stacked
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig
