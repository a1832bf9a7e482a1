"""Parallel grading (``coursekit grade --workers N``) keeps nbgrader's gradebook consistent.

Three of lesson 02's example students (blank, perfect, transposed-B: three different scores) are
graded three times, each in a temporary course folder: serially (``workers=1``, nbgrader one submission at a time), with two
workers, and with two workers again on the same folder after an instructor's manual grade. The
parallel gradebook must hold the same rows as the serial one (no lost or duplicated row), the same
grades.csv, every notebook must really have been executed by a worker, and the second run must change
nothing and lose nothing (same row ids, the manual grade kept)."""

from __future__ import annotations

import csv
import io
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from coursekit import course, parallel

ROOT = Path(__file__).resolve().parents[1]
AID = "02-lora-inside-one-matmul"
STUDENTS = ["ex-blank", "ex-perfect", "ex-transposed-B"]
N = len(STUDENTS)

GRADES = """
SELECT a.name, sa.student_id, n.name, c.name, g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade, g.id
FROM grade g JOIN submitted_notebook sn ON g.notebook_id = sn.id JOIN submitted_assignment sa ON sn.assignment_id = sa.id
JOIN assignment a ON sa.assignment_id = a.id JOIN notebook n ON sn.notebook_id = n.id JOIN base_cell c ON g.cell_id = c.id
"""
COMMENTS = """
SELECT a.name, sa.student_id, n.name, c.name, m.auto_comment, m.manual_comment, m.id
FROM comment m JOIN submitted_notebook sn ON m.notebook_id = sn.id JOIN submitted_assignment sa ON sn.assignment_id = sa.id
JOIN assignment a ON sa.assignment_id = a.id JOIN notebook n ON sn.notebook_id = n.id JOIN base_cell c ON m.cell_id = c.id
"""


def _rows(work: Path, ids: bool = False) -> dict[str, list[tuple]]:
    """Every gradebook row about submissions, keyed by table; ``ids=False`` drops the random row ids
    (two gradebooks give their rows different ids)."""
    with closing(sqlite3.connect(work / "gradebook.db")) as db:
        out = {
            "student": db.execute("SELECT id, first_name, last_name, email FROM student").fetchall(),
            "submitted_assignment": db.execute(
                "SELECT a.name, s.student_id, s.timestamp, s.extension" + (", s.id" if ids else "") +
                " FROM submitted_assignment s JOIN assignment a ON s.assignment_id = a.id").fetchall(),
            "submitted_notebook": db.execute(
                "SELECT sa.student_id, n.name, sn.flagged, sn.late_submission_penalty" + (", sn.id" if ids else "") +
                " FROM submitted_notebook sn JOIN submitted_assignment sa ON sn.assignment_id = sa.id"
                " JOIN notebook n ON sn.notebook_id = n.id").fetchall(),
            "grade": [r if ids else r[:-1] for r in db.execute(GRADES).fetchall()],
            "comment": [r if ids else r[:-1] for r in db.execute(COMMENTS).fetchall()],
        }
    return {k: sorted(v, key=repr) for k, v in out.items()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    made = []

    class Recording(parallel.Autograder):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    release = tmp_path_factory.mktemp("release")
    course.release([AID], root=ROOT, course_dir=tmp_path_factory.mktemp("release-course"), release_dir=release)
    serial, par = tmp_path_factory.mktemp("serial"), tmp_path_factory.mktemp("parallel")
    for work in (serial, par):
        built = course.build_examples(ROOT, AID, work / "submitted", release)
        for sid in set(built) - set(STUDENTS):
            shutil.rmtree(work / "submitted" / sid)

    def grade(work: Path, workers: int) -> str:
        return course.grade_class(lessons=[AID], root=ROOT, course_dir=work, release_dir=release,
                                  progress=False, workers=workers)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "Autograder", Recording)
        tables = {"serial": grade(serial, 1), "parallel": grade(par, 2)}
        first = {"csv": (par / "grades.csv").read_text(), "rows": _rows(par, ids=True)}
        # An instructor's manual grade on a hand-graded cell, between the two parallel runs.
        with closing(sqlite3.connect(par / "gradebook.db")) as db:
            (gid,) = next(r[-1:] for r in db.execute(GRADES + " WHERE sa.student_id = 'ex-perfect' AND g.auto_score IS NULL"))
            db.execute("UPDATE grade SET manual_score = 1.5, needs_manual_grade = 0 WHERE id = ?", (gid,))
            db.commit()
        manual = _rows(par, ids=True)
        tables["again"] = grade(par, 2)
    return {"serial": serial, "parallel": par, "tables": tables, "first": first, "manual": manual,
            "manual_grade": gid, "autograders": made}


