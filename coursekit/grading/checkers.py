"""Generic answer checkers. Each returns a :class:`Feedback`: points earned (partial credit) and the
lines that explain them. They never print and never raise on a bad answer; :func:`coursekit.grading.grade`
prints the feedback to stdout (nbgrader zeroes a test cell that writes to stderr).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..gradcheck import entry_name

__all__ = [
    "Feedback",
    "Mistake",
    "check_choice",
    "check_multi",
    "check_numeric",
    "check_array",
    "check_ordering",
    "check_function",
    "as_array",
    "compare_arrays",
    "describe_exception",
    "quiet",
    "PUBLIC_ONLY_NOTE",
    "MISTAKE_SHARE",
    "worded",
]

PUBLIC_ONLY_NOTE = "(Public cases only; the autograder adds hidden, randomized cases.)"
"""Ends a function check run without hidden cases (while the student works; the grading process adds them)."""


@dataclass
class Feedback:
    """Points earned out of ``max_points``, and the explanation, one line per entry."""

    points: float
    max_points: float
    lines: list[str] = field(default_factory=list)
    right: bool | None = None  # a formative (0-point) item's verdict; None: read it from the points
    credit: str = ""  # why the points are partial ("1/4 of the points: a known mistake"), shown after the lines
    #: The known mistakes this answer made, as data for the instructor's class report (coursekit.report): each
    #: matched :class:`Mistake`'s label, or "(x)" for a wrong option chosen. Empty: right, or wrong another way.
    mistakes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # nbgrader rejects a cell result above its points; never let rounding exceed it.
        self.points = float(min(max(self.points, 0.0), self.max_points))

    @property
    def full(self) -> bool:
        """Whether the answer is right: all the points, or for a formative item its verdict."""
        return self.right if self.right is not None else self.points >= self.max_points

    def text(self, title: str = "") -> str:
        unit = "point" if self.max_points == 1 else "points"
        score = f"{self.points:g} / {self.max_points:g} {unit}" if self.max_points else "feedback only, 0 points"
        head = f"{title}: {score}" if title else score
        return "\n".join([head] + ["  " + line for line in self.lines] + ([f"  ({self.credit}.)"] if self.credit else []))


def formative(fb: Feedback) -> Feedback:
    """A formative (0-point) item's result: checked as if worth one point, it keeps the verdict and the
    explanation and scores 0 of 0 (no partial-credit note: there are no points to share)."""
    return Feedback(0.0, 0.0, fb.lines, right=fb.full, mistakes=list(fb.mistakes))


@dataclass
class Mistake:
    """A known wrong answer: the value it produces and what to tell the student when it matches.

    ``message`` may quote the case's inputs ("multiply by s = 2.5"); ``hint`` (optional) says the same in words
    without any number computed from them, and is what a hidden case shows (its inputs stay hidden).
    """

    label: str
    value: Any
    message: str
    hint: str = ""


def worded(mistakes: Any) -> Any:
    """The same mistakes, each message also its hint: for messages that quote formulas and fixed constants only
    (2ε, 1e9 bytes per GB, axis=-1), never a case's values or shapes, so a hidden case may show them whole.
    ``mistakes``: a list of :class:`Mistake`, or a dict output name → list (what a ``mistakes`` callable returns)."""
    if isinstance(mistakes, Mapping):
        return {out: worded(ms) for out, ms in mistakes.items()}
    return [Mistake(m.label, m.value, m.message, m.message) for m in mistakes]


# --------------------------------------------------------------------------- choice and ordering

# Punctuation students type around a letter: "c.", "(c)", "c)", "'c'", "[c]".
_WRAP = "()[]{}.,:;!'\"` "


def _letter(x: Any) -> str | None:
    """One letter with the obvious punctuation around it ("c", " C ", "c.", "(c)", "c)"), lower case; else None."""
    if not isinstance(x, str):
        return None
    s = x.strip().strip(_WRAP).lower()
    return s if len(s) == 1 and s.isalpha() else None


def _show(x: Any, limit: int = 60) -> str:
    """A short repr of an answer for a message (a huge array must not flood the feedback)."""
    try:
        r = repr(x)
    except Exception:
        r = f"<{type(x).__name__}>"
    return r if len(r) <= limit else r[: limit - 1] + "…"


def _split_letters(text: str, options: Sequence[str]) -> list[str] | None:
    """The letters a student typed in one string: "a, c", "a c", "a;c", "a and c", "(a) (c)", or letters run together
    ("acd") when every character is an option letter. Repeats are kept (the caller decides); None when a part is
    neither one letter nor a run of option letters."""
    out: list[str] = []
    for tok in re.split(r"[\s,;/&+]+", text.strip().lower()):
        core = tok.strip(_WRAP)
        if not core or core in ("and", "or"):
            continue
        if len(core) == 1 and core.isalpha():
            out.append(core)
            continue
        run = [c for c in core if c not in _WRAP]  # "(a)(c)" → a, c
        if run and all(c in options for c in run):
            out += run
        else:
            return None
    return out


def _collection(x: Any) -> list | None:
    """The elements of a list, tuple, set or 1-D NumPy array; None for anything else (a dict included)."""
    if isinstance(x, (list, tuple, set, frozenset)):
        return list(x)
    if isinstance(x, np.ndarray) and x.ndim == 1:
        return x.tolist()
    return None


def _parse_letters(answer: Any, options: Sequence[str]) -> tuple[list[str] | None, str | None]:
    """``(letters, container)``: the letters in a string or in a collection of strings, in the order given (repeats
    kept), and the collection's type name (None for a string); letters None when the answer is not letters."""
    if isinstance(answer, np.ndarray) and answer.ndim == 0 and answer.dtype.kind in "US":
        answer = str(answer)
    if isinstance(answer, str):
        return _split_letters(answer, options), None
    items = _collection(answer)
    if items is None or not all(isinstance(i, str) for i in items):
        return None, None
    letters: list[str] = []
    for i in items:
        got = _split_letters(i, options)
        if got is None:
            return None, None
        letters += got
    return letters, "NumPy array" if isinstance(answer, np.ndarray) else type(answer).__name__


def _no_answer(answer: Any) -> bool:
    return answer is None or answer is Ellipsis or (isinstance(answer, str) and not answer.strip())


