"""Grading on a real Dask cluster (``coursekit grade --scheduler``), with a worker killed mid-run.

A scheduler and two worker processes (``dask scheduler``, ``dask worker --nthreads 1 --nworkers 1``) are
started on localhost with ``subprocess``, without the answer keys' variable in their environment, as on
machines of their own. Three of lesson 02's example students (blank, perfect, transposed-B: three different
scores) are graded through the cluster and compared with the serial grading of lesson 02's example class
(shared with the round trip, tests/graded_examples.py); while the
cluster grades, one worker is killed (its whole process group, SIGKILL) once a submission is running on it.
The scheduler runs that task again on the other worker (``allowed-failures`` 1: once), and grades.csv must be
byte for byte the serial run's lines of those students, with every notebook executed on a worker (none executed in the grading
process) and none failed. Then a task deadline too short for any notebook: the submission is tried twice and
scored 0 with the reason in the score table and its feedback file, and the run finishes. What travels to a
worker carries no answer key, hint or hidden-case seed."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from coursekit import course, parallel
from coursekit.grading import keys as keymod
from graded_examples import feedback_text, graded_example_class

ROOT = Path(__file__).resolve().parents[1]
AID = "02-lora-inside-one-matmul"
STUDENTS = ["ex-blank", "ex-perfect", "ex-transposed-B"]
DASK = str(Path(sys.executable).parent / "dask")

pytestmark = pytest.mark.notebooks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=30)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """The TLS certificates `coursekit cluster-certs` makes, which the scheduler, the workers and the grader use."""
    d = tmp_path_factory.mktemp("certs") / "tls"
    from coursekit import cluster as clus

    clus.make_certs(d)
    return d


def _tls(certs: Path) -> list[str]:
    from coursekit import cluster as clus

    return ["--tls-ca-file", str(certs / clus.CA), "--tls-cert", str(certs / clus.CERT), "--tls-key", str(certs / clus.KEY)]


def _security(certs: Path):
    from coursekit import cluster as clus

    return clus.client_security("tls://127.0.0.1:1", certs)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, certs):
    """(scheduler address, {worker name: its `dask worker` process}), all speaking TLS with the course's certificates
    as the README sets them up; every process is stopped afterwards."""
    logs = tmp_path_factory.mktemp("dask-logs")
    addr = f"tls://127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(keymod.ENV)}
    env.update(OMP_NUM_THREADS="1", DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1")
    procs: list[subprocess.Popen] = []

    def start(name, *argv):
        out = open(logs / f"{name}.log", "w")
        p = subprocess.Popen([DASK, *argv], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                             cwd=logs)
        procs.append(p)
        return p

    try:
        start("scheduler", "scheduler", "--protocol", "tls", "--host", "127.0.0.1", "--port", addr.rsplit(":", 1)[1],
              "--no-dashboard", *_tls(certs))
        workers = {name: start(name, "worker", addr, "--nthreads", "1", "--nworkers", "1", "--name", name,
                               "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(logs / name), *_tls(certs))
                   for name in ("w0", "w1")}
        from distributed import Client

        with Client(addr, timeout="60s", security=_security(certs)) as c:
            c.wait_for_workers(2, timeout=120)
        yield addr, workers
    finally:
        for p in procs:
            _stop(p)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    rel = tmp_path_factory.mktemp("release")
    course.release([AID], root=ROOT, course_dir=tmp_path_factory.mktemp("release-course"), release_dir=rel)
    return rel


def _class(work: Path, release: Path, students=STUDENTS) -> Path:
    built = course.build_examples(ROOT, AID, work / "submitted", release)
    for sid in set(built) - set(students):
        shutil.rmtree(work / "submitted" / sid)
    return work


class _Killer(threading.Thread):
    """Kills worker ``name`` (its whole process group) as soon as an execution has been running on it for a second."""

    def __init__(self, addr: str, name: str, proc: subprocess.Popen, security):
        super().__init__(daemon=True)
        self.addr, self.name, self.proc, self.security = addr, name, proc, security
        self.killed: str | None = None  # the task it was running
        self.stop = threading.Event()

    def run(self):
        from distributed import Client

        with Client(self.addr, timeout="60s", security=self.security) as c:
            where = {a: w["name"] for a, w in c.scheduler_info()["workers"].items()}
            victim = next(a for a, n in where.items() if n == self.name)
            seen = None
            while not self.stop.is_set():
                running = [k for k in c.processing(workers=[victim]).get(victim, ()) if str(k).startswith("execute-")]
                if running and seen is None:
                    seen = time.monotonic()
                if running and time.monotonic() - seen > 1.0:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.killed = str(running[0])
                    return
                time.sleep(0.1)


@pytest.fixture(scope="module")
def graded(cluster, release, tmp_path_factory, certs):
    addr, workers = cluster
    made = []

    class Recording(parallel.Autograder):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    serial = graded_example_class(tmp_path_factory, AID)  # every example student, graded serially
    dask = _class(tmp_path_factory.mktemp("dask"), release)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "Autograder", Recording)
        killer = _Killer(addr, "w0", workers["w0"], _security(certs))
        killer.start()
        try:
            table = course.grade_class(lessons=[AID], root=ROOT, course_dir=dask, release_dir=release, progress=False,
                                       scheduler=addr, certs=certs)
        finally:
            killer.stop.set()
            killer.join(timeout=30)
    return {"serial": serial, "dask": dask, "table": table, "killed": killer.killed, "autograder": made[-1],
            "worker_gone": workers["w0"].poll() is not None}


def test_a_worker_was_killed_while_executing_a_submission(graded):
    assert graded["killed"], "no execution ran on the worker to kill (the test proves nothing)"
    assert graded["worker_gone"]


def _lines_of(grades_csv: Path, students) -> bytes:
    """grades.csv's header and the lines of ``students``, byte for byte."""
    head, *lines = grades_csv.read_bytes().splitlines(keepends=True)
    col = head.decode().split(",").index("student_id")
    return head + b"".join(l for l in lines if l.decode().split(",")[col] in students)


