"""Hidden cases hold whatever the seed: every lesson's right answers score full on the hidden cases drawn
from several random seeds, not only from the seed in the instructor's key file.

An instructor may draw a new seed for a new term (``autograder/keys/NN.json``); a hidden-case generator that
only works for the shipped seed (a degenerate draw, a case where the reference itself is unstable, a trap
that disappears) would then fail right answers. The right answers are the ones each lesson's item tests
write as a student would (``RIGHT`` in tests/test_lessonNN_items.py)."""

from __future__ import annotations

import importlib
import random
from pathlib import Path

import pytest

from coursekit import course
from coursekit.grading import Function, check, lesson_items
from coursekit.grading.keys import SEED_ENV

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [random.Random(i).getrandbits(62) for i in range(6)]  # fixed, so a failure reproduces


def _function_answers() -> list[tuple[str, str]]:
    rows = []
    for lesson in course.lesson_ids(ROOT):
        n = lesson[:2]
        try:
            module = importlib.import_module(f"test_lesson{n}_items")
        except ModuleNotFoundError:  # lessons whose items are tested elsewhere
            continue
        for iid in sorted(getattr(module, "RIGHT", {})):
            if isinstance(lesson_items(n)[iid], Function):
                rows.append((n, iid))
    return rows


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lesson, item_id", _function_answers())
def test_right_answers_score_full_on_hidden_cases_from_any_seed(lesson, item_id, seed, monkeypatch):
    monkeypatch.setenv(SEED_ENV, str(seed))
    right = importlib.import_module(f"test_lesson{lesson}_items").RIGHT[item_id]
    fb = check(f"{lesson}.{item_id}", right, hidden=True)
    assert fb.points == fb.max_points, f"seed {seed}:\n{fb.text()}"
    assert "hidden case" in fb.text()


@pytest.mark.parametrize("lesson, item_id", _function_answers())
def test_the_seed_changes_the_hidden_cases(lesson, item_id, monkeypatch):
    # otherwise the sweep above would test one draw six times
    from coursekit.grading import _Context

    def draw(seed):
        monkeypatch.setenv(SEED_ENV, str(seed))
        return repr([c.kwargs for c in lesson_items(lesson)[item_id].hidden(_Context(lesson, item_id, True).rng())])

    assert draw(SEEDS[0]) != draw(SEEDS[1])


def test_the_sweep_covers_most_function_items():
    rows = _function_answers()
    lessons = {n for n, _ in rows}
    assert len(rows) >= 30 and len(lessons) >= 12, rows