def check_choice(answer: Any, key: str, points: float, options: Sequence[str], hints: Mapping[str, str] | None = None) -> Feedback:
    """One option out of ``options`` (letters). Full points for ``key``, 0 otherwise, with the option's hint.

    Accepted: one letter as a string, in either case, with the obvious punctuation around it ("c", " C ", "c.",
    "(c)", "c)"). A one-element list, tuple or set of such a letter (["c"]) is graded as that letter, with a note.
    Several letters ("ac", ["a", "c"]) earn 0: one option is right, so picking several is never rewarded.
    """
    hints = hints or {}
    options = [o.lower() for o in options]
    key = str(key).strip().lower()
    opts = ", ".join(options)
    form = f"one letter out of {opts}, as a string, e.g. \"{options[0]}\""
    if _no_answer(answer):
        return Feedback(0, points, [f"No answer yet: set it to {form}."])
    letters, container = _parse_letters(answer, options)
    if letters is None:
        return Feedback(0, points, [f"Expected {form}; got {_type_name(answer)} {_show(answer)}."])
    if not letters:
        return Feedback(0, points, [f"Your answer has no letter in it: set it to {form}."])
    letters = list(dict.fromkeys(letters))  # "c c" or ["c", "c"] is still one letter
    if len(letters) > 1:
        return Feedback(0, points, [f"Only one letter is allowed here (one option is right); you gave "
                                    f"{len(letters)}: {', '.join(letters)}. Set your answer to {form}."])
    letter = letters[0]
    if letter not in options:
        return Feedback(0, points, [f"({letter}) is not an option here: choose one letter out of {opts}."])
    lines = []
    if container is not None:
        lines.append(f"Note: graded as \"{letter}\"; a single-choice answer is one letter as a string, e.g. \"{letter}\", "
                     f"not a {container} holding it.")
    if letter == key:
        return Feedback(points, points, [f"({letter}) is right." + (f" {hints[letter]}" if letter in hints else "")] + lines)
    why = hints.get(letter, "Reread the question's key sentence and try again.")
    return Feedback(0, points, [f"({letter}) is not right. {why}"] + lines, mistakes=[f"({letter})"])


def check_multi(answer: Any, key: Iterable[str], points: float, options: Sequence[str], hints: Mapping[str, str] | None = None) -> Feedback:
    """Several options. Score = points × max(0, (right picks − wrong picks) / |key|); each error explained.

    ``hints``: option → why the statement is true or false. A wrong pick is named with its hint; a true statement
    left out is named with its hint (without one, only counted). Right picks are not commented on.

    Accepted: a set, list, tuple or 1-D array of letters ({"a", "c"}, ["a", "c"]), or one string: "a, c", "a c",
    or letters run together ("ac") when every character is an option letter. Case, the obvious punctuation around
    a letter and repeats are ignored. An empty answer earns 0 ("choose at least one").
    """
    hints = hints or {}
    options = [o.lower() for o in options]
    key = {str(k).strip().lower() for k in key}
    opts = ", ".join(options)
    form = f"the letters you choose out of {opts}, e.g. {{\"{options[0]}\", \"{options[-1]}\"}} or \"{options[0]}, {options[-1]}\""
    if answer is None or answer is Ellipsis:
        return Feedback(0, points, [f"No answer yet: set it to {form}."])
    picks, _ = _parse_letters(answer, options)
    if picks is None:
        return Feedback(0, points, [f"Expected {form}; got {_type_name(answer)} {_show(answer)}."])
    chosen = set(picks)
    if not chosen:
        return Feedback(0, points, [f"Your answer is empty: choose at least one letter out of {opts}."])
    bad = sorted(chosen - set(options))
    if bad:
        return Feedback(0, points, [f"{', '.join(f'({b})' for b in bad)} {'is not an option' if len(bad) == 1 else 'are not options'}; "
                                    f"choose among {opts}."])
    right, wrong, missed = chosen & key, chosen - key, key - chosen
    lines = []
    for o in sorted(wrong):
        lines.append(f"({o}) should not be chosen. " + hints.get(o, ""))
    for o in sorted(missed & set(hints)):  # a true statement left out, and why it is true
        lines.append(f"({o}) is missing from your set. {hints[o]}")
    unexplained = missed - set(hints)
    if unexplained:
        more = " more" if missed & set(hints) else ""
        lines.append(f"One{more} true statement is missing from your set." if len(unexplained) == 1
                     else f"{len(unexplained)}{more} true statements are missing from your set.")
    if not wrong and not missed:
        lines.append("All right.")
    score = points * max(0.0, (len(right) - len(wrong)) / len(key))
    return Feedback(score, points, [l.strip() for l in lines if l.strip()], mistakes=[f"({o})" for o in sorted(wrong)])


def _ordering_labels(answer: Any) -> list[str] | str:
    """The labels of an ordering answer, in order, lower case; or the reason it is not one (a phrase)."""
    if isinstance(answer, np.ndarray) and answer.ndim == 0 and answer.dtype.kind in "US":
        answer = str(answer)
    if isinstance(answer, str):
        parts = [p.strip(_WRAP).lower() for p in re.split(r"\s*(?:,|;|->|=>|→|>|\|)\s*|\s+", answer.strip())]
        parts = [p for p in parts if p]
        if len(parts) < 2:
            return f"a str ({_show(answer)}) that does not split into labels"
        return parts
    if isinstance(answer, (set, frozenset)):
        return f"a {type(answer).__name__} ({_show(answer)}); a set has no order"
    if isinstance(answer, (list, tuple)):
        return [str(a).strip().lower() for a in answer]
    if isinstance(answer, np.ndarray):
        if answer.ndim == 1 and answer.dtype.kind in "USO" and all(isinstance(a, str) for a in answer.tolist()):
            return [a.strip().lower() for a in answer.tolist()]
        return f"{_type_name(answer)} of shape {answer.shape}, not a 1-D array of label strings"
    return f"{_type_name(answer)} {_show(answer)}"