def test_grades_csv_is_byte_for_byte_the_serial_runs(graded):
    serial = _lines_of(graded["serial"] / "grades.csv", STUDENTS)
    assert serial.count(b"\n") == 1 + len(STUDENTS)
    assert (graded["dask"] / "grades.csv").read_bytes() == serial


def test_the_class_report_of_the_scheduler_run_is_the_serial_runs(graded):
    """coursekit report reads outcomes the grading process stored while scoring: for each student, the notebook that
    executed on a Dask cluster's worker holds exactly the outcomes (status, points, named mistakes) of the serial
    run, and the report of the cluster's class counts them."""
    from coursekit import report

    for sid in STUDENTS:
        nb = Path("autograded") / sid / AID / f"{AID}.ipynb"
        assert report.outcomes(graded["dask"] / nb) == report.outcomes(graded["serial"] / nb), sid
    les = report.collect(graded["dask"], [AID])["lessons"][0]
    assert les["graded"] == len(STUDENTS) and all(sum(r[c] for c in report.COLUMNS) == len(STUDENTS) for r in les["items"])
    assert {label for r in les["items"] for label in r["mistakes"]} == {"B not transposed"}  # ex-transposed-B's


def test_every_notebook_ran_on_a_worker_and_none_failed(graded):
    a = graded["autograder"]
    assert sorted(a.replayed) == [(AID, sid) for sid in sorted(STUDENTS)]
    assert a.executed_here == [] and a.failed == {}
    assert len(a.task_seconds) == len(STUDENTS) and all(s > 0 for s in a.task_seconds.values())
    assert "could not be graded" not in graded["table"] and "Graded 0" not in graded["table"]


def test_a_task_past_its_deadline_is_tried_twice_then_scored_zero_with_the_reason(cluster, release, tmp_path_factory, certs):
    addr, _ = cluster
    work = _class(tmp_path_factory.mktemp("deadline"), release, ["ex-perfect"])
    table = course.grade_class(lessons=[AID], root=ROOT, course_dir=work, release_dir=release, progress=False,
                               scheduler=addr, task_timeout=0.5, certs=certs)
    why = "still running after 0.5 s on two grading workers"
    assert f"ex-perfect/{AID}:" in table and why in table, table
    assert float(course.read_grades_csv(work / "grades.csv")[0]["raw_score"]) == 0.0
    assert why in feedback_text(work, AID, "ex-perfect")
    assert "attempt 2" in (work / "grading-errors" / "ex-perfect" / f"{AID}.log").read_text()


