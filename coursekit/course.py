"""The nbgrader pipeline of the course: release lessons, build the example class, autograde, feedback, export.

Everything runs through nbgrader's own API (``nbgrader.apps.NbGraderAPI``) with the configuration in
``autograder/nbgrader_config.py``; this module only decides what to call and in which order.

Layout (see the config file): source = ``solutions/``, release = ``lessons/``, working course =
``autograder/course/`` (gradebook.db, submitted/, autograded/, feedback/, grades.csv).

Example class: for every lesson, ``ex-blank`` (the release, untouched) and ``ex-perfect`` (the
release with every answer cell filled from the solution). For lessons with a folder
``autograder/examples/<lesson>/``, each subfolder is one more student, ``ex-<name>``: the perfect
submission with the answer cells named by its files (``<grade_id>.py`` or ``<grade_id>.md``) replaced.
A folder may also hold ``submission.py`` defining ``files(nb, aid) -> {file name: content}``: it
receives that notebook and returns what the student hands in (a notebook, or text/bytes written as
they are), for submissions that are not answer-cell edits: deleted, duplicated or reordered cells,
edited locked cells, a renamed notebook, an empty or non-JSON file.

Broken submissions never stop the class: a submission whose notebook is missing, empty, not JSON or
not a notebook scores 0 with a feedback file that says why (see :func:`check_submission`), and the
score table lists it; one that nbgrader fails to grade scores 0 the same way.
"""

from __future__ import annotations

import copy
import csv
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import nbformat

from .nbenv import CourseError, kernel_env

LESSON_RE = re.compile(r"^\d\d-[a-z0-9-]+$")
SOLUTION_DELIMS = ("### BEGIN SOLUTION", "### END SOLUTION")


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


def use_course_keys(root: Path) -> Path:
    """Point ``$COURSEKIT_KEYS`` at the course's instructor keys (``autograder/keys``) unless it is set already;
    kernels that nbgrader starts inherit it. Returns the folder in use."""
    from .grading import keys

    if keys.key_dir() is None:
        os.environ[keys.ENV] = str(root / "autograder" / "keys")
    return keys.key_dir()


def _require_keys(lessons: Iterable[str]) -> None:
    """Refuse to grade without the instructor's keys: every choice would score 0 and no hidden case would run."""
    from .grading import key_problems, keys

    for aid in lessons:
        try:
            keys.load(aid[:2])
        except (keys.KeysUnavailable, ValueError) as e:
            raise CourseError(f"cannot autograde {aid}: {e}") from e
    bad = key_problems(aid[:2] for aid in lessons)
    if bad:  # a missing or invalid key would score every student 0 on that item
        raise CourseError("cannot autograde: the answer keys have problems (coursekit keys check):\n  " + "\n  ".join(bad))


def api(root: Path, course_dir: Path | None = None, release_dir: Path | None = None):
    """An ``NbGraderAPI`` bound to this course."""
    import logging

    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    # bitsandbytes logs a note about an optional kernel package on import (grading imports the lesson
    # items, and lesson 19's import it); it is not the instructor's concern here (coursekit doctor reports it).
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    kernel_env()
    cfg = load_config(root, course_dir, release_dir)
    Path(cfg.CourseDirectory.root).mkdir(parents=True, exist_ok=True)
    # The sandboxed grading kernel sees neither the course folder (gradebook, other students) nor the sources.
    cfg.GuardedExecute.hidden_paths = [str(Path(cfg.CourseDirectory.root).resolve()),
                                       str(Path(cfg.CourseDirectory.source_directory).resolve())]
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
            students[f"ex-{sub.name}"] = {f.stem: f.read_text() for f in sorted(sub.iterdir())
                                          if f.suffix in (".py", ".md") and f.name != "submission.py"}
    return students


def _submission_files(root: Path, aid: str, sid: str, nb) -> dict:
    """{file name: notebook or raw content} for one example student (``submission.py``'s ``files``, if any)."""
    script = root / "autograder" / "examples" / aid / sid.removeprefix("ex-") / "submission.py"
    if not script.is_file():
        return {f"{aid}.ipynb": nb}
    ns: dict = {"__file__": str(script), "__name__": f"example_{sid}"}
    exec(compile(script.read_text(), str(script), "exec"), ns)
    return ns["files"](nb, aid)


