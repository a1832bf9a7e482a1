"""One graded example class of a lesson per test session, shared by the test modules that read its
feedback (tests/test_key_leaks.py, tests/test_browser.py), also across pytest-xdist workers.

Grading executes every example notebook in a kernel (about a minute of CPU for lesson 02), so the
first caller grades into the session's shared temporary folder under a file lock and the others
wait for it and reuse the result. tests/test_grading_roundtrip.py keeps its own course: it re-grades
in place, which would rewrite these feedback files under the readers' feet."""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock

from coursekit import course

ROOT = Path(__file__).resolve().parents[1]


def graded_example_class(tmp_path_factory, lesson: str) -> Path:
    """The course folder of ``lesson``'s example class graded with ``examples=True`` (hidden cases
    included): ``feedback/<student>/<aid>/<aid>.html``, ``autograded/``, ``grades.csv``, the gradebook."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: one folder per session
    work = shared / f"graded-example-class-{lesson}"
    done = work / ".graded"
    with FileLock(str(work) + ".lock", timeout=1800):
        if not done.exists():
            course.grade_class(lessons=[lesson], root=ROOT, examples=True, course_dir=work, workers=1,
                               release_dir=work / "release", progress=False)
            done.touch()
    return work


def feedback_files(work: Path, lesson: str) -> dict[str, Path]:
    """student id → that student's feedback HTML."""
    files = {p.parent.parent.name: p for p in (work / "feedback").glob(f"*/{lesson}/{lesson}.html")}
    assert files, f"no feedback HTML under {work / 'feedback'}"
    return files
