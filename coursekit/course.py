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
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import nbformat

from . import submissions
from .example_class import example_students  # noqa: F401  (the course's API)
from .nbenv import CourseError, kernel_env
from .submissions import MAX_FILE_BYTES, NBGRADER_FILES, lesson_files, misplaced  # noqa: F401  (the course's API)

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

    if keys.env_dir() is None:  # (not key_dir(): the repository's own keys are not found while autograding)
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


def regenerate(a, root: Path, aid: str) -> list[str]:
    """nbgrader's ``generate_assignment`` of ``aid`` for the course of the NbGraderAPI ``a`` (its gradebook gets the
    lesson's current cells), written into the release folder without that lesson ever being missing or half-written
    there: nbgrader's own ``force`` empties the lesson's release folder before it writes again, and another grading run,
    a JupyterLab server on ``lessons/`` or a test reading it meanwhile would find no notebook. Here nbgrader generates
    into a scratch folder; each file that differs then replaces the old one with ``os.replace`` (atomic within one file
    system: a reader sees the old file or the new one), and a file no longer generated is removed (nbgrader's ignored
    names, such as ``.ipynb_checkpoints``, are left alone). Returns the relative paths written or removed.

    Raises :class:`CourseError` when nbgrader cannot generate the lesson."""
    import fnmatch
    import filecmp
    import tempfile

    dest = release_folder(a) / aid
    ignore = list(a.coursedir.ignore)

    def ignored(rel: Path) -> bool:
        return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in ignore)

    changed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="coursekit-release-") as tmp:
        scratch = api(root, Path(a.coursedir.root), Path(tmp))
        _check(scratch.generate_assignment(aid, force=True, create=True), f"releasing {aid}")
        made = Path(tmp) / aid
        new = {p.relative_to(made) for p in made.rglob("*") if p.is_file()}
        for rel in sorted(new):
            target = dest / rel
            if target.is_file() and not target.is_symlink() and filecmp.cmp(made / rel, target, shallow=False):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as out:
                out.write((made / rel).read_bytes())
            shutil.copymode(made / rel, out.name)
            os.replace(out.name, target)
            changed.append(rel.as_posix())
    if dest.is_dir():
        for p in sorted(dest.rglob("*"), reverse=True):
            rel = p.relative_to(dest)
            if rel in new or ignored(rel) or (p.is_dir() and not p.is_symlink()):
                continue
            p.unlink()
            changed.append(rel.as_posix())
    return changed


def gradebook_lessons(course_dir: Path) -> set[str]:
    """The lessons nbgrader's gradebook in ``course_dir`` knows (its assignments); empty when there is none yet."""
    db = Path(course_dir) / "gradebook.db"
    if not db.is_file():
        return set()
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}") as gb:
        return {a.name for a in gb.assignments}


def prepare_gradebook(root: Path, course_dir: Path | None = None) -> list[str]:
    """Put every lesson handed in (a folder of it in ``submitted/``) that the gradebook of the course folder lacks into
    it (nbgrader's generate_assignment, released into a scratch folder: lessons/ is not rewritten), so that nbgrader's
    own autograde (the formgrader's button, a plain ``nbgrader autograde``) works on a fresh course folder without
    "Generate" first. Returns the lessons added."""
    import tempfile

    root = repo_root(root)
    folder = Path(course_dir) if course_dir else Path(load_config(root).CourseDirectory.root)
    have = gradebook_lessons(folder)
    missing = [aid for aid in lesson_ids(root) if aid not in have and handed_in(folder / "submitted", aid)]
    if missing:
        with tempfile.TemporaryDirectory(prefix="coursekit-release-") as tmp:
            release(missing, root=root, course_dir=folder, release_dir=Path(tmp))
    return missing