def write_files(dest: Path, files: dict) -> None:
    """Write a submission's files into ``dest``: bytes and str as they are, a notebook with nbformat."""
    for name, content in files.items():
        if isinstance(content, bytes):
            (dest / name).write_bytes(content)
        elif isinstance(content, str):
            (dest / name).write_text(content)
        else:
            nbformat.write(content, dest / name)


def build_examples(root: Path, aid: str, submitted: Path, release_dir: Path | None = None) -> list[str]:
    """Write the example class's submissions of lesson ``aid`` under ``submitted/<student>/<aid>/``."""
    import shutil

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
        if dest.is_dir():  # a re-run rebuilds the example exactly (a renamed notebook must not leave the old name behind)
            shutil.rmtree(dest)
        dest.mkdir(parents=True, exist_ok=True)
        write_files(dest, _submission_files(root, aid, sid, copy.deepcopy(nb)))
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
                workers: int | None = None, scheduler: str | None = None, task_timeout: float | None = None,
                certs: str | os.PathLike | None = None) -> str:
    """Release, autograde every submission, write feedback and grades.csv; return the score table.

    ``examples=False`` grades your class: the submissions in the configured course folder
    (autograder/course/submitted/). ``examples=True`` builds and grades the example class in its own
    course folder (autograder/example-class/ unless ``course_dir`` is given), so example students
    never enter your class's gradebook or grades.csv.

    Re-running is safe: nbgrader's gradebook keeps every record (manual grades included) and
    regrading gives the same scores.

    ``workers`` notebooks execute at once on a local Dask cluster (default: one per CPU core; 1 grades one
    submission after the other, as nbgrader does); ``scheduler`` (e.g. ``"tcp://10.0.0.5:8786"``) sends the
    executions to the workers of an existing Dask cluster instead. ``task_timeout``: seconds one submission's
    execution may take on a worker (default coursekit.parallel.TASK_TIMEOUT). ``certs``: the folder of TLS
    certificates (``coursekit cluster-certs``) for a ``tls://`` scheduler; a plain ``tcp://`` one is refused unless it
    is on the loopback address (coursekit.cluster). Only this process holds the keys and writes the gradebook (see
    coursekit.parallel).
    """
    if examples and course_dir is None:
        course_dir = repo_root(root) / EXAMPLE_CLASS
    import warnings

    # nbgrader's gradebook trips SQLAlchemy's autoflush warnings on every autograde; they are noise.
    warnings.filterwarnings("ignore", module="nbgrader.api")
    warnings.filterwarnings("ignore", message=".*not in session.*")
    root = repo_root(root)
    ids = _known(root, lessons)
    if scheduler:
        from . import cluster

        cluster.client_security(scheduler, certs)  # an address or certificates it cannot use: say so before anything runs
    use_course_keys(root)
    _require_keys(ids)
    from . import sandbox

    if not sandbox.off() and sandbox.problem():
        raise CourseError(f"cannot grade for credit: {sandbox.problem()}. Submissions run in a sandbox so that no student's "
                          "code can read the answer keys, other students' work or the gradebook, or outlive the run. "
                          "Install bubblewrap, or pass --unsandboxed to grade anyway (not for credit).")
    if not sandbox.off() and sandbox.tree_caps_problem():
        print(f"WARNING: each submission runs sandboxed, but without caps on its whole process tree: "
              f"{sandbox.tree_caps_problem()}. One submission's fork bomb, or many processes that each stay under the "
              f"per-process memory cap, can then slow or stop this run. Grade as root on Linux for the caps.",
              file=sys.stderr)
    from .grading import keys

    keys.freeze({aid[:2] for aid in ids})  # this run grades with the keys as they are now
    try:
        return _grade_class(ids, root, examples, course_dir, release_dir, progress, workers, scheduler, task_timeout, certs)
    finally:
        changed = keys.thaw()
        if changed:
            print("WARNING: answer key files changed on disk while grading (a submission's code may have written them); "
                  "this run used the keys read at its start. Restore them (git checkout autograder/keys) and check:\n  "
                  + "\n  ".join(changed), file=sys.stderr)


CAPSTONE = "19-capstone-a-real-qlora-run"
MODEL_LESSONS = {"08", "09", "15", "16", "17", "18", "19"}  # lessons whose notebooks load the converted embedded model (08: its config)


