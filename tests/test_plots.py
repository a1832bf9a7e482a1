"""coursekit.plots: the first row on top, the random-guess label inside its panel and off the title, the legend
beside the bars, and bad input refused."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from coursekit import plots


def _result(acc: float, lo: float, hi: float) -> dict:
    return {"accuracy": acc, "interval": [lo, hi]}


ROWS = {
    "zero-shot": {"a": _result(0.2, 0.1, 0.3), "b": _result(0.25, 0.15, 0.35)},
    "few-shot": {"a": _result(0.3, 0.2, 0.4), "b": _result(0.3, 0.2, 0.4)},
    "QLoRA": {"a": _result(0.9, 0.8, 0.95), "b": _result(0.6, 0.5, 0.7)},
}
N = {"a": 120, "b": 144}


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_the_first_row_is_on_top_in_every_panel_and_the_label_is_inside_its_panel():
    fig = plots.accuracy_intervals(ROWS, N, 1 / 6)
    renderer = _drawn(fig)
    for ax in fig.axes:
        bottom, top = ax.get_ylim()
        assert bottom > top, "the shared y axis is not inverted (inverting it once per panel undoes it)"
        points = ax.lines[0].get_ydata()  # the error bars' centres, one per row, in the order of ROWS
        assert list(points) == [0, 1, 2]
        assert ax.transData.transform((0, 0))[1] > ax.transData.transform((0, 2))[1], "the first row is not on top"
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(ROWS)
    (label,) = [t for t in fig.axes[0].texts if t.get_text() == "random guess"]
    box, panel = label.get_window_extent(renderer), fig.axes[0].get_window_extent(renderer)
    title = fig.axes[0].title.get_window_extent(renderer)
    assert panel.y0 <= box.y0 and box.y1 <= panel.y1 and panel.x0 <= box.x0 and box.x1 <= panel.x1, "label outside its panel"
    assert not box.overlaps(title), "the random-guess label sits on the title"
    assert box.y1 < (panel.y0 + panel.y1) / 2, "the random-guess label is not at the bottom of the panel"
    assert [ax.get_title() for ax in fig.axes] == ["a (n = 120)", "b (n = 144)"]


def test_a_marker_and_its_cap_at_100_percent_sit_inside_the_frame():
    """A result of 99 % with an interval up to 100 % (the capstone's QLoRA on unseen phrasing) is drawn whole: the
    axis runs a little past 100, and its ticks stop at 100."""
    rows = {"QLoRA": {"a": _result(0.992, 0.954, 1.0), "b": _result(1.0, 0.974, 1.0)}}
    fig = plots.accuracy_intervals(rows, N, 1 / 6)
    renderer = _drawn(fig)
    for ax in fig.axes:
        assert ax.get_xlim()[1] > 100 and max(ax.get_xticks()) == 100
        frame = ax.get_window_extent(renderer)
        for artist in ax.lines + list(ax.collections):
            box = artist.get_window_extent(renderer)
            assert box.x1 <= frame.x1 + 0.5, f"{artist} reaches past the panel's right edge"

def test_the_memory_legend_covers_no_bar():
    memory = {"Python": [600, 600], "parameters": [110, 270], "activations": [300, 260], "rest": [90, 100]}
    fig = plots.run_costs(["QLoRA", "LoRA"], [ROWS["QLoRA"]["b"], _result(0.62, 0.52, 0.72)], [1.4, 1.1], memory)
    renderer = _drawn(fig)
    ax = fig.axes[2]
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert len(bars) == 2 * len(memory)
    assert not any(legend.overlaps(b) for b in bars), "the legend covers a bar"
    page = fig.bbox
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and page.y0 <= legend.y0 and legend.y1 <= page.y1, \
        "the legend is cut off by the figure's edge"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(memory)[::-1], "the legend is not in the stack's order"
    heights = [sum(v[i] for v in memory.values()) for i in range(2)]
    tops = sorted({round(p.get_y() + p.get_height()) for p in ax.patches})
    assert set(heights) <= set(tops)
    for other in fig.axes[:2]:  # nor does it cover another panel
        assert not legend.overlaps(other.get_window_extent(renderer))


def test_run_costs_ends_accuracy_at_100_and_says_each_timing_is_one_measurement():
    near_top = _result(0.97, 0.93, 0.99)
    fig = plots.run_costs(["QLoRA", "LoRA"], [near_top, near_top], [1.4, 1.1], {"x": [1, 2]})
    assert fig.axes[0].get_ylim() == (0, 100)
    assert "one run, timed at its own moment" in fig.axes[1].get_title()


@pytest.mark.parametrize("call, says", [
    (lambda: plots.accuracy_intervals({}, N, 1 / 6), "at least one row"),
    (lambda: plots.accuracy_intervals(ROWS, {}, 1 / 6), "at least one row"),
    (lambda: plots.accuracy_intervals(ROWS, N, 100 / 6), "fraction"),
    (lambda: plots.accuracy_intervals(ROWS, {**N, "c": 3}, 1 / 6), "no result for split 'c'"),
    (lambda: plots.run_costs(["A", "B"], [ROWS["QLoRA"]["a"]], [1, 2], {"x": [1, 2]}), "one value per run"),
    (lambda: plots.run_costs(["A", "B"], [ROWS["QLoRA"]["a"]] * 2, [1, 2], {"x": [1]}), "memory['x']"),
])
def test_bad_input_is_refused_with_a_reason(call, says):
    with pytest.raises(ValueError, match=None) as e:
        call()
    assert says in str(e.value)
