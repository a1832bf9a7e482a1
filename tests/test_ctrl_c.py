"""Ctrl-C during a grading run (coursekit.course._CtrlC): Python runs the SIGINT handler between two bytecodes of
whatever the main thread is doing, which can be a finalizer (CI of 1a4d21c: a Dask future's ``__del__``). There the
KeyboardInterrupt cannot propagate and Python printed it as "Exception ignored in ..." with a traceback, on a run that
must stop with one line. The interrupt is remembered and dropped quietly, and the grader's waits ask whether Ctrl-C
was pressed, so the run still stops within seconds."""
from __future__ import annotations

import os
import signal
import sys

import pytest

from coursekit import course, parallel


class _InterruptedWhileFinalized:
    """An object whose finalizer receives Ctrl-C, as a Dask future's ``__del__`` did."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        total = 0
        for i in range(10_000):  # bytecodes for the handler to run between, inside the finalizer
            total += i


@pytest.fixture
def unraisable(monkeypatch):
    """What Python would print as "Exception ignored in ...", recorded."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    return seen


def test_ctrl_c_inside_a_finalizer_is_remembered_and_not_printed(unraisable):
    with course._CtrlC() as ctrl_c:
        obj = _InterruptedWhileFinalized()
        del obj
    assert ctrl_c.hit
    assert unraisable == []


def test_other_exceptions_in_finalizers_are_still_reported(unraisable):
    class Broken:
        def __del__(self):
            raise ValueError("a real bug")

    with course._CtrlC():
        obj = Broken()
        del obj
    assert unraisable == [ValueError]


def test_the_hooks_are_put_back(unraisable):
    hook, handler = sys.unraisablehook, signal.getsignal(signal.SIGINT)
    with course._CtrlC():
        assert sys.unraisablehook is not hook and signal.getsignal(signal.SIGINT) is not handler
    assert sys.unraisablehook is hook and signal.getsignal(signal.SIGINT) is handler


def test_without_ctrl_c_the_finalizer_interrupt_is_reported(unraisable):
    """The guard is specific: outside a grading run Python's own handling stands (here: the interrupt reported). Python's
    own SIGINT handler is set for the test: a pytest-xdist worker ignores SIGINT, and then nothing would be raised."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        obj = _InterruptedWhileFinalized()
        del obj
    finally:
        signal.signal(signal.SIGINT, before)
    assert unraisable == [KeyboardInterrupt]


class _Pending:
    def result(self, timeout=None):
        raise TimeoutError


class _Cluster:
    def nthreads(self):
        return {"w": 1}


def _autograder(stopped):
    a = parallel.Autograder.__new__(parallel.Autograder)  # no cluster: only the wait is under test
    a.task_timeout, a._client, a._no_workers_since, a._stopped = 60.0, _Cluster(), None, stopped
    return a


def test_a_wait_stops_when_ctrl_c_was_pressed_even_if_its_interrupt_was_lost():
    asked = []

    def stopped():
        asked.append(1)
        return len(asked) >= 3

    with pytest.raises(KeyboardInterrupt):
        _autograder(stopped)._wait(_Pending())
    assert len(asked) == 3


def test_a_wait_without_ctrl_c_keeps_waiting_until_its_timeout():
    a = _autograder(lambda: False)
    a.task_timeout = 0.05
    with pytest.raises(TimeoutError):
        a._wait(_Pending())
