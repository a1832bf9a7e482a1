"""A score is a function of the submission only: every way an instructor can grade gives the same points, item by item;
and Ctrl-C in the middle of a run stops it within seconds and keeps what it graded.

Lesson 00's perfect notebook (it answers how many threads torch uses: a fact of the machine its kernel ran on, and its
function item runs in the grader's sandboxed runner) is graded four ways:

- **serially** (``--workers 1``): lesson 00's example class of the round trip (tests/graded_examples.py), whose
  kernels run two torch threads (``KERNEL_THREADS``) while this process runs one;
- **on two local workers** (``--workers 2``), whose kernels run one thread each: handed in by two students, the run
  stopped with Ctrl-C once the first is graded, then run again to the end (what the instructor does next);
- **on a Dask cluster started by the instructor guide's own commands** (docs/instructors.md, "A grading cluster on
  one machine": ``coursekit cluster-certs``, a TLS scheduler, ``dask worker``, ``coursekit grade --scheduler``), run
  as written with only the folders, port and lesson changed;
- **by the formgrader's autograde button**, on a fresh course folder (nothing graded, no "Generate" clicked): the
  formgrader's own HTTP API, served by ``coursekit formgrader``.

Then the formgrader shows a submission that scored 0 for a reason as autograded, with its 0 and the reason, and its
links to a lesson's folders stay inside the server's root.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from coursekit import course
from graded_examples import graded_example_class

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "instructors.md"
AID = "00-setup-and-probes"
STUDENTS = ("ex-perfect",)
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.notebooks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cells(work: Path) -> dict[str, dict[str, float]]:
    """Student → {test cell: autograded score} of lesson 00 in the gradebook of ``work``."""
    from nbgrader.api import Gradebook

    out = {}
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as gb:
        for sid in STUDENTS:
            sub = gb.find_submission_notebook(AID, AID, sid)
            out[sid] = {g.name: float(g.score) for g in sub.grades if g.auto_score is not None and g.name.endswith("_test")}
    return out


def _hand_in(serial: Path, dest: Path, students=STUDENTS) -> Path:
    """A course folder ``dest`` with ``students``' lesson-00 submissions as the serial run had them, nothing graded."""
    for sid in students:
        shutil.copytree(serial / "submitted" / sid / AID, dest / "submitted" / sid / AID)
    return dest


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    p.wait(timeout=30)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return graded_example_class(tmp_path_factory, AID)


