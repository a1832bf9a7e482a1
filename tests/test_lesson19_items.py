"""Lesson 19's graded items on right and wrong answers (the run-dependent P4 is covered by the round trip)."""

import numpy as np
import pytest

from coursekit.grading import check
from coursekit.grading.lessons import lesson19


def test_supervised_positions_are_the_answer_and_the_end_token():
    pos = lesson19.supervised_positions()
    assert len(pos) >= 2 and np.all(np.diff(pos) == 1)  # one contiguous span at the end
    fb = check("19.p1", [int(p) for p in pos], hidden=False)
    assert fb.full


@pytest.mark.parametrize("shift,text", [(-1, "one to the left"), (1, "one position to the right")])
def test_shifted_positions_are_named(shift, text):
    pos = lesson19.supervised_positions() + shift
    fb = check("19.p1", pos.tolist(), hidden=False)
    assert not fb.full and text in "\n".join(fb.lines)


def test_missing_end_token_is_named():
    pos = lesson19.supervised_positions()[:-1]
    fb = check("19.p1", pos.tolist(), hidden=False)
    assert fb.points == 0 and "<|im_end|>" in "\n".join(fb.lines)


def test_window_loss_item():
    right = lambda loss_sums, counts: sum(loss_sums) / sum(counts)  # noqa: E731
    mean_of_means = lambda loss_sums, counts: float(np.mean([s / c for s, c in zip(loss_sums, counts)]))  # noqa: E731
    assert check("19.p5", right, hidden=True).full
    fb = check("19.p5", mean_of_means, hidden=False)
    assert fb.points < fb.max_points and "averaged the micro-batches' mean losses" in "\n".join(fb.lines)
    assert lesson19.window_loss_reference([2.0, 4.0], [2, 8]) == pytest.approx(0.6)


def test_deploy_order_and_choices():
    assert check("19.p2", ["train", "save", "load_bf16", "attach", "merge", "verify"]).full
    fb = check("19.p2", ["train", "merge", "save", "load_bf16", "attach", "verify"])
    assert 0 < fb.points < fb.max_points and "merge" in "\n".join(fb.lines)
    assert check("19.p6", "b").full
    assert "re-quantizes" in "\n".join(check("19.p6", "a").lines)
    assert check("19.p7", "c").full and not check("19.p7", "a").full
