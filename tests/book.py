"""The web book (`make book`, docs/conf.py) built once per test run and shared: tests/test_book.py checks the build and
drives it in Chromium, tests/test_key_leaks.py scans it for keys. Under pytest-xdist the workers share one build: the
first to ask builds into .artifacts/book-test/ under a file lock and marks it with the run's id; the others read it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / ".artifacts" / "book-test"
BUILD_TIMEOUT_S = 300


def sphinx_command(out: Path, doctrees: Path) -> list[str]:
    """The Makefile's `book` recipe, with this interpreter's Sphinx (what `make book` runs, into ``out``)."""
    line = next(l for l in (ROOT / "Makefile").read_text().splitlines() if "sphinx-build" in l)
    args = line.split("sphinx-build", 1)[1].split()
    assert args[-2:] == [".", "$(BOOK)"] and "$(BOOK)-doctrees" in args, f"the Makefile's book recipe changed: {line}"
    args = [str(doctrees) if a == "$(BOOK)-doctrees" else a for a in args[:-1]]
    return [sys.executable, "-m", "sphinx", *args, str(out)]


def built_book(run_id: str) -> dict:
    """{"html": the site's folder, "returncode", "warnings": the build's stderr lines, "seconds"} of this run's build."""
    BOOK.parent.mkdir(exist_ok=True)
    with FileLock(str(BOOK) + ".lock"):
        stamp = BOOK / "build.json"
        if stamp.exists():
            done = json.loads(stamp.read_text())
            if done["run"] == run_id:
                return {**done, "html": Path(done["html"])}
        shutil.rmtree(BOOK, ignore_errors=True)
        BOOK.mkdir()
        html = BOOK / "html"
        t0 = time.perf_counter()
        r = subprocess.run(sphinx_command(html, BOOK / "doctrees"), cwd=ROOT, capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
        done = {"run": run_id, "html": str(html), "returncode": r.returncode, "seconds": time.perf_counter() - t0,
                "warnings": [l for l in (r.stderr + r.stdout).splitlines() if l.strip()]}
        stamp.write_text(json.dumps(done))
        return {**done, "html": html}
