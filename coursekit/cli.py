"""The ``coursekit`` command: ``doctor``, ``release``, ``grade``.

``coursekit doctor``  what is installed and which bitsandbytes implementation runs each 4-bit op here.
``coursekit release`` regenerate lessons/ (nbgrader release) from solutions/ (nbgrader source).
``coursekit grade``   release, autograde your class's submissions, write feedback and grades.csv, print a table
                      (``--examples``: the example class instead).
``coursekit keys``    instructors: show or write a lesson's encoded answer keys.
"""

from __future__ import annotations

import argparse
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
    from . import course

    table = course.grade_class(lessons=args.lessons or None, root=args.root, examples=args.examples)
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="coursekit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("doctor", help="print versions, CPU features and the bitsandbytes backend of each 4-bit op")
    d.set_defaults(func=_doctor)
    for name, fn, helptext in (
        ("release", _release, "regenerate lessons/ from solutions/ with nbgrader"),
        ("grade", _grade, "autograde the class (example submissions included), write feedback and grades.csv"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("lessons", nargs="*", help="lesson ids or numbers, e.g. 02-lora-inside-one-matmul or 02 (default: every lesson)")
        s.add_argument("--root", default=None, help="course repository root (default: the current directory)")
        if name == "grade":
            s.add_argument("--examples", action="store_true",
                           help="grade the example class (autograder/example-class/) instead of your class (autograder/course/)")
        s.set_defaults(func=fn)
    k = sub.add_parser("keys", help="instructors: show or write a lesson's encoded answer keys")
    k.add_argument("action", choices=["show", "write"])
    k.add_argument("lesson", help="two-digit lesson number, e.g. 02")
    k.add_argument("json_file", nargs="?", default="-", help="with write: a JSON object (default: stdin)")
    k.set_defaults(func=lambda a: __import__("coursekit.grading.keys", fromlist=["main"]).main(
        [a.action, a.lesson] + ([a.json_file] if a.action == "write" else [])))
    args = p.parse_args(argv)
    from .course import CourseError

    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `coursekit keys show 02 | head`
        sys.stderr.close()
        return 0
    except (CourseError, FileNotFoundError, KeyError) as e:
        # A user's mistake (wrong folder, unknown lesson, missing file): one clear line, no traceback.
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"coursekit {args.command}: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