def _fill_capstone_store(progress: bool) -> None:
    """Lesson 19's notebook reads its run (three trained adapters, their evaluations, the merges) from the capstone
    store and never trains while graded. Compute whatever the store lacks once, here, with coursekit's reference
    functions: minutes on the first grading run on a machine, seconds afterwards."""
    import logging
    import warnings

    from . import capstone

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        say = print if progress else (lambda *a, **k: None)
        say("lesson 19: filling the capstone store with the reference run (once per machine) …")
        capstone.run(capstone.REFERENCE, capstone.Store(compute=True), progress=progress, log=say)


def _grade_class(ids, root, examples, course_dir, release_dir, progress, workers, scheduler=None, task_timeout=None,
                 certs=None) -> str:
    from tqdm.auto import tqdm

    from . import parallel

    a = api(root, course_dir, release_dir)
    course = Path(a.coursedir.root)
    submitted = course / a.coursedir.submitted_directory
    if any(aid[:2] in MODEL_LESSONS for aid in ids):
        # The sandboxed grading kernel sees the model cache read-only: convert the embedded model here, once.
        from . import model

        model.prepare_model(progress=progress)
    if CAPSTONE in ids:
        _fill_capstone_store(progress)
    for aid in ids:
        _check(a.generate_assignment(aid, force=True, create=True), f"releasing {aid}")
        if examples:
            build_examples(root, aid, submitted, release_dir)
    release_root = release_folder(a)
    # A kernel cell whose source is not the release's (added or edited by the student) gets the answer cells' limit.
    from .guard import release_sources

    a.config.GuardedExecute.release_sources = release_sources(release_root)
    jobs = [(aid, s.name) for aid in ids for s in sorted(submitted.iterdir()) if (s / aid).is_dir()] if submitted.is_dir() else []
    problems: dict[tuple[str, str], str] = {}
    # Files that cannot be notebooks (empty, not JSON, renamed) never reach a worker: autograde_one reports them.
    say = (lambda *m: tqdm.write(" ".join(map(str, m)), file=sys.stdout)) if progress else None
    autograde = parallel.Autograder(a, [(aid, sid) for aid, sid in jobs if check_submission(submitted / sid / aid, aid, release_root) is None],
                                    workers, scheduler=scheduler, task_timeout=task_timeout, log=say, certs=certs)
    count = Progress(jobs)
    try:
        bar = tqdm(jobs, desc=f"autograding ({autograde.workers} worker{'s' * (autograde.workers > 1)})",
                   unit="submission", disable=not progress, file=sys.stdout)
        for aid, sid in bar:
            problem = autograde_one(a, aid, sid, autograde)
            if problem:
                problems[(aid, sid)] = problem
            bar.set_postfix_str(count.step(aid, failed=bool(problem)), refresh=False)
            if progress and count.finished(aid):
                bar.write(count.line(aid), file=sys.stdout)
    finally:
        autograde.close()
    # nbgrader fails on a lesson with no autograded submission (none handed in, or every one scored 0 with a reason)
    for aid in sorted({aid for aid, sid in jobs if (aid, sid) not in problems}):
        _check(a.generate_feedback(aid, force=True), f"feedback for {aid}")
    from . import report

    for aid, sid in jobs:  # the class report reads why a submission scored 0 as data (coursekit.report)
        if (aid, sid) in problems:
            report.write_status(course, aid, sid, problems[(aid, sid)])
        else:
            report.clear_status(course, aid, sid)
    for (aid, sid), problem in problems.items():
        write_problem_feedback(course / a.coursedir.feedback_directory / sid / aid, aid, problem)
    rows = scores(course, ids)
    export_csv(a, course / "grades.csv")
    table = format_table(rows)
    if problems:
        table += "\n\nGraded 0, with a feedback file saying why:\n" + "\n".join(
            f"{sid}/{aid}: {p}" for (aid, sid), p in sorted(problems.items()))
    lost = misplaced(submitted, lesson_ids(root))
    if lost:
        table += "\n\nNot graded, in the wrong place:\n" + "\n".join(lost)
    if rows or problems:
        report.write_submissions_csv(course, ids, course / "submissions.csv")
        table += "\n\nsubmissions.csv says, per student and lesson, graded, scored 0 for a reason, or missing."
    if not jobs:
        table = f"No submissions in {submitted}: put them at <student>/<lesson>/<lesson>.ipynb there."
    return table + f"\n\ngrades.csv, gradebook.db and feedback/ are in {course}"


