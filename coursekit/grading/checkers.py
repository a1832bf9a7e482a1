"""Generic answer checkers. Each returns a :class:`Feedback`: points earned (partial credit) and the
lines that explain them. They never print and never raise on a bad answer; :func:`coursekit.grading.grade`
prints the feedback to stdout (nbgrader zeroes a test cell that writes to stderr).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

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
]


@dataclass
class Feedback:
    """Points earned out of ``max_points``, and the explanation, one line per entry."""

    points: float
    max_points: float
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # nbgrader rejects a cell result above its points; never let rounding exceed it.
        self.points = float(min(max(self.points, 0.0), self.max_points))

    @property
    def full(self) -> bool:
        return self.points >= self.max_points

    def text(self, title: str = "") -> str:
        head = f"{title}: {self.points:g} / {self.max_points:g} points" if title else f"{self.points:g} / {self.max_points:g} points"
        return "\n".join([head] + ["  " + line for line in self.lines])


@dataclass
class Mistake:
    """A known wrong answer: the value it produces and what to tell the student when it matches."""

    label: str
    value: Any
    message: str


# --------------------------------------------------------------------------- choice and ordering


def _letter(x: Any) -> str | None:
    if not isinstance(x, str):
        return None
    s = x.strip().lower().strip("()").strip()
    return s if len(s) == 1 and s.isalpha() else None


def check_choice(answer: Any, key: str, points: float, options: Sequence[str], hints: Mapping[str, str] | None = None) -> Feedback:
    """One option out of ``options`` (letters). Full points for ``key``, 0 otherwise, with the option's hint."""
    hints = hints or {}
    opts = ", ".join(options)
    letter = _letter(answer)
    if answer is None or answer is Ellipsis:
        return Feedback(0, points, [f"No answer yet: set it to one letter out of {opts}, as a string, e.g. \"{options[0]}\"."])
    if letter is None or letter not in options:
        return Feedback(0, points, [f"Expected one letter out of {opts} as a string; got {answer!r}."])
    if letter == key:
        return Feedback(points, points, [f"({letter}) is right." + (f" {hints[letter]}" if letter in hints else "")])
    why = hints.get(letter, "Reread the question's key sentence and try again.")
    return Feedback(0, points, [f"({letter}) is not right. {why}"])


def _letters(answer: Any) -> list[str] | None:
    if isinstance(answer, str):
        parts = answer.replace(",", " ").split()
    elif isinstance(answer, Iterable):
        try:
            parts = list(answer)
        except Exception:  # 0-d arrays and tensors claim to be iterable, then refuse
            return None
    else:
        return None
    out = [_letter(p) for p in parts]
    return None if any(p is None for p in out) else out


def check_multi(answer: Any, key: Iterable[str], points: float, options: Sequence[str], hints: Mapping[str, str] | None = None) -> Feedback:
    """Several options. Score = points × max(0, (right picks − wrong picks) / |key|); each error explained."""
    hints = hints or {}
    key = set(key)
    picks = _letters(answer)
    if answer is None or picks is None:
        return Feedback(0, points, [f"Expected a set of letters out of {', '.join(options)}, e.g. {{\"a\", \"c\"}}; got {answer!r}."])
    chosen = set(picks)
    bad = sorted(chosen - set(options))
    if bad:
        return Feedback(0, points, [f"{bad} are not options; choose among {', '.join(options)}."])
    right, wrong, missed = chosen & key, chosen - key, key - chosen
    lines = []
    for o in sorted(wrong):
        lines.append(f"({o}) should not be chosen. " + hints.get(o, ""))
    if missed:
        lines.append("One true statement is missing from your set." if len(missed) == 1
                     else f"{len(missed)} true statements are missing from your set.")
    if not wrong and not missed:
        lines.append("All right.")
    score = points * max(0.0, (len(right) - len(wrong)) / len(key))
    return Feedback(score, points, [l.strip() for l in lines if l.strip()])


