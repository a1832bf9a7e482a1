"""Answer checkers that nbgrader test cells call.

A test cell is one call whose value is the points earned::

    from coursekit.grading import grade
    grade("02.p1", adapted_forward)

``grade`` looks the item up in ``coursekit.grading.lessons.lessonNN``, checks the answer, prints the
feedback to **stdout** (nbgrader scores a cell 0 when it writes to stderr) and returns a float in
[0, points], which nbgrader takes as partial credit. While a student works, function items run
their public cases; in the autograde run (``NBGRADER_EXECUTION=autograde``) they add hidden cases
generated from the lesson's seed, so a hard-coded answer earns nothing.

Item kinds: :class:`Choice` (one or several letters), :class:`Numeric`, :class:`Array`,
:class:`Ordering`, :class:`Function`. Keys live encoded in ``keys/NN.key`` (see :mod:`.keys`) or are
computed from the reference kernels.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import keys as _keys
from .checkers import (
    Case,
    Feedback,
    Mistake,
    check_array,
    check_choice,
    check_function,
    check_multi,
    check_numeric,
    check_ordering,
)

__all__ = [
    "grade",
    "check",
    "autograding",
    "Choice",
    "Numeric",
    "Array",
    "Ordering",
    "Function",
    "Case",
    "Feedback",
    "Mistake",
    "check_choice",
    "check_multi",
    "check_numeric",
    "check_array",
    "check_ordering",
    "check_function",
]


def autograding() -> bool:
    """True inside ``nbgrader autograde`` (it sets ``NBGRADER_EXECUTION=autograde``)."""
    return os.environ.get("NBGRADER_EXECUTION") == "autograde"


@dataclass
class Choice:
    """A multiple-choice item; ``multi`` for "choose all that apply". Key: a letter or list of letters."""

    title: str
    points: float
    options: str = "abcd"
    hints: Mapping[str, str] = field(default_factory=dict)
    multi: bool = False

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        key = ctx.key()
        if self.multi:
            return check_multi(answer, key, self.points, list(self.options), self.hints)
        return check_choice(answer, key, self.points, list(self.options), self.hints)


@dataclass
class Numeric:
    """A number. ``expected()`` computes it from coursekit (else the key is used); ``mistakes()`` lists known wrong values."""

    title: str
    points: float
    name: str = "answer"
    expected: Callable[[], float] | None = None
    rtol: float = 1e-6
    atol: float = 0.0
    mistakes: Callable[[], Sequence[Mistake]] = lambda: ()
    unit: str = ""

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        want = self.expected() if self.expected else float(ctx.key())
        return check_numeric(answer, want, self.points, self.name, self.rtol, self.atol, list(self.mistakes()), self.unit)


@dataclass
class Array:
    """An array computed by ``expected()``; optional required dtype; ``mistakes()`` lists known wrong arrays."""

    title: str
    points: float
    name: str
    expected: Callable[[], Any]
    rtol: float = 1e-6
    atol: float = 1e-9
    dtype: Any = None
    mistakes: Callable[[], Sequence[Mistake]] = lambda: ()

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        return check_array(answer, self.expected(), self.points, self.name, self.rtol, self.atol, self.dtype, list(self.mistakes()))


@dataclass
class Ordering:
    """Put step labels in order. Key: the list of labels. ``labels`` maps a label to a short description."""

    title: str
    points: float
    labels: Mapping[str, str] = field(default_factory=dict)

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        return check_ordering(answer, list(ctx.key()), self.points, self.labels)


@dataclass
class Function:
    """Implement a function. ``public()`` → cases shown to students; ``hidden(rng)`` → the autograder's extra cases."""

    title: str
    points: float
    name: str
    reference: Callable[..., Any]
    public: Callable[[], Sequence[Case]]
    hidden: Callable[[np.random.Generator], Sequence[Case]] = lambda rng: ()
    outputs: Sequence[str] = ("result",)
    mistakes: Callable[[dict, dict], Mapping[str, Sequence[Mistake]]] | None = None
    extra: Callable[[Callable, Case], list[str] | None] | None = None
    rtol: float = 1e-6
    atol: float = 1e-9
    timeout: float | None = None  # seconds per call of the student's function; None: COURSEKIT_CASE_TIMEOUT or 30

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        cases = list(self.public())
        if ctx.hidden:
            cases += [Case(c.kwargs, c.label, hidden=True) for c in self.hidden(ctx.rng())]
        fb = check_function(answer, cases, self.reference, self.points, self.name, self.outputs,
                            self.rtol, self.atol, self.mistakes, self.extra, self.timeout)
        if not ctx.hidden:
            fb.lines.append("(Public cases only; the autograder adds hidden, randomized cases.)")
        return fb


@dataclass
class _Context:
    lesson: str
    item: str
    hidden: bool

    def key(self) -> Any:
        k = _fresh_keys(self.lesson)
        if self.item not in k:
            raise KeyError(f"no key for item {self.lesson}.{self.item} in {_keys.KEY_DIR / (self.lesson + '.key')}")
        return k[self.item]

    def rng(self) -> np.random.Generator:
        seed = int(_fresh_keys(self.lesson).get("seed", 0))
        return np.random.default_rng([seed, zlib.crc32(self.item.encode())])


