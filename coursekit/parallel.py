"""Parallel autograding on Dask, with nbgrader's gradebook written by one process only.

nbgrader autogrades one submission at a time, and its gradebook is one SQLite file: several
``nbgrader autograde`` processes writing to it at once risk "database is locked" errors and lost or
duplicated rows (creating the same student twice, for instance). So only the expensive step runs in
parallel, and nothing in parallel ever touches the course's gradebook:

1. **Execute, on Dask workers** (`Dask distributed <https://distributed.dask.org>`_): a local cluster
   of ``workers`` processes by default, or the workers of an existing cluster (``scheduler``, e.g.
   ``tcp://host:8786``). Each task is one :class:`Task`, plain data: the submission's files as bytes
   and a gradebook holding only the lesson's cells (no student, no grade, no answer key, no hidden-case
   seed). The worker (:func:`execute`) autogrades it with nbgrader in a private scratch course that it
   deletes afterwards, the pipeline cut right after nbgrader's ``Execute`` step (coursekit's sandboxed
   ``GuardedExecute``), and returns the executed notebook as text: nothing else comes back.
2. **Grade, in this process, one submission at a time, in order**: ``NbGraderAPI.autograde``, the
   same call as serial grading, with one change: its ``Execute`` preprocessor is
   :class:`ReplayExecute`, which takes the worker's executed notebook instead of starting a kernel,
   after checking that its cells are exactly the cells nbgrader just sanitized here. Everything else
   (sanitizing, overwriting locked cells, scoring every answer against the keys, ``SaveAutoGrades``,
   late penalties, the autograded/ files) is nbgrader's and coursekit's own code in this process, which
   alone holds the answer keys and writes the gradebook, exactly as in serial mode.

Failures: a task whose worker dies is run again on another worker once (the scheduler's
``distributed.scheduler.allowed-failures``, set to 1 for the local cluster; set it on your scheduler),
and so is a task that raises; a task that has not returned ``task_timeout`` seconds after this process
began waiting for it is cancelled and submitted once more. A submission that fails twice scores 0 with
the reason (see :meth:`Autograder.__call__`), and so does every submission still waiting once the cluster has had
no worker at all for ``NO_WORKERS_GRACE`` seconds: the run always finishes. A worker that executed the notebook
but whose nbgrader failed, or whose notebook's cells do not match, is graded here as a serial run would
(``ReplayExecute`` then executes it in this process). ``workers=1`` without a scheduler is nbgrader's
plain serial autograde.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import socket
import sqlite3
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Unicode

from . import cluster
from .nbenv import CourseError, kernel_env

TASK_TIMEOUT = 3600  # seconds a submission's execution may take on a worker, by default (the cells have their own limits)
NO_WORKERS_GRACE = 120  # seconds a cluster may have no worker at all (all died, or none joined yet) before jobs fail
MAX_SUBMISSION_BYTES = 64 << 20  # a submission larger than this is not sent to a worker (a notebook is ~100 kB)


def default_workers() -> int:
    """The CPU cores this process may run on (the default number of local grading workers)."""
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


# --------------------------------------------------------------------------- what travels to a worker


@dataclass(frozen=True)
class Task:
    """One sandboxed execution of one submission, as plain data (pickled by Dask to a worker).

    ``files``: the submission folder, relative path → bytes (the notebook ``<aid>.ipynb`` and whatever the
    student handed in with it). ``gradebook``: an nbgrader SQLite gradebook holding only lesson ``aid``'s
    assignment, notebook and cell rows (what nbgrader's OverwriteCells restores locked and deleted cells
    from), bytes. ``config``: the course's nbgrader configuration (traitlets ``Config``) without its
    folders; the worker sets them to its scratch course. No answer key, hint or hidden-case seed: those
    stay with the grading process, which scores every answer (coursekit.guard.ScoreAnswers)."""

    aid: str
    sid: str
    files: dict
    gradebook: bytes
    config: object
    attempt: int = 1
    # How the worker must isolate the notebook: {"unsandboxed": the instructor's --unsandboxed, "require_caps": refuse
    # without the control-group caps}. See worker_problem.
    policy: dict = field(default_factory=lambda: {"unsandboxed": False, "require_caps": True})

    def size(self) -> int:
        """Bytes of submission and gradebook carried (the config adds a few kB)."""
        return sum(len(b) for b in self.files.values()) + len(self.gradebook)


_COURSE_FOLDERS = ("root", "source_directory", "release_directory", "submitted_directory", "autograded_directory",
                   "feedback_directory", "db_url")


def task_config(config):
    """The nbgrader config a worker needs: the course's, without the grader's course folders (a worker uses its own
    scratch course) and with nothing that names the instructor's key folder."""
    from .grading import keys

    cfg = copy.deepcopy(config)
    if "CourseDirectory" in cfg:
        for k in _COURSE_FOLDERS:
            cfg.CourseDirectory.pop(k, None)
    for section in ("GuardedExecute", "TidyAutograded", "InertOutputs", "RefuseUnsafe"):  # the release folder: what it holds travels as release_*
        if section in cfg:
            cfg[section].pop("release_directory", None)
    kd = keys.key_dir()
    if kd is not None and str(kd.resolve()) in repr(cfg) or keys.ENV in repr(cfg):
        raise CourseError("the nbgrader configuration names the answer keys' folder; it must not travel to grading workers")
    return cfg


