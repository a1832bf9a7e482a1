"""On a hidden case, a known mistake is explained by its ``hint``: the message may quote the case's inputs, which
must stay hidden, and without a hint the checker can fall back to the mistake's bare name, which teaches nothing
(checkers._hidden_mistake). These tests walk every lesson's Function items over the hidden cases the autograder
draws (the lesson's seed from its key file) and check both halves of that contract:

* every mistake whose message quotes a number carries a hint;
* no hint quotes a scalar input of its case (its repr, or its 4- or 6-significant-digit rendering).
"""

from __future__ import annotations

import functools

import math
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from coursekit import course
from coursekit.grading import Function, _Context, lesson_items
from coursekit.grading.checkers import Mistake, _quotes_numbers

ROOT = Path(__file__).resolve().parents[1]
LESSONS = [lid[:2] for lid in course.lesson_ids(ROOT)]  # tests/conftest.py points $COURSEKIT_KEYS at autograder/keys

# Integers up to 16 are skipped: they are also the formulas' own constants (2^(bits−1) − 1, two codes per byte,
# 4-bit codes 0..15, 8 bytes per parameter, blocks of 16), which a hint may quote whatever the case. A hidden
# bits = 4 or blocksize = 8 is no secret worth guarding: the task fixes the choices it is drawn from.
SMALL_INTEGERS = 16

# A number of its own in a hint: not part of a word (Q4_1, fp32, int8) or of a longer number.
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.]*\d)")


def _scalars(value: Any) -> Iterator[float]:
    """The scalar inputs inside one keyword argument (looking into dicts, lists and tuples; arrays' entries are
    not scalars of the case, and a derived value such as max |x| is not an input)."""
    if isinstance(value, (bool, np.bool_, str, bytes)) or value is None:
        return
    if isinstance(value, (int, float, np.integer, np.floating)):
        yield float(value)
    elif isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.number):
        yield float(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _scalars(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _scalars(v)


def _renderings(x: float) -> set[str]:
    """How a message would print ``x``: repr, f"{x:g}" (the lessons' usual form) and 4 significant digits."""
    if not math.isfinite(x) or (x == int(x) and abs(x) <= SMALL_INTEGERS):
        return set()
    out = {f"{x:g}", f"{x:.4g}", repr(x)}
    if x == int(x):
        out.add(str(int(x)))
    return out


def _as_tuple(v: Any) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def _hidden_mistakes() -> Iterator[tuple[str, int, dict, Mistake]]:
    """(item id, hidden case number, kwargs, mistake) for every mistake of every hidden case. The mistakes are asked
    for twice: with the right outputs, and with each wrong value found that way, since some mistakes read the
    student's answer (lesson 03's 'wrong directions' names the singular directions it kept)."""
    for lesson in LESSONS:
        for iid, item in lesson_items(lesson).items():
            if not isinstance(item, Function) or item.mistakes is None:
                continue
            for k, case in enumerate(item.hidden(_Context(lesson, iid, True).rng()), 1):
                right = dict(zip(item.outputs, _as_tuple(item.reference(**case.kwargs))))
                first = item.mistakes(case.kwargs, right)
                seen: list[Mistake] = [m for ms in first.values() for m in ms]
                for out, ms in first.items():
                    for m in ms:
                        seen += [w for ws in item.mistakes(case.kwargs, right | {out: m.value}).values() for w in ws]
                for m in seen:
                    yield f"{lesson}.{iid}", k, case.kwargs, m


@functools.cache
def hidden_mistakes() -> list:
    """Every (item, case number, inputs, mistake) of :func:`_hidden_mistakes`, walked once, when a test first asks
    (not while pytest collects, on a worker that may run none of these tests)."""
    return list(_hidden_mistakes())


def test_the_walk_sees_hidden_mistakes_of_every_quantization_lesson():
    items = {item for item, *_ in hidden_mistakes()}
    assert {"14.p1", "14.p2", "14.p3", "15.p1", "15.p2", "16.p1", "17.p5", "18.p2", "18.p3"} <= items


def test_every_mistake_that_quotes_numbers_has_a_hint():
    missing = sorted({(item, m.label) for item, _, _, m in hidden_mistakes() if _quotes_numbers(m.message) and not m.hint.strip()})
    assert not missing, f"{len(missing)} mistakes quote numbers but carry no hint (a hidden case shows only their name): {missing}"


def test_no_hint_quotes_its_hidden_inputs():
    leaks = set()
    for item, k, kwargs, m in hidden_mistakes():
        if not m.hint:
            continue
        shown = set(NUMBER.findall(m.hint))
        for name, value in kwargs.items():
            for x in _scalars(value):
                for text in _renderings(x) & shown:
                    leaks.add((item, k, m.label, name, text))
    assert not leaks, f"hints that quote an input of their hidden case (item, case, mistake, input, as printed): {sorted(leaks)}"


@pytest.mark.parametrize("hint, value, leaks", [
    ("multiply by s = 2.5", 2.5, True),
    ("multiply by s = 0.9677", 0.96770833, True),   # four significant digits
    ("Q = 2^(bits−1) − 1", 2.0, False),             # a small integer: the formula's own constant
    ("Q4_1 stores d and m", 4.0, False),            # part of a word
    ("a block of 64 values", 64.5, False),
])
def test_the_leak_check_reads_numbers_as_a_message_prints_them(hint, value, leaks):
    assert bool(_renderings(value) & set(NUMBER.findall(hint))) == leaks