def _fresh_keys(lesson: str) -> dict:
    """The lesson's keys decoded from the file now: ``keys.load`` caches a dict that notebook code could edit."""
    return _keys.load.__wrapped__(lesson)


# --------------------------------------------------------------------------- tampering


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TRUSTED = tuple(sorted({os.path.abspath(p) + os.sep for p in (_PKG_DIR, sys.prefix, sys.base_prefix, sys.exec_prefix)}))
# Modules the checkers rely on besides coursekit itself: replacing np.allclose would make every array "match".
_LIBRARIES = ("builtins", "math", "numpy", "numpy.linalg", "numpy.core.numeric", "numpy._core.numeric", "torch", "zlib")


def _foreign(fn: Any) -> bool:
    """True for a Python function whose code was not loaded from an installed file (a notebook's own code)."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return False
    f = code.co_filename
    return f.startswith("<") or not os.path.abspath(f).startswith(_TRUSTED)


def _dataclass_method(cls: type, name: str, fn: Any) -> bool:
    """A method that ``dataclasses`` generated for ``cls`` (its code comes from exec, file "<string>")."""
    return (name.startswith("__") and hasattr(cls, "__dataclass_fields__") and fn.__code__.co_filename == "<string>"
            and getattr(fn, "__qualname__", "").startswith(cls.__qualname__ + "."))


def tampering() -> list[str]:
    """What notebook code changed in coursekit or in the libraries its checkers use: one line per finding.

    Scans every loaded coursekit module (functions, classes' methods, graded items' callables) and the
    namespaces of builtins, math, numpy and torch for functions defined outside an installed file, and
    coursekit modules that sys.modules maps to something else. Empty when nothing was changed.
    """
    found: list[str] = []
    for name, mod in list(sys.modules.items()):
        if not (name == "coursekit" or name.startswith("coursekit.")) or mod is None:
            continue
        f = getattr(mod, "__file__", None) or ""
        if not isinstance(mod, types.ModuleType) or not os.path.abspath(f).startswith(_PKG_DIR + os.sep):
            found.append(f"sys.modules[{name!r}] was replaced")
            continue
        for attr, v in list(vars(mod).items()):
            if _foreign(v):
                found.append(f"{name}.{attr} was replaced by a function defined in the notebook")
            elif isinstance(v, type) and v.__module__.startswith("coursekit"):
                found += [f"{name}.{attr}.{m} was replaced by a function defined in the notebook"
                          for m, fv in list(vars(v).items()) if _foreign(fv) and not _dataclass_method(v, m, fv)]
            elif attr == "ITEMS" and isinstance(v, Mapping):
                for item_id, item in list(v.items()):
                    for fname, fv in list(getattr(item, "__dict__", {}).items()):
                        if _foreign(fv):
                            found.append(f"{name}.ITEMS[{item_id!r}].{fname} was replaced by a function defined in the notebook")
    for name in _LIBRARIES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr, v in list(vars(mod).items()):
            if _foreign(v):
                found.append(f"{name}.{attr} was replaced by a function defined in the notebook")
    return sorted(set(found))


def lesson_items(lesson: str) -> Mapping[str, Any]:
    """The item registry of a lesson ("02" → ``coursekit.grading.lessons.lesson02.ITEMS``)."""
    try:
        mod = importlib.import_module(f"coursekit.grading.lessons.lesson{lesson}")
    except ModuleNotFoundError as e:
        raise KeyError(f"no graded items for lesson {lesson!r}") from e
    return mod.ITEMS


def check(item_id: str, answer: Any, hidden: bool | None = None) -> Feedback:
    """Check ``answer`` for ``item_id`` ("02.p1") without printing; ``hidden`` defaults to :func:`autograding`."""
    if not isinstance(item_id, str) or "." not in item_id:
        raise KeyError(f"item ids look like '02.p1', got {item_id!r}")
    lesson, item = item_id.split(".", 1)
    items = lesson_items(lesson)
    if item not in items:
        raise KeyError(f"lesson {lesson} has no item {item!r}; items: {sorted(items)}")
    ctx = _Context(lesson, item, autograding() if hidden is None else hidden)
    return items[item].check(answer, ctx)


def grade(item_id: str, answer: Any) -> float:
    """Check, print the feedback to stdout, and return the points earned (nbgrader's partial credit).

    If notebook code has replaced part of the grader (or a function it relies on, see :func:`tampering`),
    the item earns 0 and the feedback says what was replaced."""
    lesson, item = item_id.split(".", 1)
    changed = tampering()
    if changed:
        print(f"[{item_id}] 0 points: this notebook changed the grader, so its checks cannot be trusted.\n  "
              + "\n  ".join(changed[:5]) + ("\n  …" if len(changed) > 5 else "")
              + "\n  Remove the code that does this (and restart the kernel) to be graded.")
        return 0.0
    fb = check(item_id, answer)
    print(fb.text(f"[{item_id}] {lesson_items(lesson)[item].title}"))
    return fb.points
