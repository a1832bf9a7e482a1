"""Repository-wide pytest hooks (apply to tests/ and to the solution notebooks nbval runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

# One OpenMP thread per process. pytest-xdist runs two workers on this 2-core machine, and each worker's
# notebook kernels and nbgrader kernels run torch; with torch's default of one thread per core, four or
# more spinning threads share two cores and a 6-minute training cell (lesson 19) took over 40 minutes.
# Set before torch is imported anywhere; the workers and every kernel they start inherit it. Override by
# exporting OMP_NUM_THREADS (e.g. on a machine with more cores than workers).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# nbval waits a hard-coded 5 s for each iopub message after a cell's execute_reply (nbval 0.11,
# plugin.py: ``self.output_timeout = 5``; not configurable, see computationalmodelling/nbval#136 and
# #231). The capstone cell prints a long training log; with a second xdist worker training on the other
# core, the kernel's iopub thread can fall more than 5 s behind, and nbval then fails a cell that ran
# fine ("Timeout of 5 seconds exceeded waiting for output"). Give it the time a loaded 2-core machine
# needs; the per-cell execution limit stays --nbval-cell-timeout.
NBVAL_OUTPUT_TIMEOUT = 120


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval not installed: nothing to widen
        return
    for item in items:
        if isinstance(item, IPyNbCell):
            item.output_timeout = max(getattr(item, "output_timeout", 0), NBVAL_OUTPUT_TIMEOUT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A solution notebook cell must not write to stderr: students see it in red, and nbgrader zeroes a
    test cell with stderr output. Library notes and warnings belong silenced in the setup cell."""
    outcome = yield
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:
        return
    if not isinstance(item, IPyNbCell) or outcome.excinfo is not None:
        return
    text = "".join(o.get("text", "") for o in (item.test_outputs or [])
                   if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if text.strip():
        pytest.fail(f"cell {item.cell_num} of {item.parent.name} wrote to stderr:\n{text[:1500]}", pytrace=False)


# Lesson 19's run (the baselines, three trained adapters, their evaluations, the memory measurements and the merges:
# about ten minutes of one core) is read by both lesson-19 notebooks, tests/test_capstone.py and every test that
# grades lesson 19. Each waits on the store's per-result lock for whichever of them computes a result first, and
# the other core idled meanwhile: the suite used a third of its two cores. One background `coursekit capstone`,
# started as soon as the tests are collected, fills the store beside the unit tests, so the readers find it done.
# The store computes each result once (per-result filelock, written whole), so a reader that gets there first
# computes that result itself and the background run then reads it: what the tests check does not change.
# COURSEKIT_PRECOMPUTE=0 turns it off.
_precompute: dict = {}


def _reads_the_capstone(items) -> bool:
    """Whether the selected tests read the whole run: a lesson-19 notebook, lesson 19's grading round trip, or a
    test of the run's report (not the store's own unit tests, which take seconds)."""
    return any("19-capstone-a-real-qlora-run.ipynb" in it.nodeid or "RoundTrip19" in it.nodeid
               or ("test_capstone.py" in it.nodeid and "report" in getattr(it, "fixturenames", ())) for it in items)


def pytest_collection_finish(session):
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0" or os.environ.get("COURSEKIT_PRECOMPUTE") == "0":
        return  # one background run per session: xdist's first worker, or the only process
    if session.config.option.collectonly or not _reads_the_capstone(session.items):
        return
    fd, log = tempfile.mkstemp(prefix="coursekit-capstone-", suffix=".log")
    code = "from coursekit.cli import main; raise SystemExit(main(['capstone', '--quiet']))"
    _precompute["log"] = log
    _precompute["proc"] = subprocess.Popen([sys.executable, "-c", code], stdout=fd, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(fd)


def pytest_sessionfinish(session, exitstatus):
    proc = _precompute.pop("proc", None)
    if proc is None:
        return
    if proc.poll() is None:  # every reader here is done; a reader on another worker computes what is left itself
        # Its whole process group: a memory measurement runs in a child process of its own. Each result is written
        # whole, and its lock goes with the process.
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # it ended by itself meanwhile
                pass
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    elif proc.returncode != 0:
        return  # its log stays for a look: the readers computed what it did not
    os.unlink(_precompute["log"])
