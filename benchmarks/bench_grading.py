"""`make bench`: the time to grade a class of N submissions of one lesson, serial vs a local Dask cluster, in one run.

The class is the lesson's example class (blank, perfect and the typical wrong submissions of
autograder/examples/<lesson>/; the hostile ones only with --hostile, since their deliberate endless
loops would make the time mostly timeouts) copied under N student ids, graded twice by ``course.grade_class``,
each time in a fresh temporary course folder: once with ``workers=1`` (nbgrader's one-at-a-time
autograde) and once on a local Dask cluster of ``--workers`` processes (``coursekit grade --workers N``;
default 2). Each time covers the whole command: release, cluster start, autograde, feedback and
grades.csv. Both runs must give the same grades.csv byte for byte, else the benchmark fails.

It also measures what the engine itself costs: the start of a local cluster, and the round trip of one
task carrying a real submission and bringing back an executed notebook's worth of text, with no execution
(``coursekit.parallel.echo``), one task at a time. From the cluster run it reports each submission's
execution time on its worker and its grading time in this process (the serial part, which no number of
workers shortens). Prints a summary and writes .artifacts/bench-grading.json. Not a test: the numbers
depend on the machine and its load (the load average before and after is recorded).

    python benchmarks/bench_grading.py [--lesson 02] [--students 100] [--workers 2] [--hostile] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from coursekit import course, parallel

ROOT = Path(__file__).resolve().parents[1]


def hostile(aid: str, sid: str) -> bool:
    """An example student whose expected.json says ``"hostile": true``: a hostile or broken submission."""
    f = ROOT / "autograder" / "examples" / aid / sid.removeprefix("ex-") / "expected.json"
    return f.is_file() and json.loads(f.read_text()).get("hostile") is True


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


def grade(aid: str, template: Path, release_dir: Path, workers: int, strict: bool = True) -> tuple[float, bytes, object]:
    """Grade a copy of the class; (seconds, grades.csv bytes, the run's parallel.Autograder)."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-grading-w{workers}-"))
    made = []

    class Recording(parallel.Autograder):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    real, parallel.Autograder = parallel.Autograder, Recording
    try:
        shutil.copytree(template / "submitted", work / "submitted")
        t0 = time.perf_counter()
        table = course.grade_class(lessons=[aid], root=ROOT, course_dir=work, release_dir=release_dir, workers=workers)
        seconds = time.perf_counter() - t0
        if strict and "Graded 0, with a feedback file" in table:
            raise SystemExit(f"some submissions were not graded with {workers} workers:\n{table}")
        return seconds, (work / "grades.csv").read_bytes(), made[-1]
    finally:
        parallel.Autograder = real
        shutil.rmtree(work, ignore_errors=True)


def engine_overhead(aid: str, template: Path, release_dir: Path, workers: int, rounds: int = 40) -> dict:
    """Seconds to start a local cluster of ``workers``, and the round trip of one task (a real submission out, a
    notebook's worth of text back, no execution), one at a time, median of ``rounds``."""
    from distributed import Client

    work = Path(tempfile.mkdtemp(prefix="bench-grading-engine-"))
    try:
        shutil.copytree(template / "submitted", work / "submitted")
        a = course.api(ROOT, work, release_dir)
        course._check(a.generate_assignment(aid, force=True, create=True), "release")
        sid = sorted(p.name for p in (work / "submitted").iterdir())[0]
        task = parallel.TaskMaker(a, work)(aid, sid)
        reply = task.files[f"{aid}.ipynb"].decode() * 2  # an executed notebook is about twice the submission
        t0 = time.perf_counter()
        cluster = parallel.local_cluster(workers)
        client = Client(cluster)
        client.submit(parallel.echo, task, "", pure=False).result()  # the workers' first import of coursekit
        start = time.perf_counter() - t0
        trips = []
        for _ in range(rounds):
            t = time.perf_counter()
            client.submit(parallel.echo, task, reply, pure=False).result()
            trips.append(time.perf_counter() - t)
        client.close()
        cluster.close()
        return {"cluster_start_s": round(start, 2), "round_trip_ms": round(1000 * statistics.median(trips), 1),
                "task_bytes": task.size(), "reply_bytes": len(reply)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lesson", default="02", help="lesson id or number (default 02: cheap, with three typical mistakes)")
    p.add_argument("--students", type=int, default=100, help="submissions in the class (default 100)")
    p.add_argument("--workers", type=int, default=2, help="local cluster workers (default 2)")
    p.add_argument("--hostile", action="store_true", help="include the hostile example students (endless loops: slow)")
    p.add_argument("--out", default=".artifacts/bench-grading.json")
    args = p.parse_args()
    if args.workers < 2:
        raise SystemExit("--workers must be at least 2 (1 is the serial run it is compared with)")
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
        print("\nengine alone:")
        engine = engine_overhead(aid, tmp / "class", release_dir, args.workers)
        print(f"  local cluster of {args.workers} started in {engine['cluster_start_s']} s; one task's round trip "
              f"{engine['round_trip_ms']} ms ({engine['task_bytes']} bytes out, {engine['reply_bytes']} back)")
        print("\n1 worker (serial):")
        t1, csv1, _ = grade(aid, tmp / "class", release_dir, 1, not args.hostile)
        print(f"\nlocal Dask cluster, {args.workers} workers:")
        tn, csvn, run = grade(aid, tmp / "class", release_dir, args.workers, not args.hostile)
    n = args.students
    rows = csv1.count(b"\n") - 1
    assert rows == n, f"serial grades.csv has {rows} rows, expected {n}"
    assert csv1 == csvn, "serial and Dask grading wrote different grades.csv files: run tests/test_dask_grading.py"
    execs, replays = sorted(run.task_seconds.values()), sorted(run.replay_seconds.values())
    assert len(execs) == len(replays) == n - len(run.failed), "every submission executed on a worker and graded here"
    result = {"lesson": aid, "submissions": n, "kinds": kinds, "cores": parallel.default_workers(),
              "workers": args.workers, "engine": "dask.distributed LocalCluster", "serial_s": round(t1, 1),
              "dask_s": round(tn, 1), "speedup": round(t1 / tn, 2), "same_grades_csv_bytes": True,
              "worker_execution_s_mean": round(statistics.mean(execs), 2),
              "grading_process_s_mean": round(statistics.mean(replays), 2), **engine,
              "python": platform.python_version(), "load_average_before": load_before, "load_average_after": os.getloadavg()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{n} submissions of {aid}: serial {t1:7.1f} s ({t1 / n:5.2f} s each)   "
          f"Dask, {args.workers} workers {tn:7.1f} s ({tn / n:5.2f} s each)   speed-up {t1 / tn:4.2f}x   (same grades.csv)\n"
          f"per submission: {result['worker_execution_s_mean']} s executing on a worker, "
          f"{result['grading_process_s_mean']} s grading in this process; engine: {engine['round_trip_ms']} ms a task, "
          f"{engine['cluster_start_s']} s to start the cluster\n"
          f"load average before {load_before[0]:.1f}, after {result['load_average_after'][0]:.1f}\n{out}")


if __name__ == "__main__":
    main()
