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
:class:`Ordering`, :class:`Function`. Keys, hints for wrong choices and hidden-case seeds of the items that
count live with the instructor (``autograder/keys/NN.json``, found through ``$COURSEKIT_KEYS``; see :mod:`.keys`);
without them keyed items are recorded, not scored. Warm-ups are formative: worth 0 points, a warm-up choice
ships its key and an explanation of every option (``Choice(..., key=, explain=)``), so its check says right or
wrong at once. Numbers and arrays are computed from the reference kernels.
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from . import keys as _keys
from .checkers import (
    PUBLIC_ONLY_NOTE,
    _low_precision,
    _low_precision_hint,
    _number,
    _ordering_labels,
    Case,
    Feedback,
    Mistake,
    as_array,
    check_array,
    check_choice,
    check_function,
    check_multi,
    check_numeric,
    check_ordering,
    formative,
    withheld_here,
)

__all__ = [
    "grade",
    "check",
    "autograding",
    "unanswered",
    "written",
    "model_answer",
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
    """A multiple-choice item; ``multi`` for "choose all that apply".

    A counted item's key (a letter, or a list of letters) and the hints for its options live in the
    instructor's key file (see :mod:`.keys`), not here: while a student works its check only records the answer.
    A *formative* item (a warm-up) ships its ``key`` and an ``explain`` text for every option, right or wrong, so
    its check says at once whether the answer is right and why; such an item is worth 0 points, because a key
    that ships can be read or found by trying the letters.

    Raises ValueError when a formative item has points or leaves an option unexplained."""

    title: str
    points: float
    options: str = "abcd"
    multi: bool = False
    key: Any = None
    explain: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.key is None:
            if self.explain:
                raise ValueError(f"{self.title!r}: explanations ship only with a formative item's key; a counted "
                                 "item's hints belong in the instructor's key file")
            return
        if self.points:
            raise ValueError(f"{self.title!r}: a choice whose key ships with the course is formative and must be worth "
                             f"0 points, not {self.points}")
        missing = sorted(set(self.options) - set(self.explain))
        if missing or set(self.explain) - set(self.options):
            raise ValueError(f"{self.title!r}: explain every option {list(self.options)} (missing {missing}) and no other")

    @property
    def formative(self) -> bool:
        """Whether the key ships with the course (a warm-up: immediate feedback, 0 points)."""
        return self.key is not None

    def _run(self, answer: Any, key: Any, hints: Mapping[str, str]) -> Feedback:
        if self.multi:
            return check_multi(answer, key, self.points, list(self.options), hints)
        return check_choice(answer, key, self.points, list(self.options), hints)

    def keys_here(self) -> list[Any]:
        """Every key this item could have (to tell a well-formed answer from a malformed one without the key)."""
        opts = list(self.options)
        if not self.multi:
            return opts
        return [list(c) for n in range(1, len(opts) + 1) for c in itertools.combinations(opts, n)]

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        if self.formative:
            check = check_multi if self.multi else check_choice
            return formative(check(answer, self.key, 1, list(self.options), self.explain))
        if not ctx.has_keys():
            return _recorded(self, answer)
        return self._run(answer, ctx.key(), ctx.hints())


@dataclass
class Numeric:
    """A number. ``expected()`` computes it from coursekit (else the key is used); ``mistakes()`` lists known wrong values.
    Neither may depend on the machine that grades: the item must score the same however the grading is run
    (serially, on workers with other thread settings, on another machine). ``reread`` ("Reread '<section>' in
    <part>.", a heading of the lesson under its top-level part) ends the feedback of a wrong number that no named
    mistake explains."""

    title: str
    points: float
    name: str = "answer"
    expected: Callable[..., float] | None = None
    rtol: float = 1e-6
    atol: float = 0.0
    mistakes: Callable[..., Sequence[Mistake]] = lambda: ()
    unit: str = ""
    reread: str = ""

    def _run(self, answer: Any, key: Any, hints: Mapping[str, str]) -> Feedback:
        want = self.expected() if self.expected else float(key)
        fb = check_numeric(answer, want, self.points or 1, self.name, self.rtol, self.atol, list(self.mistakes()), self.unit)
        if _number(answer) is not None and math.isfinite(_number(answer)):  # a number, not a malformed answer
            point_to_section(fb, self.reread)
        return fb if self.points else formative(fb)  # a 0-point warm-up: the verdict, no points

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        if self.expected is None and not ctx.has_keys():
            n = _number(answer)
            return _recorded(self, answer, [] if n is None else [n])
        return self._run(answer, None if self.expected else ctx.key(), {})


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
    reread: str = ""  # as Numeric's: ends the feedback of a wrong array

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        expected = self.expected()
        fb = check_array(answer, expected, self.points or 1, self.name, self.rtol, self.atol, self.dtype, list(self.mistakes()))
        a, low = as_array(answer), _low_precision(answer)
        # a finite array, not a malformed answer, not the right numbers in another shape (a flat list for a 1 × 2 row,
        # or the transpose, which the checker names), and not one whose only fault is its low-precision dtype (the
        # checker then says to compute in float64): only a wrong value is sent back to the lesson
        if a is not None and np.isfinite(a).all() and not _right_numbers_reshaped(a, expected, self.rtol, self.atol) \
                and not (low and _low_precision_hint(self.name, low) in fb.lines):
            point_to_section(fb, self.reread)
        return fb if self.points else formative(fb)  # a 0-point warm-up: the verdict, no points


def _right_numbers_reshaped(a: np.ndarray, expected: Any, rtol: float, atol: float) -> bool:
    """True when ``a`` has another shape than ``expected`` but the same numbers, in row-major order or transposed."""
    e = np.asarray(expected, dtype=np.float64)
    if a.shape == e.shape or a.size != e.size:
        return False
    return bool(np.allclose(a.ravel(), e.ravel(), rtol=rtol, atol=atol)
                or (a.shape == e.T.shape and np.allclose(a, e.T, rtol=rtol, atol=atol)))


def point_to_section(fb: Feedback, reread: str) -> None:
    """End a wrong answer's feedback with the section to reread, when no named mistake explains it (a named
    mistake's message says what went wrong itself, and a slip of units or rounding needs no section)."""
    if reread and not fb.full and not fb.mistakes:
        fb.lines.append(reread)


@dataclass
class Ordering:
    """Put step labels in order. ``labels`` maps each label to a short description (listed alphabetically:
    the order is the answer). The key, in the instructor's key file, is the list of labels in order, or
    ``{"order": [...], "also": [[...], ...], "note": "...", "critical": [...]}`` when several orders are right (the
    others earn full points too; partial credit is counted against ``order``) or when a step's place is all or
    nothing: an order that puts a ``"critical"`` step on the other side of a step than every right order does (or
    reverses a ``"critical"`` pair ``[a, b]``, that one relation) earns 0 points instead of the share of pairs it has right (:func:`coursekit.grading.checkers.check_ordering`). The key
    file's ``"hints"`` give each label the reason for its place; a wrong order's feedback names the step most out of
    place and its reason."""

    title: str
    points: float
    labels: Mapping[str, str] = field(default_factory=dict)

    def _run(self, answer: Any, key: Any, hints: Mapping[str, str]) -> Feedback:
        if isinstance(key, Mapping):
            order, also, note = list(key["order"]), [list(o) for o in key.get("also", ())], key.get("note", "")
            critical = list(key.get("critical", ()))
        else:
            order, also, note, critical = list(key), [], "", []
        for alt in also:
            fb = check_ordering(answer, alt, self.points, self.labels)
            if fb.points == self.points:
                return Feedback(self.points, self.points, ["The order is right." + (f" {note}" if note else "")])
        fb = check_ordering(answer, order, self.points, self.labels, hints, also, critical)
        if fb.points == self.points and note:
            fb.lines.append(note)
        return fb

    def keys_here(self) -> list[Any]:
        return [list(p) for p in itertools.permutations(sorted(self.labels))] if len(self.labels) <= 8 else []

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        if not ctx.has_keys():
            return _recorded(self, answer)
        return self._run(answer, ctx.key(), ctx.hints())


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
    #: "module:qualname" of the coursekit functions stubbed in the grader's runner while this item is graded;
    #: None: the reference, or the teaching kernels it calls (coursekit.grading.remote.default_withheld).
    withheld: Sequence[str] | None = None

    def check(self, answer: Any, ctx: "_Context") -> Feedback:
        cases = list(self.public())
        if ctx.hidden:
            cases += [Case(c.kwargs, c.label, hidden=True) for c in self.hidden(ctx.rng())]
        fb = check_function(answer, cases, self.reference, self.points, self.name, self.outputs,
                            self.rtol, self.atol, self.mistakes, self.extra, self.timeout)
        if not ctx.hidden:
            fb.lines.append(PUBLIC_ONLY_NOTE)
        return fb


@dataclass
class _Context:
    lesson: str
    item: str
    hidden: bool

    def has_keys(self) -> bool:
        """Whether the instructor's key file can be read here. In the course's autograde run it cannot: the
        kernel that runs the student's code never gets the keys (coursekit.guard.GuardedExecute), the
        answer goes to the grading process, which scores it (coursekit.guard.ScoreAnswers)."""
        return _keys.available(self.lesson)

    def _file(self) -> dict:
        return _keys.load(self.lesson)

    def key(self) -> Any:
        k = self._file()["keys"]
        if self.item not in k:
            raise KeyError(f"no key for item {self.lesson}.{self.item} in the key file {_keys.key_dir()}/{self.lesson}.json")
        return k[self.item]

    def hints(self) -> Mapping[str, str]:
        return self._file()["hints"].get(self.item, {})

    def rng(self) -> np.random.Generator:
        """The generator of this item's hidden cases: the lesson's seed and the item id. The seed comes from
        ``$COURSEKIT_SEED`` (what the grading kernel is given, see coursekit.guard) or the key file."""
        seed = os.environ.get(_keys.SEED_ENV, "").strip()
        return np.random.default_rng([int(seed) if seed else int(self._file()["seed"]), zlib.crc32(self.item.encode())])


def _recorded(item: Any, answer: Any, candidates: Sequence[Any] | None = None) -> Feedback:
    """Feedback for a keyed item while a student works (no key here): well-formed answers are recorded, not
    scored; a malformed one gets the checker's own message on its form (the same for every key)."""
    cands = item.keys_here() if candidates is None else candidates
    if not cands and isinstance(item, Ordering):  # too many labels to try every order: record the one given
        parsed = _ordering_labels(answer)
        cands = [parsed] if isinstance(parsed, list) and sorted(parsed) == sorted(item.labels) else []
    for k in cands:
        if item._run(answer, k, {}).points == item.points:
            fb = Feedback(0, item.points, [
                f"Recorded: {answer!r}. The answer key does not ship with the course, so nothing on your machine can "
                "say right or wrong: the autograder scores this item, and its feedback explains a wrong answer and what to reread."])
            fb.recorded = k  # type: ignore[attr-defined]  (the answer in canonical form: grade() records it)
            return fb
    probe = item._run(answer, cands[0] if cands else (sorted(getattr(item, "labels", {})) or 0.0), {})
    return Feedback(0, item.points, [line for line in probe.lines if not re.match(r"\(\w\) is (not )?right|The order is right|\d+ of \d+ pairs", line)]
                    or [f"{answer!r} is not a well-formed answer for this item; see the question for the expected form."])


def key_problems(lessons: Iterable[str] | None = None) -> list[str]:
    """Instructor check (``coursekit keys check``): one line per keyed item without a key, key naming no
    item, bad option letter, ordering key that does not use each label once, or missing explanation (every
    option of a choice, the key's included, and every label of an ordering needs its hint),
    for ``lessons`` ("02", …; default: every lesson). Empty when all is well."""
    out = []
    every = [f.stem[-2:] for f in sorted(Path(__file__).with_name("lessons").glob("lesson[0-9][0-9].py"))]
    for lesson in every if lessons is None else sorted(set(lessons)):
        items = lesson_items(lesson)
        try:
            data = _keys.load(lesson)
        except (_keys.KeysUnavailable, ValueError) as e:
            out.append(str(e))
            continue
        needs_key = {i for i, it in items.items() if keyed(it)}
        out += [f"{lesson}.{i}: no key" for i in sorted(needs_key - set(data["keys"]))]
        out += [f"{lesson}.{i}: a key for an item that needs none or does not exist" for i in sorted(set(data["keys"]) - needs_key)]
        out += [f"{lesson}.{i}: hints for an item that is not a choice or an ordering"
                for i in sorted(set(data["hints"]) - {i for i in needs_key if isinstance(items[i], (Choice, Ordering))})]
        for i in sorted(needs_key & set(data["keys"])):
            it, k = items[i], data["keys"][i]
            hints = data["hints"].get(i, {})
            if not (isinstance(hints, Mapping) and all(isinstance(t, str) and t.strip() for t in hints.values())):
                out.append(f"{lesson}.{i}: hints must map each option or label to a text")
                hints = {}
            if isinstance(it, Choice):
                letters = k if it.multi else [k]
                if not (isinstance(letters, list) and letters and all(isinstance(x, str) and x in it.options for x in letters)):
                    out.append(f"{lesson}.{i}: key {k!r} is not {'a list of letters' if it.multi else 'one letter'} out of {it.options}")
                    continue
                bad = sorted(set(hints) - set(it.options))
                if bad:
                    out.append(f"{lesson}.{i}: hints for options {bad} that do not exist")
                # A multi-select explains every statement, true or false (a missed one is named with why it is
                # true); a single choice every option: a wrong pick is told why it is wrong, a right one why it holds.
                missing = sorted(set(it.options) - set(hints))
                if missing:
                    what = "why each statement is true or false" if it.multi else "why each option is right or wrong"
                    out.append(f"{lesson}.{i}: no explanation for options {missing} (the hints say {what})")
            elif isinstance(it, Ordering):
                orders = [k["order"], *k.get("also", [])] if isinstance(k, Mapping) else [k]
                well_formed = all(sorted(o) == sorted(it.labels) for o in orders)
                if not well_formed:
                    out.append(f"{lesson}.{i}: an order that does not use each of the labels {sorted(it.labels)} exactly once")
                # an all-or-nothing step must have a place the right orders agree on, against at least one other step
                critical = k.get("critical", []) if isinstance(k, Mapping) else []

                def entry(c):  # a label, or a pair [a, b] of two labels (that one relation only)
                    return isinstance(c, str) and c in it.labels or (
                        isinstance(c, list) and len(c) == 2 and c[0] != c[1] and all(x in it.labels for x in c))

                if not (isinstance(critical, list) and all(entry(c) for c in critical)):
                    out.append(f"{lesson}.{i}: \"critical\" must be a list of the labels {sorted(it.labels)} "
                               "(or of pairs of them)")
                elif well_formed and any(
                        all(len({o.index(c) < o.index(x) for o in orders}) > 1 for x in it.labels if x != c)
                        if isinstance(c, str) else len({o.index(c[0]) < o.index(c[1]) for o in orders}) > 1
                        for c in critical):
                    out.append(f"{lesson}.{i}: a \"critical\" step or pair that the right orders leave free")
                bad, missing = sorted(set(hints) - set(it.labels)), sorted(set(it.labels) - set(hints))
                if bad:
                    out.append(f"{lesson}.{i}: hints for labels {bad} that do not exist")
                if missing:
                    out.append(f"{lesson}.{i}: no explanation for labels {missing} (the hints say why each step takes its place)")
    return out


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
    it = items[item]
    if callable(answer) and not _value_item(it) and not getattr(it, "watches_borrowing", False):
        from .remote import Remote, withheld_of

        if not isinstance(answer, Remote):  # here, in the student's kernel: the runner's withheld functions, watched
            answer = withheld_here(answer, withheld_of(it))
    return it.check(answer, _Context(lesson, item, autograding() if hidden is None else hidden))


RECORDED_TAG = ": recorded (worth "  # what a keyed check prints after its title while no key is at hand


def keyed(item: Any) -> bool:
    """Whether ``item`` is scored against the instructor's key (a choice, an ordering, a number without
    ``expected``): while a student works, its check can only record the answer."""
    if isinstance(item, Choice):
        return not item.formative
    return isinstance(item, Ordering) or (isinstance(item, Numeric) and item.expected is None)


def _value_item(item: Any) -> bool:
    return isinstance(item, (Choice, Ordering, Numeric, Array))


def answer_record(item_id: str, answer: Any) -> dict:
    """What the kernel sends the grading process for one check in the autograde run: the answer as data
    (:mod:`coursekit.protocol`), or, when the item asks for a function, the function itself pickled by value
    (cloudpickle) with its parameters and the source of the cells it came from, for the sandboxed runner."""
    from .. import protocol

    if not callable(answer):  # (the item tables are not in the grading kernel: a callable answer is a function)
        return {"item": item_id, "answer": protocol.encode(answer)}
    import base64
    import inspect
    import linecache

    import cloudpickle

    try:
        blob = cloudpickle.dumps(answer)
    except Exception as e:  # noqa: BLE001  (whatever pickling raised, the student is told)
        return {"item": item_id, "unsendable": f"{type(e).__name__}: {str(e)[:300]}"}
    if len(blob) > (64 << 20):
        return {"item": item_id, "unsendable": f"it pickles to {len(blob) >> 20} MB (what does it hold on to?)"}
    try:
        params = [[p.name, int(p.kind), p.default is not p.empty] for p in inspect.signature(answer).parameters.values()]
    except (TypeError, ValueError):
        params = None
    lines = {f: "".join(v[2]) for f, v in list(linecache.cache.items())
             if isinstance(v, tuple) and len(v) == 4 and not os.path.isfile(f) and len(v[2]) < 2000}
    return {"item": item_id, "function": base64.b64encode(blob).decode(), "name": str(getattr(answer, "__name__", "function")),
            "params": params, "lines": lines}


def score_record(item_id: str, record: Mapping[str, Any], deadline: Any = None) -> Feedback:
    """The grading process scores one recorded answer (see :func:`answer_record`) with the instructor's keys
    and the item's public and hidden cases. A function runs in a sandboxed runner (:mod:`.remote`), within
    ``deadline`` (a :class:`.budget.Deadline`: :class:`.budget.BudgetSpent` is raised once it has passed)."""
    from .. import protocol
    from . import remote

    lesson, item = item_id.split(".", 1)
    it = lesson_items(lesson)[item]
    ctx = _Context(lesson, item, True)
    if record.get("unanswered"):
        return Feedback(0, it.points, [NOT_ANSWERED])
    if "function" in record and _value_item(it):
        return Feedback(0, it.points, ["Your answer is a function; this item asks for a value."])
    if "answer" in record:
        try:
            answer = protocol.decode(record["answer"])
        except (ValueError, TypeError, KeyError) as e:
            return Feedback(0, it.points, [f"The recorded answer could not be read ({e}); nothing to score."])
        return it.check(answer, ctx)
    if "unsendable" in record:
        return Feedback(0, it.points, [f"Your answer could not be sent to the grader: {record['unsendable']}. A function "
                                       "that works on its own (no open files, threads or generators kept in globals) can be."])
    if not isinstance(record.get("function"), str):
        return Feedback(0, it.points, ["No answer was recorded for this item."])
    import base64

    payload = {"fn": base64.b64decode(record["function"]), "lines": dict(record.get("lines") or {})}
    return remote.check_remotely(it, ctx, payload, str(record.get("name", "function")), record.get("params"), deadline)


def _model_answer_text(item_id: str) -> str:
    """The model answer of the free-text item ``item_id`` ("13.p7"): the source of the markdown cell of
    ``solutions/NN-*/NN-*.ipynb`` whose nbgrader ``grade_id`` is the item's (``p7_explain``). Raises LookupError
    with a message for the student: no solutions here (an installed course, a student's copy, the autograde
    run), or no free-text item of that name (naming the lesson's free-text items)."""
    import json

    if not isinstance(item_id, str) or not re.fullmatch(r"\d\d\.p\d+", item_id.strip()):
        raise LookupError(f"free-text items are named like '13.p7' (lesson, item); got {item_id!r}.")
    lesson, item = item_id.strip().split(".")
    sols = _keys.REPOSITORY / "solutions"
    books = sorted(sols.glob(f"{lesson}-*/{lesson}-*.ipynb")) if not autograding() else []
    if not books:
        raise LookupError(f"The model answer of {item_id} is with the instructor: this copy of the course has no "
                          "solutions (they come with the whole course repository, not with the lessons alone). "
                          "Your instructor's feedback on your answer is the place to compare.")
    cells = [c for c in json.loads(books[0].read_text(encoding="utf-8"))["cells"]
             if c.get("cell_type") == "markdown" and (c.get("metadata", {}).get("nbgrader") or {}).get("solution")]
    ids = {(c["metadata"]["nbgrader"].get("grade_id") or "").split("_")[0]: c for c in cells}
    if item not in ids:
        have = ", ".join(f"{lesson}.{i}" for i in sorted(ids, key=lambda i: int(i[1:]) if i[1:].isdigit() else 0)) or "none"
        raise LookupError(f"lesson {lesson} has no free-text item {item!r} (its free-text items: {have}); "
                          "a choice, number or function item is checked by its check cell instead.")
    src = ids[item]["source"]
    return ("".join(src) if isinstance(src, list) else src).strip()


def model_answer(item_id: str) -> None:
    """Show the model answer of a free-text item ("13.p7") after you have written your own: the instructor's answer
    from the course's solution notebook, rendered as markdown in a notebook (printed elsewhere). Works where the
    whole course repository is (self-study); elsewhere (a class's copy of the lessons, the autograde run) it says
    that the model answer is with the instructor. Prints, never raises, returns None."""
    try:
        text = _model_answer_text(item_id)
    except LookupError as e:
        print(e.args[0])
        return None
    head = f"Model answer of {item_id} (compare it with yours):"
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            print(head)
            display(Markdown(text))
            return None
    except ImportError:  # pragma: no cover  (IPython is installed with the course)
        pass
    print(head + "\n\n" + text)
    return None


NOT_ANSWERED = "Not answered yet: write your answer in the answer cell above, run it, then run this check again."


def unanswered(answer: Any) -> bool:
    """Whether ``answer`` is the release's blank: ``None`` (a value cell not yet filled in) or a function whose body
    is only its docstring and the ``# YOUR CODE HERE`` comment (it does nothing and returns None)."""
    if answer is None:
        return True
    code = getattr(answer, "__code__", None)
    if code is None or not callable(answer):
        return False
    import dis

    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP", "CACHE")]
    return ops in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)])


