"""`make bench`: what the grader's edges cost an honest student, side by side in one run.

The steps that keep a student's work from the grading process and the instructor's pages (coursekit/inert.py's
InertOutputs after scoring, coursekit.protocol.measure before every answer is decoded) run on every submission. This
grades lesson 02's perfect example notebook serially, ``--rounds`` times each way, alternating: with those steps as
the course runs them, and with both replaced by no-ops (the grader before them). It prints the median of each and
their ratio, and the time InertOutputs alone takes on the graded notebook, and writes .artifacts/bench-edges.json.
Not a test: the numbers depend on the machine and its load (the load average before and after is recorded).

    python benchmarks/bench_edges.py [--lesson 02-lora-inside-one-matmul] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from coursekit import course, inert, protocol

ROOT = Path(__file__).resolve().parents[1]


def _course(tmp: Path, aid: str) -> Path:
    """A course folder holding one student, ``ana``, with the lesson's perfect example notebook."""
    work = tmp / "build"
    course.build_examples(ROOT, aid, work / "submitted")
    dest = tmp / "course"
    shutil.copytree(work / "submitted" / "ex-perfect", dest / "submitted" / "ana")
    return dest


def _grade(template: Path, tmp: Path, aid: str, name: str) -> float:
    work = tmp / name
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    t0 = time.perf_counter()
    course.grade_class(lessons=[aid], root=ROOT, course_dir=work, release_dir=tmp / f"release-{name}", workers=1,
                       progress=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lesson", default="02-lora-inside-one-matmul")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / ".artifacts" / "bench-edges.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-edges-") as d:
        tmp = Path(d)
        template = _course(tmp, args.lesson)
        real_pre, real_measure = inert.InertOutputs.preprocess, protocol.measure
        times: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(args.rounds):
            for way in ("with", "without"):
                if way == "without":
                    inert.InertOutputs.preprocess = lambda self, nb, resources: (nb, resources)
                    protocol.measure = lambda x: 0
                try:
                    times[way].append(_grade(template, tmp, args.lesson, f"{way}-{i}"))
                finally:
                    inert.InertOutputs.preprocess, protocol.measure = real_pre, real_measure
        graded = tmp / "with-0" / "autograded" / "ana" / args.lesson / f"{args.lesson}.ipynb"
        import nbformat

        nb = nbformat.read(graded, as_version=4)
        t0 = time.perf_counter()
        for _ in range(20):
            inert.InertOutputs(release_directory=str(ROOT / "lessons")).preprocess(
                nbformat.from_dict(nb), {"nbgrader": {"assignment": args.lesson}})
        inert_ms = (time.perf_counter() - t0) / 20 * 1000
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"lesson": args.lesson, "rounds": args.rounds, "seconds": times, "median_s": med,
              "ratio_with_over_without": med["with"] / med["without"], "inert_outputs_ms": inert_ms,
              "loadavg_before": load0, "loadavg_after": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"grading one honest {args.lesson[:2]} submission serially, median of {args.rounds}: "
          f"{med['with']:.1f} s with the edges' steps, {med['without']:.1f} s without "
          f"(ratio {result['ratio_with_over_without']:.3f}); InertOutputs alone {inert_ms:.1f} ms. "
          f"Load average {load0[0]:.1f} -> {result['loadavg_after'][0]:.1f}. ({args.out})")


if __name__ == "__main__":
    main()
