"""The grader's defenses against hostile and broken submissions, piece by piece and fast.

The end-to-end checks (real nbgrader, the example class's hostile students of lessons 00, 02 and 03,
graded twice) are in tests/test_grading_roundtrip.py; these pin each defense without a full class:
the per-case time limit, captured print floods, odd number types, broken submission files, and the
guarded executor on a tiny notebook. The trust boundary itself (the sandbox, scores computed only in the
grading process) is tests/test_trust_boundary.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from coursekit import course
from coursekit.grading import check
from coursekit.grading.checkers import Case, check_function

ROOT = Path(__file__).resolve().parents[1]

def _right(X, W, A, B, lora_alpha, r):
    return X @ W + (lora_alpha / r) * (X @ A) @ B


def test_editing_the_loaded_keys_changes_nothing():
    from coursekit.grading import keys

    loaded = keys.load("02")
    wrong = next(x for x in "abcd" if x != loaded["keys"]["p6"])
    loaded["keys"]["p6"] = wrong  # a plain dict a notebook could edit: the next check reads the file again
    assert check("02.p6", wrong).points == 0


def test_a_function_that_loops_forever_loses_its_cases_and_grading_goes_on():
    cases = [Case({"x": np.ones(2)}, "a"), Case({"x": np.zeros(2)}, "b")]

    def endless(x):
        while True:
            try:
                pass
            except Exception:  # cannot swallow the time limit
                pass

    fb = check_function(endless, cases, lambda x: x, 2, "f", timeout=0.2)
    text = "\n".join(fb.lines)
    assert fb.points == 0 and "did not return within 0.2 s" in text and "not run (an earlier case did not return)" in text
    assert check_function(lambda x: x, cases, lambda x: x, 2, "f", timeout=0.2).full  # the alarm is off again


def test_a_print_flood_is_counted_not_shown(capfd):
    def chatty(X, W, A, B, lora_alpha, r):
        for i in range(5000):
            print("line", i)
        return _right(X, W, A, B, lora_alpha, r)

    fb = check("02.p1", chatty)
    out, err = capfd.readouterr()
    assert out == err == "" and fb.full
    text = "\n".join(fb.lines)
    assert "printed 5000 lines while being checked" in text and len(text) < 2000


@pytest.mark.parametrize("answer,points", [
    (float("nan"), 0),
    (np.float32(0.0625), 1),
    ("torch", 1),
    ([0.0625], 1),
])
def test_odd_number_types_get_the_right_score(answer, points):
    """03.p4's key, 1/16, in the types a student may hand in (exact in float32 and as a tensor)."""
    if answer == "torch":
        import torch

        answer = torch.tensor(0.0625, requires_grad=True)
    fb = check("03.p4", answer)
    assert fb.points == points, fb.lines
    if points == 0:
        assert "finite" in fb.lines[0]


# --------------------------------------------------------------------------- broken submission files


def test_broken_files_are_named_in_plain_words(tmp_path):
    aid = "02-lora-inside-one-matmul"
    d = tmp_path / "s" / aid
    d.mkdir(parents=True)
    assert "no notebook named" in course.check_submission(d, aid)
    (d / "mine.ipynb").write_text("{}")
    assert "(found mine.ipynb)" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_text("")
    assert "is an empty file" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_text('{"cells": [')
    assert "is not JSON" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_text(json.dumps({"hello": 1}))
    assert "is not a notebook" in course.check_submission(d, aid)
    (d / f"{aid}.ipynb").write_bytes(b"\xff\xfe\x00garbage")
    assert "not UTF-8" in course.check_submission(d, aid)
    nbformat.write(new_notebook(cells=[new_code_cell("1")]), d / f"{aid}.ipynb")
    assert "none of the lesson's answer and check cells" in course.check_submission(d, aid)
    shutil.copyfile(ROOT / "lessons" / aid / f"{aid}.ipynb", d / f"{aid}.ipynb")
    assert course.check_submission(d, aid) is None
    page = course.write_problem_feedback(tmp_path / "fb", aid, "it is <empty>").read_text()
    assert "0 points" in page and "it is &lt;empty&gt;" in page


# --------------------------------------------------------------------------- the guarded executor


def test_the_guarded_executor_stops_a_loop_and_survives_a_dead_kernel():
    """One tiny notebook: an answer cell that loops, a test cell after it, then a cell that kills the kernel:
    the loop is stopped with a plain message, the cell after it still runs, everything after the kernel's
    death is marked as not run (an error output, so a test cell there scores 0 rather than full marks)."""
    from nbgrader.utils import determine_grade

    from coursekit.guard import GuardedExecute

    def cell(src, **nbg):
        c = new_code_cell(src)
        if nbg:
            c.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": False, "grade": False, **nbg}
        return c

    nb = new_notebook(cells=[
        cell("while True:\n    pass", grade_id="a_answer", solution=True),
        cell("print('after the loop')\n1", grade_id="a_test", grade=True, locked=True, points=1),
        cell("import os\nos._exit(0)", grade_id="b_answer", solution=True),
        cell("1", grade_id="b_test", grade=True, locked=True, points=1),
    ])
    ex = GuardedExecute(timeout=60, answer_timeout=3, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": "."}})
    loop, after, killer, later = nb.cells
    assert "was still running after 3 s" in loop.outputs[-1]["evalue"]
    assert any("after the loop" in o.get("text", "") for o in after.outputs)
    assert determine_grade(after)[0] == 1
    assert "stopped the Python kernel in this cell (cell 3 (b_answer))" in killer.outputs[-1]["evalue"]
    assert "not run" in later.outputs[0]["evalue"] and determine_grade(later)[0] == 0


def test_a_loop_that_ignores_the_interrupt_stops_the_kernel_not_the_grader():
    from coursekit.guard import GuardedExecute

    def cell(src, **nbg):
        c = new_code_cell(src)
        c.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": False, "grade": False, **nbg}
        return c

    nb = new_notebook(cells=[
        cell("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", grade_id="a_answer", solution=True),
        cell("1", grade_id="a_test", grade=True, locked=True, points=1),
    ])
    ex = GuardedExecute(timeout=60, answer_timeout=2, interrupt_grace=2, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"unique_key": "tiny", "metadata": {"path": "."}})
    assert "kept running after its time limit and an interrupt" in nb.cells[0].outputs[-1]["evalue"]
    assert "not run" in nb.cells[1].outputs[0]["evalue"]


def test_config_puts_the_guards_in_nbgraders_pipeline():
    from pathlib import Path

    cfg = course.load_config(Path(__file__).resolve().parents[1])
    steps = list(cfg.Autograde.autograde_preprocessors)
    assert steps[0] == "coursekit.guard.GuardedExecute"
    assert steps.index("coursekit.guard.ScoreAnswers") < steps.index("nbgrader.preprocessors.SaveAutoGrades")


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("SIGALRM time limits are POSIX only")