def lesson_gradebook(db: Path, aid: str, dest: Path) -> bytes:
    """A copy of the gradebook ``db`` with lesson ``aid``'s cells only: no student, submission, grade or comment,
    and no other lesson. Written to ``dest`` and returned as bytes."""
    with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(dest)) as dst:
        src.backup(dst)  # a consistent copy (this process is the gradebook's only writer anyway)
        for t in ("comment", "grade", "submitted_notebook", "submitted_assignment", "student"):
            dst.execute(f"DELETE FROM {t}")
        others = "SELECT n.id FROM notebook n JOIN assignment a ON n.assignment_id = a.id WHERE a.name != ?"
        cells = f"SELECT id FROM base_cell WHERE notebook_id IN ({others})"
        for t in ("grade_cells", "solution_cells", "task_cells"):
            dst.execute(f"DELETE FROM {t} WHERE id IN ({cells})", (aid,))
        dst.execute(f"DELETE FROM base_cell WHERE notebook_id IN ({others})", (aid,))
        dst.execute(f"DELETE FROM source_cell WHERE notebook_id IN ({others})", (aid,))
        dst.execute("DELETE FROM notebook WHERE assignment_id IN (SELECT id FROM assignment WHERE name != ?)", (aid,))
        dst.execute("DELETE FROM assignment WHERE name != ?", (aid,))
        dst.commit()
        dst.execute("VACUUM")
    return dest.read_bytes()


def submission_files(folder: Path, keep: set[str] | None = None) -> dict:
    """Relative path → bytes of the files of a submission folder that a worker needs: those named in ``keep`` (the
    lesson's files, coursekit.submissions.lesson_files; None: every file). CourseError past MAX_SUBMISSION_BYTES, or
    for a symbolic link (coursekit.submissions.check refuses those first)."""
    out, total = {}, 0
    for f in sorted(folder.rglob("*")):
        if f.is_symlink():
            raise CourseError(f"the submission folder {folder} holds a symbolic link: {f.name}")
        rel = f.relative_to(folder).as_posix()
        if f.is_file() and (keep is None or rel in keep):
            total += f.stat().st_size
            if total > MAX_SUBMISSION_BYTES:
                raise CourseError(f"the submission folder {folder} holds more than {MAX_SUBMISSION_BYTES >> 20} MB")
            out[rel] = f.read_bytes()
    return out


# --------------------------------------------------------------------------- on a worker


_CAPTURED: dict[str, str] = {}  # token → the notebook a worker just executed, as JSON text (see CaptureExecuted)


class CaptureExecuted(NbGraderPreprocessor):
    """Last in a worker's pipeline: keep the executed notebook in memory (never the file on disk, which a process
    the student's code left running could rewrite), to return it as the task's result."""

    token = Unicode("").tag(config=True)

    def preprocess(self, nb, resources):
        _CAPTURED[self.token] = nbformat.writes(nb)
        return nb, resources


def _execute_index(pps: list) -> int:
    """Position of the pipeline's execute preprocessor (``Execute`` or a subclass); ValueError if none."""
    for i, p in enumerate(pps):
        if isinstance(p, type) and issubclass(p, Execute):
            return i
    raise ValueError("no Execute preprocessor in the autograde pipeline")