def formgrader_root(root: Path, course_dir: Path) -> Path:
    """The folder the formgrader's server serves. nbgrader's formgrader links a lesson's folders as
    ``<course folder relative to the server root>/<folder relative to the course folder>``: rooted at the repository
    (where the course folder is by default, ``autograder/course/``) both stay inside it, and rooted at ``autograder/``
    the source link pointed outside. A course folder elsewhere: the folder holding both it and the repository, unless
    that is the file system's root (then the course folder itself; the links to ``solutions/`` and ``lessons/`` do
    not open, coursekit formgrader says so)."""
    root, course_dir = Path(root).resolve(), Path(course_dir).resolve()
    if course_dir.is_relative_to(root):
        return root
    top = Path(os.path.commonpath([root, course_dir]))
    return course_dir if top == Path(top.anchor) else top


def formgrader_command(root: Path, course_dir: Path, port: int = 8888, ip: str = "127.0.0.1",
                       browser: bool = True) -> tuple[list[str], dict, Path]:
    """(argv, environment, working folder) of a Jupyter server that serves nbgrader's formgrader for the course folder
    ``course_dir``: started in ``autograder/`` (nbgrader reads the course's ``nbgrader_config.py`` from there, with
    ``$COURSEKIT_COURSE`` naming the course folder), rooted at :func:`formgrader_root`, so that the formgrader's links
    to ``solutions/``, ``lessons/`` and the submissions stay inside the server's root; it opens on ``/formgrader``."""

    root = repo_root(root)
    top = formgrader_root(root, Path(course_dir))
    exe = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or shutil.which("jupyter") or "jupyter"
    argv = [exe, "server", f"--ServerApp.root_dir={top}", "--ServerApp.default_url=/formgrader",
            f"--ServerApp.ip={ip}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            # the students' side of nbgrader (assignment and course lists) has no use here, and it reports a missing
            # exchange folder as a critical error at every start
            "--ServerApp.jpserver_extensions=nbgrader.server_extensions.assignment_list=False",
            "--ServerApp.jpserver_extensions=nbgrader.server_extensions.course_list=False"]
    if not browser:
        argv.append("--no-browser")
    if os.geteuid() == 0:  # Jupyter refuses to run as root unless told; graders often are root (the sandbox's caps)
        argv.append("--allow-root")
    env = {**os.environ, "COURSEKIT_COURSE": str(Path(course_dir).resolve())}
    return argv, env, root / "autograder"


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
    if lessons is None and not examples:  # grade what was handed in, not every lesson of the course
        cfg = load_config(root, course_dir).CourseDirectory
        folder = Path(cfg.root) / cfg.get("submitted_directory", "submitted")
        ids = [aid for aid in ids if handed_in(folder, aid)]
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
MODEL_LESSONS = {"04", "08", "09", "10", "13", "15", "16", "17", "18", "19"}  # lessons whose notebooks load the converted embedded model (08: its config)


def handed_in(submitted: Path, aid: str) -> bool:
    """Whether any student folder of ``submitted`` holds a folder of lesson ``aid``."""
    return any((s / aid).is_dir() for s in submissions.student_folders(submitted))


class GradingInterrupted(CourseError):
    """Ctrl-C stopped a grading run; what was graded before it is in the gradebook and grades.csv."""


class _CtrlC:
    """While grading: Ctrl-C (SIGINT) raises KeyboardInterrupt as usual, and is remembered (:attr:`hit`). nbgrader
    catches every exception of an autograde run, KeyboardInterrupt included, and reports a failed submission
    (``nbgrader.utils.capture_log``): the grader asks :attr:`hit` before it would score that submission 0, and stops
    instead. A no-op outside the main thread (signals go to the main thread only).

    Python runs the handler between two bytecodes of whatever the main thread is doing, which may be a finalizer (a
    Dask future's ``__del__``): there the KeyboardInterrupt cannot propagate, and Python would print it as
    "Exception ignored in ..." with a traceback. While this is active such a lost KeyboardInterrupt is dropped
    quietly (:attr:`hit` already records it, and the grader's waits ask :attr:`hit`); every other unraisable
    exception is reported as before."""

    def __init__(self):
        self.hit = False
        self._before = None
        self._unraisable_before = None

    def _handler(self, signum, frame):
        self.hit = True
        raise KeyboardInterrupt

    def _unraisable(self, u):
        if self.hit and isinstance(u.exc_value, KeyboardInterrupt):
            return
        self._unraisable_before(u)

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._before = signal.signal(signal.SIGINT, self._handler)
            self._unraisable_before, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc):
        import signal

        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)
            sys.unraisablehook = self._unraisable_before