class Progress:
    """Live counts of a grading run, per lesson: graded, failed (scored 0 with a reason) and left."""

    def __init__(self, jobs):
        self.total: dict[str, int] = {}
        for aid, _ in jobs:
            self.total[aid] = self.total.get(aid, 0) + 1
        self.done = dict.fromkeys(self.total, 0)
        self.failed = dict.fromkeys(self.total, 0)

    def step(self, aid: str, failed: bool = False) -> str:
        """Count one graded submission of ``aid``; returns the lesson's status, e.g. ``02: 5 done, 1 failed, 12 left``."""
        self.done[aid] += 1
        self.failed[aid] += failed
        return self.status(aid)

    def finished(self, aid: str) -> bool:
        return self.done[aid] == self.total[aid]

    def status(self, aid: str) -> str:
        return f"{aid[:2]}: {self.done[aid] - self.failed[aid]} done, {self.failed[aid]} failed, {self.total[aid] - self.done[aid]} left"

    def line(self, aid: str) -> str:
        failed = self.failed[aid]
        return f"{aid}: {self.done[aid] - failed} graded, {failed} failed" + (" (0 points; the table below says why)" if failed else "")


#: A submitted file larger than this is refused (a lesson's notebook with its outputs is well under 10 MB).
MAX_FILE_BYTES = 32 << 20
#: Files nbgrader itself adds to a submission folder (``nbgrader collect`` writes the submission time).
NBGRADER_FILES = ("timestamp.txt",)


def lesson_files(release: Path | None, aid: str) -> set[str]:
    """The files a submission of ``aid`` may hold: its notebook, nbgrader's own, and the files the lesson's release
    folder ships (``release/<aid>/``, relative paths)."""
    names = {f"{aid}.ipynb", *NBGRADER_FILES}
    folder = None if release is None else Path(release) / aid
    if folder is not None and folder.is_dir():
        names |= {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}
    return names


def _unsafe(folder: Path, aid: str, allowed: set[str] | None) -> str | None:
    """Why ``folder`` is not plain data (a symbolic link, a device or pipe, a file too large, a file the lesson does
    not name), looked at without following any link; None when it is."""
    if folder.is_symlink() or folder.parent.is_symlink():
        return ("your submission folder is a symbolic link. Hand in the lesson's folder itself, with the notebook "
                "file in it.")
    extra = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted([*dirnames, *filenames]):
            p = Path(dirpath) / name
            rel = p.relative_to(folder).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                return (f"it holds a symbolic link ({rel}), which the grader does not follow: hand in the files "
                        "themselves (the notebook saved by Jupyter), not links to them.")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                return f"it holds {rel}, which is not a regular file (a device, pipe or socket): hand in files only."
            if st.st_nlink != 1:
                return (f"{rel} is a hard link to another file: hand in the files themselves (the notebook saved by "
                        "Jupyter), not links to them.")
            if st.st_size > MAX_FILE_BYTES:
                return (f"{rel} is {st.st_size >> 20} MB, more than the {MAX_FILE_BYTES >> 20} MB a submitted file may "
                        "have (clear the notebook's outputs, or leave large files out).")
            if allowed is not None and rel not in allowed:
                extra.append(rel)
    if extra and (folder / f"{aid}.ipynb").is_file():
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        return (f"it holds files the lesson does not ask for ({shown}). Hand in {aid}.ipynb"
                + (" and the lesson's own files" if len(allowed or ()) > 1 + len(NBGRADER_FILES) else "") + " only.")
    return None


