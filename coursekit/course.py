"""The nbgrader pipeline of the course: release lessons, build the example class, autograde, feedback, export.

Everything runs through nbgrader's own API (``nbgrader.apps.NbGraderAPI``) with the configuration in
``autograder/nbgrader_config.py``; this module only decides what to call and in which order.

Layout (see the config file): source = ``solutions/``, release = ``lessons/``, working course =
``autograder/course/`` (gradebook.db, submitted/, autograded/, feedback/, grades.csv).

Example class: for every lesson, ``ex-blank`` (the release, untouched) and ``ex-perfect`` (the
release with every answer cell filled from the solution). For lessons with a folder
``autograder/examples/<lesson>/``, each subfolder is one more student, ``ex-<name>``: the perfect
submission with the answer cells named by its files (``<grade_id>.py`` or ``<grade_id>.md``) replaced.
"""

from __future__ import annotations

import copy
import csv
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import nbformat

LESSON_RE = re.compile(r"^\d\d-[a-z0-9-]+$")
SOLUTION_DELIMS = ("### BEGIN SOLUTION", "### END SOLUTION")


class CourseError(RuntimeError):
    """A step of the pipeline failed; the message says which step, which lesson or student, and why."""


def repo_root(root: str | os.PathLike | None = None) -> Path:
    """The course repository: ``root`` if given, else the nearest folder upwards holding solutions/ and autograder/."""
    if root is not None:
        p = Path(root).resolve()
        if not (p / "solutions").is_dir():
            raise CourseError(f"{p} has no solutions/ folder: pass the course repository's root.")
        return p
    for p in [Path.cwd(), *Path.cwd().parents]:
        if (p / "solutions").is_dir() and (p / "autograder").is_dir():
            return p
    raise CourseError("not inside the course repository (no solutions/ and autograder/ found upwards); pass --root.")


def lesson_ids(root: Path) -> list[str]:
    """Lesson ids, in order: the folders of solutions/ named like ``02-lora-inside-one-matmul``."""
    return sorted(p.name for p in (root / "solutions").iterdir() if p.is_dir() and LESSON_RE.match(p.name))


def _known(root: Path, lessons: Iterable[str] | None) -> list[str]:
    """The requested lesson ids (all by default). "02" or "2" stands for the lesson whose id starts
    with "02-"; an unknown one is an error naming the known ones."""
    known = lesson_ids(root)
    ids = []
    for l in lessons or known:
        l = str(l).strip().rstrip("/").split("/")[-1]
        if l.isdigit():
            l = next((k for k in known if k.startswith(f"{int(l):02d}-")), l)
        if l not in known:
            raise CourseError(f"unknown lesson {l!r}; lessons are: {', '.join(known)} (or their numbers, e.g. 02)")
        ids.append(l)
    return ids


def load_config(root: Path, course_dir: Path | None = None, release_dir: Path | None = None):
    """nbgrader's config from autograder/nbgrader_config.py, optionally redirecting the working course and release."""
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(root / "autograder")).load_config()
    if course_dir is not None:
        cfg.CourseDirectory.root = str(course_dir)
    if release_dir is not None:
        cfg.CourseDirectory.release_directory = str(release_dir)
    return cfg


def _kernel_env() -> None:
    # nbgrader runs the `alembic` console script of its environment to migrate the gradebook.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    # Make the "python3" kernel that nbgrader starts the one of this environment (with coursekit),
    # even if the user has another python3 kernelspec in ~/.local/share/jupyter.
    share = str(Path(sys.prefix) / "share" / "jupyter")
    paths = os.environ.get("JUPYTER_PATH", "").split(os.pathsep)
    if share not in paths:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([share] + [p for p in paths if p])