def _pipeline(config) -> list:
    """The configured autograde preprocessors (nbgrader's default list unless the config sets one)."""
    from nbgrader.converters import Autograde
    from traitlets.utils.importstring import import_item

    pps = config.Autograde.get("autograde_preprocessors", None) if "Autograde" in config else None
    if pps is None:
        pps = Autograde.class_traits()["autograde_preprocessors"].default()
    return [import_item(p) if isinstance(p, str) else p for p in pps]


class TaskMaker:
    """Builds the :class:`Task` of each submission of the course that ``api`` grades, in the grading process: the
    files from its submitted/ folder, read when the task is made, and one cells-only gradebook per lesson, made
    from the course's gradebook (after the release) once and kept in ``scratch``."""

    def __init__(self, api, scratch: Path):
        db = _sqlite_path(api.coursedir.db_url)
        if db is None:
            raise CourseError("grading on workers needs nbgrader's default SQLite gradebook")
        self._db, self._scratch = db, Path(scratch)
        self._gradebooks: dict[str, bytes] = {}
        self._config = task_config(api.config)
        self._submitted = Path(api.coursedir.root) / api.coursedir.submitted_directory
        self.policy = {"unsandboxed": False, "require_caps": True}

    def __call__(self, aid: str, sid: str, attempt: int = 1) -> Task:
        if aid not in self._gradebooks:
            self._gradebooks[aid] = lesson_gradebook(self._db, aid, self._scratch / f"{aid}.db")
        keep = set(self._config.GuardedExecute.get("release_files", {}).get(aid, ())) or {f"{aid}.ipynb"}
        return Task(aid, sid, submission_files(self._submitted / sid / aid, keep), self._gradebooks[aid], self._config, attempt,
                    self.policy)


def _quiet() -> None:
    import logging
    import warnings

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="nbgrader.api")
    warnings.filterwarnings("ignore", message=".*not in session.*")


class SandboxRefused(RuntimeError):
    """A grading worker cannot run a submission in the sandbox the grader asked for, so it refuses the task."""


def worker_problem(policy: dict) -> str | None:
    """On a worker: why it cannot execute a submission under ``policy`` (no bubblewrap, or no control-group caps where
    they are required), naming the worker; None when it can."""
    from . import sandbox

    if policy.get("unsandboxed"):
        return None
    why = sandbox.problem() or (sandbox.tree_caps_problem() if policy.get("require_caps", True) else None)
    return None if why is None else f"grading worker {socket.gethostname()}:{os.getpid()} refuses to run submissions: {why}"


