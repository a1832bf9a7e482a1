"""The cost of grading each lesson's honest perfect submission, which sets the submission budgets.

For every lesson (or those named), the example class's ``ex-perfect`` submission alone is graded serially by
``course.grade_class`` in a fresh course folder, and the seconds its execution and scoring took are read from the
run (``GuardedExecute`` and ``ScoreAnswers`` record their seconds in the notebook's metadata). ``COST_S`` in each lesson's item table (``coursekit/grading/lessons/lessonNN.py``)
is this figure, rounded up, from the course's 2-core test machine; ``coursekit.grading.budget`` turns it into each
submission's budget. Prints a table and writes .artifacts/bench-budgets.json. Not a test: the numbers depend on the
machine and its load.

    python benchmarks/bench_budgets.py [LESSON ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from coursekit import course
from coursekit.grading import budget

ROOT = Path(__file__).resolve().parents[1]


def measure(aid: str) -> dict:
    import shutil

    work = Path(tempfile.mkdtemp(prefix="bench-budget-"))
    try:
        release = work / "release"
        course.release([aid], root=ROOT, course_dir=work / "rel-course", release_dir=release)
        course.build_examples(ROOT, aid, work / "course" / "submitted", release)
        for sid in os.listdir(work / "course" / "submitted"):
            if sid != "ex-perfect":
                shutil.rmtree(work / "course" / "submitted" / sid)
        t0 = time.perf_counter()
        course.grade_class(lessons=[aid], root=ROOT, course_dir=work / "course", release_dir=release, workers=1,
                           progress=False)
        total = time.perf_counter() - t0
        import nbformat

        nb = nbformat.read(work / "course" / "autograded" / "ex-perfect" / aid / f"{aid}.ipynb", as_version=4)
        spent = nb.metadata.get("coursekit_budget") or {}
        executed, scored = float(spent.get("executed_seconds", "nan")), float(spent.get("scored_seconds", "nan"))
        return {"lesson": aid, "grade_class_s": round(total, 1), "executed_s": round(executed, 1),
                "scored_s": round(scored, 1), "cost_s": round(executed + scored, 1), "budget_s": budget.seconds(aid[:2])}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lessons", nargs="*")
    p.add_argument("--out", default=str(ROOT / ".artifacts" / "bench-budgets.json"))
    args = p.parse_args()
    ids = course._known(ROOT, args.lessons or None)
    rows = []
    for aid in ids:
        r = measure(aid)
        rows.append(r)
        print(f"{aid:<40} execution {r['executed_s']:7.1f} s   scoring {r['scored_s']:7.1f} s   cost {r['cost_s']:7.1f} s   "
              f"budget now {r['budget_s']:6.0f} s   (whole command {r['grade_class_s']:.1f} s)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": os.uname().nodename, "load": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