def api(root: Path, course_dir: Path | None = None, release_dir: Path | None = None):
    """An ``NbGraderAPI`` bound to this course."""
    import logging

    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    # bitsandbytes logs a note about an optional kernel package on import (grading imports the lesson
    # items, and lesson 19's import it); it is not the instructor's concern here (coursekit doctor reports it).
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    _kernel_env()
    cfg = load_config(root, course_dir, release_dir)
    Path(cfg.CourseDirectory.root).mkdir(parents=True, exist_ok=True)
    coursedir = CourseDirectory(config=cfg)
    return NbGraderAPI(coursedir=coursedir, config=cfg)


def _check(result: dict, step: str) -> None:
    if not result.get("success"):
        log = (result.get("log") or "").strip().splitlines()[-15:]
        raise CourseError(f"{step} failed: {result.get('error') or ''}\n" + "\n".join(log))


def release(lessons: Iterable[str] | None = None, root: str | os.PathLike | None = None,
            course_dir: Path | None = None, release_dir: Path | None = None) -> list[str]:
    """Generate the student notebooks (nbgrader ``generate_assignment``) of each lesson; returns the ids."""
    root = repo_root(root)
    ids = _known(root, lessons)
    a = api(root, course_dir, release_dir)
    for aid in ids:
        _check(a.generate_assignment(aid, force=True, create=True), f"releasing {aid}")
    return ids


# --------------------------------------------------------------------------- the example class


def _strip_solution(source: str) -> str:
    return "\n".join(l for l in source.splitlines() if l.strip() not in SOLUTION_DELIMS)


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def perfect_submission(solution_nb, release_nb):
    """The release notebook with each answer cell's source taken from the solution (delimiters removed)."""
    answers = {
        _grade_id(c): _strip_solution(c.source)
        for c in solution_nb.cells
        if c.get("metadata", {}).get("nbgrader", {}).get("solution")
    }
    nb = copy.deepcopy(release_nb)
    for c in nb.cells:
        gid = _grade_id(c)
        if gid in answers and c.metadata["nbgrader"].get("solution"):
            c.source = answers[gid]
    return nb


def example_students(root: Path, aid: str) -> dict[str, dict[str, str]]:
    """Student id → {grade_id: replacement source} for the example class of one lesson."""
    students: dict[str, dict[str, str] | None] = {"ex-blank": None, "ex-perfect": {}}
    folder = root / "autograder" / "examples" / aid
    if folder.is_dir():
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            students[f"ex-{sub.name}"] = {f.stem: f.read_text() for f in sorted(sub.iterdir()) if f.suffix in (".py", ".md")}
    return students


def build_examples(root: Path, aid: str, submitted: Path, release_dir: Path | None = None) -> list[str]:
    """Write the example class's submissions of lesson ``aid`` under ``submitted/<student>/<aid>/``."""
    sol = nbformat.read(root / "solutions" / aid / f"{aid}.ipynb", as_version=4)
    rel_path = (release_dir or root / "lessons") / aid / f"{aid}.ipynb"
    rel = nbformat.read(rel_path, as_version=4)
    written = []
    for sid, replace in example_students(root, aid).items():
        if replace is None:
            nb = rel
        else:
            nb = perfect_submission(sol, rel)
            known = {_grade_id(c) for c in nb.cells}
            unknown = sorted(set(replace) - known)
            if unknown:
                raise CourseError(f"example {sid} of {aid} replaces unknown cells {unknown}; cells are {sorted(k for k in known if k)}")
            for c in nb.cells:
                if _grade_id(c) in replace:
                    c.source = replace[_grade_id(c)].rstrip("\n")
        dest = submitted / sid / aid
        dest.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest / f"{aid}.ipynb")
        written.append(sid)
    return written


# --------------------------------------------------------------------------- grading


@dataclass
class Row:
    lesson: str
    student: str
    score: float
    max_score: float


EXAMPLE_CLASS = Path("autograder") / "example-class"