def execute(task: Task) -> dict:
    """On a worker: autograde ``task``'s submission in a private scratch course, up to and including nbgrader's
    ``Execute`` step (coursekit.guard.GuardedExecute: the kernel runs in the sandbox), then delete the scratch.

    Returns nbgrader's result dict (``success``, ``error``, ``log``) plus ``executed`` (the executed notebook as
    JSON text, or None when nbgrader failed before executing it), ``seconds`` (wall time of the execution) and
    ``worker`` (host name and process id). Raises only if the worker itself cannot run nbgrader."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    from . import sandbox
    from .grading import keys

    why = worker_problem(task.policy)
    if why:
        raise SandboxRefused(why)
    if task.policy.get("unsandboxed"):
        os.environ[sandbox.ENV_OFF] = "1"
    t0 = time.perf_counter()
    # A worker started from the grader's shell may have inherited the key folder's variable: drop it (the sandboxed
    # kernel never gets it anyway, coursekit.sandbox.environment).
    for k in [k for k in os.environ if k.startswith(keys.ENV) or k == keys.SEED_ENV]:
        os.environ.pop(k)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _quiet()
    kernel_env()
    with tempfile.TemporaryDirectory(prefix=f"coursekit-exec-{task.sid}-") as tmp:
        scratch = Path(tmp)
        (scratch / "gradebook.db").write_bytes(task.gradebook)
        (scratch / "source" / task.aid).mkdir(parents=True)  # no source files: a worker never sees solutions/
        dest = scratch / "submitted" / task.sid / task.aid
        for rel, data in task.files.items():
            f = dest / rel
            if not f.resolve().is_relative_to(dest.resolve()):
                raise CourseError(f"a submitted file lies outside its folder: {rel}")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
        cfg = copy.deepcopy(task.config)
        cfg.CourseDirectory.root = str(scratch)
        cfg.CourseDirectory.source_directory = str(scratch / "source")
        cfg.CourseDirectory.submitted_directory = "submitted"
        cfg.CourseDirectory.autograded_directory = "autograded"
        cfg.CourseDirectory.db_url = f"sqlite:///{scratch / 'gradebook.db'}"
        # The kernel sees neither this scratch course nor the grader's course folder (when the worker shares its machine).
        cfg.GuardedExecute.hidden_paths = [*cfg.GuardedExecute.get("hidden_paths", []), str(scratch)]
        pps = _pipeline(cfg)
        token = uuid.uuid4().hex
        cfg.Autograde.autograde_preprocessors = pps[: _execute_index(pps) + 1] + [CaptureExecuted]
        cfg.CaptureExecuted.token = token
        a = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
        try:
            r = dict(a.autograde(task.aid, task.sid, force=True, create=True))
        finally:
            r_nb = _CAPTURED.pop(token, None)
    r["executed"] = r_nb
    r["seconds"] = time.perf_counter() - t0
    r["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    return r


def echo(task: Task, reply: str) -> dict:
    """On a worker: the round trip of :func:`execute` without the execution (``benchmarks/bench_grading.py``
    measures the engine's own cost per submission with it)."""
    return {"success": True, "executed": reply, "seconds": 0.0, "worker": f"{socket.gethostname()}:{os.getpid()}",
            "bytes": task.size()}


# --------------------------------------------------------------------------- in the grading process


# token → {"replayed": [...], "executed_here": [...], "notebooks": {(aid, sid): text}}, read by the ReplayExecute
# of the Autograder that owns the token (traitlets deep-copies config values, so a dict cannot be handed over in
# the config itself).
_RECORDS: dict[str, dict] = {}


class _Replay:
    """Mixed into the pipeline's execute preprocessor (nbgrader's ``Execute`` or a subclass such as
    coursekit.guard.GuardedExecute): a notebook already executed by a grading worker is used as is,
    provided its cells are exactly the ones nbgrader sanitized in this process; otherwise the
    preprocessor executes it here as usual."""

    def preprocess(self, nb, resources=None, km=None):
        g = (resources or {}).get("nbgrader", {})
        rec = _RECORDS.get(self.replay_token) if self.replay_token else None
        if rec is not None and g:
            who = (g["assignment"], g["student"])
            text = rec["notebooks"].pop(who, None)
            if text is not None:
                done = nbformat.reads(text, as_version=4)
                if _same_cells(nb, done):
                    self.log.info("Using the notebook executed by a grading worker: %s/%s", g["student"], g["assignment"])
                    rec["replayed"].append(who)
                    return done, resources
                self.log.warning("The worker's executed notebook of %s/%s has other cells; executing it here", *who[::-1])
            else:
                self.log.info("No executed notebook from a grading worker for %s/%s; executing it here", *who[::-1])
            rec["executed_here"].append(who)
        return super().preprocess(nb, resources, km=km)


def _token_trait():
    return Unicode("", help="which grading run's executed notebooks to replay (coursekit.parallel)").tag(config=True)


class ReplayExecute(_Replay, Execute):
    """:class:`_Replay` over nbgrader's own ``Execute``."""

    replay_token = _token_trait()


def _replay_class(execute_cls: type) -> type:
    """ReplayExecute for nbgrader's Execute; for a subclass, a class of the same behaviour named
    ``ReplayExecute`` whose config also reads the subclass's section (traitlets follows the MRO)."""
    if execute_cls is Execute:
        return ReplayExecute
    return type("ReplayExecute", (_Replay, execute_cls), {"__module__": __name__, "replay_token": _token_trait()})


def lock_course(root: Path):
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


def local_cluster(workers: int):
    """A Dask cluster on this machine: ``workers`` worker processes of one thread each (one notebook kernel at a
    time each), a task retried once when its worker dies, the dashboard only where bokeh is installed.

    Its processes ignore SIGINT: Ctrl-C in the terminal reaches the whole foreground process group, and the worker
    processes would each die with a traceback of their own; the grading process alone decides what a Ctrl-C stops,
    and closes the cluster (coursekit.course.grade_class).

    Its workers (whose stderr is the grader's) print only distributed's CRITICAL messages: closing a cluster while a
    result is on its way makes a worker print a traceback ("failed during get data"), which reads as a crash after a
    clean Ctrl-C. What goes wrong with a task is the grader's to say, and it says it (:class:`Failure`: the reason
    and each attempt). :class:`Autograder` quiets this process's side while it holds a cluster."""
    import signal
    import threading

    import dask
    from distributed import LocalCluster

    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # inherited by the spawned processes
    try:
        with dask.config.set({"distributed.scheduler.allowed-failures": 1,
                              # the workers share the cores: one BLAS/torch thread per kernel (distributed's default too)
                              "distributed.nanny.pre-spawn-environ.OMP_NUM_THREADS": 1}):
            # A free port for the scheduler's web server (two local clusters on one machine must not both want 8787);
            # it serves the dashboard where bokeh is installed.
            # Loopback only, and TLS with a certificate made for this run: no other process can join or command it
            # (coursekit.cluster).
            return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, silence_logs=logging.CRITICAL,
                                host="127.0.0.1", dashboard_address="127.0.0.1:0", security=cluster.local_security())
    finally:
        if main:
            signal.signal(signal.SIGINT, before)


