"""Shared fixtures: the repository root, and the instructor's answer keys for the grading tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The tests grade like an instructor: with the answer keys of autograder/keys (coursekit/grading/keys.py).
# Set for the whole run so that module-scoped grading fixtures and the nbgrader kernels they start see
# the same keys; tests of a student's machine (no keys) unset it with monkeypatch.
os.environ.setdefault("COURSEKIT_KEYS", str(ROOT / "autograder" / "keys"))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def book(testrun_uid):
    """The web book of this test run (tests/book.py): built once, whichever worker asks first."""
    from book import built_book

    return built_book(testrun_uid)