def written(*functions: Callable, **values: Any) -> bool:
    """Whether every answer given is written (not a blank of the release, see :func:`unanswered`); if one is not,
    say which, so that a cell that tries the student's answers waits for them instead of failing. Functions are
    named by their ``__name__``, values by their keyword::

        if written(lora_backward):
            ...  # the cell's own check of the student's function
        if written(answer_w1=answer_w1):
            ...
    """
    named = {getattr(f, "__name__", repr(f)): f for f in functions} | values
    missing = [name for name, answer in named.items() if unanswered(answer)]
    if missing:
        print(f"Not answered yet: {', '.join(missing)}. This cell runs once you have written "
              f"{'it' if len(missing) == 1 else 'them'} above.")
    return not missing


def grade(item_id: str, answer: Any) -> float | None:
    """Check and print the feedback to stdout (one line with the points, then what was right or wrong and why).

    An unanswered item (see :func:`unanswered`) says so and scores 0, so that Run All on a fresh lesson reaches
    the end. The points are returned only under ``nbgrader validate`` (which reads them as partial credit);
    while a student works the printed feedback is the whole answer, so the score is not shown twice.

    In the autograde run nothing is scored here: the answer goes to the grading process as a typed record
    (a ``display_data`` output of MIME type :data:`coursekit.protocol.MIME`), which scores it with the keys
    and cases it alone holds, and replaces this cell's output with the feedback and points."""
    if autograding():
        from IPython.display import display

        from .. import protocol

        record = {"item": item_id, "unanswered": True} if unanswered(answer) else answer_record(item_id, answer)
        display({protocol.MIME: record, "text/plain": f"[{item_id}] answer handed to the grader"}, raw=True)
        return None
    lesson, item = item_id.split(".", 1)
    it = lesson_items(lesson)[item]
    title = f"[{item_id}] {it.title}"
    validating = os.environ.get("NBGRADER_EXECUTION") == "validate"
    if unanswered(answer):
        print(Feedback(0, it.points, [NOT_ANSWERED]).text(title))
        return 0.0 if validating else None
    fb = check(item_id, answer)
    if hasattr(fb, "recorded"):
        print("\n".join([f"{title}{RECORDED_TAG}{fb.max_points:g} point{'' if fb.max_points == 1 else 's'}, scored by the autograder)"]
                        + ["  " + x for x in fb.lines]))
        return None  # nothing to score here (a 0.0 under "recorded" would read as a grade)
    print(fb.text(title))
    return fb.points if validating else None