class _NoWorkers(RuntimeError):
    """The cluster has had no worker for NO_WORKERS_GRACE seconds."""


@dataclass
class Failure:
    """Why a submission could not be executed on the cluster (it then scores 0 with ``reason``)."""

    reason: str
    attempts: list = field(default_factory=list)  # one line per attempt, for the instructor's log


class Autograder:
    """``autograde(aid, sid)`` for each of ``jobs`` in turn, returning nbgrader's result dict.

    Serial (``workers=1`` and no ``scheduler``): nbgrader's own autograde. Otherwise the executions run on a Dask
    cluster (see the module docstring): a local one of ``workers`` processes (default: one per core), or the one
    whose scheduler is at ``scheduler`` (e.g. ``tcp://10.0.0.5:8786``). Up to ``ahead`` tasks are on the cluster at
    once, in job order; each call waits for its own job (at most ``task_timeout`` seconds from when the call began,
    by which time every earlier job is done) and grades it in this process. Call :meth:`close` when done (or use it
    as a context manager). It holds the course folder's lock (:func:`lock_course`) until then, unless ``lock=False``
    (the caller holds it). ``replayed``, ``executed_here`` and ``failed`` say what happened to each job.
    ``stopped``: a callable asked every few seconds while a call waits; when it returns true the wait raises
    KeyboardInterrupt (Ctrl-C's interrupt can be lost in a finalizer; coursekit.course._CtrlC)."""

    def __init__(self, api, jobs: list[tuple[str, str]], workers: int | None = None, scheduler: str | None = None,
                 task_timeout: float | None = None, ahead: int | None = None, log=None, certs=None, lock: bool = True,
                 stopped=None):
        self.api = api
        self._stopped = stopped or (lambda: False)
        self._certs = certs
        self._client = self._cluster = self._tmp = None
        self._quiet = ExitStack()
        self._lock = lock_course(Path(api.coursedir.root)) if lock else None
        try:
            self._start(jobs, workers, scheduler, task_timeout, ahead, log)
        except BaseException:  # e.g. no scheduler at that address: release the course folder's lock
            self.close()
            raise

    def _start(self, jobs, workers, scheduler, task_timeout, ahead, log) -> None:
        api = self.api
        self.workers = max(1, min(workers or default_workers(), len(jobs) or 1))
        self.task_timeout = float(task_timeout or TASK_TIMEOUT)
        self._say = log or (lambda *a, **k: None)
        self._futures: dict = {}  # (aid, sid) → (Dask future, submitted at) or the Failure that kept it off the cluster
        self._pending: list[tuple[str, str]] = []
        self.dashboard = None
        self._no_workers_since: float | None = None
        self.replayed: list[tuple[str, str]] = []       # executed by a worker, graded here
        self.executed_here: list[tuple[str, str]] = []  # executed here after all (nbgrader failed there, or cells differ)
        self.failed: dict[tuple[str, str], Failure] = {}  # not executed after a retry: scored 0 with the reason
        self.task_seconds: dict[tuple[str, str], float] = {}  # wall time of each execution on its worker
        self.replay_seconds: dict[tuple[str, str], float] = {}  # wall time of grading each one here (the serial part)
        self.task_bytes = 0  # submission and gradebook bytes sent to the workers
        db = _sqlite_path(api.coursedir.db_url)
        has_execute = any(isinstance(p, type) and issubclass(p, Execute) for p in _pipeline(api.config))
        if (self.workers == 1 and not scheduler) or not jobs or db is None or not has_execute:
            if scheduler and jobs:
                raise CourseError("--scheduler needs nbgrader's default SQLite gradebook and an Execute step in the "
                                  "autograde pipeline")
            self.workers = 1  # serial: nbgrader's own autograde, one submission after the other
            return
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory

        self._tmp = tempfile.TemporaryDirectory(prefix="coursekit-grade-")
        self.task = TaskMaker(api, Path(self._tmp.name))
        from . import sandbox

        # Workers isolate as this process would: with --unsandboxed not at all; on a cluster of other machines always
        # with the tree caps; on a local cluster with them where this machine has them (a grader that is not root
        # has none, and was told so).
        self.task.policy = {"unsandboxed": sandbox.off(),
                            "require_caps": bool(scheduler) or sandbox.tree_caps_problem() is None}
        cfg = copy.deepcopy(api.config)
        pps = _pipeline(api.config)
        i = _execute_index(pps)
        cfg.Autograde.autograde_preprocessors = pps[:i] + [_replay_class(pps[i])] + pps[i + 1:]
        self._token = uuid.uuid4().hex
        cfg.ReplayExecute.replay_token = self._token
        _RECORDS[self._token] = {"replayed": self.replayed, "executed_here": self.executed_here, "notebooks": {}}
        self._replay = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
        self._connect(scheduler)
        self._pending = list(jobs)
        self.ahead = ahead or max(4 * self.workers, 8)
        self._top_up()

    # -- the cluster

    def _connect(self, scheduler: str | None) -> None:
        from distributed import Client

        # Until close(): distributed logs only CRITICAL messages here. A Ctrl-C closes the client while a result is
        # on its way, and the scheduler (in this process, for a local cluster) or the client logs "Couldn't gather
        # keys" and tracebacks; the grader says itself what went wrong with a task (Failure).
        for name in ("distributed", "distributed.client", "tornado.application"):  # the ones distributed configures
            quiet = logging.getLogger(name)
            self._quiet.callback(quiet.setLevel, quiet.level)
            quiet.setLevel(logging.CRITICAL)

        if scheduler:
            security = cluster.client_security(scheduler, self._certs)
            try:
                self._client = Client(scheduler, timeout="30s", security=security)
            except OSError as e:
                raise cluster.unreachable(scheduler, e) from None
            try:
                self._client.wait_for_workers(1, timeout=NO_WORKERS_GRACE)
            except TimeoutError:
                raise CourseError(f"the Dask scheduler at {scheduler} has had no worker for {NO_WORKERS_GRACE} s: start "
                                  "`dask worker` on the grading machines (docs/instructors.md: A large class on a cluster)") from None
            self.workers = max(1, len(self._client.nthreads()))
            refusing = {a: p for a, p in self._client.run(worker_problem, self.task.policy).items() if p}
            if refusing and len(refusing) == len(self._client.nthreads()):
                raise CourseError("no worker of the cluster can grade in the sandbox:\n  " + "\n  ".join(refusing.values()))
            for why in refusing.values():  # the tasks they are sent fail there and are retried on another worker
                print(f"WARNING: {why}", file=sys.stderr)
            self.dashboard = self._client.dashboard_link
            self._say(f"Dask cluster {scheduler}: {self.workers} worker{'s' * (self.workers > 1)}; "
                      f"dashboard (needs bokeh on the scheduler): {self.dashboard}")
        else:
            self._cluster = local_cluster(self.workers)
            self._client = Client(self._cluster)
            if self._cluster.dashboard_link and "status" in self._cluster.dashboard_link:
                import importlib.util

                if importlib.util.find_spec("bokeh"):
                    self.dashboard = self._cluster.dashboard_link
            self._say(f"local Dask cluster: {self.workers} worker{'s' * (self.workers > 1)}"
                      + (f"; dashboard: {self.dashboard}" if self.dashboard else ""))

    def _submit(self, aid: str, sid: str, attempt: int = 1):
        try:
            t = self.task(aid, sid, attempt)
        except (CourseError, OSError) as e:  # e.g. a submission folder too large to send: never stops the class
            return Failure(f"it could not be sent to a grading worker: {e}", [f"not sent: {e}"]), time.monotonic()
        self.task_bytes += t.size()
        # pure=False: a resubmission is a new task, never the cancelled one's result.
        return self._client.submit(execute, t, key=f"execute-{aid}-{sid}-{attempt}-{uuid.uuid4().hex[:8]}",
                                   pure=False, retries=1), time.monotonic()

    def _top_up(self) -> None:
        while self._pending and len(self._futures) < self.ahead:
            aid, sid = self._pending.pop(0)
            self._futures[(aid, sid)] = self._submit(aid, sid)

    def _result(self, aid: str, sid: str) -> dict | Failure:
        """The worker's result for one job: a second try on a timeout, a Failure after two."""
        from distributed import TimeoutError as DaskTimeout

        fut, _ = self._futures.pop((aid, sid))
        attempts = []
        for attempt in (1, 2):
            if isinstance(fut, Failure):
                return fut
            try:
                r = self._wait(fut)
                self.task_seconds[(aid, sid)] = r.get("seconds", 0.0)
                return r
            except _NoWorkers as e:
                fut.cancel()
                return Failure(f"no grading worker was connected to the cluster for {NO_WORKERS_GRACE:g} s", [str(e)])
            except (TimeoutError, DaskTimeout):
                fut.cancel()
                attempts.append(f"attempt {attempt}: not done after {self.task_timeout:g} s")
                why = (f"its execution was still running after {self.task_timeout:g} s on two grading workers, so it was "
                       "stopped")
            except Exception as e:  # KilledWorker (its worker died twice), or the task failed twice (retries=1)
                attempts.append(f"attempt {attempt}: {type(e).__name__}: {e}")
                dead = type(e).__name__ == "KilledWorker"
                why = ("the grading worker running it stopped twice (out of memory, or its machine went away)" if dead
                       else str(e) if isinstance(e, SandboxRefused)
                       else f"the grading worker failed twice ({type(e).__name__})")
                if isinstance(e, SandboxRefused):
                    print(f"coursekit grade: {e}", file=sys.stderr)
                break  # the scheduler has already run it twice
            if attempt == 1:
                fut, _ = self._submit(aid, sid, attempt=2)
        return Failure(why, attempts)

    def _wait(self, fut) -> dict:
        """``fut.result()`` within ``task_timeout`` seconds (TimeoutError past it); _NoWorkers once the cluster has had
        no worker for NO_WORKERS_GRACE seconds (then at once for every later job, unless a worker has come back)."""
        from distributed import TimeoutError as DaskTimeout

        deadline = time.monotonic() + self.task_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"not done after {self.task_timeout:g} s")
            try:
                return fut.result(timeout=min(left, 5.0))
            except (TimeoutError, DaskTimeout):
                if self._stopped():
                    raise KeyboardInterrupt from None
                if self._client.nthreads():
                    self._no_workers_since = None
                    continue
                now = time.monotonic()
                if self._no_workers_since is None:
                    self._no_workers_since = now
                if now - self._no_workers_since >= NO_WORKERS_GRACE:
                    raise _NoWorkers(f"no worker since {NO_WORKERS_GRACE:g} s or more") from None

    # -- grading

    def __call__(self, aid: str, sid: str) -> dict:
        """Grade one submission here. Returns nbgrader's result dict; for a submission the cluster could not execute,
        ``{"success": False, "problem": <reason for the student>, "log": ...}`` (coursekit.course scores it 0)."""
        if (aid, sid) in self._pending:  # not yet on the cluster (called out of order)
            self._pending.remove((aid, sid))
            self._futures[(aid, sid)] = self._submit(aid, sid)
        if (aid, sid) not in self._futures:
            return self.api.autograde(aid, sid, force=True, create=True)
        r = self._result(aid, sid)
        self._top_up()
        if isinstance(r, Failure):
            self.failed[(aid, sid)] = r
            print(f"coursekit grade: {sid}/{aid} could not be executed: {r.reason}", file=sys.stderr)
            return {"success": False, "problem": r.reason, "error": r.reason, "log": "\n".join(r.attempts)}
        if r.get("executed"):
            _RECORDS[self._token]["notebooks"][(aid, sid)] = r["executed"]
        # else nbgrader failed on the worker before executing: ReplayExecute grades it here exactly as serially
        t0 = time.perf_counter()
        try:
            return self._replay.autograde(aid, sid, force=True, create=True)
        finally:
            self.replay_seconds[(aid, sid)] = time.perf_counter() - t0

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._client is not None:
            try:
                for fut, _ in self._futures.values():
                    if not isinstance(fut, Failure):
                        fut.cancel()
                self._client.close()
            finally:
                if self._cluster is not None:
                    self._cluster.close()
            self._client = self._cluster = None
        self._quiet.close()
        if self._tmp is not None:
            _RECORDS.pop(self._token, None)
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
