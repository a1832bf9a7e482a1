"""Repository-wide pytest hooks (apply to tests/ and to the solution notebooks nbval runs)."""

from __future__ import annotations

import os

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
