"""`make bench`: the time to grade a class of 100 submissions of one lesson, serial vs parallel, in one run.

The class is the lesson's example class (blank, perfect and the typical wrong submissions of
autograder/examples/<lesson>/; the hostile ones only with --hostile, since their deliberate endless
loops would make the time mostly timeouts) copied under 100 student ids, graded twice by ``course.grade_class``,
each time in a fresh temporary course folder: once with ``workers=1`` (nbgrader's one-at-a-time
autograde) and once with one worker per core (``coursekit grade --workers N``). Each time covers the
whole command: release, autograde, feedback and grades.csv. Both runs must give the same grades.csv
scores, else the benchmark fails. Prints one line and writes .artifacts/bench-grading.json. Not a
test: the numbers depend on the machine and its load.

    python benchmarks/bench_grading.py [--lesson 02] [--students 100] [--workers N] [--hostile] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from coursekit import course, parallel

ROOT = Path(__file__).resolve().parents[1]


def hostile(aid: str, sid: str) -> bool:
    """An example student whose expected.json gives an exact "score": a hostile or broken submission."""
    f = ROOT / "autograder" / "examples" / aid / sid.removeprefix("ex-") / "expected.json"
    return f.is_file() and "score" in json.loads(f.read_text())


def build_class(aid: str, dest: Path, release_dir: Path, n: int, with_hostile: bool = False) -> dict[str, str]:
    """``n`` submissions under ``dest/submitted/``: the example class of ``aid`` in turn; student → example."""
    examples = dest / "examples"
    kinds = [k for k in course.build_examples(ROOT, aid, examples, release_dir) if with_hostile or not hostile(aid, k)]
    who = {}
    for i in range(n):
        kind = kinds[i % len(kinds)]
        sid = f"s{i:03d}"
        shutil.copytree(examples / kind / aid, dest / "submitted" / sid / aid)
        who[sid] = kind
    shutil.rmtree(examples)
    return who


def grade(aid: str, template: Path, release_dir: Path, workers: int) -> tuple[float, list[dict]]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-grading-w{workers}-"))
    try:
        shutil.copytree(template / "submitted", work / "submitted")
        t0 = time.perf_counter()
        table = course.grade_class(lessons=[aid], root=ROOT, course_dir=work, release_dir=release_dir, workers=workers)
        seconds = time.perf_counter() - t0
        if "Not graded" in table:
            raise SystemExit(f"some submissions were not graded with {workers} workers:\n{table}")
        return seconds, course.read_grades_csv(work / "grades.csv")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lesson", default="02", help="lesson id or number (default 02: cheap, with three typical mistakes)")
    p.add_argument("--students", type=int, default=100, help="submissions in the class (default 100)")
    p.add_argument("--workers", type=int, default=parallel.default_workers(), help="parallel workers (default: one per core)")
    p.add_argument("--hostile", action="store_true", help="include the hostile example students (endless loops: slow)")
    p.add_argument("--out", default=".artifacts/bench-grading.json")
    args = p.parse_args()
    (aid,) = course._known(ROOT, [args.lesson])
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        release_dir = tmp / "release"
        course.release([aid], root=ROOT, course_dir=tmp / "release-course", release_dir=release_dir)
        who = build_class(aid, tmp / "class", release_dir, args.students, args.hostile)
        kinds = sorted(set(who.values()))
        print(f"Grading {args.students} submissions of {aid} ({len(kinds)} kinds: {', '.join(kinds)}), "
              f"{parallel.default_workers()} cores")
        results = {}
        for workers in (1, args.workers):
            print(f"\n{workers} worker{'s' if workers > 1 else ''}:")
            results[workers] = grade(aid, tmp / "class", release_dir, workers)
    (t1, rows1), (tn, rowsn) = results[1], results[args.workers]
    key = lambda r: (r["assignment"], r["student_id"])  # noqa: E731
    score = lambda rows: [(key(r), r["score"], r["max_score"]) for r in sorted(rows, key=key)]  # noqa: E731
    assert len(rows1) == args.students, f"serial grades.csv has {len(rows1)} rows, expected {args.students}"
    assert score(rows1) == score(rowsn), "serial and parallel grading disagree: run tests/test_parallel_grading.py"
    n = args.students
    result = {"lesson": aid, "submissions": n, "kinds": kinds, "cores": parallel.default_workers(),
              "workers": args.workers, "serial_s": round(t1, 1), "parallel_s": round(tn, 1),
              "speedup": round(t1 / tn, 2), "same_scores": True, "python": platform.python_version(),
              "load_average_before": load_before, "load_average_after": os.getloadavg()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{n} submissions of {aid}: serial {t1:7.1f} s ({t1 / n:5.2f} s each)   "
          f"{args.workers} workers {tn:7.1f} s ({tn / n:5.2f} s each)   speed-up {t1 / tn:4.2f}x   "
          f"(same grades.csv scores)\n{out}")


if __name__ == "__main__":
    main()