def check_ordering(answer: Any, key: Sequence[str], points: float, labels: Mapping[str, str] | None = None,
                   reasons: Mapping[str, str] | None = None, accepted: Sequence[Sequence[str]] = (),
                   critical: Sequence[str | Sequence[str]] = ()) -> Feedback:
    """An order of step labels. Full points when exact; otherwise points × (pairs in the right order) / (all pairs),
    with the first misplaced step named.

    ``reasons``: label → why that step takes its place. A wrong order then also names the step most out of place
    (the one in the most pairs the answer inverts; a tie goes to the one the answer puts first) and its reason, one
    step only: what this answer got wrong, not the whole order. ``accepted``: other right orders; the step is chosen
    against the right order closest to the answer (the points are counted against ``key``).

    ``critical``: steps whose place is all or nothing. An order that puts one of them on the other side of a step
    than every right order (``key`` and ``accepted``) does earns 0 points, however many pairs it has right: for a
    procedure where such a relation decides whether it does its job at all, an order that breaks it is not nearly
    right (12.p4: the RNG restore after everything that draws from the RNG, the preflight after what it checks and
    before the restore, step k + 1 last; an order that breaks one of them runs and resumes another run, silently).
    A relation the right orders disagree on (a step that may come before or after the critical one) is free. An
    entry may also be a pair ``[a, b]``: only the relation of those two steps is all or nothing (12.p4: the preflight
    after the adapter it checks; its place against the optimizer is not, because an order that breaks that fails at
    once, and keeps its share of pairs). The feedback names one reversed relation: of the first critical entry (in
    the order given) that has one.

    Accepted: a list or tuple of the labels, a 1-D NumPy array of them, or one string of them separated by commas,
    spaces or arrows ("train, save, attach"). A set (it has no order), a dict, a number, or a string that does not
    split into labels earns 0, with the expected form.
    """
    labels = labels or {}
    key = [str(k).strip().lower() for k in key]
    # The labels alphabetically: the order they are listed in elsewhere may be the answer.
    form = (f"Expected a list of the {len(key)} step labels (strings) in order, first step first, "
            f"e.g. [\"first label\", \"second label\", ...], using the labels {', '.join(sorted(key))}")
    if answer is None or answer is Ellipsis:
        return Feedback(0, points, [f"No answer yet. {form}."])
    ans = _ordering_labels(answer)
    if isinstance(ans, str):
        return Feedback(0, points, [f"{form}; got {ans}."])
    if sorted(ans) != sorted(key):
        missing, extra = sorted(set(key) - set(ans)), sorted(set(ans) - set(key))
        return Feedback(0, points, [f"Use each of the {len(key)} labels exactly once (missing {missing}, unknown or repeated {extra or sorted({a for a in ans if ans.count(a) > 1})})."])
    if ans == key:
        return Feedback(points, points, ["The order is right."])
    pos = {k: i for i, k in enumerate(key)}
    pairs = [(i, j) for i in range(len(ans)) for j in range(i + 1, len(ans))]
    good = sum(pos[ans[i]] < pos[ans[j]] for i, j in pairs)
    first = next(i for i, (a, k) in enumerate(zip(ans, key)) if a != k)
    step = ans[first]
    name = f" ({labels[step]})" if step in labels else ""
    lines = [f"{good} of {len(pairs)} pairs are in the right order. The first step out of place is position {first + 1}: '{step}'{name}."]
    orders = [key, *([str(k).strip().lower() for k in o] for o in accepted)]
    broken = _critical_broken(ans, orders, [str(c).strip().lower() if isinstance(c, str)
                                            else tuple(str(x).strip().lower() for x in c) for c in critical])
    if broken:
        c, other, side = broken
        lines.append(f"Where '{c}'{f' ({labels[c]})' if c in labels else ''} goes is all or nothing in this item: every "
                     f"right order puts it {side} '{other}', and this one does not, so the order earns no points.")
    worst = _most_out_of_place(ans, orders)
    if reasons and worst in reasons:
        why = f" ({labels[worst]})" if worst in labels and worst != step else ""
        lines.append(f"The step most out of place is '{worst}'{why}: {reasons[worst]}")
    score = 0.0 if broken else points * good / len(pairs) * 0.999  # never full unless exact
    return Feedback(score, points, lines)


def _critical_broken(ans: Sequence[str], orders: Sequence[Sequence[str]],
                     critical: Sequence[str | tuple[str, ...]]) -> tuple[str, str, str] | None:
    """A critical relation that ``ans`` reverses, as (critical step, other step, "before" or "after": where every right
    order puts the critical step); None when it keeps every one. A critical step (a label) stands for each relation of
    it that all the right orders (of ``orders``, the first being the key, holding the same labels) agree on; a pair
    ``(a, b)`` for that one relation, if they agree on it. Of several reversed relations of a step, the one with the
    step closest to it in the key: the neighbour it was swapped past, not the far end."""
    orders = [list(o) for o in orders if sorted(o) == sorted(ans)]
    if not orders:
        return None
    for c in critical:
        c, others = (c[0], [c[1]]) if isinstance(c, tuple) else (c, list(ans))
        if c not in ans:
            continue
        reversed_ = []
        for other in others:
            if other not in ans:
                continue
            sides = {o.index(c) < o.index(other) for o in orders} if other != c else set()
            if len(sides) == 1 and (ans.index(c) < ans.index(other)) not in sides:
                reversed_.append((abs(orders[0].index(other) - orders[0].index(c)), other, "before" if sides == {True} else "after"))
        if reversed_:
            _, other, side = min(reversed_)
            return c, other, side
    return None


def _most_out_of_place(ans: Sequence[str], orders: Sequence[Sequence[str]]) -> str:
    """The label of ``ans`` that takes part in the most inverted pairs against the right order (of ``orders``, all
    holding the same labels) with the fewest inversions; a tie goes to the label ``ans`` puts first."""
    def inversions(order: Sequence[str]) -> dict[str, int]:
        pos = {k: i for i, k in enumerate(order)}
        count = dict.fromkeys(ans, 0)
        for i in range(len(ans)):
            for j in range(i + 1, len(ans)):
                if pos[ans[i]] > pos[ans[j]]:
                    count[ans[i]] += 1
                    count[ans[j]] += 1
        return count

    best = min((inversions(o) for o in orders if sorted(o) == sorted(ans)), key=lambda c: sum(c.values()))
    return max(ans, key=lambda a: (best[a], -ans.index(a)))


# --------------------------------------------------------------------------- numbers and arrays


def _number(answer: Any) -> float | None:
    if isinstance(answer, bool) or answer is None:
        return None
    try:
        if hasattr(answer, "detach"):
            answer = answer.detach().cpu()
            if answer.is_floating_point():
                answer = answer.double()  # NumPy has no bfloat16
            answer = answer.numpy()
        arr = np.asarray(answer)
        if arr.size != 1 or not (np.issubdtype(arr.dtype, np.number)):
            return None
        return float(arr.reshape(()))
    except Exception:
        return None


def check_numeric(answer: Any, expected: float, points: float, name: str = "answer", rtol: float = 1e-6, atol: float = 0.0,
                  mistakes: Sequence[Mistake] = (), unit: str = "") -> Feedback:
    """A single number within ``atol + rtol·|expected|``. Known mistakes are recognised and explained."""
    unit_s = f" {unit}" if unit else ""
    x = _number(answer)
    if x is None:
        return Feedback(0, points, [f"{name} should be a single number; got {type(answer).__name__} {answer!r:.60}."])
    if not math.isfinite(x):
        return Feedback(0, points, [f"{name} is {x}; expected a finite number."])
    if abs(x - expected) <= atol + rtol * abs(expected):
        return Feedback(points, points, [f"{name} = {_num(x, expected)}{unit_s} is right."])
    for m in mistakes:
        mv = _number(m.value)
        if mv is not None and abs(x - mv) <= atol + rtol * abs(mv):
            return Feedback(0, points, [f"{name} = {_num(x, expected)}{unit_s} is not right. Likely mistake: {m.message}"],
                            mistakes=[m.label])
    return Feedback(0, points, [f"{name} = {_num(x, expected)}{unit_s} is not right (tolerance: relative {rtol:g}, absolute {atol:g})."])


def _num(x: float, other: float) -> str:
    """Format x with enough digits that it never prints like ``other`` when the two differ."""
    for digits in (8, 12, 17):
        if f"{x:.{digits}g}" != f"{other:.{digits}g}" or x == other:
            return f"{x:.{digits}g}"
    return repr(float(x))


