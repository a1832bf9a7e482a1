"""What the example class must score, checked after it is graded (``coursekit grade --examples --check``).

Every example student of ``autograder/examples/<lesson>/<name>/`` says in its ``expected.json`` the exact
autograded score it must get (``"score"``: points of the checks, without the free-text answers graded by hand); the
two implicit students of every lesson are known without a file: ``ex-blank`` scores 0 and ``ex-perfect`` every
autograded point of the lesson. :func:`differences` compares a graded example class with those numbers, so a new
deployment (another machine, other thread settings, a cluster) is checked by a command, not by eye, and the
README's table of the example class is written by that same run (:func:`table`, :func:`splice`) and checked by a
test against the expected scores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

#: The README's block of the example class's scores (written by ``coursekit grade --examples --check --readme``).
BEGIN = "<!-- example class scores: begin (written by `coursekit grade --examples --check --readme`; do not edit by hand) -->"
END = "<!-- example class scores: end -->"


def example_students(root: Path, aid: str) -> dict[str, dict[str, str] | None]:
    """Student id → {grade_id: replacement source} for the example class of one lesson (``ex-blank``: None, the
    release untouched; ``ex-perfect``: {}, every answer from the solution; each folder of
    ``autograder/examples/<aid>/``: the answer cells its files replace)."""
    students: dict[str, dict[str, str] | None] = {"ex-blank": None, "ex-perfect": {}}
    folder = root / "autograder" / "examples" / aid
    if folder.is_dir():
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            students[f"ex-{sub.name}"] = {f.stem: f.read_text() for f in sorted(sub.iterdir())
                                          if f.suffix in (".py", ".md") and f.name != "submission.py"}
    return students


def _grade_cells(root: Path, aid: str) -> list[dict]:
    nb = json.loads((Path(root) / "lessons" / aid / f"{aid}.ipynb").read_text())
    return [c.get("metadata", {}).get("nbgrader", {}) for c in nb["cells"]
            if c.get("metadata", {}).get("nbgrader", {}).get("grade")]


def max_points(root: Path, aid: str) -> tuple[float, float]:
    """(autograded points, all points) of lesson ``aid``, from its release notebook's graded cells: what nbgrader
    counts as the code score's and the score's maximum (the difference is the free-text answers graded by hand)."""
    cells = _grade_cells(root, aid)
    auto = sum(float(c.get("points", 0) or 0) for c in cells if not c.get("solution"))
    return auto, sum(float(c.get("points", 0) or 0) for c in cells)


def expected_scores(root: Path, aid: str) -> dict[str, float | None]:
    """Example student → the autograded score it must get in lesson ``aid`` (None: its expected.json gives none)."""
    auto, _ = max_points(root, aid)
    out: dict[str, float | None] = {}
    for sid in example_students(Path(root), aid):
        if sid == "ex-blank":
            out[sid] = 0.0
        elif sid == "ex-perfect":
            out[sid] = auto
        else:
            spec = json.loads((Path(root) / "autograder" / "examples" / aid / sid.removeprefix("ex-") / "expected.json").read_text())
            out[sid] = float(spec["score"]) if "score" in spec else None
    return out


def graded_scores(course: Path, aid: str) -> dict[str, float]:
    """Student → autograded score (nbgrader's code score) of lesson ``aid`` in the gradebook of ``course``."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{Path(course) / 'gradebook.db'}") as gb:
        try:
            assignment = gb.find_assignment(aid)
        except MissingEntry:
            return {}
        return {s.student.id: float(s.code_score) for s in assignment.submissions}


def differences(root: Path, course: Path, lessons: Iterable[str]) -> list[str]:
    """One line per example student of ``lessons`` whose autograded score in the graded class ``course`` is not the
    one it expects (or that was not graded, or expects nothing); empty when the class scored exactly as expected."""
    out = []
    for aid in lessons:
        got = graded_scores(course, aid)
        for sid, want in expected_scores(root, aid).items():
            if want is None:
                out.append(f"{aid} {sid}: its expected.json gives no \"score\"")
            elif sid not in got:
                out.append(f"{aid} {sid}: not graded (expected {want:g})")
            elif abs(got[sid] - want) > 1e-6:
                out.append(f"{aid} {sid}: scored {got[sid]:.2f}, expected {want:.2f}")
    return out


def rows(root: Path, lessons: Iterable[str]) -> list[tuple[str, str, float, float]]:
    """(lesson, student, score, max) of the example class of ``lessons`` as ``coursekit grade`` prints them (the score
    is the total: autograded points, the free-text answers not yet graded by hand), from the expected scores."""
    out = []
    for aid in lessons:
        _, total = max_points(root, aid)
        for sid, want in sorted(expected_scores(root, aid).items()):
            out.append((aid, sid, float(want or 0.0), total))
    return out


def block(table: str, lessons: list[str], count: int, seconds: float, workers: int) -> str:
    """The README block: the score ``table`` (coursekit.course.format_table of :func:`rows`) of ``count``
    submissions, and how the run that checked it went (``workers`` 0: on a cluster's workers)."""
    m, s = divmod(round(seconds), 60)
    took = f"{m} min {s} s" if m else f"{s} s"
    nums = " ".join(aid[:2] for aid in lessons)
    return (f"```text\n{table}\n```\n"
            f"{count} submissions of {len(lessons)} lesson{'s' * (len(lessons) != 1)}, hostile ones included, each scored exactly as its "
            f"expected.json says: `coursekit grade --examples {nums} --check`, {took} with "
            + (f"{workers} worker{'s' * (workers != 1)}" if workers else "a Dask cluster's workers")
            + " on the course's 2-core test machine.\n")


def splice(text: str, new: str) -> str:
    """``text`` with its example-class block (between :data:`BEGIN` and :data:`END`) replaced by ``new``. ValueError
    when the markers are missing, repeated or out of order."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"the file needs exactly one example-class block: a line {BEGIN} and, after it, {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{new}{END}{tail}"


def current(text: str) -> str:
    """The block's text now (between the markers, without the marker lines)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError("no example-class block")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].removeprefix("\n")
