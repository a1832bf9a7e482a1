"""Keyed items in the autograde run: the kernel that runs the student's code never holds the keys.

coursekit.guard.GuardedExecute starts the grading kernel without $COURSEKIT_KEYS (only the lesson's
hidden-case seed, $COURSEKIT_SEED); a choice, ordering or keyed-number check there records the answer
in a marked line, and coursekit.guard.ScoreKeyed, in the grading process, scores it against the key and
writes the feedback and the points. These tests run each half on its own; tests/test_grading_roundtrip.py
runs them together through nbgrader."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from coursekit.grading import RECORD_MARK, grade, keys
from coursekit.guard import GuardedExecute, ScoreKeyed

KEYS02 = keys.load("02")  # tests/conftest.py points $COURSEKIT_KEYS at autograder/keys
RIGHT = KEYS02["keys"]["w1"]
WRONG = next(o for o in "abcd" if o != RIGHT)


def _test_cell(item: str, outputs: list) -> nbformat.NotebookNode:
    cell = new_code_cell(f'from coursekit.grading import grade\ngrade("{item}", answer)')
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": 1, "grade_id": "t",
                                 "schema_version": 3}
    cell.outputs = outputs
    return cell


def _mark(item: str, answer) -> str:
    return RECORD_MARK + json.dumps({"item": item, "answer": answer}) + "\n"


def _score(cell) -> tuple[float, str]:
    nb = new_notebook(cells=[cell])
    ScoreKeyed().preprocess(nb, {})
    out = nb.cells[0].outputs
    result = [o for o in out if o.output_type == "execute_result"]
    text = "".join(o.get("text", "") for o in out if o.output_type == "stream")
    return (float(result[-1].data["text/plain"]) if result else None), text


def test_the_grading_kernel_records_instead_of_reading_keys(monkeypatch, capsys):
    """Inside the autograde run without keys, grade() prints the marked answer in canonical form and returns 0."""
    monkeypatch.delenv(keys.ENV, raising=False)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert grade("02.w1", f" ({RIGHT.upper()}) ") == 0.0
    out = capsys.readouterr().out
    assert _mark("02.w1", RIGHT) in out and "recorded" in out
    assert grade("16.p2", "acd") == 0.0  # a multi-choice answer is recorded as its sorted letters
    assert _mark("16.p2", ["a", "c", "d"]) in capsys.readouterr().out
    assert grade("02.w1", "ab") == 0.0  # malformed: told why, nothing recorded
    out = capsys.readouterr().out
    assert RECORD_MARK not in out and "Only one letter" in out


@pytest.mark.parametrize("answer, points, says", [(RIGHT, 1.0, "is right"), (WRONG, 0.0, "is not right")])
def test_score_keyed_scores_a_recorded_answer(answer, points, says):
    cell = _test_cell("02.w1", [new_output("stream", name="stdout", text="[02.w1] …: recorded\n  Recorded: 'x'.\n" + _mark("02.w1", answer)),
                                new_output("execute_result", data={"text/plain": "0.0"}, execution_count=1)])
    got, text = _score(cell)
    assert got == points and says in text and RECORD_MARK not in text and "Recorded:" not in text
    if answer == WRONG and KEYS02["hints"].get("w1", {}).get(WRONG):
        assert KEYS02["hints"]["w1"][WRONG][:30] in text  # the hint that teaches, from the instructor's file


@pytest.mark.parametrize("stdout, why", [
    (_mark("02.w1", RIGHT) + _mark("02.w1", WRONG), "two answers"),
    (_mark("02.w3", RIGHT), "an answer recorded for another item"),
    (RECORD_MARK + "{not json\n", "an altered record"),
])
def test_score_keyed_refuses_forged_records(stdout, why):
    got, text = _score(_test_cell("02.w1", [new_output("stream", name="stdout", text=stdout),
                                            new_output("execute_result", data={"text/plain": "0.0"}, execution_count=1)]))
    assert got == 0.0, why
    assert "More than one answer was recorded" in text


def test_score_keyed_leaves_failed_and_kernel_scored_cells_alone():
    err = _test_cell("02.w1", [new_output("stream", name="stdout", text=_mark("02.w1", RIGHT)),
                               new_output("error", ename="NameError", evalue="answer", traceback=[])])
    nb = new_notebook(cells=[err])
    ScoreKeyed().preprocess(nb, {})
    assert [o.output_type for o in nb.cells[0].outputs] == ["stream", "error"]  # nbgrader scores it 0
    plain = _test_cell("02.w2", [new_output("stream", name="stdout", text="[02.w2] …: 1 / 1 points\n"),
                                 new_output("execute_result", data={"text/plain": "1.0"}, execution_count=1)])
    assert _score(plain) == (1.0, "[02.w2] …: 1 / 1 points\n")


def test_the_grading_kernel_has_the_seed_but_no_keys():
    """GuardedExecute starts the kernel without $COURSEKIT_KEYS (set in this process by conftest) and with
    the lesson's seed; the function items' hidden cases then draw from the same seed as the key file."""
    cell = new_code_cell("import os\nprint(repr(os.environ.get('COURSEKIT_KEYS')), os.environ.get('COURSEKIT_SEED'))")
    nb = new_notebook(cells=[cell], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    ex = GuardedExecute(timeout=120)
    ex.preprocess(nb, {"unique_key": "02-lora-inside-one-matmul", "metadata": {"path": "."}})
    printed = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert printed.split() == ["None", str(KEYS02["seed"])], printed


def test_score_keyed_fails_closed():
    """No record for a keyed item (the notebook switched off the autograde mode, or set up its own keys and
    scored itself in the kernel), or a non-keyed check whose result is missing or not points: 0, with why."""
    self_scored = _test_cell("02.w1", [new_output("stream", name="stdout", text="[02.w1] the shape of A: 1 / 1 points\n  (b) is right.\n"),
                                       new_output("execute_result", data={"text/plain": "1.0"}, execution_count=1)])
    student_mode = _test_cell("02.w1", [new_output("stream", name="stdout", text="[02.w1] the shape of A: recorded (worth 1 point, scored by the autograder)\n  Recorded: 'b'.\n")])
    for cell in (self_scored, student_mode):
        got, text = _score(cell)
        assert got == 0.0, text
    assert "no answer was recorded" in _score(student_mode)[1].lower()
    malformed = _test_cell("02.w1", [new_output("stream", name="stdout", text="[02.w1] the shape of A: 0 / 1 points\n  (e) is not an option here\n"),
                                     new_output("execute_result", data={"text/plain": "0.0"}, execution_count=1)])
    got, text = _score(malformed)
    assert got == 0.0 and "is not an option" in text and "environment" not in text
    for shown in (None, "'x0.0'", "nan", "5.0", "-1.0"):  # no result, a reformatted one, out of range
        outs = [new_output("stream", name="stdout", text="[02.p1] …: 3 / 3 points\n")]
        if shown is not None:
            outs.append(new_output("execute_result", data={"text/plain": shown}, execution_count=1))
        cell = _test_cell("02.p1", outs)
        cell.metadata.nbgrader["points"] = 3
        got, text = _score(cell)
        assert got == 0.0 and "not the points it earned" in text, (shown, text)
    public_only = _test_cell("02.p1", [new_output("stream", name="stdout", text="[02.p1] …: 3 / 3 points\n  (Public cases only; the autograder adds hidden, randomized cases.)\n"),
                                       new_output("execute_result", data={"text/plain": "3.0"}, execution_count=1)])
    public_only.metadata.nbgrader["points"] = 3
    got, text = _score(public_only)
    assert got == 0.0 and "hidden cases did not run" in text
    forged = _test_cell("02.p1", [new_output("stream", name="stdout", text=_mark("02.p1", 1)),
                                  new_output("execute_result", data={"text/plain": "3.0"}, execution_count=1)])
    forged.metadata.nbgrader["points"] = 3
    assert _score(forged)[0] == 0.0


def test_every_test_cell_is_one_grade_call_the_scorer_can_read():
    """ScoreKeyed finds a test cell's item by its one grade("NN.item", ...) call: every lesson's test cells
    must have exactly one, naming an item of that lesson."""
    from pathlib import Path

    from coursekit import course
    from coursekit.grading import lesson_items
    from coursekit.guard import _GRADE_CALL

    root = Path(__file__).resolve().parents[1]
    for aid in course.lesson_ids(root):
        nb = nbformat.read(root / "solutions" / aid / f"{aid}.ipynb", as_version=4)
        for c in nb.cells:
            md = c.get("metadata", {}).get("nbgrader", {})
            if c.cell_type == "code" and md.get("grade") and not md.get("solution"):
                calls = _GRADE_CALL.findall(c.source)
                assert len(calls) == 1 and calls[0].startswith(aid[:2] + "."), (aid, md.get("grade_id"), c.source)
                assert calls[0].split(".", 1)[1] in lesson_items(aid[:2]), (aid, calls[0])


@pytest.mark.parametrize("answer", ["i, h, g, f, e, d, c, b, a", "i h g f e d c b a", list("ihgfedcba"), tuple("ihgfedcba")])
def test_an_ordering_too_long_to_enumerate_is_recorded_in_any_accepted_form(answer):
    # more than 8 labels: the student's machine cannot try every order, so the answer itself is recorded
    from coursekit.grading import Ordering, _recorded

    item = Ordering("nine steps", 1, {c: f"step {c}" for c in "abcdefghi"})
    fb = _recorded(item, answer)
    assert getattr(fb, "recorded", None) == list("ihgfedcba") and "Recorded" in fb.text()


def test_an_ordering_too_long_to_enumerate_with_a_wrong_label_is_not_recorded():
    from coursekit.grading import Ordering, _recorded

    item = Ordering("nine steps", 1, {c: f"step {c}" for c in "abcdefghi"})
    fb = _recorded(item, "i, h, g, f, e, d, c, b, z")
    assert not hasattr(fb, "recorded") and "exactly once" in fb.text()
