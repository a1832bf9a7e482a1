"""`make bench`: what the allow-list sandbox costs, side by side with an earlier commit's sandbox, in one run.

Grades lesson 02's honest perfect submission serially (``course.grade_class`` with ``workers=1``, one student, a
fresh course folder each time) with this tree and with a checkout of ``--baseline`` (default: the last commit
before the sandbox became an allow-list without privilege or network), alternating the two ``--rounds`` times so
that the machine's drift hits both alike. Each grading runs in its own Python process with its tree first on
``PYTHONPATH``. Reports the median seconds of each and their ratio, and writes .artifacts/bench-sandbox.json.
Not a test: the numbers depend on the machine and its load.

    python benchmarks/bench_sandbox.py [--baseline REF] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "ab5f5dd"  # main before the allow-list sandbox (issue 22)
AID = "02-lora-inside-one-matmul"

ONE = r'''
import shutil, sys, tempfile, time
from pathlib import Path
from coursekit import course
root, aid = Path(sys.argv[1]), sys.argv[2]
work = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
try:
    course.release([aid], root=root, course_dir=work / "rel", release_dir=work / "release")
    course.build_examples(root, aid, work / "course" / "submitted", work / "release")
    for p in (work / "course" / "submitted").iterdir():
        if p.name != "ex-perfect":
            shutil.rmtree(p)
    t0 = time.perf_counter()
    table = course.grade_class(lessons=[aid], root=root, course_dir=work / "course", release_dir=work / "release",
                               workers=1, progress=False)
    print("SECONDS", time.perf_counter() - t0)
    print("SCORE", [l.split()[2] for l in table.splitlines() if "ex-perfect" in l][0])
finally:
    shutil.rmtree(work, ignore_errors=True)
'''


def grade_once(tree: Path) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-c", ONE, str(tree), AID], capture_output=True, text=True, env=env, cwd=tree)
    if r.returncode != 0:
        raise SystemExit(f"grading with {tree} failed:\n{r.stderr[-3000:]}")
    lines = dict(l.split(" ", 1) for l in r.stdout.splitlines() if l.startswith(("SECONDS", "SCORE")))
    return float(lines["SECONDS"]), lines["SCORE"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default=BASELINE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / ".artifacts" / "bench-sandbox.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old), args.baseline], check=True)
        try:
            times: dict[str, list[float]] = {"baseline": [], "now": []}
            scores = {}
            for _ in range(args.rounds):
                for name, tree in (("baseline", old), ("now", ROOT)):
                    s, score = grade_once(tree)
                    times[name].append(s)
                    scores[name] = score
                    print(f"{name:<9} {s:6.2f} s  (ex-perfect scored {score})", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["now"] / med["baseline"]
    print(f"grading one honest lesson-02 submission serially: {med['now']:.2f} s now, {med['baseline']:.2f} s with "
          f"{args.baseline} (medians of {args.rounds}); ratio {ratio:.3f}")
    if scores["now"] != scores["baseline"]:
        raise SystemExit(f"the perfect submission scored {scores['now']} now and {scores['baseline']} before")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"baseline": args.baseline, "seconds": times, "median": med, "ratio": ratio,
                                          "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