def check_ordering(answer: Any, key: Sequence[str], points: float, labels: Mapping[str, str] | None = None) -> Feedback:
    """An order of step labels. Full points when exact; otherwise points × (pairs in the right order) / (all pairs),
    with the first misplaced step named."""
    labels = labels or {}
    if not isinstance(answer, (list, tuple)):
        return Feedback(0, points, [f"Expected a list of the {len(key)} step labels in order; got {type(answer).__name__}."])
    ans = [str(a).strip().lower() for a in answer]
    if sorted(ans) != sorted(key):
        missing, extra = sorted(set(key) - set(ans)), sorted(set(ans) - set(key))
        return Feedback(0, points, [f"Use each of the {len(key)} labels exactly once (missing {missing}, unknown or repeated {extra or sorted({a for a in ans if ans.count(a) > 1})})."])
    if ans == list(key):
        return Feedback(points, points, ["The order is right."])
    pos = {k: i for i, k in enumerate(key)}
    pairs = [(i, j) for i in range(len(ans)) for j in range(i + 1, len(ans))]
    good = sum(pos[ans[i]] < pos[ans[j]] for i, j in pairs)
    first = next(i for i, (a, k) in enumerate(zip(ans, key)) if a != k)
    step = ans[first]
    name = f" ({labels[step]})" if step in labels else ""
    return Feedback(
        points * good / len(pairs) * 0.999,  # never full unless exact
        points,
        [f"{good} of {len(pairs)} pairs are in the right order. The first step out of place is position {first + 1}: '{step}'{name}."],
    )


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
            return Feedback(0, points, [f"{name} = {_num(x, expected)}{unit_s} is not right. Likely mistake: {m.message}"])
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