def test_what_travels_to_a_worker_holds_no_key_hint_or_seed(release, tmp_path):
    """The pickled task (as Dask sends it) of a perfect submission, searched for every secret of lesson 02."""
    work = _class(tmp_path / "course", release, ["ex-perfect"])
    a = course.api(ROOT, work, release)
    assert a.generate_assignment(AID, force=True, create=True)["success"]
    data = json.loads((ROOT / "autograder" / "keys" / "02.json").read_text())
    secrets = [str(data["seed"]), *(h for hints in data.get("hints", {}).values() for h in hints.values())]
    secrets += [json.dumps(k) for k in data["keys"].values() if not isinstance(k, str)]  # orderings, multi-choice
    task = parallel.TaskMaker(a, tmp_path)(AID, "ex-perfect")
    # The files are the student's own hand-in, byte for byte (a perfect one holds the right answers, of course).
    assert task.files == {f"{AID}.ipynb": (work / "submitted" / "ex-perfect" / AID / f"{AID}.ipynb").read_bytes()}
    blob = pickle.dumps(task)
    rest = pickle.dumps(dataclasses.replace(task, files={}))  # the gradebook, the config and the names
    leaked = [s[:40] for s in secrets if s.encode() in rest]
    assert not leaked, f"secrets in a worker's task: {leaked}"
    assert b"autograder/keys" not in rest and keymod.ENV.encode() not in rest
    assert len(blob) < 2 << 20, "a task should carry one submission and one lesson's cells"
    db = tmp_path / "sent.db"
    db.write_bytes(task.gradebook)
    with closing(sqlite3.connect(db)) as c:
        assert c.execute("SELECT name FROM assignment").fetchall() == [(AID,)]
        assert c.execute("SELECT COUNT(*) FROM base_cell").fetchone()[0] > 0
        for table in ("student", "submitted_assignment", "grade", "comment"):
            assert c.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0, f"the worker's gradebook has {table} rows"


def test_cli_refuses_workers_with_a_scheduler(capsys):
    from coursekit import cli

    assert cli.main(["grade", "02", "--scheduler", "tcp://127.0.0.1:1", "--workers", "2"]) == 2
    assert "--workers is for a local cluster" in capsys.readouterr().err


def test_the_cluster_admits_only_holders_of_the_courses_certificates(cluster, tmp_path):
    """The scheduler speaks TLS and asks each peer for a certificate signed by the course's authority: a client with
    none, or with a certificate of another authority, is turned away (so it cannot run code on the workers or in the
    grading process); one with the course's certificates gets in."""
    from coursekit import cluster as clus

    addr, _ = cluster
    other = tmp_path / "other"
    clus.make_certs(other)
    # Each refused client in a fresh interpreter: a Client that fails inside its constructor can leave distributed's
    # shared event-loop runner half started, and the next Client in the same process then fails an internal assert
    # instead of the handshake (it did so in two full-suite runs, after the other tests' clusters in this worker).
    refused = {  # what, the call, the exceptions that mean "turned away"
        "no certificate (distributed will not even try)": (f"Client({addr!r}, timeout='5s').close()",
                                                           "OSError, TimeoutError, TypeError"),
        "another authority's (the handshake fails)": (
            f"Client({addr!r}, timeout='5s', security=clus.client_security({addr!r}, Path({str(other)!r}))).close()",
            "OSError, TimeoutError"),
        "plain TCP to the TLS port": (f"Client({addr.replace('tls://', 'tcp://')!r}, timeout='5s').close()",
                                      "OSError, TimeoutError"),
    }
    for what, (call, errors) in refused.items():
        code = ("import sys\nfrom pathlib import Path\nfrom distributed import Client\nfrom coursekit import cluster as clus\n"
                f"try:\n    {call}\nexcept ({errors}) as e:\n    print(type(e).__name__); sys.exit(3)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 3, (what, done.returncode, done.stdout, done.stderr[-500:])


def test_plain_tcp_to_the_tls_scheduler_says_to_use_tls(cluster, tmp_path):
    """tcp:// to the scheduler the guide starts with --protocol tls: the connection is reset, and the instructor is
    told why and what to type, not only 'ConnectionResetError'."""
    from coursekit import cluster as clus

    addr, _ = cluster
    plain = addr.replace("tls://", "tcp://")
    assert clus.speaks_tls(plain) and not clus.speaks_tls(f"tcp://127.0.0.1:{_free_port()}")
    code = ("import sys\nfrom coursekit import cli\n"
            f"sys.exit(cli.main(['grade', '02', '--scheduler', {plain!r}, '--course', {str(tmp_path / 'c')!r}]))")
    (tmp_path / "c" / "submitted" / "ana" / AID).mkdir(parents=True)
    shutil.copyfile(ROOT / "lessons" / AID / f"{AID}.ipynb", tmp_path / "c" / "submitted" / "ana" / AID / f"{AID}.ipynb")
    # A copy of lessons/ as the release folder (read by autograder/nbgrader_config.py): grading may generate lesson 02
    # into it again before it connects, and other tests read the repository's lessons/ meanwhile.
    shutil.copytree(ROOT / "lessons", tmp_path / "release")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "COURSEKIT_RELEASE": str(tmp_path / "release")})
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    assert "speaks TLS" in done.stderr and f"--scheduler {addr}" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("addr, ok", [("tcp://10.0.0.5:8786", False), ("tcp://grader.example:8786", False),
                                      ("tcp://127.0.0.1:8786", True), ("tcp://localhost:8786", True),
                                      ("tls://10.0.0.5:8786", True), ("ws://10.0.0.5:8786", False), ("10.0.0.5:8786", False)])
