"""Shared fixtures: the repository root, and one graded example class per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    return Path(sys.executable).parent
