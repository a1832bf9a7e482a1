"""Parallel grading (``coursekit grade --workers N``) keeps nbgrader's gradebook consistent.

Lesson 02's example class, graded serially (``workers=1``, nbgrader one submission at a time) and shared with
the round trip (tests/graded_examples.py), is copied and graded again in place with two workers, with three
broken files handed in too (empty, not JSON, renamed: lesson 00's broken examples handed in for lesson 02):
``graded_examples.regraded_in_parallel``, which is also the round trip's second run of that class. Among the
students are lesson 02's hostile ones (an answer cell that calls os._exit, one that forges coursekit's
``grade``, one that calls the grader's reference, endless loops). The copy's automatic scores and comments are
cleared first, so every grade compared below was written by the parallel run. Then a copy of that folder is
graded again with two workers after an instructor's manual grade, this time with three ordinary students and the
broken files only.

The ordinary students must get exactly the serial run's gradebook rows and grades.csv lines (a hostile
classmate changes nothing for them); each hostile or broken student gets the exact score of its expected.json
(the score serial grading gives it in tests/test_grading_roundtrip.py) and a feedback file that says what
happened; every notebook that can be graded must really have been executed by a worker; the gradebook holds
one row per student and graded cell, none lost or duplicated; and the second run must change nothing and lose
nothing (same row ids, the manual grade kept, the rows of the students it did not re-grade untouched)."""

from __future__ import annotations

import csv
import io
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from coursekit import course, parallel
from graded_examples import HOSTILE as HOSTILE_EXAMPLES
from graded_examples import (BROKEN_FILES, BROKEN_FROM, EXACT, EXAMPLES, PARALLEL_LIMITS, WRONG, cell_scores,
                             feedback_text, graded_example_class, parallel_run, regradable_copy, regraded_in_parallel,
                             score_table, submission_scores)

ROOT = Path(__file__).resolve().parents[1]
AID = "02-lora-inside-one-matmul"
STUDENTS = ["ex-blank", "ex-perfect", "ex-transposed-B"]  # graded serially and in both parallel runs
# Lesson 02's hostile students (the examples README's *hostile* rows): sid → (code score, texts the feedback must contain).
HOSTILE = {sid: (score, texts + [t for a, s, _, t in WRONG if (a, s) == (AID, sid)])
           for aid, sid, score, texts in EXACT if aid == AID and (aid, sid) in HOSTILE_EXAMPLES}
# Every other example student of lesson 02 (an ordinary mistake): graded serially and in the first parallel run.
ORDINARY = sorted({"ex-blank", "ex-perfect"} | {f"ex-{p.name}" for p in (EXAMPLES / AID).iterdir() if p.is_dir()} - HOSTILE.keys())
N = len(ORDINARY)
# Lesson 00's broken-file students, handed in for lesson 02 (their submission.py takes the lesson id):
# score 0, and the feedback file and the score table say why.
BROKEN = {sid: (score, [t.replace(BROKEN_FROM, AID) for t in texts])
          for aid, sid, score, texts in EXACT if aid == BROKEN_FROM and sid in BROKEN_FILES}
EXPECTED = {**HOSTILE, **BROKEN}
EVERYONE = sorted(ORDINARY + list(EXPECTED))
LIMITS = PARALLEL_LIMITS

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