@pytest.fixture(scope="module")
def two_workers(serial, tmp_path_factory):
    """`coursekit grade 00 --workers 2` on two students' perfect notebooks (ex-perfect and a classmate's copy), stopped
    with Ctrl-C once one of them is graded, then run again to the end. What the first run printed and kept, its
    time to stop, and the course folder after the second run."""
    from coursekit.example_class import graded_scores, max_points

    work = _hand_in(serial, tmp_path_factory.mktemp("two-workers") / "course")
    shutil.copytree(work / "submitted" / "ex-perfect", work / "submitted" / "classmate")
    argv = [str(BIN / "coursekit"), "grade", "00", "--course", str(work), "--workers", "2"]
    full, _ = max_points(ROOT, AID)

    # A terminal's Ctrl-C reaches the whole foreground process group: the grader and its local cluster's workers.
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                         start_new_session=True)
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(lambda: p.stdout.read(64), "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while "00: 1 done" not in "".join(printed):  # the progress bar: one submission graded whole
            assert p.poll() is None, ("".join(printed), p.stderr.read())
            assert time.monotonic() < deadline, "nothing was graded in 10 minutes"
            time.sleep(0.2)
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=60)
        took = time.monotonic() - t0
        reader.join(timeout=10)
        out, err = "".join(printed), p.stderr.read()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    with open(work / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    stopped = {"returncode": p.returncode, "stdout": out, "stderr": err, "took": took, "rows": rows,
               "kept": graded_scores(work, AID), "full": full}
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    return {"course": work, "stopped": stopped}


def guide_cluster_commands() -> list[str]:
    """The guide's commands for a grading cluster on one machine (one per terminal, in order)."""
    m = re.search(r"<!-- a grading cluster on one machine -->\s*```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert m, "docs/instructors.md lost its block <!-- a grading cluster on one machine -->"
    return [l for l in (x.split("  #", 1)[0].strip() for x in m.group(1).splitlines()) if l and not l.startswith("#")]


@pytest.fixture(scope="module")
def scheduler(serial, tmp_path_factory):
    """The guide's cluster commands, as written: with HOME a temporary folder (the certificates go to
    ~/grading-certs), the port a free one, lesson 00 instead of 02, and the course folder a temporary one
    ($COURSEKIT_COURSE) holding the perfect notebook and one student whose notebook is renamed (a 0 for a reason)."""
    home = tmp_path_factory.mktemp("home")
    work = _hand_in(serial, tmp_path_factory.mktemp("scheduler") / "course", (*STUDENTS, "ex-renamed"))
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSEKIT_KEYS")}
    env.update(HOME=str(home), COURSEKIT_COURSE=str(work), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    cmds = [c.replace("8786", port).replace("grade 02", "grade 00") for c in guide_cluster_commands()]
    assert len(cmds) == 5 and cmds[0].startswith("coursekit cluster-certs") and "dask scheduler" in cmds[2] \
        and "dask worker" in cmds[3] and cmds[4].startswith("coursekit grade"), cmds
    logs = tmp_path_factory.mktemp("cluster-logs")
    procs = []
    try:
        shell = "set -e\n" + cmds[0] + "\n" + cmds[1] + "\n"  # the certificates, and the TLS variable of the guide
        for i, cmd in ((2, cmds[2]), (3, cmds[3])):  # the scheduler's and the workers' terminals
            out = open(logs / f"{i}.log", "w")
            procs.append(subprocess.Popen(["bash", "-c", shell + cmd if i == 2 else cmds[1] + "\n" + cmd], env=env,
                                          cwd=home, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            if i == 2:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not (home / "grading-certs" / "node.pem").exists():
                    time.sleep(0.2)
                shell = ""
        r = subprocess.run(["bash", "-c", cmds[4]], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"{cmds[4]}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n" + "\n".join(
            (logs / f"{i}.log").read_text()[-2000:] for i in (2, 3))
        return {"course": work, "table": r.stdout}
    finally:
        for p in procs:
            _stop(p)


@pytest.fixture(scope="module")
def formgrader(serial, tmp_path_factory):
    """`coursekit formgrader` on a fresh course folder (the perfect notebook handed in, nothing generated or graded),
    and the formgrader's autograde button pressed: its own HTTP API, as the page's button calls it."""
    work = _hand_in(serial, tmp_path_factory.mktemp("formgrader") / "course")
    port, token = _free_port(), "coursekit-test-token"
    env = {**os.environ, "JUPYTER_TOKEN": token, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = open(tmp_path_factory.mktemp("formgrader-log") / "server.log", "w")
    p = subprocess.Popen([str(BIN / "coursekit"), "formgrader", "--course", str(work), "--port", str(port),
                          "--no-browser"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def call(path: str, method: str = "GET", timeout: float = 600):
        req = urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode())

    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                call("/formgrader/api/assignments", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    log.flush()
                    pytest.fail("coursekit formgrader did not answer:\n" + Path(log.name).read_text()[-3000:])
                time.sleep(0.5)
        results = {sid: call(f"/formgrader/api/submission/{AID}/{sid}/autograde", "POST") for sid in STUDENTS}
        yield {"course": work, "results": results, "call": call}
    finally:
        _stop(p)


def test_every_way_of_grading_gives_the_same_points(serial, two_workers, scheduler, formgrader):
    for sid, r in formgrader["results"].items():
        assert r.get("success"), f"the formgrader's autograde failed for {sid}: {str(r)[-2000:]}"
    want = _cells(serial)
    assert want["ex-perfect"]["p3_test"] == 1.0, "the thread-count item: what the student's own kernel saw"
    for name, work in (("2 workers", two_workers["course"]), ("a Dask cluster", scheduler["course"]),
                       ("the formgrader's button", formgrader["course"])):
        assert _cells(work) == want, f"{name} scored differently from the serial run"


def test_ctrl_c_stops_within_seconds_and_keeps_what_is_graded(two_workers):
    """The first run, stopped once one student was graded: exit status 130 within seconds, one line saying how far it
    got, no traceback; the gradebook holds only submissions graded whole (the one Ctrl-C cut short left nothing:
    nbgrader lists a student it knows without a submission with an empty timestamp and 0); the second run graded
    both, the same way."""
    st = two_workers["stopped"]
    assert st["returncode"] == 130, (st["returncode"], st["stdout"][-2000:], st["stderr"][-3000:])
    assert st["took"] < 20, f"Ctrl-C took {st['took']:.1f} s to stop the run"
    assert "stopped (Ctrl-C) after" in st["stderr"] and "Run the same command again" in st["stderr"], st["stderr"][-2000:]
    assert "Traceback" not in st["stderr"], st["stderr"][-3000:]
    kept, rows, full = st["kept"], st["rows"], st["full"]
    assert kept and set(kept.values()) == {full}, kept
    assert all(float(rows[s]["raw_score"]) == full for s in kept), rows
    assert all(not rows[s]["timestamp"] and float(rows[s]["raw_score"]) == 0 for s in set(rows) - set(kept)), rows
    from coursekit.example_class import graded_scores

    assert graded_scores(two_workers["course"], AID) == {"ex-perfect": full, "classmate": full}


def test_a_grader_killed_mid_class_loses_nothing_on_the_next_run(serial, tmp_path):
    """SIGKILL (the OOM killer's signal, no chance to tidy up) to the whole grading run, serial, while the second of two
    students is being graded: the next run of the same command finishes the class, both scored as the serial run
    scored them, with grades.csv and submissions.csv written."""
    from coursekit.example_class import graded_scores, max_points

    work = _hand_in(serial, tmp_path / "course")
    shutil.copytree(work / "submitted" / "ex-perfect", work / "submitted" / "classmate")
    argv = [str(BIN / "coursekit"), "grade", "00", "--course", str(work), "--workers", "1"]
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        # the first student's autograded copy is written when it is graded whole; the second one's execution follows
        while not list((work / "autograded").glob(f"*/{AID}/{AID}.ipynb")):
            assert p.poll() is None, "the run ended before one student was graded"
            assert time.monotonic() < deadline, "nothing was graded in 10 minutes"
            time.sleep(0.1)
        time.sleep(2)  # into the second student's execution (one takes about 6 s)
        assert p.poll() is None, "the run ended before it could be killed mid-class"
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == -signal.SIGKILL
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    full, _ = max_points(ROOT, AID)
    assert graded_scores(work, AID) == {"ex-perfect": full, "classmate": full}
    assert (work / "grades.csv").is_file() and (work / "submissions.csv").is_file()


def test_the_formgrader_shows_a_zero_for_a_reason_with_the_reason(scheduler):
    """ex-renamed scored 0 for a reason in the cluster run: nbgrader's own view of the course folder (what the
    formgrader's pages list) has it autograded, 0 points, nothing to grade by hand, and its autograded notebook, which
    the formgrader opens, starts with the reason."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    cfg = course.load_config(ROOT, scheduler["course"])
    api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    subs = {s["student"]: s for s in api.get_submissions(AID)}
    zero = subs["ex-renamed"]
    assert zero["autograded"] and zero["score"] == 0 and not zero["needs_manual_grade"], zero
    nb = json.loads((scheduler["course"] / "autograded" / "ex-renamed" / AID / f"{AID}.ipynb").read_text())
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith("**0 points: this submission could not be graded.**") and "my\\-lesson\\-00" in first, first


@pytest.mark.parametrize("course_dir", ["autograder/course", "autograder/example-class"])
def test_the_formgrader_links_stay_inside_its_root(course_dir):
    """nbgrader's formgrader links a lesson's source and release folders as <course folder relative to the server
    root>/<folder relative to the course folder> (nbgrader.apps.api.NbGraderAPI.get_assignment). coursekit formgrader
    roots its server at the repository: both links stay inside it. Rooted at autograder/ (where nbgrader finds the
    course's configuration), the source link pointed outside the server."""
    from nbgrader.coursedir import CourseDirectory

    course_dir = ROOT / course_dir
    cd = CourseDirectory(config=course.load_config(ROOT, course_dir))
    # NbGraderAPI.get_assignment's two paths (nbgrader 0.9.6, apps/api.py), without opening a gradebook
    a = {key: os.path.relpath(os.path.abspath(cd.format_path(folder, ".", AID)), cd.root)
         for key, folder in (("source_path", cd.source_directory), ("release_path", cd.release_directory))}
    top = course.formgrader_root(ROOT, course_dir)
    assert top == ROOT
    prefix = os.path.relpath(course_dir, top)
    for key in ("source_path", "release_path"):
        link = os.path.normpath(os.path.join(prefix, a[key]))
        assert not link.startswith(".."), (key, link)
        assert (top / link).is_dir(), (key, link)
    old = os.path.normpath(os.path.join(os.path.relpath(course_dir, ROOT / "autograder"), a["source_path"]))
    assert old.startswith(".."), "rooted at autograder/, the source link would stay inside too: this test shows nothing"
    # A course folder outside the repository: the folder holding both, never the file system's root.
    assert course.formgrader_root(ROOT, ROOT.parent / "graded") == ROOT.parent
    assert course.formgrader_root(ROOT, Path("/") / "ck-nowhere" / "course") == Path("/ck-nowhere/course")


def test_the_guides_cluster_commands_name_their_settings():
    """What the guide runs is what `coursekit cluster-certs` prints: the same settings on each line."""
    from coursekit import cluster

    printed = cluster.usage("/tmp/certs")
    cmds = guide_cluster_commands()
    assert "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=1 dask scheduler" in printed and \
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=1 dask scheduler" in cmds[2]
    assert "OMP_NUM_THREADS=1 dask worker" in printed and "OMP_NUM_THREADS=1 dask worker" in cmds[3]
    assert all('"~' not in c and "'~" not in c for c in cmds), "a ~ inside quotes is not expanded by the shell"
    shlex.split(cmds[1])  # the TLS variable's line is one assignment a shell can read


def test_the_check_of_the_example_class_passes_and_names_who_differs(serial, tmp_path, monkeypatch, capsys):
    """`coursekit grade --examples --check` (`make grade`) on lesson 00's graded example class: every example student
    scored what its expected.json says, so it exits 0 and, with --readme, writes the table into the file's block; with
    one expected score changed it exits 1 and names that student (the grading itself is the round trip's, not run
    again here)."""
    from coursekit import cli, example_class

    monkeypatch.setattr(course, "grade_class", lambda **kw: "(graded)")
    guide = tmp_path / "guide.md"
    guide.write_text(f"before\n{example_class.BEGIN}\nold\n{example_class.END}\nafter\n")
    assert cli.main(["grade", "--examples", "00", "--check", "--course", str(serial), "--readme", str(guide)]) == 0
    out = capsys.readouterr().out
    assert "Checked: every one of the 6 example submissions of 1 lesson scored exactly as expected" in out
    written = example_class.current(guide.read_text())
    assert "00-setup-and-probes ex-perfect" in written and guide.read_text().startswith("before\n")
    real = example_class.expected_scores
    monkeypatch.setattr(example_class, "expected_scores",
                        lambda root, aid: {**real(root, aid), "ex-strings-compared": 5.0})
    assert cli.main(["grade", "--examples", "00", "--check", "--course", str(serial)]) == 1
    err = capsys.readouterr().err
    assert "00-setup-and-probes ex-strings-compared: scored 7.60, expected 5.00" in err, err
