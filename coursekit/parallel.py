"""Parallel autograding that keeps nbgrader's gradebook consistent by construction.

nbgrader autogrades one submission at a time, and its gradebook is one SQLite file: several
``nbgrader autograde`` processes writing to it at once risk "database is locked" errors and lost or
duplicated rows (creating the same student twice, for instance). So only the expensive step runs in
parallel, and nothing in parallel ever touches the course's gradebook:

1. **Execute, in worker processes** (``concurrent.futures.ProcessPoolExecutor``). Each submission
   is autograded by nbgrader in a private scratch course folder with a *copy* of the gradebook taken
   after the release, with the autograde pipeline cut right after nbgrader's ``Execute``
   preprocessor. The result is the executed notebook, nothing else.
2. **Grade, in this process, one submission at a time, in order**: ``NbGraderAPI.autograde``, the
   same call as serial grading, with one change: its ``Execute`` preprocessor is
   :class:`ReplayExecute`, which takes the worker's executed notebook instead of starting a kernel,
   after checking that its cells are exactly the cells nbgrader just sanitized here. Everything else
   (sanitizing, overwriting locked cells, ``SaveAutoGrades``, late penalties, the autograded/ files)
   is nbgrader's own code writing to the gradebook from a single process, exactly as in serial mode.

If a worker failed (a kernel that died, a broken pool) or its cells do not match, ``ReplayExecute``
falls back to nbgrader's ``Execute`` right here, so a submission always ends as it would serially.
``workers=1`` is nbgrader's plain serial autograde.
"""

from __future__ import annotations

import copy
import os
import shutil
import sqlite3
import sys
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Unicode

from .nbenv import CourseError, kernel_env


def default_workers() -> int:
    """The CPU cores this process may run on (the default number of grading workers)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _same_cells(a, b) -> bool:
    """Same cells, in the same order: type, source and nbgrader metadata (outputs may differ)."""
    if len(a.cells) != len(b.cells):
        return False
    return all(
        x.cell_type == y.cell_type and x.source == y.source
        and x.get("metadata", {}).get("nbgrader") == y.get("metadata", {}).get("nbgrader")
        for x, y in zip(a.cells, b.cells)
    )


def _scratch(root: Path, aid: str, sid: str) -> Path:
    """A worker's private course folder for one submission."""
    return root / aid / sid


def _executed(root: Path, aid: str, sid: str, notebook: str) -> Path:
    return _scratch(root, aid, sid) / "autograded" / sid / aid / f"{notebook}.ipynb"


# executed_root → {"replayed": [(aid, sid), ...], "executed_here": [...]}, read by the Autograder that owns
# executed_root (traitlets deep-copies config values, so a list cannot be handed over in the config).
_RECORDS: dict[str, dict] = {}
_CAPTURED: dict[str, str] = {}  # in a worker: the notebook just executed, as JSON text (see _Capture)


class _Capture(NbGraderPreprocessor):
    """Last in a worker's pipeline: keep the executed notebook in memory, to return it with the result."""

    def preprocess(self, nb, resources):
        _CAPTURED["nb"] = nbformat.writes(nb)
        return nb, resources


def _record(executed_root: str, what: str, g: dict) -> None:
    if executed_root in _RECORDS:
        _RECORDS[executed_root][what].append((g["assignment"], g["student"]))


class _Replay:
    """Mixed into the pipeline's execute preprocessor (nbgrader's ``Execute`` or a subclass such as
    coursekit.guard.GuardedExecute): a notebook already executed by a grading worker is used as is,
    provided its cells are exactly the ones nbgrader sanitized in this process; otherwise the
    preprocessor executes it here as usual."""

    def preprocess(self, nb, resources=None, km=None):
        g = (resources or {}).get("nbgrader", {})
        if self.executed_root and g:
            path = _executed(Path(self.executed_root), g["assignment"], g["student"], g["notebook"])
            # The notebook as the worker held it in memory right after execution, never the file on disk: a
            # process the student's code left running could rewrite that file before this reads it.
            text = _RECORDS.get(self.executed_root, {}).get("notebooks", {}).pop((g["assignment"], g["student"]), None)
            if text is not None:
                done = nbformat.reads(text, as_version=4)
                if _same_cells(nb, done):
                    self.log.info("Using the notebook executed by a grading worker: %s", path)
                    _record(self.executed_root, "replayed", g)
                    return done, resources
                self.log.warning("The worker's executed notebook %s has other cells; executing it here", path)
            else:
                self.log.info("No executed notebook from a grading worker for %s/%s; executing it here",
                              g["student"], g["assignment"])
            _record(self.executed_root, "executed_here", g)
        return super().preprocess(nb, resources, km=km)


