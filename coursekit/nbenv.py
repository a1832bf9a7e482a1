"""What the grading pipeline (coursekit.course) and its parallel executor (coursekit.parallel) share: the error
they raise and the environment nbgrader needs. (Its own module, so that neither imports the other.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path


class CourseError(RuntimeError):
    """A step of the pipeline failed; the message says which step, which lesson or student, and why."""


def kernel_env() -> None:
    """Make nbgrader's tools (``alembic``) and this environment's ``python3`` kernel the ones it finds."""
    # nbgrader runs the `alembic` console script of its environment to migrate the gradebook.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    # Make the "python3" kernel that nbgrader starts the one of this environment (with coursekit),
    # even if the user has another python3 kernelspec in ~/.local/share/jupyter.
    share = str(Path(sys.prefix) / "share" / "jupyter")
    paths = os.environ.get("JUPYTER_PATH", "").split(os.pathsep)
    if share not in paths:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([share] + [p for p in paths if p])
