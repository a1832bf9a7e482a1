""".ci/run's own logic, with `make` and the system packages stood in for: the exit code is the suite's, the second
venv's install is waited for, and the fresh model cache is removed. The real run takes half an hour; these take a
second. CI of 79ee7a1 passed every test and still exited 1: the EXIT trap's `kill` of the already-finished install
failed under `set -e`."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _script(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def repo(tmp_path):
    """A repository holding only .ci/run and a .venv whose python is this one; `make` logs its arguments and the
    cache it was given, and fails when its arguments match the pattern $FAIL_GOAL."""
    (tmp_path / ".ci").mkdir()
    shutil.copy2(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    log = tmp_path / "make.log"
    _script(fake / "make", f'echo "$* cache=$COURSEKIT_CACHE" >> {log}\n'
                           '[ -d "$COURSEKIT_CACHE" ] || exit 3\n'
                           'case "$*" in $FAIL_GOAL) exit 2;; esac\n')
    for name in ("chromium", "bwrap"):
        _script(fake / name, "exit 0\n")
    # a second interpreter: this one under every other supported version's name
    for v in ("3.11", "3.12", "3.13"):
        (fake / f"python{v}").symlink_to(sys.executable)
    return tmp_path


def _run(repo: Path, fail_goal: str = "none") -> tuple[subprocess.CompletedProcess, list[str]]:
    env = {**os.environ, "PATH": f"{repo / 'fakebin'}:{os.environ['PATH']}", "FAIL_GOAL": fail_goal}
    env.pop("COURSEKIT_CACHE", None)
    done = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    log = (repo / "make.log").read_text().splitlines() if (repo / "make.log").exists() else []
    return done, log


def test_a_green_run_exits_zero_and_removes_its_cache(repo):
    done, log = _run(repo)
    assert done.returncode == 0, done.stderr
    goals = [line.split(" cache=")[0] for line in log]
    assert goals[0] == "setup" and "test" in goals and goals[-1].startswith("test-targeted PYTHON=")
    assert any(g.startswith("setup PYTHON=") for g in goals), "the second venv was never installed"
    caches = {line.split(" cache=")[1] for line in log}
    assert len(caches) == 1 and not Path(caches.pop()).exists(), "the fresh model cache outlived the run"


@pytest.mark.parametrize("goal", ["test", "test-targeted *", "setup", "setup PYTHON=*"])
def test_a_failing_step_fails_the_run(repo, goal):
    done, log = _run(repo, goal)
    assert done.returncode != 0, f"make {goal} failed and .ci/run still exited 0"
    goals = [line.split(" cache=")[0] for line in log]
    if goal == "setup":  # the first install failed: nothing else runs
        assert goals == ["setup"]
    if goal == "setup PYTHON=*":  # the second install failed: the suite ran, the targeted run did not, and the log says why
        assert "test" in goals and not any(g.startswith("test-targeted") for g in goals)
        assert "for the targeted run failed" in done.stderr