def misplaced(submitted: Path, lessons: Iterable[str]) -> list[str]:
    """What in ``submitted`` (``<student>/<lesson>/``) no lesson folder holds, each with what to do: a folder named by
    a lesson's number or another name of it (``00/``, ``lesson-02``), a notebook directly in the student's folder,
    a lesson folder nested one level too deep. Nothing in it is graded; the instructor moves it and grades again.
    ``lessons``: every lesson id of the course (the student may have handed in any of them)."""
    known = list(lessons)
    out = []
    if not submitted.is_dir():
        return out

    def lesson_of(name: str) -> str | None:
        digits = re.sub(r"\D", "", name.split("-", 1)[0]) or re.sub(r"\D", "", name)[:2]
        return next((k for k in known if digits and k.startswith(f"{int(digits):02d}-")), None) if digits else None

    for student in sorted(p for p in submitted.iterdir() if p.is_dir()):
        for entry in sorted(student.iterdir()):
            if entry.name in known or entry.name.startswith("."):
                continue
            where = f"{student.name}/{entry.name}"
            if entry.is_dir():
                inner = [q.name for q in entry.iterdir() if q.is_dir() and q.name in known]
                guess = inner[0] if inner else lesson_of(entry.name)
                if guess is None:
                    for nb in entry.glob("*.ipynb"):
                        guess = lesson_of(nb.stem)
                        if guess:
                            break
                todo = (f"move {where}/{guess} up one level, to {student.name}/{guess}" if inner else
                        f"rename it to {student.name}/{guess}" if guess else
                        f"it names no lesson: put each notebook at {student.name}/<lesson>/<lesson>.ipynb")
                out.append(f"{where}/ is not a lesson folder, so nothing in it was graded: {todo}, then grade again.")
            elif entry.suffix == ".ipynb":
                guess = lesson_of(entry.stem)
                todo = (f"move it to {student.name}/{guess}/{guess}.ipynb" if guess else
                        f"put it at {student.name}/<lesson>/<lesson>.ipynb")
                out.append(f"{where} sits outside any lesson folder, so it was not graded: {todo}, then grade again.")
    return out


def release_folder(a) -> Path:
    """The release folder (``lessons/``) of the course that the NbGraderAPI ``a`` grades."""
    return Path(a.coursedir.root) / a.coursedir.release_directory


def check_submission(folder: Path, aid: str, release: Path | None = None) -> str | None:
    """Why the submission in ``folder`` cannot be autograded (plain words for the student), or None.

    A submission is data, looked at before nbgrader touches it (nbgrader copies what it finds, following links, as
    the user who grades): the folder must hold no symbolic or hard link, device or pipe, no file over
    :data:`MAX_FILE_BYTES`, and nothing but ``<aid>.ipynb`` and the files of :func:`lesson_files` (checked when
    ``release`` is given). The notebook must be ``<aid>.ipynb``, non-empty, JSON, and a notebook nbformat can read."""
    nb_path = folder / f"{aid}.ipynb"
    unsafe = _unsafe(folder, aid, lesson_files(release, aid) if release is not None else None)
    if unsafe is not None and not (folder / f"{aid}.ipynb").is_file() and "does not ask for" in unsafe:
        unsafe = None  # a renamed notebook: the sentence below says what to do
    if unsafe is not None:
        return unsafe
    if not nb_path.is_file():
        others = sorted(p.name for p in folder.glob("*.ipynb"))
        if others:
            return (f"no notebook named {aid}.ipynb was handed in (found {', '.join(others)}). The grader only reads "
                    f"{aid}.ipynb: rename your notebook back to that name and hand it in again.")
        return f"no notebook named {aid}.ipynb was handed in. Hand in the lesson's notebook, {aid}.ipynb."
    raw = nb_path.read_bytes()
    if not raw.strip():
        return f"{aid}.ipynb is an empty file ({len(raw)} bytes): it holds no notebook. Save the notebook in Jupyter and hand it in again."
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    except UnicodeDecodeError:
        return f"{aid}.ipynb is not a text file (it is not UTF-8), so it is not a notebook. Hand in the .ipynb file Jupyter saves."
    except Exception as e:
        kind = "is not JSON" if "JSON" in type(e).__name__ or "json" in str(e).lower()[:200] else "is not a notebook nbformat can read"
        return (f"{aid}.ipynb {kind} ({type(e).__name__}: {str(e).splitlines()[0][:120]}). It may have been edited in a "
                f"text editor or cut short. Open it in Jupyter, save it, and hand it in again.")
    return _not_this_lesson(nb, aid)