_EPS = {"float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}


def _low_precision(x: Any) -> str | None:
    dt = str(getattr(x, "dtype", "")).replace("torch.", "")
    return dt if dt in _EPS else None


_CASTS = {"float32": ".astype(np.float32), torch.Tensor(...) or .float()", "float16": ".astype(np.float16) or .half()",
          "bfloat16": ".bfloat16() or .to(torch.bfloat16)"}  # how code usually lands in each low precision


def _on_grid(expected: np.ndarray, dtype: str) -> bool:
    """Whether every entry of ``expected`` is itself a number of ``dtype`` (float32, float16 or bfloat16).

    Then an answer of that dtype can hold the right answer exactly, so its rounding does not explain a miss, and
    "compute in float64" is wrong advice: a bf16 weight after bf16 arithmetic (lesson 13's merge and unmerge) is
    right only in bf16. bfloat16 is float32 with the low 16 bits of the mantissa zero (NumPy has no bfloat16)."""
    x = np.asarray(expected, dtype=np.float64)
    with np.errstate(all="ignore"):  # out-of-range values overflow to inf in the cast: off the grid, no warning
        small = x.astype(np.float16 if dtype == "float16" else np.float32)
        if not np.array_equal(small.astype(np.float64), x):
            return False
    return dtype != "bfloat16" or not np.any(small.view(np.uint32) & 0xFFFF)


def _low_precision_hint(name: str, dtype: str) -> str:
    return (f"Your {name} is {dtype}: its rounding (machine epsilon {_EPS[dtype]:.1e}) is larger than the tolerance. "
            f"Compute in float64, as the inputs are: don't convert on the way ({_CASTS[dtype]}).")


def as_array(x: Any) -> np.ndarray | None:
    """A float64 NumPy copy of an array-like answer (NumPy, torch tensor, nested lists), or None."""
    try:
        if hasattr(x, "detach"):
            x = x.detach().cpu()
            if not x.is_complex() and x.is_floating_point():
                x = x.double()  # NumPy has no bfloat16: convert in torch first
            x = x.numpy()
        a = np.asarray(x)
        # Complex is a number to NumPy, but casting it warns (on stderr) and drops the imaginary part.
        if a.dtype == object or not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a):
            return None
        return a.astype(np.float64)
    except Exception:
        return None


def _type_name(x: Any) -> str:
    if isinstance(x, tuple) and type(x) is not tuple:  # a named tuple, e.g. np.linalg.svd's SVDResult
        return f"{type(x).__name__} (a tuple of {len(x)})"
    if hasattr(x, "dtype"):
        return f"{type(x).__module__.split('.')[0]}.{type(x).__name__} of dtype {str(x.dtype).replace('torch.', '')}"
    return type(x).__name__


def compare_arrays(got: Any, expected: np.ndarray, name: str, rtol: float, atol: float,
                   mistakes: Sequence[Mistake] = (), reveal: bool = True, hidden: bool = False,
                   found: list[str] | None = None, matched: list[Mistake] | None = None) -> tuple[str, list[str]]:
    """Classify an array answer: ``("ok"|"shape"|"values"|"type", lines)`` naming tensor, index and values.

    ``reveal=False`` (answer items, whose expected value is the key) names the wrong entry and the value
    that came back, never the expected one. ``hidden=True`` (a hidden case) names the output and what is
    wrong with it, but no shape, index or value: each is computed from the hidden inputs. Mistake messages
    are printed as given; for a hidden case pass messages without numbers (see :func:`check_function`).
    ``found``: a list that gets the label of every known mistake the answer equals (the message names the first;
    two mistakes can give the same value on one case), as data for the class report. ``matched``: a list that gets
    each of those :class:`Mistake` objects, in the same order (a caller that names a mistake only when it explains
    the failures of several cases, as :func:`check_function` does, words or drops the "Likely mistake:" line later).
    """
    a = as_array(got)
    expected = np.asarray(expected, dtype=np.float64)
    if a is None:
        return "type", [f"{name} should be an array of numbers; got {_type_name(got)}."]
    if a.shape != expected.shape:
        if hidden:
            lines = [f"{name} has the wrong shape (hidden inputs and the shapes they give are not shown; "
                     f"the public cases check shapes the same way)."]
        else:
            lines = [f"{name} has shape {a.shape}; expected {expected.shape}."]
        if a.shape == expected.T.shape and np.allclose(a, expected.T, rtol=rtol, atol=atol):
            lines.append(f"Your {name} is the transpose of the right one: compare it with the task's shapes (row-vector convention: X is n × d, W is d × m; nn.Linear stores its weight out × in, the transpose).")
        for m in mistakes:
            mv = np.asarray(m.value, dtype=np.float64) if m.value is not None else None
            if mv is not None and mv.shape == a.shape and np.allclose(a, mv, rtol=rtol, atol=atol):
                if not any(l.startswith("Likely mistake:") for l in lines):
                    lines.append(f"Likely mistake: {m.message}")
                if found is None and matched is None:
                    break
                if found is not None:
                    found.append(m.label)
                if matched is not None:
                    matched.append(m)
        return "shape", lines
    if not np.all(np.isfinite(a)):
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        if hidden:
            return "values", [f"{name} has {'a NaN' if np.isnan(a[idx]) else 'an infinite'} entry; every entry should be finite."]
        return "values", [f"{entry_name(name, idx)} is {a[idx]}; every entry should be finite."]
    close = np.isclose(a, expected, rtol=rtol, atol=atol)
    if close.all():
        return "ok", [f"{name} matches" + ("." if hidden else f" (shape {a.shape}).")]
    err = np.abs(a - expected) - (atol + rtol * np.abs(expected))
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), a.shape))
    where = entry_name(name, idx)
    if hidden:
        lines = [f"{name} is not right: {'every entry is' if (~close).all() else 'some entries are'} off "
                 f"(tolerance: relative {rtol:g}, absolute {atol:g}; the values of hidden cases are not shown)."]
    elif reveal:
        lines = [f"{where}: expected {_num(expected[idx], a[idx])}, got {_num(a[idx], expected[idx])} ({int((~close).sum())} of {a.size} entries differ)."]
    else:
        lines = [f"{where} = {_num(a[idx], expected[idx])} is not right ({int((~close).sum())} of {a.size} entries are off; "
                 f"tolerance: relative {rtol:g}, absolute {atol:g})."]
    named = None
    for m in mistakes:
        if m.value is None:
            continue
        mv = np.asarray(m.value, dtype=np.float64)
        if mv.shape == a.shape and np.allclose(a, mv, rtol=max(rtol, 1e-6), atol=max(atol, 1e-9)):
            named = named or f"Likely mistake: {m.message}"
            if found is None and matched is None:
                break
            if found is not None:
                found.append(m.label)
            if matched is not None:
                matched.append(m)
    low = _low_precision(got)
    # Blame the dtype only when its rounding could explain the miss and no known mistake does
    # (a wrong formula computed in float32 is a wrong formula), and only when the right answer is not itself a number
    # of that dtype (an answer meant to be bf16 that misses is wrong arithmetic, not too few bits).
    if low and named is None and not _on_grid(expected, low) and np.allclose(a, expected, rtol=100 * _EPS[low],
                                             atol=atol + 100 * _EPS[low] * float(np.abs(expected).max())):
        lines.append(_low_precision_hint(name, low))
    if named:
        lines.append(named)
    return "values", lines


