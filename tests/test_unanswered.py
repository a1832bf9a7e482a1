"""A fresh lesson runs top to bottom: an item not answered yet says so and scores 0, everywhere.

The release's answer cells raise nothing (autograder/nbgrader_config.py's code stub): a value cell keeps its
``answer_xx = None`` line and a function only its docstring. These tests pin what each of those blanks gives
while a student works, under ``nbgrader validate``, and in the autograde run's grading process; running every
release notebook top to bottom is nbval's job (``lessons`` in pytest's testpaths)."""

from __future__ import annotations

import nbformat
import pytest

from coursekit import capstone
from coursekit.grading import NOT_ANSWERED, grade, score_record, unanswered
from coursekit.course import repo_root

ROOT = repo_root()


def blank(X, W, A, B, lora_alpha, r):
    """The adapted layer's output for the inputs X; returns an n × m array."""
    # YOUR CODE HERE


def forgot_return(X, W, A, B, lora_alpha, r):
    """A body that computes and drops its result is an answer (a wrong one), not a blank."""
    X @ W


def test_blanks_are_recognised_and_answers_are_not():
    assert unanswered(None) and unanswered(blank) and unanswered(lambda: None)
    for answer in (forgot_return, 0, 0.0, "", "b", [], print, len, lambda x: x):
        assert not unanswered(answer), answer


@pytest.mark.parametrize("item, answer", [("02.p6", None), ("02.p1", blank), ("02.p3", None)])
def test_grade_says_not_answered_and_scores_0(item, answer, capsys, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert grade(item, answer) is None  # the printed line carries the points; no second "Out: 0.0"
    out = capsys.readouterr().out
    assert f"[{item}]" in out and ": 0 / " in out and NOT_ANSWERED in out
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")  # nbgrader validate reads the points as partial credit
    assert grade(item, answer) == 0.0


def test_an_answer_prints_its_points_once(capsys, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert grade("02.p3", 12345) is None
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert grade("02.p3", 12345) == 0.0
    assert "not answered" not in capsys.readouterr().out.lower()


def test_the_grading_process_scores_a_blank_0():
    fb = score_record("02.p1", {"item": "02.p1", "unanswered": True})
    assert fb.points == 0 and NOT_ANSWERED in fb.lines


def test_release_answer_cells_raise_nothing():
    """Every answer cell of lessons/ is valid Python that defines its answer without raising."""
    for path in sorted((ROOT / "lessons").glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            md = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "code" and md.get("solution"):
                compile(cell.source, f"{path.name}:{md['grade_id']}", "exec")
                assert "raise NotImplementedError" not in cell.source, f"{path.name} {md['grade_id']}"


def test_a_recipe_not_written_yet_runs_with_the_reference():
    mine = capstone.Recipe("mine", blank, *[getattr(capstone.REFERENCE, f) for f in
                                            ("preflight", "adapter_optimizer", "train_steps", "answer_logprobs",
                                             "first_word", "merge_onto_w16")])
    assert mine.missing() == ["load_for_lora"]
    full = mine.or_reference()
    assert full.missing() == [] and full.load_for_lora is capstone.REFERENCE.load_for_lora
    assert "load_for_lora" in full.name and capstone.REFERENCE.or_reference() is capstone.REFERENCE