def test_the_class_has_the_hostile_and_broken_students():
    assert {"ex-kills-kernel", "ex-forged-grade", "ex-borrows-reference", "ex-endless-loops"} <= HOSTILE.keys()
    assert BROKEN.keys() == {"ex-empty-file", "ex-not-json", "ex-renamed"}
    assert all(texts for _, texts in EXPECTED.values()), "every hostile or broken student names a feedback text"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    made = []

    class Recording(parallel.Autograder):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    serial = graded_example_class(tmp_path_factory, AID)  # every example student, graded serially
    shared = regraded_in_parallel(tmp_path_factory, AID)  # that class with the broken files, graded again with 2 workers
    run = parallel_run(shared)
    par = regradable_copy(shared, tmp_path_factory.mktemp("parallel") / "course")  # the second run writes to it
    first = {"csv": run["csv"], "rows": _rows(par, ids=True)}
    # An instructor's manual grade on a hand-graded cell, between the two parallel runs.
    with closing(sqlite3.connect(par / "gradebook.db")) as db:
        (gid,) = next(r[-1:] for r in db.execute(GRADES + " WHERE sa.student_id = 'ex-perfect' AND g.auto_score IS NULL"))
        db.execute("UPDATE grade SET manual_score = 1.5, needs_manual_grade = 0 WHERE id = ?", (gid,))
        db.commit()
    manual = _rows(par, ids=True)
    # The second run re-grades three ordinary students and the broken ones only (a hostile notebook costs up to a
    # minute of CPU; the first run was the round trip's second run of them): the rows of students it does not
    # grade must stay as they are.
    for sid in set(EVERYONE) - set(STUDENTS) - BROKEN.keys():
        (par / "submitted" / sid).rename(par / f"not-regraded-{sid}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "Autograder", Recording)
        for k, v in LIMITS.items():  # read when the config is loaded (answer cells) and in the kernels (cases)
            mp.setenv(k, v)
        again = course.grade_class(lessons=[AID], root=ROOT, course_dir=par, release_dir=par / "release",
                                   progress=False, workers=2)
    return {"serial": serial, "shared": shared, "parallel": par, "tables": {"serial": score_table(serial), "parallel": run["table"],
                                                          "again": again},
            "first": first, "manual": manual, "manual_grade": gid, "first_run": run, "again": made}


def test_parallel_mode_executes_every_notebook_in_a_worker(graded):
    (again,) = graded["again"]
    first = graded["first_run"]
    runs = ((first["workers"], [tuple(j) for j in first["replayed"]], first["executed_here"], ORDINARY + list(HOSTILE)),
            (again.workers, sorted(again.replayed), again.executed_here, STUDENTS))
    # A broken file never reaches nbgrader's autograde; the second run re-grades three ordinary students only.
    for workers, replayed, executed_here, gradable in runs:
        assert workers == 2
        assert replayed == [(AID, sid) for sid in sorted(gradable)]
        assert executed_here == [], "a worker's notebook was not used: see ReplayExecute's log"
    # The first run re-graded the serial run's copy: each autograded notebook was written again (the copy keeps
    # the serial run's file times), so the grades compared below are the parallel run's, not left over.
    for sid in ORDINARY + list(HOSTILE):
        nb = graded["shared"] / "autograded" / sid / AID / f"{AID}.ipynb"
        assert nb.stat().st_mtime >= first["started"], f"{sid}: the parallel run did not write its autograded notebook"


def _ours(rows: dict[str, list[tuple]], students) -> dict[str, list[tuple]]:
    """The rows about ``students`` only (the student id is column 0 of student and submitted_notebook, else 1)."""
    col = {"student": 0, "submitted_notebook": 0}
    return {k: [r for r in v if r[col.get(k, 1)] in students] for k, v in rows.items()}


def test_ordinary_students_get_the_serial_grades_csv_and_table(graded):
    serial = [r for r in course.read_grades_csv(graded["serial"] / "grades.csv") if r["student_id"] in ORDINARY]
    assert len(serial) == N
    par = list(csv.DictReader(io.StringIO(graded["first"]["csv"])))
    assert [r for r in par if r["student_id"] in ORDINARY] == serial, "a hostile classmate changed an ordinary student's grades"
    assert sorted(r["student_id"] for r in par) == EVERYONE
    # (lesson, student, score, max) of each line (the column widths follow the longest student id)
    table = lambda t, who: [l.split() for l in t.splitlines() if AID in l and l.split()[1] in who]  # noqa: E731
    assert table(graded["tables"]["serial"], ORDINARY) == table(graded["tables"]["parallel"], ORDINARY)
    assert len(table(graded["tables"]["parallel"], EVERYONE)) == len(EVERYONE) and "Not graded" not in graded["tables"]["parallel"]


def test_same_gradebook_rows_as_serial_none_lost_or_duplicated(graded):
    serial = _ours(_rows(graded["serial"]), ORDINARY)
    first = {k: [r[:-1] if k != "student" else r for r in v] for k, v in graded["first"]["rows"].items()}
    first = {k: sorted(v, key=repr) for k, v in first.items()}
    assert _ours(first, ORDINARY) == serial, "the ordinary students' gradebook rows differ from serial grading"
    n_cells = len({r[3] for r in serial["grade"]})
    assert len(serial["grade"]) == N * n_cells > 0, "one grade row per student and graded cell"
    assert len({r[:2] for r in serial["grade"]}) == N
    # Everyone, hostile and broken included: one student, submission and notebook row each, one grade row
    # per graded cell, no row twice (ids included: no row written twice under two ids either).
    rows = graded["first"]["rows"]
    assert sorted(r[0] for r in rows["student"]) == EVERYONE
    assert sorted(r[1] for r in rows["submitted_assignment"]) == EVERYONE
    assert sorted(r[0] for r in rows["submitted_notebook"]) == EVERYONE
    for table in ("grade", "comment"):
        keys = [r[1:4] for r in rows[table]]  # (student, notebook, cell)
        assert len(set(keys)) == len(keys), f"duplicated {table} rows"
        assert {sid for sid, *_ in keys} == set(EVERYONE)
        assert all(sum(k[0] == sid for k in keys) == sum(k[0] == "ex-perfect" for k in keys) for sid in EVERYONE), \
            f"a student has more or fewer {table} rows than ex-perfect"
    assert len(rows["grade"]) == len(EVERYONE) * n_cells


@pytest.mark.parametrize("sid", sorted(EXPECTED))
def test_hostile_and_broken_students_get_their_exact_score_and_say_what_happened(graded, sid):
    """Read after the second run, which keeps the hostile students' rows and rewrites their feedback from
    the first run's autograded notebooks (see the fixture)."""
    score, texts = EXPECTED[sid]
    par = graded["parallel"]
    code, _, _ = submission_scores(par, AID, sid)
    assert code == pytest.approx(score, abs=1e-6), f"{sid}: scored {code} in parallel, expected {score} (as serial grading)"
    first = {r["student_id"]: r for r in csv.DictReader(io.StringIO(graded["first"]["csv"]))}
    assert float(first[sid]["raw_score"]) == pytest.approx(score, abs=1e-6), f"{sid}: first parallel run's grades.csv"
    fb = par / "feedback" / sid / AID / f"{AID}.html"
    assert fb.is_file(), f"{sid}: no feedback file"
    for text in texts:
        assert text in feedback_text(par, AID, sid), f"{sid}: feedback lacks {text!r}"
    if sid in HOSTILE:
        cells = cell_scores(par, AID, sid)
        for cell in (c for a, s, c, _ in WRONG if (a, s) == (AID, sid)):
            assert cells[cell][0] < cells[cell][1], f"{sid}: {cell} should lose points"
    else:
        assert f"{sid}/{AID}:" in graded["tables"]["parallel"], "the score table names a submission that could not be graded"


def test_workers_use_the_time_limits_of_the_grading_process(graded):
    fb = feedback_text(graded["parallel"], AID, "ex-endless-loops")
    assert f"was still running after {LIMITS['COURSEKIT_ANSWER_TIMEOUT']} s" in fb, "the answer-cell limit did not reach the worker"
    assert f"did not return within {LIMITS['COURSEKIT_CASE_TIMEOUT']} s" in fb, "the per-case limit did not reach the worker's kernel"


def test_a_print_flood_is_cut_and_keeps_its_point(graded):
    """ex-endless-loops' P4 cell prints 20,000 lines, 2.6 MB (fast enough to finish well within the answer limit on
    busy cores): its point is kept, and what reaches autograded/ is cut to the 400 lines nbgrader's LimitOutput keeps
    (autograder/nbgrader_config.py), with its note saying so."""
    import nbformat

    for run in ("serial", "shared"):
        work = graded[run]
        assert cell_scores(work, AID, "ex-endless-loops")["p4_test"] == (1.0, 1.0), f"{run}: the flood lost P4's point"
        nb = nbformat.read(work / "autograded" / "ex-endless-loops" / AID / f"{AID}.ipynb", as_version=4)
        (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "p4_answer"]
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        assert "Output truncated" in text and text.count("debug") <= 400, f"{run}: {text.count('debug'):,} lines kept"


def test_feedback_for_every_student(graded):
    for work, students in ((graded["serial"], ORDINARY), (graded["parallel"], EVERYONE)):
        graded_students = {r[1] for r in _rows(work)["submitted_assignment"]}
        assert set(students) <= graded_students and (work is graded["serial"] or graded_students == set(students))
        assert {p.parent.parent.name for p in (work / "feedback").glob(f"*/{AID}/{AID}.html")} == graded_students


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
    assert before.keys() == after.keys() == set(EVERYONE)
    for sid in before:
        bump = 1.5 if sid == "ex-perfect" else 0.0  # the manual grade, nothing else
        assert float(after[sid]["score"]) == pytest.approx(float(before[sid]["score"]) + bump), sid
    for sid, (score, _) in BROKEN.items():
        assert submission_scores(par, AID, sid)[0] == pytest.approx(score, abs=1e-6), \
            f"{sid}: second parallel run scored differently"
        assert f"{sid}/{AID}:" in graded["tables"]["again"]


def test_one_worker_or_one_submission_is_serial(tmp_path):
    a = course.api(ROOT, tmp_path, tmp_path / "release")
    for jobs, workers in (([(AID, "s1"), (AID, "s2")], 1), ([(AID, "s1")], 4), ([], None)):
        with parallel.Autograder(a, jobs, workers) as g:
            assert g.workers == 1 and g._client is None  # no Dask cluster started


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
