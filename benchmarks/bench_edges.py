"""`make bench`: what the grader's edges cost an honest student, side by side in one run.

The steps that keep a student's work from the grading process and the instructor's pages (coursekit/inert.py's
InertOutputs after scoring, coursekit.protocol.measure before every answer is decoded) run on every submission. This
grades lesson 02's perfect example notebook serially, ``--rounds`` times each way, alternating: with those steps as
the course runs them, and with both replaced by no-ops (the grader before them). It prints the median of each and
their ratio, and the time InertOutputs alone takes on the graded notebook; then the peak memory of the grading
process over a class of five perfect notebooks against a class of one perfect notebook and four that each add one
attack on the grading process's memory (:data:`ATTACKS`), each class graded serially in a fresh process. It writes
.artifacts/bench-edges.json.
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


#: Code cells a hostile student adds at the end of an otherwise perfect notebook, one student each: everything the
#: grading process reads of the kernel, made as large as the caps allow.
ATTACKS = {
    "stdin-flood": ("k = get_ipython().kernel\nblob = 'x' * (1 << 20)\nfor _ in range(300):\n"
                    "    k.session.send(k.stdin_socket, 'input_request', {'prompt': blob, 'password': False},\n"
                    "                   parent=k.get_parent('shell'), ident=k._parent_ident.get('shell'))\n"),
    "many-values": ("k = get_ipython().kernel\nk.session.send(k.iopub_socket, 'display_data', {'data': "
                    "{'application/json': [[]] * (12 << 20)}, 'metadata': {}}, parent=k.get_parent('shell'), "
                    "ident=k._topic('display_data'))\n"),
    "answer-records": ("from IPython.display import display\nfor _ in range(100):\n    display({'"
                       + protocol.MIME + "': {'item': '02.p1', 'answer': 'x' * (2 << 20)}}, raw=True)\n"),
    "big-print": "print('y' * (50 << 20))\n",
}


def _class(tmp: Path, aid: str, hostile: bool) -> Path:
    """A course folder of five students: five perfect notebooks, or one perfect and four with an attack each
    (:data:`ATTACKS`)."""
    import nbformat

    work = tmp / "build"
    if not (work / "submitted" / "ex-perfect").is_dir():
        course.build_examples(ROOT, aid, work / "submitted")
    dest = tmp / ("hostile" if hostile else "honest")
    names = ["ana", *(ATTACKS if hostile else ["ben", "cy", "dee", "eve"])]
    for name in names:
        shutil.copytree(work / "submitted" / "ex-perfect", dest / "submitted" / name)
        if name in ATTACKS:
            path = dest / "submitted" / name / aid / f"{aid}.ipynb"
            nb = nbformat.read(path, as_version=4)
            nb.cells.append(nbformat.v4.new_code_cell(ATTACKS[name]))
            nbformat.write(nb, path)
    return dest


def _peak_of_grading(course_dir: Path, tmp: Path, aid: str) -> dict:
    """Grade ``course_dir`` serially in a fresh process; its peak resident memory from the start of grading (MB)."""
    import subprocess
    import sys

    code = ("import json, sys, time\nfrom pathlib import Path\nfrom coursekit import course\n"
            "open('/proc/self/clear_refs', 'w').write('5')\nt0 = time.perf_counter()\n"
            "course.grade_class(lessons=[sys.argv[1]], root=Path(sys.argv[2]), course_dir=Path(sys.argv[3]), "
            "release_dir=Path(sys.argv[4]), workers=1, progress=False)\n"
            "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "print(json.dumps({'peak_mb': hwm / 1024, 'seconds': time.perf_counter() - t0}))\n")
    r = subprocess.run([sys.executable, "-c", code, aid, str(ROOT), str(course_dir), str(tmp / f"rel-{course_dir.name}")],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"grading {course_dir.name} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


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
        peaks = {kind: _peak_of_grading(_class(tmp, args.lesson, kind == "hostile"), tmp, args.lesson)
                 for kind in ("honest", "hostile")}
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"lesson": args.lesson, "rounds": args.rounds, "seconds": times, "median_s": med,
              "ratio_with_over_without": med["with"] / med["without"], "inert_outputs_ms": inert_ms,
              "class_peak": peaks, "peak_ratio_hostile_over_honest": peaks["hostile"]["peak_mb"] / peaks["honest"]["peak_mb"],
              "attacks": sorted(ATTACKS), "loadavg_before": load0, "loadavg_after": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"grading one honest {args.lesson[:2]} submission serially, median of {args.rounds}: "
          f"{med['with']:.1f} s with the edges' steps, {med['without']:.1f} s without "
          f"(ratio {result['ratio_with_over_without']:.3f}); InertOutputs alone {inert_ms:.1f} ms. "
          f"Load average {load0[0]:.1f} -> {result['loadavg_after'][0]:.1f}. ({args.out})")
    print(f"peak memory of the grading process over a class of five: {peaks['honest']['peak_mb']:.0f} MB honest, "
          f"{peaks['hostile']['peak_mb']:.0f} MB with one student per attack ({', '.join(sorted(ATTACKS))}): "
          f"ratio {result['peak_ratio_hostile_over_honest']:.2f} (to hold: at most 1.5)")


if __name__ == "__main__":
    main()