def _executed_root_trait():
    return Unicode("", help="folder of the workers' scratch courses (<assignment>/<student>/...)").tag(config=True)


class ReplayExecute(_Replay, Execute):
    """:class:`_Replay` over nbgrader's own ``Execute``."""

    executed_root = _executed_root_trait()


def _execute_index(pps: list) -> int:
    """Position of the pipeline's execute preprocessor (``Execute`` or a subclass); ValueError if none."""
    for i, p in enumerate(pps):
        if isinstance(p, type) and issubclass(p, Execute):
            return i
    raise ValueError("no Execute preprocessor in the autograde pipeline")


def _replay_class(execute_cls: type) -> type:
    """ReplayExecute for nbgrader's Execute; for a subclass, a class of the same behaviour named
    ``ReplayExecute`` whose config also reads the subclass's section (traitlets follows the MRO)."""
    if execute_cls is Execute:
        return ReplayExecute
    return type("ReplayExecute", (_Replay, execute_cls), {"__module__": __name__, "executed_root": _executed_root_trait()})


def _pipeline(config) -> list:
    """The configured autograde preprocessors (nbgrader's default list unless the config sets one)."""
    from nbgrader.converters import Autograde
    from traitlets.utils.importstring import import_item

    pps = config.Autograde.get("autograde_preprocessors", None) if "Autograde" in config else None
    if pps is None:
        pps = Autograde.class_traits()["autograde_preprocessors"].default()
    return [import_item(p) if isinstance(p, str) else p for p in pps]


@dataclass(frozen=True)
class _Job:
    config: object       # the course's nbgrader config (traitlets Config), as the grading process uses it
    submitted: str       # the course's submitted/ folder (read only)
    snapshot: str        # the gradebook copied after the release (read only)
    scratch_root: str
    aid: str
    sid: str


def _init_worker() -> None:
    # Workers share the cores: one BLAS/torch thread per kernel unless the user chose otherwise.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import logging
    import warnings

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="nbgrader.api")
    warnings.filterwarnings("ignore", message=".*not in session.*")


