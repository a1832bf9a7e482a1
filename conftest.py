"""Repository-wide pytest hooks (apply to tests/ and to the solution notebooks nbval runs)."""

from __future__ import annotations

import pytest

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
