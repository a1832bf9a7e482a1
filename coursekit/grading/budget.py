"""One wall-clock budget for executing and scoring one submission.

A cell has its own time limit and so does each call of a student's function, but a submission made only of
calls that each stay just under their limit (a right answer that sleeps 29 s before returning) would still
hold the grader for hours and stall the class behind it. So each submission gets one budget in seconds for
its whole autograde run: its notebook's execution (:class:`coursekit.guard.GuardedExecute`) and the scoring of
its answers (:class:`coursekit.guard.ScoreAnswers`) share it. What the submission earned before the budget ran
out, it keeps; the cells after that are not run, and every function check after that scores 0 and says why
(an answer that is a value is still scored: scoring it runs none of the student's code).

The default is a few times what the honest perfect submission of the lesson costs (``COST_S`` in the lesson's
item table, ``coursekit/grading/lessons/lessonNN.py``, measured on the course's 2-core test machine by
``benchmarks/bench_budgets.py``): ``max(FACTOR × COST_S, COST_S + FLOOR_S)``. The floor leaves room for what an
honest submission may still do: trip the answer-cell limit (60 s) and a function call's limit (30 s) twice each,
on a grading machine slower than the test machine or shared by two workers. ``$COURSEKIT_SUBMISSION_BUDGET`` (seconds)
overrides it for every lesson.
"""

from __future__ import annotations

import importlib
import os

ENV = "COURSEKIT_SUBMISSION_BUDGET"
FACTOR = 4.0
FLOOR_S = 240.0
DEFAULT_COST_S = 60.0  # a lesson whose table records no cost yet


class BudgetSpent(BaseException):
    """The submission's time budget ran out while its code was running (a BaseException, so that neither a
    student's nor a check's ``except Exception`` can swallow it)."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = float(seconds)

    def reason(self) -> str:
        return (f"your submission used up its grading time budget ({self.seconds:g} s in all for running the notebook "
                "and checking its functions), so this function's check did not finish and earns nothing. Answers "
                "checked before it keep their points. Is one of your functions far slower than it needs to be "
                "(a sleep, a loop over every element)?")


def cost(lesson: str) -> float:
    """Seconds the honest perfect submission of ``lesson`` ("02") takes to execute and score (``COST_S``)."""
    try:
        mod = importlib.import_module(f"coursekit.grading.lessons.lesson{lesson}")
    except ModuleNotFoundError:
        return DEFAULT_COST_S
    return float(getattr(mod, "COST_S", DEFAULT_COST_S))


def seconds(lesson: str) -> float:
    """The budget of one submission of ``lesson`` ("02"), in seconds (see the module docstring)."""
    forced = os.environ.get(ENV, "").strip()
    if forced:
        try:
            value = float(forced)
        except ValueError:
            raise ValueError(f"${ENV} must be a number of seconds, got {forced!r}") from None
        if not value > 0:
            raise ValueError(f"${ENV} must be positive, got {forced!r}")
        return value
    c = cost(lesson)
    return max(FACTOR * c, c + FLOOR_S)


class Deadline:
    """When one submission's budget runs out: ``seconds`` in all, ``left()`` of it now (``time.monotonic`` clock)."""

    def __init__(self, seconds: float, left: float):
        import time

        self.seconds = float(seconds)
        self.at = time.monotonic() + max(0.0, float(left))

    def left(self) -> float:
        import time

        return self.at - time.monotonic()

    def spent(self) -> BudgetSpent:
        return BudgetSpent(self.seconds)
