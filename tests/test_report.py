"""coursekit report on lesson 02's graded example class: every count comes from what the example students are known
to do (their expected.json: the cells each loses, the named mistakes each makes), the files are byte-identical on a
second run, the HTML names nobody unless asked, and a missing or unreadable submission is not a zero like another."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coursekit import report
from coursekit.grading import lesson_items
from graded_examples import EXAMPLES, graded_example_class, regradable_copy

LESSON = "02-lora-inside-one-matmul"


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Path:
    return graded_example_class(tmp_path_factory, LESSON)


@pytest.fixture(scope="module")
def rep(graded) -> dict:
    return report.collect(graded, [LESSON])


def _specs() -> dict[str, dict]:
    return {f"ex-{p.parent.name}": json.loads(p.read_text()) for p in sorted((EXAMPLES / LESSON).glob("*/expected.json"))}


def test_every_count_is_the_example_students_known_one(rep):
    """Per item: who lost points there is exactly the students whose expected.json lists its check cell, plus the
    blank student on every item worth points; the named mistakes are exactly the ones the students declare."""
    items = lesson_items("02")
    specs = _specs()
    les = rep["lessons"][0]
    students = 2 + len(specs)  # ex-blank and ex-perfect besides the folders
    assert (les["students"], les["graded"], les["missing"], les["zero"]) == (students, students, 0, 0)
    by_item = {r["item"]: r for r in les["items"]}
    assert set(by_item) == set(items)
    for item, it in items.items():
        losers = {sid for sid, spec in specs.items() if f"{item}_test" in spec["loses"]}
        declared: dict[str, int] = {}
        for spec in specs.values():
            for label in spec.get("mistakes", {}).get(item, []):
                declared[label] = declared.get(label, 0) + 1
        r = by_item[item]
        assert r["lost_by"] == len(losers) + (1 if it.points > 0 else 0), (item, r, sorted(losers))
        assert r["mistakes"] == declared, (item, r["mistakes"])
        assert r["blank"] == 1 and sum(r[c] for c in report.COLUMNS) == students, (item, r)
        assert r["answered"] == students - 1 - r["not_scored"]


def test_items_are_sorted_by_how_many_lost_points(rep):
    lost = [r["lost_by"] for r in rep["lessons"][0]["items"]]
    assert lost == sorted(lost, reverse=True)


def test_the_files_are_byte_identical_on_a_second_run_and_the_html_names_nobody(graded, rep, tmp_path):
    first = report.write(rep, tmp_path / "a")
    second = report.write(report.collect(graded, [LESSON]), tmp_path / "b")
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name
    page = (tmp_path / "a" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2  # the item bars and the totals histogram
    assert "ex-missing-s" not in page and "ex-missing-s" in (tmp_path / "a" / "students.csv").read_text()
    named = report.write(rep, tmp_path / "c", names=True)[-1].read_text()
    assert "ex-kills-kernel" in named or "ex-forged-grade" in named  # checks the grader could not score, named
    items_csv = (tmp_path / "a" / "items.csv").read_text().splitlines()
    assert items_csv[0].startswith("lesson,item,title,points,answered,right,partial,mistake,wrong,blank,not_scored")


def test_missing_and_unreadable_are_not_zeros_like_another(graded, tmp_path):
    """A student of the class who handed nothing in is 'missing'; one whose notebook could not be graded is 'zero'
    with the reason, and neither counts in the items' outcomes."""
    course = regradable_copy(graded, tmp_path / "course")
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.update_or_create_student("late-joiner")
    report.write_status(course, LESSON, "ex-perfect", "ex-perfect.ipynb is an empty file (0 bytes)")
    shutil.rmtree(course / "autograded" / "ex-perfect")
    rep = report.collect(course, [LESSON])
    les = rep["lessons"][0]
    rows = {r["student"]: r for r in rep["students"]}
    assert rows["late-joiner"]["status"] == "missing" and les["missing"] == 1
    assert rows["ex-perfect"]["status"] == "zero" and "empty file" in rows["ex-perfect"]["reason"]
    assert les["zero"] == 1 and les["graded"] == les["students"] - 2
    assert all(sum(r[c] for c in report.COLUMNS) == les["graded"] for r in les["items"])