def grade_class(lessons: Iterable[str] | None = None, root: str | os.PathLike | None = None, examples: bool = False,
                course_dir: Path | None = None, release_dir: Path | None = None, progress: bool = True,
                workers: int | None = None) -> str:
    """Release, autograde every submission, write feedback and grades.csv; return the score table.

    ``examples=False`` grades your class: the submissions in the configured course folder
    (autograder/course/submitted/). ``examples=True`` builds and grades the example class in its own
    course folder (autograder/example-class/ unless ``course_dir`` is given), so example students
    never enter your class's gradebook or grades.csv.

    Re-running is safe: nbgrader's gradebook keeps every record (manual grades included) and
    regrading gives the same scores.

    ``workers`` notebooks execute at once (default: one per CPU core; 1 grades one submission after
    the other, as nbgrader does); only this process writes the gradebook (see coursekit.parallel).
    """
    if examples and course_dir is None:
        course_dir = repo_root(root) / EXAMPLE_CLASS
    import warnings

    from tqdm.auto import tqdm

    from . import parallel

    # nbgrader's gradebook trips SQLAlchemy's autoflush warnings on every autograde; they are noise.
    warnings.filterwarnings("ignore", module="nbgrader.api")
    warnings.filterwarnings("ignore", message=".*not in session.*")
    root = repo_root(root)
    ids = _known(root, lessons)
    a = api(root, course_dir, release_dir)
    course = Path(a.coursedir.root)
    submitted = course / a.coursedir.submitted_directory
    for aid in ids:
        _check(a.generate_assignment(aid, force=True, create=True), f"releasing {aid}")
        if examples:
            build_examples(root, aid, submitted, release_dir)
    jobs = [(aid, s.name) for aid in ids for s in sorted(submitted.iterdir()) if (s / aid).is_dir()] if submitted.is_dir() else []
    failures = []
    autograde = parallel.Autograder(a, jobs, workers)
    for aid, sid in tqdm(jobs, desc=f"autograding ({autograde.workers} worker{'s' * (autograde.workers > 1)})", unit="submission",
                         disable=not progress, file=sys.stdout):
        r = autograde(aid, sid)
        if not r.get("success"):
            failures.append(f"{sid}/{aid}: {(r.get('error') or '').strip()[:300]}")
    autograde.close()
    for aid in sorted({aid for aid, _ in jobs}):  # nbgrader fails on a lesson with no submissions
        _check(a.generate_feedback(aid, force=True), f"feedback for {aid}")
    rows = scores(course, ids)
    export_csv(a, course / "grades.csv")
    table = format_table(rows)
    if failures:
        table += "\n\nNot graded (see the log above):\n" + "\n".join(failures)
    if not jobs:
        table = f"No submissions in {submitted}: put them at <student>/<lesson>/<lesson>.ipynb there."
    return table + f"\n\ngrades.csv, gradebook.db and feedback/ are in {course}"


def scores(course: Path, ids: Iterable[str]) -> list[Row]:
    """(lesson, student, score, max) for every autograded submission, from the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    rows = []
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for aid in ids:
            try:
                assignment = gb.find_assignment(aid)
            except MissingEntry:
                continue
            for sub in sorted(assignment.submissions, key=lambda s: s.student.id):
                rows.append(Row(aid, sub.student.id, float(sub.score), float(sub.max_score)))
    return rows


def export_csv(a, dest: Path) -> None:
    """nbgrader's own CSV export (columns assignment, duedate, …, raw_score, score, max_score)."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins.export import CsvExportPlugin

    plugin = CsvExportPlugin(config=a.config)
    plugin.to = str(dest)
    with Gradebook(a.coursedir.db_url) as gb:
        plugin.export(gb)


def format_table(rows: list[Row]) -> str:
    if not rows:
        return "No submissions graded."
    w = max(len(r.student) for r in rows)
    lw = max(len("lesson"), *(len(r.lesson) for r in rows))  # lesson ids grow long (05-backward-through-…)
    lines = [f"{'lesson':<{lw}} {'student':<{w}} {'score':>7} {'max':>5}", "-" * (lw + w + 16)]
    for r in rows:
        lines.append(f"{r.lesson:<{lw}} {r.student:<{w}} {r.score:7.2f} {r.max_score:5g}")
    return "\n".join(lines)


def read_grades_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
