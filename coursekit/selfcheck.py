"""A lesson's own tries of a student's function, said in sentences: what a self-check cell prints, never a traceback.

Before its graded check, a lesson lets the student try the function on the worked example and against coursekit's
kernel ("check your function yourself"). A wrong answer there is the normal case while a student works, so it must
not stop Run All with a forty-line NumPy traceback before the graded check that explains the same mistake. Each
function here prints one line and returns whether the try passed; :func:`trying` turns an exception raised by the
student's code into one sentence that says where it was raised. The graded check below names the likely mistake.
"""

from __future__ import annotations

import contextlib
import os
import sysconfig
import traceback
from typing import Any, Iterator

import numpy as np

__all__ = ["close", "passed", "trying"]

_THEN = "The graded check below names the likely mistake."


def close(name: str, got: Any, want: Any, rtol: float = 1e-7, atol: float = 0.0) -> bool:
    """Whether ``got`` equals ``want`` within ``atol + rtol·|want|`` entrywise; prints "✓ name matches" or one
    sentence naming the shape, or the worst entry with its expected and actual value (as the graded check does).
    got: an array, tensor or number (anything else is reported as the wrong type)."""
    from .grading.checkers import compare_arrays

    kind, lines = compare_arrays(got, np.asarray(want, dtype=np.float64), name, rtol, atol)
    if kind == "ok":
        print(f"✓ {name} matches.")
        return True
    print(f"✗ {' '.join(lines)} {_THEN}")
    return False


def passed(ok: bool, what: str) -> bool:
    """Print whether a further try (e.g. a finite-difference check's verdict) passed: "✓ what" or "✗ what: no"."""
    print(f"✓ {what}." if ok else f"✗ {what}: no. {_THEN}")
    return bool(ok)


def _notebook_frame(e: BaseException):
    """The last traceback frame of ``e`` in the notebook's own code (not in Python, a library or coursekit)."""
    libs = [os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                          sysconfig.get_paths()["platlib"], os.path.dirname(__file__)}]
    mine = [f for f in traceback.extract_tb(e.__traceback__)
            if not any(os.path.realpath(f.filename).startswith(lib + os.sep) for lib in libs)]
    return mine[-1] if mine else None


@contextlib.contextmanager
def trying(name: str) -> Iterator[None]:
    """Run the block; an exception raised in it (by the student's ``name``, or by the cell on what it returned) is
    printed as one sentence naming the exception and the line of the notebook's code it came from, instead of a
    traceback. Stops the block."""
    try:
        yield
    except Exception as e:  # the student's bug, reported; the graded check below scores it
        f = _notebook_frame(e)
        where = "" if f is None else (f" in your {f.name}, line {f.lineno}" if f.name == name else
                                      f" in this cell, line {f.lineno}") + (f": {f.line.strip()}" if f.line else "")
        print(f"✗ Trying your {name} raised {type(e).__name__}: {str(e)[:300]}{where}. {_THEN}")