#: What filling the capstone store costs on the course's 2-core test machine, cold: about 6 minutes for the runs and
#: one more for the cheap rungs where the CPU multiplies bf16 (AVX512-BF16 or AMX); in float32 on an AVX2-only CPU,
#: about 8 and up to 6 more (docs/capstone-results-*.md; coursekit.cheap's feature pass and probe search).
CAPSTONE_FILL_MINUTES = (7, 15)


def _fill_capstone_store(progress: bool) -> None:
    """Lesson 19's notebook reads its run (three trained adapters, their evaluations, the merges) from the capstone
    store and never trains while graded. Compute whatever the store lacks once, here, with coursekit's reference
    functions: minutes on the first grading run on a machine (said before it starts), seconds afterwards."""
    import logging
    import warnings

    from . import capstone

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        say = print if progress else (lambda *a, **k: None)
        lo, hi = CAPSTONE_FILL_MINUTES
        say(f"lesson 19: its notebook reads the reference run from the capstone store ({capstone.Store().root}). "
            f"Whatever the store lacks is computed now, once per machine: {lo} to {hi} minutes of CPU when it is empty "
            f"(more on a busy machine), seconds when it is full. Ctrl-C stops it; what is stored stays.")
        capstone.run(capstone.REFERENCE, capstone.Store(compute=True), progress=progress, log=say)


#: The lesson whose notebook reads a stored held-out-loss comparison (coursekit.quantloss.stored_comparison).
QUANTLOSS = "15-nf4-and-double-quantization"


def _fill_quantloss_store(progress: bool) -> None:
    """Lesson 15 compares NF4, FP4 and int4 by SmolLM2's loss on held-out tickets (about a minute of CPU). Its notebook
    reads the comparison from the capstone store, so compute it here once, before grading, rather than once per
    graded notebook (the grading sandbox may not write the store). The arguments are the lesson's own
    (:data:`coursekit.quantloss.LESSON_TICKETS`; tests/test_quantloss.py checks the lesson's cell)."""
    import logging

    from . import capstone, data, quantloss

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    n = quantloss.LESSON_TICKETS
    if progress:
        print("lesson 15: its held-out loss comparison is read from the capstone store; computed now if missing "
              "(about a minute, once per machine).")
    quantloss.stored_comparison(capstone.Store(compute=True), data.load_split("unseen_phrasing")[:n], batch_size=n,
                                progress=progress)


