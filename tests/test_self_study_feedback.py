"""Feedback that says why, where the keys are present, and nothing more where they are not.

* In the course repository (self-study) a kernel finds autograder/keys while $COURSEKIT_KEYS is unset: a practice
  choice or ordering check explains the mistake actually made, from the key file's hints, and only that one.
* A student's machine (no repository around the package) and the autograde run (NBGRADER_EXECUTION=autograde) find
  no keys: the check only records, exactly as before.
* The grading process's feedback (score_record, what coursekit.guard.ScoreAnswers calls) for a wrong multi-select
  names each wrong pick and each true statement left out with why; for a wrong ordering, the step most out of place
  and why.
* `coursekit keys check` refuses a keyed item whose explanations are missing.
* model_answer reads a free-text item's model answer from solutions/, and says where it is when there are none.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from coursekit import protocol
from coursekit.grading import Choice, Ordering, check, grade, key_problems, keyed, lesson_items, model_answer, score_record
from coursekit.grading import keys as keymod

ROOT = Path(__file__).resolve().parents[1]
LESSONS = [f"{n:02d}" for n in range(20)]
REAL_KEYS = {num: json.loads((ROOT / "autograder" / "keys" / f"{num}.json").read_text()) for num in LESSONS}


def _keyed(kind):
    return [(num, iid, it) for num in LESSONS for iid, it in lesson_items(num).items()
            if isinstance(it, kind) and keyed(it)]


def _order(key):
    return list(key["order"]) if isinstance(key, dict) else list(key)


@pytest.fixture
def repository(monkeypatch):
    """A kernel started in the course repository: no $COURSEKIT_KEYS, not autograding."""
    monkeypatch.delenv(keymod.ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert keymod.key_dir() == ROOT / "autograder" / "keys"


@pytest.fixture
def student_machine(monkeypatch, tmp_path):
    """The lessons without the course repository: no $COURSEKIT_KEYS, no autograder/keys or solutions/ beside the package."""
    monkeypatch.delenv(keymod.ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setattr(keymod, "REPOSITORY", tmp_path)
    assert keymod.key_dir() is None


# --------------------------------------------------------------------------- where the keys are


def test_the_repository_keys_are_found_only_outside_an_autograde_run(monkeypatch):
    monkeypatch.delenv(keymod.ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert keymod.key_dir() == ROOT / "autograder" / "keys" and keymod.available("13")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # the autograde kernel: no keys, even unsandboxed
    assert keymod.key_dir() is None and not keymod.available("13")
    assert "Recorded" in check("13.p6", "a").lines[0]
    monkeypatch.delenv("NBGRADER_EXECUTION")
    monkeypatch.setenv(keymod.ENV, "")  # set and empty: "no keys here", even in the repository
    assert keymod.key_dir() is None
    monkeypatch.setenv(keymod.ENV, str(ROOT / "autograder" / "keys"))
    assert keymod.key_dir() == ROOT / "autograder" / "keys"


def test_the_grading_commands_still_name_the_keys_explicitly(monkeypatch):
    """coursekit grade sets $COURSEKIT_KEYS itself (the repository's keys are not found while nbgrader autogrades)."""
    from coursekit import course

    monkeypatch.delenv(keymod.ENV, raising=False)
    course.use_course_keys(ROOT)
    import os

    assert os.environ[keymod.ENV] == str(ROOT / "autograder" / "keys")


def test_without_keys_the_check_is_unchanged(student_machine, capsys):
    grade("13.p6", "a")
    out = capsys.readouterr().out
    assert out == ("[13.p6] W + sAB's distance from the trained function when the update is ten times larger: recorded (worth 1 point, scored by the autograder)\n"
                   "  Recorded: 'a'. The answer key does not ship with the course, so nothing on your machine can say right or "
                   "wrong: the autograder scores this item, and its feedback explains a wrong answer and what to reread.\n")
    for num, iid, it in _keyed((Choice, Ordering)):
        hints = REAL_KEYS[num]["hints"].get(iid, {})
        answer = sorted(it.labels) if isinstance(it, Ordering) else ([it.options[0]] if it.multi else it.options[0])
        fb = check(f"{num}.{iid}", answer)
        assert hasattr(fb, "recorded") and not any(h[:50] in line for h in hints.values() for line in fb.lines), f"{num}.{iid}"


# --------------------------------------------------------------------------- a student's check, keys present


@pytest.mark.parametrize("num, iid", [(n, i) for n, i, it in _keyed(Choice) if not it.multi])
def test_each_single_choice_is_explained_and_only_it(repository, num, iid):
    """A wrong pick is told why it is wrong, the key why it holds, each with its own text only."""
    item = lesson_items(num)[iid]
    key, hints = REAL_KEYS[num]["keys"][iid], REAL_KEYS[num]["hints"][iid]
    for option in item.options:
        text = "\n".join(check(f"{num}.{iid}", option).lines)
        verdict = "is right." if option == key else "is not right."
        assert text.startswith(f"({option}) {verdict} {hints[option]}"), text
        others = [o for o in hints if o != option and hints[o][:50] not in hints[option]]
        assert not [o for o in others if hints[o][:50] in text], f"{num}.{iid} ({option}) shows another option's hint"


@pytest.mark.parametrize("num, iid", [(n, i) for n, i, it in _keyed(Choice) if it.multi])
def test_a_wrong_multi_select_names_each_mistake_with_why(repository, num, iid):
    item = lesson_items(num)[iid]
    key, hints = set(REAL_KEYS[num]["keys"][iid]), REAL_KEYS[num]["hints"][iid]
    wrong = [o for o in item.options if o not in key]
    right = sorted(key)
    # one right pick kept, one left out, and (where there is one) a wrong pick
    answer = right[:1] + wrong[:1] if len(right) > 1 else right + wrong[:1]
    lines = check(f"{num}.{iid}", set(answer)).lines
    text = "\n".join(lines)
    for o in item.options:
        said = hints[o] in text
        if o in answer and o in key:
            assert not said, f"{num}.{iid}: the right pick ({o}) is commented on"
        elif o in answer:
            assert f"({o}) should not be chosen. {hints[o]}" in lines, text
        else:
            assert (f"({o}) is missing from your set. {hints[o]}" in lines) == (o in key), text
    assert "statement is missing" not in text and "statements are missing" not in text  # every miss is named


@pytest.mark.parametrize("num, iid", [(n, i) for n, i, _ in _keyed(Ordering)])
def test_a_wrong_ordering_explains_the_step_most_out_of_place_only(repository, num, iid):
    key, hints = REAL_KEYS[num]["keys"][iid], REAL_KEYS[num]["hints"][iid]
    order = _order(key)
    moved = order[1:] + order[:1]  # the first step put last: it is the one out of place
    lines = check(f"{num}.{iid}", moved).lines
    assert lines[-1].startswith(f"The step most out of place is '{order[0]}' (") and lines[-1].endswith(f"): {hints[order[0]]}"), lines
    assert sum(h in "\n".join(lines) for h in hints.values()) == 1
    assert check(f"{num}.{iid}", order).lines[0].startswith("The order is right.")


def test_an_ordering_with_several_right_orders_explains_against_the_closest(repository):
    """12.p4 accepts the load before or after the preflight and the RNG restore: an answer that moves only the load
    before the optimizer is explained by the load's reason, not by the RNG's."""
    key = REAL_KEYS["12"]["keys"]["p4"]
    hints = REAL_KEYS["12"]["hints"]["p4"]
    answer = ["base", "attach", "load", "optimizer", "preflight", "rng", "step"]  # of the accepted orders, closest to the first
    assert sorted(answer) == sorted(key["order"])
    lines = check("12.p4", answer).lines
    assert lines[-1].startswith("The step most out of place is '") and hints["rng"] not in lines[-1], lines
    assert hints["load"] in lines[-1], lines


def test_the_check_cell_prints_the_explanation(repository, capsys):
    grade("13.p6", "a")
    out = capsys.readouterr().out
    assert out.startswith("[13.p6] W + sAB's distance from the trained function when the update is ten times larger: 0 / 1 point\n")
    assert REAL_KEYS["13"]["hints"]["p6"]["a"] in out and REAL_KEYS["13"]["hints"]["p6"]["b"] not in out


# --------------------------------------------------------------------------- the graded feedback


def test_graded_feedback_of_a_multi_select_says_why(monkeypatch):
    """What ScoreAnswers writes for 16.p3 answered {"b", "e"}: the wrong pick and every true statement left out,
    each with its reason; the right pick is not commented on."""
    monkeypatch.setenv(keymod.ENV, str(ROOT / "autograder" / "keys"))
    hints, key = REAL_KEYS["16"]["hints"]["p3"], set(REAL_KEYS["16"]["keys"]["p3"])
    assert "b" in key and "e" not in key and len(key) > 1
    fb = score_record("16.p3", {"item": "16.p3", "answer": protocol.encode({"b", "e"})})
    assert fb.points == 0 and fb.mistakes == ["(e)"]
    assert fb.lines == [f"(e) should not be chosen. {hints['e']}"] + [f"({o}) is missing from your set. {hints[o]}"
                                                                     for o in sorted(key - {"b"})]


def test_graded_feedback_of_an_ordering_says_why(monkeypatch):
    monkeypatch.setenv(keymod.ENV, str(ROOT / "autograder" / "keys"))
    hints = REAL_KEYS["19"]["hints"]["p15"]
    answer = ["train", "save", "attach", "dequantize", "merge", "verify"]
    fb = score_record("19.p15", {"item": "19.p15", "answer": protocol.encode(answer)})
    assert 0 < fb.points < fb.max_points
    assert fb.lines[0].startswith("14 of 15 pairs are in the right order. The first step out of place is position 3: 'attach'")
    assert fb.lines[1] == f"The step most out of place is 'attach': {hints['attach']}"


# --------------------------------------------------------------------------- the key files


def test_every_explanation_teaches_and_points_to_a_section():
    for num, iid, it in _keyed((Choice, Ordering)):
        for opt, text in REAL_KEYS[num]["hints"].get(iid, {}).items():
            assert len(text) >= 60 and re.search(r"[Rr]eread|\(Lesson \d\d", text), f"{num}.{iid} ({opt}): {text}"


@pytest.mark.parametrize("critical, line", [
    (["rng", "fetch"], '12.p4: "critical" must be a list of the labels [\'attach\', \'base\', \'load\', \'optimizer\', \'preflight\', \'rng\', \'step\'] (or of pairs of them)'),
    ("rng", '12.p4: "critical" must be a list of the labels [\'attach\', \'base\', \'load\', \'optimizer\', \'preflight\', \'rng\', \'step\'] (or of pairs of them)'),
    (["rng", ["preflight", "preflight"]], '12.p4: "critical" must be a list of the labels [\'attach\', \'base\', \'load\', \'optimizer\', \'preflight\', \'rng\', \'step\'] (or of pairs of them)'),
    (["rng", ["preflight", "attach", "base"]], '12.p4: "critical" must be a list of the labels [\'attach\', \'base\', \'load\', \'optimizer\', \'preflight\', \'rng\', \'step\'] (or of pairs of them)'),
    (["rng", ["load", "rng"]], '12.p4: a "critical" step or pair that the right orders leave free'),
])
def test_keys_check_refuses_a_critical_step_that_is_no_label(tmp_path, monkeypatch, critical, line):
    shutil.copytree(ROOT / "autograder" / "keys", tmp_path / "keys")
    data = json.loads((tmp_path / "keys" / "12.json").read_text())
    data["keys"]["p4"]["critical"] = critical
    (tmp_path / "keys" / "12.json").write_text(json.dumps(data))
    monkeypatch.setenv(keymod.ENV, str(tmp_path / "keys"))
    assert key_problems() == [line]


def test_keys_check_refuses_a_critical_step_the_right_orders_leave_free(tmp_path, monkeypatch):
    """A critical step needs a place that every right order agrees on against some other step."""
    shutil.copytree(ROOT / "autograder" / "keys", tmp_path / "keys")
    data = json.loads((tmp_path / "keys" / "19.json").read_text())
    order = data["keys"]["p15"]["order"]
    data["keys"]["p15"] = {"order": order, "also": [order[::-1]], "critical": ["merge"]}
    (tmp_path / "keys" / "19.json").write_text(json.dumps(data))
    monkeypatch.setenv(keymod.ENV, str(tmp_path / "keys"))
    assert key_problems() == ['19.p15: a "critical" step or pair that the right orders leave free']


@pytest.mark.parametrize("num, iid, drop, line", [
    ("16", "p3", "b", "16.p3: no explanation for options ['b'] (the hints say why each statement is true or false)"),
    ("13", "p6", "a", "13.p6: no explanation for options ['a'] (the hints say why each option is right or wrong)"),
    ("13", "p6", "c", "13.p6: no explanation for options ['c'] (the hints say why each option is right or wrong)"),
    ("12", "p4", "rng", "12.p4: no explanation for labels ['rng'] (the hints say why each step takes its place)"),
])
def test_keys_check_refuses_a_missing_explanation(tmp_path, monkeypatch, num, iid, drop, line):
    shutil.copytree(ROOT / "autograder" / "keys", tmp_path / "keys")
    data = json.loads((tmp_path / "keys" / f"{num}.json").read_text())
    del data["hints"][iid][drop]
    (tmp_path / "keys" / f"{num}.json").write_text(json.dumps(data))
    monkeypatch.setenv(keymod.ENV, str(tmp_path / "keys"))
    assert key_problems() == [line]
    from coursekit import cli

    assert cli.main(["keys", "check", "--root", str(ROOT)]) == 1


def test_keys_check_refuses_hints_for_unknown_labels(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "autograder" / "keys", tmp_path / "keys")
    data = json.loads((tmp_path / "keys" / "19.json").read_text())
    data["hints"]["p15"]["deploy"] = "A step that is not one of the item's labels, explained all the same."
    (tmp_path / "keys" / "19.json").write_text(json.dumps(data))
    monkeypatch.setenv(keymod.ENV, str(tmp_path / "keys"))
    assert key_problems(["19"]) == ["19.p15: hints for labels ['deploy'] that do not exist"]


# --------------------------------------------------------------------------- model answers


def _solution_text(num: str, gid: str) -> str:
    nb = json.loads(next((ROOT / "solutions").glob(f"{num}-*/{num}-*.ipynb")).read_text())
    cell = next(c for c in nb["cells"] if (c["metadata"].get("nbgrader") or {}).get("grade_id") == gid)
    return "".join(cell["source"]).strip()


def test_model_answer_reads_the_solution(repository, capsys):
    model_answer("13.p7")
    out = capsys.readouterr().out
    assert out.startswith("Model answer of 13.p7") and _solution_text("13", "p7_explain") in out
    model_answer("13.p6")  # a choice: no model answer to show, and the free-text items named
    out = capsys.readouterr().out
    assert "no free-text item 'p6'" in out and "13.p7" in out and "Traceback" not in out


def test_model_answer_without_solutions_says_where_it_is(student_machine, capsys):
    assert model_answer("13.p7") is None
    out = capsys.readouterr().out
    assert "is with the instructor" in out and _solution_text("13", "p7_explain")[:40] not in out


def test_model_answer_is_never_shown_in_an_autograde_run(repository, monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    model_answer("13.p7")
    out = capsys.readouterr().out
    assert "is with the instructor" in out and _solution_text("13", "p7_explain")[:40] not in out