def check_array(answer: Any, expected: Any, points: float, name: str = "answer", rtol: float = 1e-6, atol: float = 1e-9,
                dtype: Any = None, mistakes: Sequence[Mistake] = ()) -> Feedback:
    """An array answer: shape, then values, then (if given) dtype.

    A wrong value earns 1/4 only when it matches one of ``mistakes`` (a right shape alone earns nothing:
    any array of zeros has it); right values with the wrong dtype earn 3/4. Feedback names the worst index and the value that came back, but
    not the expected value (it is the key), and recognises ``mistakes``.
    """
    found: list[str] = []
    kind, lines = compare_arrays(answer, expected, name, rtol, atol, mistakes, reveal=False, found=found)
    if kind in ("type", "shape"):
        return Feedback(0, points, lines, mistakes=found[:1])
    if kind == "values":
        if found and as_array(answer) is not None and np.isfinite(as_array(answer)).all():
            return Feedback(points / 4, points, lines, credit="1/4 of the points: a known mistake, on the right track",
                            mistakes=found[:1])
        return Feedback(0, points, lines, mistakes=found[:1])
    if dtype is not None:
        got = str(getattr(answer, "dtype", type(answer).__name__)).replace("torch.", "")
        want = np.dtype(dtype).name
        if got != want:
            return Feedback(points * 3 / 4, points, lines + [f"{name} has dtype {got}; expected {want}."], credit="3/4 of the points")
    return Feedback(points, points, lines)


# --------------------------------------------------------------------------- functions under test


@dataclass
class Case:
    """One call of the function under test: keyword arguments and a short public description."""

    kwargs: dict
    label: str = ""
    hidden: bool = False


@contextlib.contextmanager
def quiet(sink: list[str] | None = None):
    """Run student code with its warnings and stderr captured (a test cell with stderr scores 0).

    What was captured goes to ``sink`` (a list of lines) when given, else to stdout.
    """
    buf = _Capped()
    out = _Capped()
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(buf), contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            yield
    finally:  # also when the student's code raises: its stderr is the best clue to why
        lines = [l[:300] for l in buf.getvalue().strip().splitlines()]
        lines += [f"{w.category.__name__}: {w.message}" for w in caught]
        if out.lines:
            shown = [l[:300] for l in out.getvalue().strip().splitlines()][:3]
            lines.append(_Printed(f"(printed {out.lines} line{'s' if out.lines != 1 else ''} while being checked; the "
                                  f"first {len(shown)}: " + " | ".join(shown) + ")", out.lines))
        if sink is not None:
            sink.extend(lines)
        elif lines:
            print(_noise_text(lines))


class _Printed(str):
    """The one-line summary of what student code printed; ``count`` is how many printed lines it stands for."""

    def __new__(cls, text: str, count: int):
        self = super().__new__(cls, text)
        self.count = count
        return self


class _Capped(io.StringIO):
    """A text sink that keeps the first lines written to it and counts the rest (a print flood stays small)."""

    KEEP = 50_000  # characters

    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def write(self, s: str) -> int:
        self.lines += s.count("\n")
        if self.tell() < self.KEEP:
            super().write(s[: self.KEEP])
        return len(s)


def probe(fn: Any, measure: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``measure(fn, *args, **kwargs)``: call the student's ``fn`` and reduce what it returned to data.

    For items whose answer is an object (a model, the parameters it holds) rather than data: ``measure`` is the
    item's own code that calls ``fn`` and reads what the check needs (names, logits, flags). While the student
    works it runs here; in the autograde run ``fn`` is a :class:`coursekit.grading.remote.Remote` and ``measure``
    runs next to the student's function in the sandboxed runner, so that only its data comes back. ``measure``
    must return data (numbers, strings, arrays, tensors, lists, dicts) and use nothing of coursekit.grading."""
    run = getattr(fn, "run_probe", None)
    return run(measure, *args, **kwargs) if run is not None else measure(fn, *args, **kwargs)


class CaseTimeout(BaseException):
    """Raised (by an alarm) inside a student's function that runs past its time limit.

    A BaseException, so that a student's ``except Exception`` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise :class:`CaseTimeout` in the main thread after ``seconds`` (no limit off the main thread,
    without SIGALRM, or when ``seconds`` is falsy)."""
    import signal
    import threading

    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _alarm(signum, frame):
        raise CaseTimeout(seconds)

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _case_timeout() -> float:
    """Seconds one call of a student's function may take (``COURSEKIT_CASE_TIMEOUT``, default 30)."""
    try:
        return float(os.environ.get("COURSEKIT_CASE_TIMEOUT", "30"))
    except ValueError:
        return 30.0


class _CallWatch:
    """Records which coursekit functions a piece of code enters (``sys.setprofile``).

    ``entries``: coursekit code objects called directly from code outside coursekit (the student's);
    ``all``: every coursekit code object that ran. Used to catch a student's function that calls the
    reference answer (or the kernels the reference itself is built on) instead of computing it."""

    def __init__(self) -> None:
        self.entries: dict = {}
        self.all: set = set()

    def _hook(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if _in_pkg(code.co_filename):
            self.all.add(code)
            back = frame.f_back
            if back is not None and not _in_pkg(back.f_code.co_filename) and code not in self.entries:
                self.entries[code] = f"{frame.f_globals.get('__name__', '?')}.{code.co_name}"

    @contextlib.contextmanager
    def __call__(self):
        old, old_threads = sys.getprofile(), threading.getprofile()
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)  # threads the student's function starts (a pool that calls the reference)
        try:
            yield self
        finally:
            sys.setprofile(old)
            threading.setprofile(old_threads)


def withheld_message(module: str, qualname: str) -> str:
    """What a withheld coursekit function says when the student's code calls it while its item is graded."""
    return (f"coursekit's {module.split('.')[-1]}.{qualname} is withheld while this item is graded: "
            "the task is to compute it in your own code")


def withheld_here(fn: Callable, withheld: Sequence[str]) -> Callable:
    """``fn`` as the grader's runner runs it, for a check in the student's own kernel.

    In the autograde run the item's ``withheld`` coursekit functions (``"module:qualname"``, see
    :func:`coursekit.grading.remote.withheld_of`) are stubs that raise (:func:`coursekit.grading.remote.stub_files`),
    so an answer that calls one fails every case that calls it. In the notebook they are the real functions; so the
    returned function runs ``fn`` under a profile hook (``sys.setprofile``, and ``threading.setprofile`` for the
    threads it starts) that raises the stub's RuntimeError when one of them is entered, directly or through other
    code: the notebook's check then says what grading will, pointing at the student's line. Names that do not
    resolve are skipped; with none left, ``fn`` itself is returned."""
    import functools
    import importlib

    codes: dict = {}
    for w in withheld:
        mod, _, qual = w.partition(":")
        try:
            obj: Any = importlib.import_module(mod)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            continue
        code = getattr(getattr(obj, "__func__", obj), "__code__", None)
        if code is not None:
            codes[code] = withheld_message(mod, qual)
    if not codes:
        return fn

    def hook(frame, event, arg):  # an exception raised here propagates from the call it saw (and unsets the hook)
        if event == "call" and frame.f_code in codes:
            raise RuntimeError(codes[frame.f_code])

    @functools.wraps(fn)
    def watched(*args, **kwargs):
        old, old_threads = sys.getprofile(), threading.getprofile()
        sys.setprofile(hook)
        threading.setprofile(hook)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(old)
            threading.setprofile(old_threads)
    return watched


