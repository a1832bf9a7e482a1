"""Ctrl-C in the middle of `coursekit grade`: the command stops within seconds, says how far it got, keeps what it
graded (the gradebook, grades.csv) and leaves the course folder to a second run, which finishes the class."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graded_examples import graded_example_class

ROOT = Path(__file__).resolve().parents[1]
AID = "00-setup-and-probes"
COURSEKIT = str(Path(sys.executable).parent / "coursekit")

pytestmark = pytest.mark.notebooks


def test_ctrl_c_stops_within_seconds_and_keeps_what_is_graded(tmp_path_factory):
    serial = graded_example_class(tmp_path_factory, AID)  # its perfect notebook, handed in by three students
    work = tmp_path_factory.mktemp("interrupted") / "course"
    students = [f"s{i}" for i in range(3)]
    for sid in students:
        shutil.copytree(serial / "submitted" / "ex-perfect" / AID, work / "submitted" / sid / AID)
    argv = [COURSEKIT, "grade", "00", "--course", str(work), "--workers", "2"]
    # A terminal's Ctrl-C reaches the whole foreground process group: the grader and its local cluster's workers.
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    from coursekit.example_class import graded_scores, max_points

    full, _ = max_points(ROOT, AID)
    deadline = time.monotonic() + 600
    while not ((work / "gradebook.db").is_file() and full in graded_scores(work, AID).values()):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "nothing was graded in 10 minutes"
        time.sleep(0.2)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    took = time.monotonic() - t0
    assert p.returncode == 130, (p.returncode, out[-2000:], err[-3000:])
    assert took < 20, f"Ctrl-C took {took:.1f} s to stop the run"
    assert "stopped (Ctrl-C) after" in err and "Run the same command again" in err, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    with open(work / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    # Every submission the gradebook holds is one graded whole; the one Ctrl-C cut short left nothing (nbgrader lists
    # a student it knows without a submission with an empty timestamp and 0).
    kept = graded_scores(work, AID)
    assert kept and set(kept.values()) == {full}, kept
    assert all(float(rows[s]["raw_score"]) == full for s in kept), rows
    assert all(not rows[s]["timestamp"] and float(rows[s]["raw_score"]) == 0 for s in set(rows) - set(kept)), rows
    # The same command again grades everyone, and the lock of the stopped run is gone.
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(work / "grades.csv", newline="") as f:
        again = {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader(f)}
    assert again == dict.fromkeys(students, full), again
