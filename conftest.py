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
# about ten minutes of one core) is read by both lesson-19 notebooks, tests/test_capstone_run.py and every test that
# grades lesson 19. A reader that gets to a result first computes it under the store's per-result lock and the
# others wait on that lock, their core idle. So one background `coursekit capstone` fills the store from the start,
# and the scheduler below hands the readers out only once it has finished, with other work meanwhile. The store
# computes each result once (per-result filelock, written whole), so what the tests check does not change.
# COURSEKIT_PRECOMPUTE=0 turns the background run off.
PRECOMPUTE = pytest.StashKey[dict]()
PRECOMPUTE_CODE = "from coursekit.cli import main; raise SystemExit(main(['capstone', '--quiet']))"


def _reads_the_capstone(nodeid: str) -> bool:
    """Whether a test reads the whole run: a lesson-19 notebook's cell, a test of lesson 19's grading round trip,
    or a test of the run's claims (tests/test_capstone_run.py)."""
    return ("19-capstone-a-real-qlora-run.ipynb" in nodeid or "RoundTrip19" in nodeid
            or nodeid.startswith("tests/test_capstone_run.py"))


def _start_precompute(config, nodeids) -> None:
    """Start the background `coursekit capstone` once per session, when a selected test reads the run."""
    if os.environ.get("COURSEKIT_PRECOMPUTE") == "0" or config.option.collectonly or PRECOMPUTE in config.stash:
        return
    if not any(map(_reads_the_capstone, nodeids)):
        return
    fd, log = tempfile.mkstemp(prefix="coursekit-capstone-", suffix=".log")
    proc = subprocess.Popen([sys.executable, "-c", PRECOMPUTE_CODE], stdout=fd, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(fd)
    config.stash[PRECOMPUTE] = {"proc": proc, "log": log}


def pytest_collection_finish(session):
    """Without pytest-xdist (``-n 0``) the one test process starts the background run; under xdist the controller's
    scheduler does (:class:`LongestFirst`)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and not session.config.pluginmanager.hasplugin("dsession"):
        _start_precompute(session.config, [it.nodeid for it in session.items])


def pytest_sessionfinish(session, exitstatus):
    run = session.config.stash.get(PRECOMPUTE, None)
    if run is None or run.get("done"):
        return
    run["done"] = True
    proc = run["proc"]
    if proc.poll() is None:  # every reader is done; whatever the background run has left, nobody reads
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
    os.unlink(run["log"])


# pytest-xdist's --dist loadscope hands each worker a whole module or test class at a time (their module- and
# class-scoped fixtures, such as a graded example class, are built once), in collection order, largest test count
# first. On two cores that left a four-minute grading round trip for the end, with the other core idle. The
# scheduler below hands out the longest scope first (seconds from the durations table in docs/maintainers.md; a
# scope not in it counts a twentieth of a second per test) and keeps lesson 19's readers back while the
# background capstone run is filling the store. Scopes that share one graded example class run as one scope, on
# one worker, so that no worker waits on another's grading lock.
SHARED_SCOPES = {  # nodeid prefix → the scope it runs in
    "tests/test_key_leaks.py": "lesson 02's graded example class",
    "tests/test_browser.py": "lesson 02's graded example class",
    "tests/test_grading_roundtrip.py::TestRoundTrip02": "lesson 02's graded example class",
    "tests/test_parallel_grading.py": "lesson 02's graded example class",
    "tests/test_dask_grading.py": "lesson 02's graded example class",
    "tests/test_report.py": "lesson 02's graded example class",
    "tests/test_grading_roundtrip.py::TestRoundTrip00": "lesson 00's graded example class",
    "tests/test_same_score.py": "lesson 00's graded example class",
}
SCOPE_SECONDS = {  # one core's seconds, rounded, from the 2026-12-04 run of docs/maintainers.md (classes with merged
    # example students scaled by their notebook executions, the second run's included)
    "lesson 02's graded example class": 570,
    "lesson 00's graded example class": 200,  # its round trip, the four ways of grading, Ctrl-C (estimated)
    "tests/test_exchange.py": 60,  # estimated
    "tests/test_book.py": 40,  # the web book built (about 20 s, shared with test_key_leaks' scan of it) and Chromium
    "tests/test_grading_roundtrip.py::TestRoundTrip19": 115,  # three notebooks since its two wrong students merged
    "tests/test_grading_roundtrip.py::TestRoundTrip18": 145,
    "tests/test_grading_roundtrip.py::TestRoundTrip03": 135,
    "tests/test_grading_roundtrip.py::TestRoundTrip16": 125,
    "tests/test_grading_roundtrip.py::TestRoundTrip17": 95,  # four notebooks since two wrong students merged
    "tests/test_grading_roundtrip.py::TestRoundTrip04": 81,
    "tests/test_grading_roundtrip.py::TestRoundTrip05": 72,
    "tests/test_grading_roundtrip.py::TestRoundTrip12": 69,
    "tests/test_train.py": 66,
    "tests/test_grading_roundtrip.py::TestRoundTrip13": 65,
    "tests/test_trust_boundary.py": 62,
    "solutions/19-capstone-a-real-qlora-run/19-capstone-a-real-qlora-run.ipynb": 60,
    "tests/test_lesson19_items.py": 55,
    "tests/test_grading_roundtrip.py::TestRoundTrip15": 55,
    "tests/test_grading_roundtrip.py::TestRoundTrip10": 51,
    "tests/test_grading_roundtrip.py::TestRoundTrip06": 49,
    "tests/test_grading_roundtrip.py::TestRoundTrip08": 48,
    "lessons/19-capstone-a-real-qlora-run/19-capstone-a-real-qlora-run.ipynb": 45,
    "tests/test_grading_roundtrip.py::TestRoundTrip11": 43,
    "tests/test_grading_roundtrip.py::TestRoundTrip09": 34,
    "tests/test_grading_roundtrip.py::TestRoundTrip14": 34,
    "solutions/18-gguf/18-gguf.ipynb": 29,
    "tests/test_grading_roundtrip.py::TestRoundTrip01": 25,
    "tests/test_evaluate.py": 23,
    "tests/test_grading_roundtrip.py::TestRoundTrip07": 22,
    "tests/test_course.py": 21,
    "solutions/17-what-qlora-actually-costs/17-what-qlora-actually-costs.ipynb": 20,
    "tests/test_capstone_run.py": 20,
}


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: a test class, else its module or notebook, unless :data:`SHARED_SCOPES`
    puts it in a shared one."""
    for prefix, scope in SHARED_SCOPES.items():
        if nodeid == prefix or nodeid.startswith(prefix + "::"):
            return scope
    return nodeid.rsplit("::", 1)[0]


def _filling(config) -> bool:
    run = config.stash.get(PRECOMPUTE, None)
    return run is not None and run["proc"].poll() is None


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # without pytest-xdist, tests run in collection order in one process
    LoadScopeScheduling = None
else:
    class LongestFirst(LoadScopeScheduling):
        """--dist loadscope, with :func:`scope_of`'s scopes handed out longest first, lesson 19's readers last while
        the background capstone run is filling the store."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:  # the first call: every worker has collected
                _start_precompute(self.config, next(iter(self.registered_collections.values()), []))
            super().schedule()

        def next_scope(self) -> str:
            """The pending scope to hand out next."""
            filling = _filling(self.config)

            def cost(scope: str) -> float:
                return SCOPE_SECONDS.get(scope, 0.05 * len(self.workqueue[scope]))

            ready = [s for s in self.workqueue if not (filling and any(map(_reads_the_capstone, self.workqueue[s])))]
            return max(ready or self.workqueue, key=cost)  # only readers left: they compute what is missing

        def _assign_work_unit(self, node) -> None:  # LoadScopeScheduling's, with the scope chosen by next_scope
            scope = self.next_scope()
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    @pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown under -p no:xdist
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") != "loadscope":
            return None  # another --dist asked for on the command line: xdist's own
        return LongestFirst(config, log)
