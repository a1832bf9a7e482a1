"""One graded example class of a lesson per test session, shared by every test module that reads it
(tests/test_grading_roundtrip.py, tests/test_key_leaks.py, tests/test_browser.py, tests/test_parallel_grading.py,
tests/test_dask_grading.py), also across pytest-xdist workers.

Grading executes every example notebook in a kernel (about three minutes of one core for lesson 02's
fourteen students), so the first caller grades into the session's shared temporary folder under a file
lock and the others wait for it and reuse the result. Readers never write to it: a test that re-grades
works on a copy (:func:`regradable_copy`). A lesson with hostile examples (expected.json with "score") is
graded with short time limits (:data:`FAST_LIMITS`): its notebooks loop on purpose.

Lesson 02's class is graded a second time, also once per session: a copy, with lesson 00's broken files
handed in too, graded in place with two workers (:func:`regraded_in_parallel`). That one run is the round
trip's second run of the class (same grades, nothing lost) and the parallel-grading tests' first run (every
notebook executed by a worker, the serial run's grades): one grading of fourteen notebooks instead of two.

Also what every example folder expects (``WRONG``, ``EXACT``, from its expected.json) and readers of a
graded course (``cell_scores``, ``submission_scores``, ``feedback_text``), for the serial round trip and
the parallel-grading tests alike."""

from __future__ import annotations

import html
import json
import os
import shutil
import sqlite3
import time
from contextlib import closing, contextmanager
from pathlib import Path

from filelock import FileLock

from coursekit import course, parallel

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "autograder" / "examples"


def _cell_rows(field: str, required: bool) -> list[tuple[str, str, str, str]]:
    """(lesson, student, test cell, text its feedback must contain) from every example folder's expected.json:
    ``"loses"`` names the cells that must lose points ({"p1_test": "feedback text", ...}); ``"told"`` the warm-up
    cells, worth 0 points, whose feedback must still explain the wrong answer."""
    rows = []
    for exp in sorted(EXAMPLES.glob("*/*/expected.json")):
        spec = json.loads(exp.read_text())
        for cell, text in (spec[field] if required else spec.get(field, {})).items():
            rows.append((exp.parent.parent.name, f"ex-{exp.parent.name}", cell, text))
    return rows


WRONG = _cell_rows("loses", required=True)  # every example says what it loses ({} when nothing)
TOLD = _cell_rows("told", required=False)


def _exact_rows() -> list[tuple[str, str, float, list[str]]]:
    """(lesson, student, exact code score, texts the feedback file must contain) for the example folders whose
    expected.json gives a "score" (hostile and broken submissions: some score 0 or full marks on purpose)."""
    rows = []
    for exp in sorted(EXAMPLES.glob("*/*/expected.json")):
        spec = json.loads(exp.read_text())
        if "score" in spec:
            rows.append((exp.parent.parent.name, f"ex-{exp.parent.name}", float(spec["score"]), list(spec.get("feedback", []))))
    return rows


EXACT = _exact_rows()


def _hostile() -> set[tuple[str, str]]:
    """(lesson, student) of every example whose expected.json says ``"hostile": true`` (it attacks the grader or
    breaks cells on purpose; the examples README's table marks the same rows *hostile*, a test checks)."""
    rows = set()
    for exp in sorted(EXAMPLES.glob("*/*/expected.json")):
        if json.loads(exp.read_text()).get("hostile") is True:
            rows.add((exp.parent.parent.name, f"ex-{exp.parent.name}"))
    return rows


def readme_hostile() -> set[tuple[str, str]]:
    """(lesson, student) of every example the examples README's table marks *hostile*."""
    rows = set()
    for line in (EXAMPLES / "README.md").read_text().splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 3 and cols[0].isdigit() and cols[2].startswith("*hostile*"):
            lesson = next(p.name for p in EXAMPLES.iterdir() if p.name.startswith(cols[0] + "-"))
            rows.add((lesson, cols[1]))
    return rows