def _low_precision_hint(name: str, dtype: str) -> str:
    return (f"Your {name} is {dtype}: its rounding (machine epsilon {_EPS[dtype]:.1e}) is larger than the tolerance, "
            f"and finite-difference gradient checks need float64. Keep the float64 inputs in float64; "
            f"don't convert with .astype(np.float32), torch.Tensor(...) or .float().")


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
                   mistakes: Sequence[Mistake] = (), reveal: bool = True) -> tuple[str, list[str]]:
    """Classify an array answer: ``("ok"|"shape"|"values"|"type", lines)`` naming tensor, index and values.

    ``reveal=False`` (answer items, whose expected value is the key) names the wrong entry and the value
    that came back, never the expected one.
    """
    a = as_array(got)
    expected = np.asarray(expected, dtype=np.float64)
    if a is None:
        return "type", [f"{name} should be an array of numbers; got {_type_name(got)}."]
    if a.shape != expected.shape:
        lines = [f"{name} has shape {a.shape}; expected {expected.shape}."]
        if a.shape == expected.T.shape and np.allclose(a, expected.T, rtol=rtol, atol=atol):
            lines.append(f"Your {name} is the transpose of the right one: check the row-vector convention (X is n × d, W is d × m).")
        for m in mistakes:
            mv = np.asarray(m.value, dtype=np.float64) if m.value is not None else None
            if mv is not None and mv.shape == a.shape and np.allclose(a, mv, rtol=rtol, atol=atol):
                lines.append(f"Likely mistake: {m.message}")
                break
        return "shape", lines
    if not np.all(np.isfinite(a)):
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        return "values", [f"{name}{list(idx)} is {a[idx]}; every entry should be finite."]
    close = np.isclose(a, expected, rtol=rtol, atol=atol)
    if close.all():
        return "ok", [f"{name} matches (shape {a.shape})."]
    err = np.abs(a - expected) - (atol + rtol * np.abs(expected))
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), a.shape))
    where = f"{name}{list(idx)}" if idx else name
    if reveal:
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
            named = f"Likely mistake: {m.message}"
            break
    low = _low_precision(got)
    # Blame the dtype only when its rounding could explain the miss and no known mistake does
    # (a wrong formula computed in float32 is a wrong formula).
    if low and named is None and np.allclose(a, expected, rtol=100 * _EPS[low],
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
    kind, lines = compare_arrays(answer, expected, name, rtol, atol, mistakes, reveal=False)
    if kind in ("type", "shape"):
        return Feedback(0, points, lines)
    if kind == "values":
        if any(l.startswith("Likely mistake:") for l in lines) and as_array(answer) is not None and np.isfinite(as_array(answer)).all():
            return Feedback(points / 4, points, lines + ["(1/4 of the points: a known mistake, on the right track.)"])
        return Feedback(0, points, lines)
    if dtype is not None:
        got = str(getattr(answer, "dtype", type(answer).__name__)).replace("torch.", "")
        want = np.dtype(dtype).name
        if got != want:
            return Feedback(points * 3 / 4, points, lines + [f"{name} has dtype {got}; expected {want} (3/4 of the points)."])
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
            lines.append(f"(printed {out.lines} line{'s' if out.lines != 1 else ''} while being checked; the first "
                         f"{len(shown)}: " + " | ".join(shown) + ")")
        if sink is not None:
            sink.extend(lines)
        elif lines:
            print(_noise_text(lines))


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
        old = sys.getprofile()
        sys.setprofile(self._hook)
        try:
            yield self
        finally:
            sys.setprofile(old)


_CHECKERS_FILE = os.path.abspath(__file__)


def _in_pkg(filename: str) -> bool:
    f = os.path.abspath(filename) if filename and not filename.startswith("<") else ""
    return f.startswith(_PKG + os.sep) and f != _CHECKERS_FILE


def _trusted(fn: Any) -> bool:
    """True for a function defined in coursekit itself or in the course's own test suite (tests/ beside the
    package): the test suite checks the checkers by handing them coursekit's reference kernels, which is no
    borrowing. A student's function is defined in a notebook cell (or anywhere else) and is watched."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return False
    f = os.path.abspath(code.co_filename) if code.co_filename and not code.co_filename.startswith("<") else ""
    tests = os.path.join(os.path.dirname(_PKG), "tests") + os.sep
    return bool(f) and (_in_pkg(f) or f.startswith(tests))


def _reference_calls(student: "_CallWatch", reference: Callable[..., Any], inputs: Mapping[str, Any]) -> list[str]:
    """Names of the grader's own functions the student's function called: the item's reference itself, or
    anything in coursekit.grading (where the answers live), except callables handed to it as inputs (e.g. the
    f of a finite-difference item). coursekit's teaching kernels (lora, block, ...) stay allowed: lessons
    build on them, and a student may use an earlier lesson's kernel."""
    grading = os.path.join(_PKG, "grading") + os.sep
    ref_code = getattr(getattr(reference, "__func__", reference), "__code__", None)
    given = {getattr(getattr(v, "__func__", v), "__code__", None) for v in inputs.values() if callable(v)}
    return sorted({name for code, name in student.entries.items()
                   if code not in given and (code is ref_code or os.path.abspath(code.co_filename).startswith(grading))})


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

    Hostile code: each call may take ``timeout`` seconds (default ``COURSEKIT_CASE_TIMEOUT`` or 30 s);
    one that runs longer is stopped, fails, and the later cases are not run. A case where ``fn``
    calls the reference (or a coursekit function the reference runs) fails. What ``fn`` prints is
    captured and summarised (a print flood cannot push the feedback out of nbgrader's output limit).

    The student's function and the reference each get their own copies of the inputs, so a function that
    changes its inputs in place cannot change the expected answer; doing so fails the case, with the
    input named. A function whose parameters are named differently but number the same is called
    positionally, with a note.
    """
    if not callable(fn):
        return Feedback(0, points, [f"{name} should be a function; got {type(fn).__name__}. Define it with def {name}(...):"])
    passed, lines, noise = 0, [], []
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
        watch = _CallWatch()
        try:
            with quiet(noise), time_limit(limit), watch():
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
            lines.append(f"✗ {tag}: " + _describe_exception(e, name, kwargs))
            lines += _exception_hints(e)
            continue
        ref_watch = _CallWatch()
        with ref_watch():
            want = reference(**{k: _copy_input(v) for k, v in case.kwargs.items()})
        borrowed = [] if _trusted(fn) else _reference_calls(watch, reference, case.kwargs)
        if borrowed:
            lines.append(f"✗ {tag}: your {name} calls coursekit's own answer code ({', '.join(borrowed)}) instead of "
                         f"computing the result itself; a case passed that way earns nothing.")
            continue
        changed = _changed_inputs(case.kwargs, kwargs)
        if len(outputs) > 1:
            if isinstance(got, np.ndarray) and got.ndim == 1 and len(got) == len(outputs):
                got = tuple(got)  # a 1-D array of scalar outputs (e.g. two counts) is as good as a tuple
            if not isinstance(got, (tuple, list)) or len(got) != len(outputs):
                n_got = f" of {len(got)} values" if isinstance(got, (tuple, list)) and type(got) in (tuple, list) else ""
                lines.append(f"✗ {tag}: {name} should return {len(outputs)} values ({', '.join(outputs)}), in this order; "
                             f"got {_type_name(got)}{n_got}.")
                continue
        else:
            got, want = (got,), (want,)
        known = mistakes(case.kwargs, dict(zip(outputs, got))) if mistakes else {}
        bad = []
        for out_name, g, w in zip(outputs, got, want):
            kind, msg = compare_arrays(g, np.asarray(w), out_name, rtol, atol, known.get(out_name, ()))
            if kind != "ok":
                bad += msg
        if not bad and extra is not None:
            try:
                with quiet(noise):  # extra checks call the student's code again
                    bad = extra(fn, case) or []
            except Exception as e:
                bad = ["a further check on your function (beyond its outputs) could not run it: " + _describe_exception(e, name, kwargs)]
            lows = [(n, _low_precision(g)) for n, g in zip(outputs, got) if _low_precision(g)]
            if bad and lows:
                bad.append(_low_precision_hint(*lows[0]))
        if changed and not any("in place" in b or "restore" in b for b in bad):
            bad.append(f"{name} changed its input {changed} in place. Leave inputs as they are: work on a copy "
                       f"(x = x.copy() in NumPy, x = x.clone() in torch) or build new arrays.")
        if bad:
            lines.append(f"✗ {tag}:")
            lines += ["    " + b for b in bad]
        else:
            passed += 1
            lines.append(f"✓ {tag}")
    score = points * passed / max(len(cases), 1)
    if noise:
        lines += _noise_text(noise).splitlines()
    return Feedback(score, points, lines)


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


def _changed_inputs(pristine: Mapping[str, Any], used: Mapping[str, Any]) -> str | None:
    """The name (and first changed index) of an array or tensor input the student's function changed."""
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
            return f"`{k}` (entry {idx})" if idx else f"`{k}`"
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


def _stub_name(e: BaseException) -> str | None:
    """The function (outside coursekit) whose body raised NotImplementedError, if any."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not os.path.abspath(f.filename).startswith(_PKG)]
    return frames[-1].name if frames else None


def _describe_exception(e: Exception, name: str, kwargs: dict) -> str:
    """Where the student's code failed: the last traceback frame outside coursekit, or the call itself."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not os.path.abspath(f.filename).startswith(_PKG)]
    if not frames:  # failed at the call: the function's parameters do not fit
        return (f"{name}({', '.join(kwargs)}) could not be called: {type(e).__name__}: {e}. "
                f"Check that your function takes exactly these parameters.")
    f = frames[-1]
    where = f" (line {f.lineno}: {f.line.strip()})" if f.line else f" (line {f.lineno})"
    return f"{name} raised {type(e).__name__}: {e}{where}"


def _exception_hints(e: Exception) -> list[str]:
    msg = str(e)
    if "matmul" in msg or "shapes" in msg and "not aligned" in msg or "mat1 and mat2" in msg or "size mismatch" in msg:
        return ["    A matrix product's inner sizes disagree: write each operand's shape next to it "
                "(X n×d, W d×m, A d×r, B r×m; nn.Linear.weight is out×in) and check which one needs a transpose."]
    return []