def _not_this_lesson(nb, aid: str) -> str | None:
    """Why a readable notebook is not a submission of ``aid``: it has no cells, or none of the lesson's answer cells
    (nbgrader would restore the missing cells and grade a blank lesson, with a traceback for every check), and then
    which lesson's notebook it is, when its first heading or cells say so."""
    if not nb.cells:
        return (f"{aid}.ipynb is a notebook with no cells in it: nothing to grade. Open the lesson's notebook in Jupyter, "
                f"answer it, save it, and hand it in again.")
    ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells}
    ids.discard(None)
    checks = {m.group(1)[:2] for c in nb.cells if c.cell_type == "code"
              for m in re.finditer(r"""grade\(\s*["'](\d\d)\.""", c.source)}
    if ids and checks and aid[:2] not in checks:
        other = sorted(checks)[0]
        return (f"{aid}.ipynb holds lesson {other}'s notebook, not lesson {aid[:2]}'s (its checks are lesson {other}'s). "
                f"Hand in lesson {aid[:2]}'s notebook under this name.")
    if not ids:
        return (f"{aid}.ipynb has none of the lesson's answer and check cells (it is not the lesson's notebook, or they "
                f"were deleted). Start again from the lesson's notebook, answer it, and hand it in.")
    return None


def autograde_one(a, aid: str, sid: str, autograde=None) -> str | None:
    """Autograde one submission; never raises for the student's sake. Returns None when nbgrader graded it,
    else why it could not be graded (it then scores 0 in the gradebook, and nothing of an earlier
    run's autograded copy remains to produce stale feedback)."""
    course = Path(a.coursedir.root)
    problem = check_submission(course / a.coursedir.submitted_directory / sid / aid, aid, release_folder(a))
    if problem is None:
        r = autograde(aid, sid) if autograde is not None else a.autograde(aid, sid, force=True, create=True)
        if r.get("success"):
            return None
        log = (r.get("log") or "") + "\n" + (r.get("error") or "")
        if r.get("problem"):  # the grading cluster could not execute it (coursekit.parallel.Autograder)
            kept = course / "grading-errors" / sid / f"{aid}.log"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(log)
            _record_zero(a, aid, sid)
            return f"the grader could not run this notebook: {r['problem']}. The instructor has the log."
        why = _nbgrader_reason(log)
        kept = course / "grading-errors" / sid / f"{aid}.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(log)
        print(f"coursekit grade: nbgrader could not grade {sid}/{aid}: {why} (its log: {kept})", file=sys.stderr)
        problem = ("the grader could not run this notebook" +
                   (": its kernel stopped responding (an endless loop that ignores interrupts, or one that fills the memory?)"
                    if "unresponsive" in log else f" (nbgrader: {why})") + ". The instructor has the log.")
    _record_zero(a, aid, sid)
    return problem


def _nbgrader_reason(log: str) -> str:
    """The last exception line of nbgrader's log (e.g. a check cell whose metadata the student edited)."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    errs = [l for l in lines if re.match(r"^[\w.]*(Error|Exception|Entry)\b:?", l) and not l.startswith("Traceback")]
    return (errs[-1] if errs else (lines[-1] if lines else "no log"))[:300]


def _record_zero(a, aid: str, sid: str) -> None:
    """Score 0 on every cell of ``sid``'s submission of ``aid`` (as nbgrader does for a missing notebook),
    creating the student and submission if needed, and drop any autograded copy of an earlier run."""
    import shutil

    from nbgrader.api import Gradebook

    with Gradebook(a.coursedir.db_url, a.coursedir.course_id) as gb:
        gb.update_or_create_student(sid)
        sub = gb.update_or_create_submission(aid, sid)
        for nb in sub.notebooks:
            for g in nb.grades:
                g.auto_score = 0
                g.needs_manual_grade = False
        gb.db.commit()
    for step in (a.coursedir.autograded_directory, a.coursedir.feedback_directory):
        stale = Path(a.coursedir.root) / step / sid / aid
        if stale.is_dir():
            shutil.rmtree(stale)


def write_problem_feedback(folder: Path, aid: str, problem: str) -> Path:
    """The feedback file of a submission that could not be graded: ``<aid>.html``, saying why in plain words."""
    import html as _html

    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{aid}.html"
    dest.write_text(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + _html.escape(aid) + " - feedback</title></head>\n"
        f"<body><h1>{_html.escape(aid)}: 0 points</h1>\n<p>Your submission could not be graded: {_html.escape(problem)}</p>\n"
        "<p>Nothing else in it was looked at. Ask your instructor to grade it again once you have handed in the fixed notebook.</p>\n"
        "</body></html>\n")
    return dest


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