def _grade_class(ids, root, examples, course_dir, release_dir, progress, workers, scheduler=None, task_timeout=None,
                 certs=None) -> str:
    from . import parallel

    a = api(root, course_dir, release_dir)
    course = Path(a.coursedir.root)
    submitted = course / a.coursedir.submitted_directory
    if any(aid[:2] in MODEL_LESSONS for aid in ids):
        # The sandboxed grading kernel sees the model cache read-only: convert the embedded model here, once.
        from . import model

        model.prepare_model(progress=progress)
    if QUANTLOSS in ids:
        _fill_quantloss_store(progress)
    for aid in ids:
        regenerate(a, root, aid)
        if examples:
            build_examples(root, aid, submitted, release_dir)
    release_root = release_folder(a)
    # A kernel cell whose source is not the release's (added or edited by the student) gets the answer cells' limit,
    # and the kernel sees the lesson's own files of the submission folder, nothing else of it.
    from .guard import release_sources

    a.config.GuardedExecute.release_sources = release_sources(release_root)
    a.config.GuardedExecute.release_files = {aid: sorted(lesson_files(release_root, aid)) for aid in ids}
    a.config.TidyAutograded.release_directory = str(release_root)
    a.config.InertOutputs.release_directory = str(release_root)
    a.config.RefuseUnsafe.release_directory = str(release_root)
    # (a folder whose name nbgrader would read as a pattern is not a student: listed as misplaced, with the rename)
    jobs = [(aid, s.name) for aid in ids for s in submissions.student_folders(submitted) if (s / aid).is_dir()]
    problems: dict[tuple[str, str], str] = {}
    done: list[tuple[str, str]] = []
    lock = parallel.lock_course(course)
    try:
        # Lesson 19 last, after its store is filled: the other lessons are graded meanwhile, not kept waiting.
        first = [j for j in jobs if j[0] != CAPSTONE]
        last = [j for j in jobs if j[0] == CAPSTONE]
        if last and progress:
            lo, hi = CAPSTONE_FILL_MINUTES
            print(f"lesson 19 is handed in: after the other lessons, its capstone store is checked and what it lacks "
                  f"is computed ({lo} to {hi} minutes when it is empty, the first run on a machine; seconds after).")
        count = Progress(jobs)
        with _CtrlC() as ctrl_c:
            for part in (first, last):
                if not part:
                    continue
                if part is last:
                    _fill_capstone_store(progress)
                _autograde(a, part, release_root, workers, scheduler, task_timeout, certs, progress, count, problems,
                           done, ctrl_c)
    except KeyboardInterrupt:
        export_csv(a, course / "grades.csv")
        raise GradingInterrupted(
            f"stopped (Ctrl-C) after {len(done)} of {len(jobs)} submissions: their scores are in {course / 'gradebook.db'} "
            f"and grades.csv. Run the same command again to grade the rest and write the feedback.") from None
    finally:
        lock.release()
    export_csv(a, course / "grades.csv")  # every score is in: written now, whatever stops the feedback
    with _CtrlC() as stop:
        try:
            _write_feedback(a, jobs, problems, submitted, course, release_root)
        except KeyboardInterrupt:
            stop.hit = True
        except CourseError:  # nbgrader's feedback step reports an interrupted run as a failure
            if not stop.hit:
                raise
    if stop.hit:
        raise GradingInterrupted(
            f"stopped (Ctrl-C) after {len(done)} of {len(jobs)} submissions, while writing the feedback: their scores "
            f"are in {course / 'gradebook.db'} and grades.csv. Run the same command again to write the feedback.") from None
    return _grading_summary(a, ids, jobs, problems, submitted, course, root, examples)


def _write_feedback(a, jobs, problems, submitted, course, release_root) -> None:
    """nbgrader's feedback of every graded lesson, the page saying why for each 0 for a reason, the status the class
    report reads, and nbgrader's files beside every page (so that release_feedback can release it)."""
    from . import report

    for aid in sorted({aid for aid, _ in jobs}):  # every submission has an autograded copy (record_zero's, or nbgrader's)
        _check(a.generate_feedback(aid, force=True), f"feedback for {aid}")
    for aid, sid in jobs:
        folder = submitted / sid / aid
        fb = course / a.coursedir.feedback_directory / sid / aid
        if (aid, sid) in problems:  # the class report reads why a submission scored 0 as data (coursekit.report)
            report.write_status(course, aid, sid, problems[(aid, sid)])
            stems = [] if submissions.refusal(folder) else [p.stem for p in folder.glob("*.ipynb") if p.is_file()]
            write_problem_feedback(fb, aid, problems[(aid, sid)], also=stems)
        else:
            report.write_status(course, aid, sid, "", ignored=submissions.ignored(folder, aid, release_root))
        # nbgrader release_feedback reads timestamp.txt and submission_secret.txt beside every page
        submissions.releasable(fb, folder)