def test_the_command_writes_the_files(graded, tmp_path, capsys):
    from coursekit.cli import main

    assert main(["report", "02", "--course", str(graded), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "02-lora-inside-one-matmul:" in out and "lost by" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["items.csv", "report.html", "report.json", "students.csv"]
    assert main(["report", "--course", str(tmp_path)]) == 2  # no gradebook there


def test_the_guides_excerpt_is_this_report(rep):
    import re

    guide = (Path(__file__).resolve().parents[1] / "docs" / "instructors.md").read_text()
    block = re.search(r"<!-- class report excerpt: begin -->\n```text\n(.*?)\n```\n<!-- class report excerpt: end -->",
                      guide, flags=re.S)
    assert block, "docs/instructors.md lost its class report excerpt"
    assert block.group(1) == report.format_text(rep)


def test_the_report_says_who_made_each_mistake_and_each_students_outcome_per_item(graded, rep, tmp_path):
    """From a mistake to the students who made it (report.json always, the page with --names), and from a student to
    their outcome on every item (students.csv, report.json)."""
    specs = _specs()
    les = rep["lessons"][0]
    for r in les["items"]:
        for label, who in r["mistake_students"].items():
            assert len(who) == r["mistakes"][label]
            assert all(label in specs[sid]["mistakes"].get(r["item"], []) for sid in who), (r["item"], label, who)
    row = next(x for x in rep["students"] if x["student"] == "ex-alpha-not-over-r")
    assert row["items"]["p1"]["status"] == "mistake" and row["items"]["p1"]["mistakes"] == ["alpha"]
    assert set(row["items"]) == set(lesson_items("02"))
    named = report.write(rep, tmp_path / "n", names=True)
    page = (tmp_path / "n" / "report.html").read_text()
    assert "alpha (1: ex-alpha-not-over-r)" in page
    plain = (tmp_path / "p").mkdir() or report.write(rep, tmp_path / "p")
    assert "ex-alpha-not-over-r" not in (tmp_path / "p" / "report.html").read_text()
    students_csv = (tmp_path / "p" / "students.csv").read_text()
    assert "p1 mistake [alpha]" in students_csv and students_csv.splitlines()[0].endswith(",not_scored,items")
    assert named and plain


def test_missing_counts_the_class_not_every_student_of_every_lesson(graded, tmp_path):
    """A roster per lesson (the example class: each lesson's own example students) makes a student of another lesson
    no one missing here; a misplaced folder is 'misplaced' with its move, not 'missing'."""
    course = regradable_copy(graded, tmp_path / "course")
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.update_or_create_student("ex-of-another-lesson")
    (course / "submitted" / "ada" / "02").mkdir(parents=True)
    (course / "submitted" / "ada" / "02" / f"{LESSON}.ipynb").write_text("{}")
    specs = _specs()
    roster = {LESSON: ["ex-blank", "ex-perfect", *specs, "ada"]}
    rep = report.collect(course, [LESSON], roster=roster)
    les = rep["lessons"][0]
    rows = {r["student"]: r for r in rep["students"]}
    assert "ex-of-another-lesson" not in rows and les["missing"] == 0 and les["misplaced"] == 1
    assert rows["ada"]["status"] == "misplaced" and rows["ada"]["move"] == f"rename it to ada/{LESSON}"
    everyone = report.collect(course, [LESSON])  # nbgrader's roster: everyone in the gradebook
    assert everyone["lessons"][0]["missing"] == 1


def test_only_the_graders_outcomes_count_and_no_value_stops_the_report(graded, tmp_path):
    """An outcome record on a cell that is not a scored check cell (an answer cell, a markdown cell the student made)
    is not the grader's and is ignored; a record with a status the report does not know counts as not scored; no
    CSV cell starts like a spreadsheet formula."""
    import json as _json

    from coursekit.guard import OUTCOME_KEY

    course = regradable_copy(graded, tmp_path / "course")
    nb_path = course / "autograded" / "ex-blank" / LESSON / f"{LESSON}.ipynb"
    nb = _json.loads(nb_path.read_text())
    forged = {"item": "02.p1", "points": 3.0, "max_points": 3.0, "status": "right", "mistakes": ["=HYPERLINK(1)"],
              "reason": ""}
    nb["cells"].insert(0, {"cell_type": "markdown", "id": "forged", "metadata": {OUTCOME_KEY: forged}, "source": "x"})
    for c in nb["cells"]:
        md = c.get("metadata", {})
        if md.get("nbgrader", {}).get("solution"):
            md[OUTCOME_KEY] = forged  # an answer cell's metadata is the student's
        rec = md.get(OUTCOME_KEY)
        if md.get("nbgrader", {}).get("grade") and not md.get("nbgrader", {}).get("solution") and rec and rec["item"] == "02.p2":
            md[OUTCOME_KEY] = {**rec, "status": "astonishing", "mistakes": ["-2+3"]}
    nb_path.write_text(_json.dumps(nb))
    got = report.outcomes(nb_path)
    assert got["p1"]["status"] == "blank" and got["p2"]["status"] == "not_scored", (got["p1"], got["p2"])
    rep = report.collect(course, [LESSON])
    paths = report.write(rep, tmp_path / "out")
    for p in paths:
        if p.suffix == ".csv":
            for line in p.read_text().splitlines():
                for cell in next(__import__("csv").reader([line])):
                    assert not cell.startswith(("=", "+", "-", "@")), (p.name, cell)