_CHECKERS_FILE = os.path.abspath(__file__)


def _in_pkg(filename: str) -> bool:
    f = os.path.abspath(filename) if filename and not filename.startswith("<") else ""
    return f.startswith(_PKG + os.sep) and f != _CHECKERS_FILE


def _noise_text(lines: list[str]) -> str:
    distinct = list(dict.fromkeys(lines))
    more = f"\n  ({len(distinct) - 5} more distinct lines)" if len(distinct) > 5 else ""
    return "(your code printed, warned or wrote to stderr while being checked; shown here, not graded)\n  " + "\n  ".join(distinct[:5]) + more


def check_function(
    fn: Any,
    cases: Sequence[Case],
    reference: Callable[..., Any],
    points: float,
    name: str,
    outputs: Sequence[str] = ("result",),
    rtol: float = 1e-6,
    atol: float = 1e-9,
    mistakes: Callable[[dict, dict], Mapping[str, Sequence[Mistake]]] | None = None,
    extra: Callable[[Callable, Case], list[str] | None] | None = None,
    timeout: float | None = None,
) -> Feedback:
    """Run ``fn(**case.kwargs)`` on every case and compare each output with ``reference(**case.kwargs)``.

    Args:
        fn: the student's function. cases: public and (in the autograde run) hidden cases.
        reference: returns the expected output (a tuple when ``outputs`` has several names).
        outputs: names of the outputs, used in messages ("dA[1, 0]: expected …").
        mistakes: ``mistakes(kwargs, answers)`` → output name → known wrong values with explanations.
        extra: a further check per passed case (e.g. a gradient check); returns failure lines or None.

    Score: points × (cases passed) / (cases run). Exceptions inside ``fn`` fail that case only.

    A known mistake is named (a "Likely mistake:" line, and its label in :attr:`Feedback.mistakes` for the class
    report) only when it explains the failures: the answer equals it on at least :data:`MISTAKE_SHARE` (two thirds)
    of the failed cases that returned an answer and for which ``mistakes`` lists it (a case that raised or timed
    out has no answer and is not counted: see :data:`MISTAKE_SHARE`). A mistake one case matches by coincidence
    among other wrong answers is not named; that case's lines still say what is wrong. When one case's answer
    equals several mistakes, the one the other cases share is named (:func:`_consistent`).

    Each call may take ``timeout`` seconds (default ``COURSEKIT_CASE_TIMEOUT`` or 30 s); one that runs
    longer is stopped, fails, and the later cases are not run. What ``fn`` prints is captured and
    summarised (a print flood cannot push the feedback out of nbgrader's output limit). In the autograde
    run ``fn`` is a :class:`coursekit.grading.remote.Remote`: the student's code runs in a sandboxed
    runner, with the coursekit functions the item asks for withheld, and its time limit is enforced there.

    The student's function and the reference each get their own copies of the inputs, so a function that
    changes its inputs in place cannot change the expected answer; doing so fails the case, with the
    input named. A function whose parameters are named differently but number the same is called
    positionally, with a note.
    """
    if not callable(fn):
        return Feedback(0, points, [f"{name} should be a function; got {type(fn).__name__}. Define it with def {name}(...):"])
    passed, lines, noise, hidden_noise = 0, [], [], []
    per_case: list[list[str]] = []  # per failed case, the labels of every known mistake its answer equals
    likely: list[tuple[int, list[Mistake]]] = []  # where a "Likely mistake:" line sits in lines, its output's matches
    evidence: list[tuple[set[str], set[str]]] = []  # per failed case that returned an answer: (listed, matched) labels
    public_mistakes: dict[tuple[str, str], tuple[int, str]] = {}  # (output, label) → (case number, message)
    positional = _needs_positional(fn, cases)
    if positional:
        lines.append(f"Note: your {name} names its parameters ({positional}); the task names them "
                     f"({', '.join(cases[0].kwargs)}). Graded by position; use the task's names.")
    limit = _case_timeout() if timeout is None else timeout
    timed_out = False
    for i, case in enumerate(cases, 1):
        tag = f"{'hidden' if case.hidden else 'public'} case {i}" + (f" ({case.label})" if case.label and not case.hidden else "")
        if timed_out:
            lines.append(f"✗ {tag}: not run (an earlier case did not return).")
            continue
        kwargs = {k: _copy_input(v) for k, v in case.kwargs.items()}
        sink = hidden_noise if case.hidden else noise
        try:
            with quiet(sink), time_limit(limit):
                got = fn(*kwargs.values()) if positional else fn(**kwargs)
        except CaseTimeout:
            timed_out = True
            lines.append(f"✗ {tag}: your {name} did not return within {limit:g} s and was stopped "
                         f"(an endless loop, or far more work than the task needs). Later cases are not run.")
            continue
        except NotImplementedError as e:
            stub = _stub_name(e)
            if stub and stub != name:
                return Feedback(0, points, [f"{name} calls {stub}, which still raises NotImplementedError: "
                                            f"finish {stub} first (it has its own check cell), then run this check again."])
            return Feedback(0, points, [f"{name} still raises NotImplementedError: replace the stub with your code."])
        except Exception as e:  # the student's bug, reported, not raised
            msg = describe_exception(e, name, kwargs, hidden=case.hidden)
            lines.append(f"✗ {tag}: " + msg)
            lines += _exception_hints(e)
            continue
        want = reference(**{k: _copy_input(v) for k, v in case.kwargs.items()})
        changed = _changed_inputs(case.kwargs, kwargs, where=not case.hidden)
        if len(outputs) > 1:
            if isinstance(got, np.ndarray) and got.ndim == 1 and len(got) == len(outputs):
                got = tuple(got)  # a 1-D array of scalar outputs (e.g. two counts) is as good as a tuple
            if not isinstance(got, (tuple, list)) or len(got) != len(outputs):
                n_got = f" of {len(got)} values" if isinstance(got, (tuple, list)) and type(got) in (tuple, list) else ""
                lines.append(f"✗ {tag}: {name} should return {len(outputs)} values ({', '.join(outputs)}), in this order; "
                             f"got {_type_name(got)}{n_got}.")
                continue
        else:
            if isinstance(got, (tuple, list)) and len(got) == 1 and np.shape(want) != (1,) + np.shape(got[0]):
                lines.append(f"✗ {tag}: {name} should return its {outputs[0]} itself; got a {type(got).__name__} holding "
                             f"one value (a trailing comma after return, or return [{outputs[0]}]?).")
                continue
            got, want = (got,), (want,)
        known = mistakes(case.kwargs, dict(zip(outputs, got))) if mistakes else {}
        if case.hidden:
            known = {out: [_hidden_mistake(m, out, public_mistakes) for m in ms] for out, ms in known.items()}
        else:
            for out, ms in known.items():
                for m in ms:
                    public_mistakes.setdefault((out, m.label), (i, m.message))
        bad, found, at = [], [], []
        for out_name, g, w in zip(outputs, got, want):
            matched: list[Mistake] = []
            kind, msg = compare_arrays(g, np.asarray(w), out_name, rtol, atol, known.get(out_name, ()), hidden=case.hidden,
                                       found=found, matched=matched)
            if kind != "ok":
                # Worded (or dropped) after the last case, once it is known whether the mistake explains the failures.
                at += [(len(bad) + k, matched) for k, b in enumerate(msg) if matched and b.startswith("Likely mistake:")][:1]
                bad += msg
        if found:
            per_case.append(found)
        if not bad and extra is not None:
            try:
                with quiet(sink):  # extra checks call the student's code again
                    bad = extra(fn, case) or []
            except Exception as e:
                bad = ["a further check on your function (beyond its outputs) could not run it: "
                       + describe_exception(e, name, kwargs, hidden=case.hidden)]
            if case.hidden:
                # An extra check's lines are written for public cases and may quote the inputs. Even a line a public
                # case printed word for word is withheld: that it recurs would tell that the hidden values equal the
                # public ones.
                safe = [b for b in bad if not _quotes_numbers(b)]
                if len(safe) < len(bad):
                    n = len(bad) - len(safe)
                    safe.append(f"({n} line{'s' if n != 1 else ''} of this check not shown: "
                                f"{'they quote' if n != 1 else 'it quotes'} values of the hidden inputs.)")
                bad = safe
            lows = [(n, _low_precision(g)) for n, g in zip(outputs, got) if _low_precision(g)]
            if bad and lows:
                bad.append(_low_precision_hint(*lows[0]))
        if bad and len(outputs) > 1:
            swapped = _swapped_outputs(outputs, got, want, rtol, atol)
            if swapped:
                bad.append(f"Your values are right but in the wrong order: {swapped}. Return ({', '.join(outputs)}), "
                           f"in this order.")
        if changed and not any("in place" in b or "restore" in b for b in bad):
            bad.append(f"{name} changed its input {changed} in place. Leave inputs as they are: work on a copy "
                       f"(x = x.copy() in NumPy, x = x.clone() in torch) or build new arrays.")
        if bad:
            evidence.append(({m.label for ms in known.values() for m in ms}, set(found)))
            lines.append(f"✗ {tag}:")
            likely += [(len(lines) + k, ms) for k, ms in at]
            lines += ["    " + b for b in bad]
        else:
            passed += 1
            lines.append(f"✓ {tag}")
    score = points * passed / max(len(cases), 1)
    if hidden_noise:
        # What the student's code printed on a hidden case may be its inputs (print(X)): only lines without
        # numbers are passed on (not even a line a public case printed too: its recurring would say the values match).
        safe = [l for l in hidden_noise if not _quotes_numbers(l)]
        n = sum(l.count if isinstance(l, _Printed) else 1 for l in hidden_noise if _quotes_numbers(l))  # a summary counts its lines
        noise += safe
        if n:
            noise.append(f"({n} line{'s' if n != 1 else ''} printed or warned during hidden cases not shown: "
                         f"{'they quote' if n != 1 else 'it quotes'} numbers, which may be hidden inputs.)")
    if noise:
        lines += _noise_text(noise).splitlines()
    explaining = _explaining(evidence)
    named = _consistent([[label for label in c if label in explaining] for c in per_case
                         if any(label in explaining for label in c)])
    drop = set()
    for k, ms in likely:
        # The line names its output's first match among the mistakes named for the item (Feedback.mistakes); else
        # the first that explains the failures; else no mistake at all (what is wrong with the output stays).
        m = next((m for m in ms if m.label in named), None) or next((m for m in ms if m.label in explaining), None)
        if m is None:
            drop.add(k)
        else:
            lines[k] = f"    Likely mistake: {m.message}"
    lines = [line for k, line in enumerate(lines) if k not in drop]
    return Feedback(score, points, lines, mistakes=named)