HOSTILE = _hostile()
HOSTILE_LESSONS = {aid for aid, _ in HOSTILE}
EXACT_SCORE = {(aid, sid): score for aid, sid, score, _ in EXACT}
def cell_scores(work: Path, aid: str, sid: str) -> dict[str, tuple[float, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as gb:
        sub = gb.find_submission_notebook(aid, aid, sid)
        return {g.name: (float(g.score), float(g.max_score)) for g in sub.grades if g.cell.__class__.__name__ == "GradeCell" and g.auto_score is not None}


def submission_scores(work: Path, aid: str, sid: str):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as gb:
        s = gb.find_submission(aid, sid)
        return float(s.code_score), float(s.max_code_score), float(s.score)


def feedback_text(work: Path, aid: str, sid: str) -> str:
    return html.unescape((work / "feedback" / sid / aid / f"{aid}.html").read_text())


# Hostile examples loop on purpose: short limits keep the grading fast (the course's defaults are 60 s / 30 s). The
# answer limit stays well above the ~0.6 s (idle machine; a few times that on busy cores) ex-endless-loops' P4 cell needs
# to print its 20,000 lines (it printed 200,000 short ones, which took 5 s idle and, once, over 15 s in CI), and both
# differ from :data:`PARALLEL_LIMITS`, so that a worker's feedback shows whose it used.
FAST_LIMITS = {"COURSEKIT_ANSWER_TIMEOUT": "16", "COURSEKIT_CASE_TIMEOUT": "6"}


#: Lessons whose example class is graded with kernels that run another number of torch threads than this process (the
#: tests run with one, conftest.py; a grading worker's kernels have one too): an item that asks about the machine must
#: score what the student's own kernel saw (tests/test_same_score.py compares the ways of grading).
KERNEL_THREADS = {"00-setup-and-probes": "2"}


@contextmanager
def limits_for(lesson: str):
    """:data:`FAST_LIMITS` in the environment while ``lesson``'s example class is graded, when it has hostile
    examples (read when nbgrader's config is loaded and by the kernels it starts), and :data:`KERNEL_THREADS`."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        if any(aid in HOSTILE_LESSONS for aid in [lesson]):
            for k, v in FAST_LIMITS.items():
                mp.setenv(k, v)
        if lesson in KERNEL_THREADS:
            mp.setenv("OMP_NUM_THREADS", KERNEL_THREADS[lesson])
        yield


def graded_example_class(tmp_path_factory, lesson: str) -> Path:
    """The course folder of ``lesson``'s example class graded with ``examples=True`` (hidden cases
    included): ``feedback/<student>/<aid>/<aid>.html``, ``autograded/``, ``grades.csv``, the gradebook, and
    ``.graded`` (the score table :func:`coursekit.course.grade_class` returned; :func:`score_table`).
    Read it; never write to it (copy it first: :func:`regradable_copy`)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: one folder per session
    work = shared / f"graded-example-class-{lesson}"
    done = work / ".graded"
    with FileLock(str(work) + ".lock", timeout=1800):
        if not done.exists():
            with limits_for(lesson):
                table = course.grade_class(lessons=[lesson], root=ROOT, examples=True, course_dir=work, workers=1,
                                           release_dir=work / "release", progress=False)
            done.write_text(table)
    return work


def score_table(work: Path) -> str:
    """The score table the grading run of :func:`graded_example_class` printed."""
    return (work / ".graded").read_text()


def regradable_copy(work: Path, dest: Path) -> Path:
    """A copy of a graded course folder (file times kept) that a test may grade again in place."""
    shutil.copytree(work, dest, symlinks=True)
    return dest


# Two kernels share the cores when grading in parallel. The answer limit stays well above the ~0.6 s (on an idle
# machine; a few times that when two kernels and another test share the cores) that ex-endless-loops' P4 cell needs
# to print its 20,000 lines, which must keep its point; the case limit is not the serial run's, so that the feedback shows
# which run's limits a worker used.
PARALLEL_LIMITS = {"COURSEKIT_ANSWER_TIMEOUT": "15", "COURSEKIT_CASE_TIMEOUT": "5"}
# Lesson 00's broken-file students (empty, not JSON, renamed), handed in for another lesson by the parallel re-run.
BROKEN_FROM = "00-setup-and-probes"
BROKEN_FILES = ("ex-empty-file", "ex-not-json", "ex-renamed")


def hand_in_broken_files(submitted: Path, lesson: str) -> None:
    """Lesson 00's broken-file students, for ``lesson``: what their submission.py makes of the perfect notebook."""
    import runpy

    import nbformat

    perfect = nbformat.read(submitted / "ex-perfect" / lesson / f"{lesson}.ipynb", as_version=4)
    for sid in BROKEN_FILES:
        files = runpy.run_path(str(EXAMPLES / BROKEN_FROM / sid.removeprefix("ex-") / "submission.py"))["files"]
        dest = submitted / sid / lesson
        dest.mkdir(parents=True)
        course.write_files(dest, files(nbformat.from_dict(perfect), lesson))


def regraded_in_parallel(tmp_path_factory, lesson: str) -> Path:
    """A copy of :func:`graded_example_class`'s folder of ``lesson``, with lesson 00's broken files handed in too
    (:func:`hand_in_broken_files`) and every score and comment the autograder wrote cleared (row ids, manual grades
    and flags kept), graded again in place with two workers and :data:`PARALLEL_LIMITS`, once per session: the round trip's second run of that class (same grades, nothing lost) and the parallel-grading
    tests' first run (every notebook executed by a worker, the serial run's grades) in one grading.

    ``.regraded.json`` in it holds that run's score table, its grades.csv text, when it started (``time.time()``:
    the copy keeps the first run's file times, so a file older than that was not written again), and what the grading process's
    :class:`coursekit.parallel.Autograder` reports (``workers``, ``replayed``, ``executed_here``). Read it;
    never write to it (:func:`regradable_copy`)."""
    import pytest

    serial = graded_example_class(tmp_path_factory, lesson)
    work = serial.parent / f"regraded-in-parallel-{lesson}"
    done = work / ".regraded.json"
    with FileLock(str(work) + ".lock", timeout=1800):
        if not done.exists():
            shutil.rmtree(work, ignore_errors=True)  # what a crashed attempt left
            regradable_copy(serial, work)
            (work / ".graded").unlink()  # the serial run's table: this folder's is in .regraded.json
            # Every score and comment the autograder wrote is cleared (row ids, manual grades and flags stay), so
            # that a grade equal to the serial run's afterwards was written by this run, not left over.
            with closing(sqlite3.connect(work / "gradebook.db")) as db:
                db.execute("UPDATE grade SET auto_score = NULL")
                db.execute("UPDATE comment SET auto_comment = NULL")
                db.commit()
            hand_in_broken_files(work / "submitted", lesson)
            made: list[parallel.Autograder] = []

            class Recording(parallel.Autograder):
                def __init__(self, *a, **k):
                    super().__init__(*a, **k)
                    made.append(self)

            started = time.time()
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(parallel, "Autograder", Recording)
                for k, v in PARALLEL_LIMITS.items():  # read when the config is loaded (answer cells) and in the kernels
                    mp.setenv(k, v)
                table = course.grade_class(lessons=[lesson], root=ROOT, course_dir=work, release_dir=work / "release",
                                           progress=False, workers=2)
            (run,) = made
            part = done.with_suffix(".part")  # written whole, then renamed: a reader never sees half of it
            part.write_text(json.dumps({"table": table, "csv": (work / "grades.csv").read_text(), "started": started,
                                        "workers": run.workers,
                                        "replayed": sorted(map(list, run.replayed)),
                                        "executed_here": sorted(map(list, run.executed_here))}))
            os.replace(part, done)
    return work


def parallel_run(work: Path) -> dict:
    """What :func:`regraded_in_parallel`'s grading run reported (see there)."""
    return json.loads((work / ".regraded.json").read_text())


def feedback_files(work: Path, lesson: str) -> dict[str, Path]:
    """student id → that student's feedback HTML."""
    files = {p.parent.parent.name: p for p in (work / "feedback").glob(f"*/{lesson}/{lesson}.html")}
    assert files, f"no feedback HTML under {work / 'feedback'}"
    return files