def _grading_summary(a, ids, jobs, problems, submitted, course, root, examples) -> str:
    """The score table and what follows it, and submissions.csv, once the feedback is written."""
    from . import report

    rows = scores(course, ids)
    table = format_table(rows)
    if problems:
        table += "\n\nGraded 0, with a feedback file saying why:\n" + "\n".join(
            f"{sid}/{aid}: {p}" for (aid, sid), p in sorted(problems.items()))
    lost = misplaced(submitted, lesson_ids(root))
    if lost:
        table += "\n\nNot graded, in the wrong place:\n" + "\n".join(m.text for m in lost)
    if rows or problems or lost:
        roster = {aid: list(example_students(root, aid)) for aid in ids} if examples else None
        report.write_submissions_csv(course, ids, course / "submissions.csv", known=lesson_ids(root), roster=roster)
        table += ("\n\nsubmissions.csv says, per student and lesson, graded, scored 0 for a reason, missing or in the "
                  "wrong place, and which files were set aside.")
    if not jobs:
        table = (f"No submissions in {submitted}: put them at <student>/<lesson>/<lesson>.ipynb there."
                 + ("\n\nNot graded, in the wrong place:\n" + "\n".join(m.text for m in lost) if lost else ""))
    return table + f"\n\ngrades.csv, gradebook.db and feedback/ are in {course}"


def _autograde(a, jobs, release_root, workers, scheduler, task_timeout, certs, progress, count, problems, done,
               ctrl_c=None) -> None:
    """Autograde ``jobs`` ((lesson, student) pairs) on one cluster (coursekit.parallel.Autograder), recording each
    submission that scored 0 for a reason in ``problems`` and each one finished in ``done``; ``ctrl_c``
    (:class:`_CtrlC`) stops it when Ctrl-C was pressed."""
    from tqdm.auto import tqdm

    from . import parallel

    submitted = Path(a.coursedir.root) / a.coursedir.submitted_directory
    say = (lambda *m: tqdm.write(" ".join(map(str, m)), file=sys.stdout)) if progress else None
    # Files that cannot be notebooks (empty, not JSON, renamed) never reach a worker: autograde_one reports them.
    runnable = [(aid, sid) for aid, sid in jobs if check_submission(submitted / sid / aid, aid, release_root) is None]
    autograde = parallel.Autograder(a, runnable, workers, scheduler=scheduler, task_timeout=task_timeout, log=say,
                                    certs=certs, lock=False, stopped=(lambda: ctrl_c.hit) if ctrl_c else None)
    try:
        bar = tqdm(jobs, desc=f"autograding ({autograde.workers} worker{'s' * (autograde.workers > 1)})",
                   unit="submission", disable=not progress, file=sys.stdout)
        for aid, sid in bar:
            problem = autograde_one(a, aid, sid, autograde, stopped=(lambda: ctrl_c.hit) if ctrl_c else None)
            if problem:
                problems[(aid, sid)] = problem
            done.append((aid, sid))
            bar.set_postfix_str(count.step(aid, failed=bool(problem)), refresh=False)
            if progress and count.finished(aid):
                bar.write(count.line(aid), file=sys.stdout)
    finally:
        autograde.close()


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


def release_folder(a) -> Path:
    """The release folder (``lessons/``) of the course that the NbGraderAPI ``a`` grades."""
    return Path(a.coursedir.root) / a.coursedir.release_directory


def check_submission(folder: Path, aid: str, release: Path | None = None) -> str | None:
    """Why the submission in ``folder`` cannot be autograded (plain words for the student), or None: see
    :func:`coursekit.submissions.check`."""
    return submissions.check(folder, aid, release)