MISTAKE_SHARE = 2 / 3
"""The share of an item's failed cases a known mistake must explain to be named (:func:`check_function`).

A case counts for a :class:`Mistake` when the function returned an answer there, the answer is wrong (values, shape,
type, NaN, an extra check or an input changed in place), and the item lists that mistake for the case (it has a
value there); it explains the case when the answer equals that value. The mistake is named when it explains at
least this share of the failed cases that count for it.

Not counted, on purpose:

* a case that raised, timed out, was not run after a timeout, or returned the wrong number of outputs: there is no
  answer to compare, and the same wrong code often raises where the shapes differ (a missing transpose runs only
  on a square weight, a missing ``keepdims`` only on one head). The exception is reported with its own hints;
* a case whose list leaves the mistake out: an item omits a mistake where it has no value or cannot be told from
  another (``|a|`` alone when ``a = 0``; ``√d_v`` when ``d_v = 1`` is no scale at all), so there the mistake
  predicts nothing.

Why two thirds, not every case: a student's mistake can come with a second bug that shows on a few cases only
(a masked key, one token): one such case of three must not hide it. Why not less: a wrong answer that equals a
listed mistake on one case among two or more wrong answers (an unlisted mistake that coincides with ``lora_alpha
// r`` where ``lora_alpha < r``) is a coincidence, and so are different mistakes that each match a minority of the
cases (the answer is wrong in a way no listed mistake explains). One wrong answer alone is all the evidence there
is: a match there is named.
"""


def _explaining(evidence: list[tuple[set[str], set[str]]]) -> set[str]:
    """The labels that explain at least :data:`MISTAKE_SHARE` of the failed cases that count for them, from
    ``(listed, matched)`` labels per failed case that returned an answer (see :data:`MISTAKE_SHARE`)."""
    named = set()
    for label in set().union(*(matched for _, matched in evidence)):
        counted = [matched for listed, matched in evidence if label in listed or label in matched]
        if sum(label in matched for matched in counted) >= MISTAKE_SHARE * len(counted) - 1e-9:
            named.add(label)
    return named


def _consistent(per_case: list[list[str]]) -> list[str]:
    """The mistakes an answer made, from the labels each failed case's answer equals: those every such case shares
    (on one case two mistakes can give the same value, e.g. s // r = 0 and no adapter at all), else each case's
    first."""
    if not per_case:
        return []
    shared = [label for label in dict.fromkeys(per_case[0]) if all(label in c for c in per_case)]
    return shared or list(dict.fromkeys(c[0] for c in per_case))