def test_parallel_mode_executes_every_notebook_in_a_worker(graded):
    serial, par, again = graded["autograders"]
    assert serial.workers == 1 and not serial.replayed
    for run in (par, again):
        assert run.workers == 2
        assert sorted(run.replayed) == [(AID, sid) for sid in STUDENTS]
        assert run.executed_here == [], "a worker's notebook was not used: see ReplayExecute's log"


def test_same_grades_csv_and_table_as_serial(graded):
    assert (graded["serial"] / "grades.csv").read_text() == graded["first"]["csv"]
    table = lambda t: [l for l in t.splitlines() if AID in l]  # noqa: E731  (the last line names the folder)
    assert table(graded["tables"]["serial"]) == table(graded["tables"]["parallel"])
    assert len(table(graded["tables"]["parallel"])) == N and "Not graded" not in graded["tables"]["parallel"]


def test_same_gradebook_rows_as_serial_none_lost_or_duplicated(graded):
    serial = _rows(graded["serial"])
    first = {k: [r[:-1] if k != "student" else r for r in v] for k, v in graded["first"]["rows"].items()}
    first = {k: sorted(v, key=repr) for k, v in first.items()}
    assert first == serial
    n_cells = len({r[3] for r in serial["grade"]})
    assert len(serial["grade"]) == N * n_cells > 0, "one grade row per student and graded cell"
    assert len(set(first["grade"])) == len(first["grade"]) and len(set(first["submitted_assignment"])) == N
    assert len({r[:2] for r in serial["grade"]}) == N


def test_feedback_for_every_student(graded):
    for work in (graded["serial"], graded["parallel"]):
        students = {r[1] for r in _rows(work)["submitted_assignment"]}
        assert {p.parent.parent.name for p in (work / "feedback").glob(f"*/{AID}/{AID}.html")} == students


def test_second_parallel_run_changes_nothing_and_loses_nothing(graded):
    par = graded["parallel"]
    expected = graded["manual"]
    # nbgrader flags a manually graded cell for review again when it re-autogrades it (SaveAutoGrades);
    # serial grading does the same. Nothing else may change, and no row may be replaced (same ids).
    expected["grade"] = [r[:7] + (1,) + r[8:] if r[-1] == graded["manual_grade"] else r for r in expected["grade"]]
    assert _rows(par, ids=True) == expected, "a re-run changed, replaced or lost gradebook rows"
    with closing(sqlite3.connect(par / "gradebook.db")) as db:
        assert db.execute("SELECT manual_score FROM grade WHERE id = ?", (graded["manual_grade"],)).fetchone() == (1.5,)
    before = {r["student_id"]: r for r in csv.DictReader(io.StringIO(graded["first"]["csv"]))}
    after = {r["student_id"]: r for r in course.read_grades_csv(par / "grades.csv")}
    assert before.keys() == after.keys()
    for sid in before:
        bump = 1.5 if sid == "ex-perfect" else 0.0  # the manual grade, nothing else
        assert float(after[sid]["score"]) == pytest.approx(float(before[sid]["score"]) + bump), sid


def test_one_worker_or_one_submission_is_serial(tmp_path):
    a = course.api(ROOT, tmp_path, tmp_path / "release")
    for jobs, workers in (([(AID, "s1"), (AID, "s2")], 1), ([(AID, "s1")], 4), ([], None)):
        with parallel.Autograder(a, jobs, workers) as g:
            assert g.workers == 1 and g._pool is None


def test_one_grading_run_at_a_time_per_course(tmp_path):
    a = course.api(ROOT, tmp_path, tmp_path / "release")
    with parallel.Autograder(a, [], 1):
        with pytest.raises(course.CourseError, match="another `coursekit grade`"):
            parallel.Autograder(a, [], 1)
    parallel.Autograder(a, [], 1).close()  # released


def test_same_cells_compares_sources_not_outputs():
    import nbformat.v4 as v4

    a = v4.new_notebook(cells=[v4.new_code_cell("x = 1"), v4.new_markdown_cell("hi")])
    b = v4.new_notebook(cells=[v4.new_code_cell("x = 1", outputs=[v4.new_output("stream", text="1")]), v4.new_markdown_cell("hi")])
    assert parallel._same_cells(a, b)
    b.cells[0].source = "x = 2"
    assert not parallel._same_cells(a, b)
    assert not parallel._same_cells(a, v4.new_notebook(cells=a.cells[:1]))


def test_cli_rejects_zero_workers(capsys):
    from coursekit import cli

    assert cli.main(["grade", "--workers", "0", "--root", str(ROOT)]) == 2
    assert "--workers" in capsys.readouterr().err