def _execute(job: _Job) -> dict:
    """In a worker: autograde one submission in a private course folder, up to and including
    ``Execute``. Returns nbgrader's result dict (success, error, log)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    kernel_env()
    scratch = _scratch(Path(job.scratch_root), job.aid, job.sid)
    scratch.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(job.snapshot, scratch / "gradebook.db")
    cfg = copy.deepcopy(job.config)
    cfg.CourseDirectory.root = str(scratch)
    cfg.CourseDirectory.submitted_directory = job.submitted
    cfg.CourseDirectory.db_url = f"sqlite:///{scratch / 'gradebook.db'}"
    pps = _pipeline(cfg)
    cfg.Autograde.autograde_preprocessors = pps[: _execute_index(pps) + 1] + [_Capture]
    a = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    _CAPTURED.clear()
    r = a.autograde(job.aid, job.sid, force=True, create=True)
    r["executed"] = _CAPTURED.pop("nb", None)
    return r


def _copy_missing(src: Path, dest: Path) -> None:
    """Copy the files under ``src`` that ``dest`` lacks (never a notebook: those are written by nbgrader)."""
    if not src.is_dir() or not dest.is_dir():
        return
    for f in src.rglob("*"):
        target = dest / f.relative_to(src)
        if f.is_file() and f.suffix != ".ipynb" and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)


def _lock_course(root: Path):
    """Hold an exclusive lock (``filelock``) on the course folder while grading (released by its ``release()``):
    two grading runs on one gradebook would be two writers."""
    from filelock import FileLock, Timeout

    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / ".coursekit-grading.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise CourseError(f"another `coursekit grade` is grading {root} right now; wait for it to finish") from None
    return lock


def _sqlite_path(db_url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(db_url[len(prefix):]) if db_url.startswith(prefix) else None


class Autograder:
    """``autograde(aid, sid)`` for each of ``jobs`` in turn, returning nbgrader's result dict.

    With ``workers > 1`` every job's notebook starts executing in a worker process right away (in job
    order); each call then waits for its own job and grades it in this process (see the module
    docstring). Call :meth:`close` when done (or use it as a context manager)."""

    def __init__(self, api, jobs: list[tuple[str, str]], workers: int | None = None):
        self.api = api
        self._lock = _lock_course(Path(api.coursedir.root))
        self.workers = max(1, min(workers or default_workers(), len(jobs)))
        self._futures: dict[tuple[str, str], Future] = {}
        self._pool = self._tmp = None
        self.replayed: list[tuple[str, str]] = []       # executed by a worker, graded here
        self.executed_here: list[tuple[str, str]] = []  # executed here after all (worker failed or cells differ)
        db = _sqlite_path(api.coursedir.db_url)
        if self.workers == 1 or db is None or not any(isinstance(p, type) and issubclass(p, Execute)
                                                      for p in _pipeline(api.config)):
            self.workers = 1  # serial: nbgrader's own autograde, one submission after the other
            return
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory

        self._tmp = tempfile.TemporaryDirectory(prefix="coursekit-grade-")
        self._scratch_root = scratch_root = Path(self._tmp.name) / "work"
        snapshot = Path(self._tmp.name) / "gradebook.db"
        with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(snapshot)) as dst:
            src.backup(dst)  # a consistent copy (this process is the gradebook's only writer anyway)
        submitted = str(Path(api.coursedir.root) / api.coursedir.submitted_directory)
        cfg = copy.deepcopy(api.config)
        pps = _pipeline(api.config)
        i = _execute_index(pps)
        cfg.Autograde.autograde_preprocessors = pps[:i] + [_replay_class(pps[i])] + pps[i + 1:]
        cfg.ReplayExecute.executed_root = str(scratch_root)
        _RECORDS[str(scratch_root)] = {"replayed": self.replayed, "executed_here": self.executed_here, "notebooks": {}}
        self._replay = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
        import multiprocessing

        # The platform's default start method (fork on Linux: workers start at once, before this process
        # opens the gradebook or starts any kernel). Where it is spawn (macOS, Windows), a script that
        # calls grade_class needs the usual `if __name__ == "__main__":` guard; `coursekit grade` has it.
        self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(),
                                         initializer=_init_worker)
        for aid, sid in jobs:
            job = _Job(api.config, submitted, str(snapshot), str(scratch_root), aid, sid)
            self._futures[(aid, sid)] = self._pool.submit(_execute, job)

    def __call__(self, aid: str, sid: str) -> dict:
        fut = self._futures.pop((aid, sid), None)
        if fut is None:
            return self.api.autograde(aid, sid, force=True, create=True)
        try:
            executed = fut.result().get("executed")  # a failed execution has none: ReplayExecute executes it here
            if executed:
                _RECORDS[str(self._scratch_root)]["notebooks"][(aid, sid)] = executed
        except Exception as e:  # the worker itself died (e.g. BrokenProcessPool): same fallback
            print(f"grading worker failed on {sid}/{aid} ({type(e).__name__}: {e}); executing it here", file=sys.stderr)
        scratch = _scratch(self._scratch_root, aid, sid)
        try:
            r = self._replay.autograde(aid, sid, force=True, create=True)
            if r.get("success"):  # files the student's code wrote next to the notebook, as a serial run leaves them
                _copy_missing(scratch / "autograded" / sid / aid,
                              Path(self.api.coursedir.format_path(self.api.coursedir.autograded_directory, sid, aid)))
            return r
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._tmp is not None:
            _RECORDS.pop(str(self._scratch_root), None)
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