def _swapped_outputs(outputs: Sequence[str], got: Sequence[Any], want: Sequence[Any], rtol: float, atol: float) -> str:
    """"you returned dK where dQ belongs, …" when every wrong output equals another output's expected value; else ""."""
    def same(g: Any, w: Any) -> bool:
        return compare_arrays(g, np.asarray(w), "", rtol, atol)[0] == "ok"

    moved = []
    for i, g in enumerate(got):
        if same(g, want[i]):
            continue
        j = next((j for j in range(len(want)) if j != i and same(g, want[j])), None)
        if j is None:
            return ""
        moved.append(f"you returned {outputs[j]} where {outputs[i]} belongs")
    return ", ".join(moved)


# Names that contain digits but quote no input: dtypes, formats, instruction sets, logarithms.
_NAMES_WITH_DIGITS = re.compile(
    r"\b(?:u?int|float|bfloat|fp|bf|f|complex)\d+\b|\bQ\d(?:_[0-9KSML]+)*\b|\b(?:NF|FP)4\b|\bAVX\d*(?:[_-]\w+)?\b"
    r"|\blog(?:2|10)\b|\bx86_64\b|\bsha\d+\b|\butf-?8\b", re.IGNORECASE)


def _quotes_numbers(text: str) -> bool:
    """True when ``text`` holds a digit that may come from a case's inputs: "s = 2.5", "X[3, 1]", "(4, 7)", and
    digits glued to letters too ("m3_d5", "len12", "bs64": a student's own message can print a hidden shape that
    way). A lesson reference ("Lesson 05") and names that merely contain digits (float64, fp32, uint8, Q4_1,
    NF4, AVX512_BF16, log10) are not numbers in this sense."""
    text = re.sub(r"\b[Ll]essons? \d+(?:\s*(?:-|–|and)\s*\d+)?", "", text)
    return re.search(r"\d", _NAMES_WITH_DIGITS.sub("", text)) is not None


def _hidden_mistake(m: Mistake, output: str, public: Mapping[tuple[str, str], tuple[int, str]]) -> Mistake:
    """The same mistake with a message that quotes nothing computed from a hidden case's inputs: its name and
    ``hint``; else its message when it holds no number; else the message a public case gave for it (computed
    from public inputs, and naming the mistake in full); else its name alone."""
    note = "(hidden inputs are not shown.)"
    if m.hint:
        # "you kept ..." → "You kept ..."; a symbol stays as written (dQ, not DQ: D is a matrix of its own)
        hint = m.hint[:1].upper() + m.hint[1:] if re.match(r"[a-z]+(?![\w′'])", m.hint) else m.hint
        text = f"'{m.label}'. {hint} {note}"
    elif not _quotes_numbers(m.message):
        text = m.message
    elif (output, m.label) in public:
        k, msg = public[(output, m.label)]
        text = f"as explained with the inputs of public case {k}: {msg} {note}"
    else:
        text = f"'{m.label}'. Its explanation quotes this case's inputs, which are hidden, so only its name is shown."
    return Mistake(m.label, m.value, text, m.hint)


_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy_input(v: Any) -> Any:
    """A private copy of one input (arrays and tensors by value; anything that cannot be copied as is)."""
    if isinstance(v, np.ndarray):
        return v.copy()
    if hasattr(v, "detach") and hasattr(v, "clone"):  # a torch tensor (leaf or not)
        return v.detach().clone().requires_grad_(bool(getattr(v, "requires_grad", False)))
    if callable(v) or isinstance(v, (str, bytes, int, float, bool, type(None))):
        return v
    try:
        import copy

        return copy.deepcopy(v)
    except Exception:
        return v


def _changed_inputs(pristine: Mapping[str, Any], used: Mapping[str, Any], where: bool = True) -> str | None:
    """The name (and, with ``where``, the first changed index) of an array or tensor input the student's function
    changed. Without ``where`` (a hidden case) the index is left out: it points into a hidden input."""
    for k, v in pristine.items():
        u = used.get(k)
        if u is v:
            continue
        a, b = as_array(v), as_array(u)
        if a is None or b is None or a.shape != b.shape:
            continue
        diff = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        if diff.any():
            idx = [int(i) for i in np.argwhere(diff)[0]]
            return f"`{k}` (entry {idx})" if idx and where else f"`{k}`"
    return None


def _needs_positional(fn: Callable, cases: Sequence[Case]) -> str | None:
    """The student's parameter names when they differ from the task's but a positional call fits."""
    import inspect

    if not cases:
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    kwargs = cases[0].kwargs
    try:
        sig.bind(**kwargs)
        return None
    except TypeError:
        pass
    try:
        sig.bind(*kwargs.values())
    except TypeError:
        return None
    return ", ".join(sig.parameters)


def _student_frames(e: BaseException) -> list:
    """The traceback frames of ``e`` outside coursekit (for an exception raised in the grader's sandboxed runner,
    the frames it reported), each with ``filename``, ``lineno``, ``name`` and ``line``."""
    sent = getattr(e, "coursekit_frames", None)
    if sent is not None:
        return [traceback.FrameSummary(f[0], f[1], f[2], line=f[3] or None, lookup_line=False) for f in sent]
    return [f for f in traceback.extract_tb(e.__traceback__) if not os.path.abspath(f.filename).startswith(_PKG)]


def _stub_name(e: BaseException) -> str | None:
    """The function (outside coursekit) whose body raised NotImplementedError, if any."""
    frames = _student_frames(e)
    return frames[-1].name if frames else None


def describe_exception(e: Exception, name: str, kwargs: dict, hidden: bool = False) -> str:
    """Where the student's code failed: the last traceback frame outside coursekit, or the call itself.

    ``hidden``: the exception's message is left out when it holds a number (``matmul: ... size 7 is different
    from 5`` quotes the hidden inputs' sizes), even when a public case raised the same words: that they recur
    would tell that the hidden values equal the public ones."""
    frames = _student_frames(e)
    if not frames:  # failed at the call: the function's parameters do not fit
        text = (f"{name}({', '.join(kwargs)}) could not be called: {type(e).__name__}: {e}. "
                f"Check that your function takes exactly these parameters.")
        if hidden and _quotes_numbers(str(e)):
            text = (f"{name}({', '.join(kwargs)}) could not be called: {type(e).__name__} (its message quotes the hidden "
                    f"inputs, so it is not shown). Check that your function takes exactly these parameters.")
        return text
    f = frames[-1]
    where = f" (line {f.lineno}: {f.line.strip()})" if f.line else f" (line {f.lineno})"
    text = f"{name} raised {type(e).__name__}: {e}{where}"
    if hidden and _quotes_numbers(str(e)):
        text = f"{name} raised {type(e).__name__}{where}; its message quotes the hidden inputs, so it is not shown"
    return text


def _exception_hints(e: Exception) -> list[str]:
    msg = str(e)
    if "coursekit.grading" in msg:
        return ["    coursekit's grader is not available to your function while it is graded (it runs in a sandbox "
                "without it): compute the result in your own code."]
    if "matmul" in msg or "shapes" in msg and "not aligned" in msg or "mat1 and mat2" in msg or "size mismatch" in msg:
        return ["    A matrix product's inner sizes disagree: write each operand's shape next to it "
                "(X n×d, W d×m, A d×r, B r×m; nn.Linear.weight is out×in) and check which one needs a transpose."]
    return []