def test_a_plain_tcp_scheduler_is_refused_beyond_loopback(addr, ok):
    from coursekit import cluster as clus

    if ok:
        assert clus.check_address(addr) in ("tcp", "tls")
    else:
        with pytest.raises(course.CourseError, match="tls://"):
            clus.check_address(addr)


def test_a_tls_scheduler_without_certificates_is_refused_before_grading_starts(tmp_path):
    with pytest.raises(course.CourseError, match="no certificate"):
        course.grade_class(lessons=[AID], root=ROOT, course_dir=tmp_path / "c", release_dir=tmp_path / "r",
                           progress=False, scheduler="tls://127.0.0.1:1")
    with pytest.raises(course.CourseError, match="missing ca.pem"):
        course.grade_class(lessons=[AID], root=ROOT, course_dir=tmp_path / "c", release_dir=tmp_path / "r",
                           progress=False, scheduler="tls://127.0.0.1:1", certs=tmp_path)


def test_the_local_cluster_listens_on_loopback_with_tls():
    from distributed import Client

    with parallel.local_cluster(1) as lc:
        assert lc.scheduler_address.startswith("tls://127.0.0.1:"), lc.scheduler_address
        with pytest.raises((OSError, TimeoutError)):  # another process of this machine, without the run's certificate
            Client(lc.scheduler_address.replace("tls://", "tcp://"), timeout="5s").close()


def _prints_errors(name: str) -> bool:
    """Whether logger ``name``'s ERROR messages reach a handler that prints them (a stream; logging's last resort
    included), not only one that keeps them in memory (distributed's own log deque)."""
    import logging

    lg = logging.getLogger(name)
    if not lg.isEnabledFor(logging.ERROR):
        return False
    found, c = False, lg
    while c is not None:
        streams = [h for h in c.handlers if isinstance(h, logging.StreamHandler)]
        found = found or bool(streams)
        if any(h.level <= logging.ERROR for h in streams):
            return True
        c = c.parent if c.propagate else None
    return not found and logging.lastResort is not None


def test_grading_on_a_local_cluster_prints_no_errors_of_distributed(release, tmp_path):
    """Closing a cluster while a result is on its way logs "Couldn't gather keys" (the scheduler, in this process) and
    a worker's traceback; a Ctrl-C must end with the grader's one line (tests/test_same_score.py). So while the
    Autograder holds its cluster, distributed's errors are printed neither here nor by a worker; after, as before."""
    work = _class(tmp_path / "course", release, ["ex-blank", "ex-perfect"])
    a = course.api(ROOT, work, release)
    assert a.generate_assignment(AID, force=True, create=True)["success"]
    assert _prints_errors("distributed.scheduler")  # the check can fail: outside a grading run they are printed
    with parallel.Autograder(a, [(AID, "ex-blank"), (AID, "ex-perfect")], workers=2, lock=False) as grader:
        assert grader._cluster is not None
        assert not any(map(_prints_errors, ("distributed.scheduler", "distributed.client", "tornado.application")))
        assert set(grader._client.run(_prints_errors, "distributed.worker").values()) == {False}
    assert _prints_errors("distributed.scheduler")


def test_a_worker_without_the_sandbox_refuses_the_task_and_says_why(monkeypatch, release, tmp_path):
    from coursekit import sandbox

    work = _class(tmp_path / "course", release, ["ex-blank"])
    a = course.api(ROOT, work, release)
    assert a.generate_assignment(AID, force=True, create=True)["success"]
    task = parallel.TaskMaker(a, tmp_path)(AID, "ex-blank")
    monkeypatch.setattr(sandbox, "problem", lambda: "bubblewrap is not installed (test)")
    with pytest.raises(parallel.SandboxRefused, match="refuses to run submissions: bubblewrap is not installed"):
        parallel.execute(task)
    monkeypatch.setattr(sandbox, "problem", lambda: None)
    monkeypatch.setattr(sandbox, "tree_caps_problem", lambda: "no cgroup file system here")
    with pytest.raises(parallel.SandboxRefused, match="no cgroup file system here"):
        parallel.execute(task)
    assert parallel.worker_problem({"unsandboxed": False, "require_caps": False}) is None