def autograde_one(a, aid: str, sid: str, autograde=None, stopped=None) -> str | None:
    """Autograde one submission; never raises for the student's sake. Returns None when nbgrader graded it,
    else why it could not be graded (it then scores 0 in the gradebook, and :func:`record_zero` leaves an
    autograded copy that says why, so that the formgrader shows it graded). Raises KeyboardInterrupt, scoring
    nothing, when ``stopped()`` says the grader was interrupted meanwhile (nbgrader reports that as a failure)."""
    course = Path(a.coursedir.root)
    problem = check_submission(course / a.coursedir.submitted_directory / sid / aid, aid, release_folder(a))
    if problem is None:
        before = _scores_of(a, aid, sid) if stopped is not None else None
        r = autograde(aid, sid) if autograde is not None else a.autograde(aid, sid, force=True, create=True)
        if stopped is not None and stopped():  # whatever this run wrote of it is not a grade: put back what was
            _put_back(a, aid, sid, before)
            raise KeyboardInterrupt
        if r.get("success"):
            return None
        log = (r.get("log") or "") + "\n" + (r.get("error") or "")
        if r.get("problem"):  # the grading cluster could not execute it (coursekit.parallel.Autograder)
            kept = course / "grading-errors" / sid / f"{aid}.log"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(log)
            problem = f"the grader could not run this notebook: {r['problem']}. The instructor has the log."
            record_zero(a, aid, sid, problem)
            return problem
        why = _nbgrader_reason(log)
        kept = course / "grading-errors" / sid / f"{aid}.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(log)
        print(f"coursekit grade: nbgrader could not grade {sid}/{aid}: {why} (its log: {kept})", file=sys.stderr)
        problem = ("the grader could not run this notebook" +
                   (": its kernel stopped responding (an endless loop that ignores interrupts, or one that fills the memory?)"
                    if "unresponsive" in log else f" (nbgrader: {why})") + ". The instructor has the log.")
    record_zero(a, aid, sid, problem)
    return problem


def _scores_of(a, aid: str, sid: str) -> dict | None:
    """What the gradebook holds of ``sid``'s ``aid`` before it is graded again: (notebook, cell) → (auto_score,
    auto_comment); None when it holds no such submission."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(a.coursedir.db_url, a.coursedir.course_id) as gb:
        try:
            sub = gb.find_submission(aid, sid)
        except MissingEntry:
            return None
        out = {}
        for nb in sub.notebooks:
            for g in nb.grades:
                out[(nb.name, "grade", g.name)] = g.auto_score
            for c in nb.comments:
                out[(nb.name, "comment", c.name)] = c.auto_comment
        return out


def _put_back(a, aid: str, sid: str, before: dict | None) -> None:
    """Undo an autograde run of ``sid``'s ``aid`` that Ctrl-C cut short: the automatic scores and comments it had
    (:func:`_scores_of`; manual grades were never touched), or no submission at all if it had none; its autograded
    copy, which the cut-short run wrote, is removed (the next run writes it again)."""

    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(a.coursedir.db_url, a.coursedir.course_id) as gb:
        try:
            sub = gb.find_submission(aid, sid)
        except MissingEntry:
            sub = None
        if sub is not None and before is None:
            gb.remove_submission(aid, sid)
        elif sub is not None:
            for nb in sub.notebooks:
                for g in nb.grades:
                    g.auto_score = before.get((nb.name, "grade", g.name))
                for c in nb.comments:
                    c.auto_comment = before.get((nb.name, "comment", c.name))
            gb.db.commit()
    stale = Path(a.coursedir.root) / a.coursedir.autograded_directory / sid / aid
    if stale.is_dir():
        shutil.rmtree(stale)


def _nbgrader_reason(log: str) -> str:
    """The last exception line of nbgrader's log (e.g. a check cell whose metadata the student edited)."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    errs = [l for l in lines if re.match(r"^[\w.]*(Error|Exception|Entry)\b:?", l) and not l.startswith("Traceback")]
    return (errs[-1] if errs else (lines[-1] if lines else "no log"))[:300]


def record_zero(a, aid: str, sid: str, problem: str) -> None:
    """Score 0 on every cell of ``sid``'s submission of ``aid`` (as nbgrader does for a missing notebook), creating the
    student and submission if needed with the time ``nbgrader collect`` recorded, and replace any autograded copy
    of an earlier run by the lesson's release notebook with ``problem`` in a first cell: the formgrader then lists
    the submission as autograded, 0 points, and shows why when it is opened, and nbgrader's own feedback step
    has something to start from. nbgrader's files (:data:`coursekit.submissions.NBGRADER_FILES`) go with it, so
    that its feedback can be released however often it is generated again (coursekit.submissions.releasable)."""

    from nbgrader.api import Gradebook

    course = Path(a.coursedir.root)
    submitted = course / a.coursedir.submitted_directory / sid / aid
    stamp = _timestamp(submitted)
    with Gradebook(a.coursedir.db_url, a.coursedir.course_id) as gb:
        gb.update_or_create_student(sid)
        sub = gb.update_or_create_submission(aid, sid, **({"timestamp": stamp} if stamp else {}))
        for nb in sub.notebooks:
            for g in nb.grades:
                g.auto_score = 0
                g.needs_manual_grade = False
        gb.db.commit()
    for step in (a.coursedir.autograded_directory, a.coursedir.feedback_directory):
        stale = course / step / sid / aid
        if stale.is_dir():
            shutil.rmtree(stale)
    placeholder = course / a.coursedir.autograded_directory / sid / aid
    placeholder.mkdir(parents=True)
    nb = nbformat.read(release_folder(a) / aid / f"{aid}.ipynb", as_version=4)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(
        f"**0 points: this submission could not be graded.** {submissions.inert_markdown(problem, most=2000)}",
        id=submissions.ZERO_CELL_ID))
    nbformat.write(nb, placeholder / f"{aid}.ipynb")
    submissions.releasable(placeholder, submitted)


def _timestamp(submitted: Path):
    """When ``nbgrader collect`` says the submission in ``submitted`` was handed in (its ``timestamp.txt``, read as
    data: coursekit.submissions.nbgrader_file), or None: none, or one nbgrader cannot parse (the file is the
    student's; a bad one must not stop the class)."""
    from nbgrader.utils import parse_utc

    text = submissions.nbgrader_file(submitted, "timestamp.txt")
    if not text or not text.strip():
        return None
    try:
        return parse_utc(text.strip())
    except Exception:  # noqa: BLE001  (dateutil raises ValueError, OverflowError, ...: any of them means "unreadable")
        return None


def write_problem_feedback(folder: Path, aid: str, problem: str, also: Iterable[str] = ()) -> Path:
    """The feedback file of a submission that could not be graded: ``<aid>.html``, saying why in plain words (and the
    same page under each name of ``also``: a renamed notebook's feedback is fetched under the student's name for it).
    Returns the path of ``<aid>.html``."""
    import html as _html

    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{aid}.html"
    page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + _html.escape(aid) + " - feedback</title></head>\n"
            f"<body><h1>{_html.escape(aid)}: 0 points</h1>\n<p>Your submission could not be graded: {_html.escape(problem)}</p>\n"
            "<p>Nothing else in it was looked at. Ask your instructor to grade it again once you have handed in the fixed notebook.</p>\n"
            "</body></html>\n")
    dest.write_text(page)
    for stem in also:
        if stem != aid and re.fullmatch(r"[\w.+ -]{1,120}", stem) and not stem.startswith("."):
            (folder / f"{stem}.html").write_text(page)
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


#: grades.csv's columns that hold names (the others are numbers and times nbgrader writes).
_NAME_COLUMNS = ("assignment", "student_id", "last_name", "first_name", "email")


def export_csv(a, dest: Path) -> None:
    """nbgrader's own CSV export (columns assignment, duedate, …, raw_score, score, max_score), with every name cell
    that starts like a spreadsheet formula made inert (:func:`coursekit.report.inert_cell`, OWASP's rule)."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins.export import CsvExportPlugin

    from .report import inert_cell

    plugin = CsvExportPlugin(config=a.config)
    plugin.to = str(dest)
    with Gradebook(a.coursedir.db_url) as gb:
        plugin.export(gb)
    with open(dest, newline="") as f:
        rows = list(csv.reader(f))
    if rows:
        names = {i for i, col in enumerate(rows[0]) if col in _NAME_COLUMNS}
        with open(dest, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(
                [rows[0]] + [[inert_cell(v) if i in names else v for i, v in enumerate(r)] for r in rows[1:]])


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
