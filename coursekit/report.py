"""What the class got wrong: the instructor's report of a graded class (``coursekit report``, ``make report``).

The question after a deadline is what to re-teach. The grader already knows, for every student and item, which
known mistake a wrong answer made; :class:`coursekit.guard.ScoreAnswers` writes it, as data, into the scored
check cell of each autograded notebook (``coursekit.guard.OUTCOME_KEY``). This module reads, and never grades:

* nbgrader's gradebook (``gradebook.db``): the students, who handed in which lesson, scores and lateness;
* the outcome of every check cell in ``autograded/<student>/<lesson>/<lesson>.ipynb``;
* what ``coursekit grade`` recorded of each submission (``grading-status/<student>/<lesson>.json``): graded, with
  the files it set aside, or scored 0 without being graded and why (an unreadable notebook, a sandbox refusal, a
  notebook the grader could not run);
* what sits in ``submitted/`` where no lesson folder is (coursekit.submissions.misplaced), with the move to make.

:func:`collect` gives, per lesson and item, how many students answered, got it right, made each named mistake,
failed another way, left it blank, or were not scored, with the items sorted by how much of the class lost
points there, and who made each named mistake; and per student, the outcome of every item and what is missing,
late, misplaced or zero for a reason. "Missing" counts the class's students (nbgrader's roster: the gradebook's
students, or the ``roster`` given) who handed nothing in for that lesson. :func:`write` saves it as
``report.json``, ``items.csv``, ``students.csv`` and a self-contained ``report.html`` with its plots inline.
The same gradebook and notebooks give byte-identical files. The HTML names students only with ``names=True``. A
cell of a CSV file never starts with a character a spreadsheet reads as a formula (OWASP's CSV injection rule).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path
from typing import Any, Iterable

__all__ = ["STATUS_DIR", "outcomes", "write_status", "clear_status", "graded_lessons", "collect", "write",
           "write_submissions_csv", "format_text", "inert_cell"]

#: Folder (in the course folder) of the submissions that scored 0 without being graded: one JSON per submission.
STATUS_DIR = "grading-status"
#: The outcome columns of an item, in the order the tables and the bars show them.
COLUMNS = ("right", "partial", "mistake", "wrong", "blank", "not_scored")


def write_status(course: Path, lesson: str, student: str, reason: str = "", ignored: Iterable[str] = ()) -> Path:
    """Record what ``coursekit grade`` made of ``student``'s ``lesson``: scored 0 without being graded and why
    (``reason``, what the feedback file says), or graded (``reason`` empty), with the files it set aside."""
    dest = Path(course) / STATUS_DIR / student / f"{lesson}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"lesson": lesson, "student": student, "status": "zero" if reason else "graded",
                                "reason": reason, "ignored": list(ignored)}, sort_keys=True) + "\n")
    return dest


def clear_status(course: Path, lesson: str, student: str) -> None:
    """Forget an earlier run's record of ``student``'s ``lesson``."""
    (Path(course) / STATUS_DIR / student / f"{lesson}.json").unlink(missing_ok=True)


def _status(course: Path, lesson: str, student: str) -> dict:
    """The record :func:`write_status` left ({} when none, or when it cannot be read)."""
    f = Path(course) / STATUS_DIR / student / f"{lesson}.json"
    try:
        rec = json.loads(f.read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def graded_lessons(course: str | Path, known: Iterable[str]) -> list[str]:
    """The lessons of ``known`` (in that order) that the gradebook in ``course`` holds an assignment for."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{Path(course) / 'gradebook.db'}") as gb:
        have = {a.name for a in gb.assignments}
    return [aid for aid in known if aid in have]


def outcomes(notebook: Path) -> dict[str, dict]:
    """``{item: outcome}`` of every scored check cell of one autograded notebook (``autograded/<student>/<lesson>/
    <lesson>.ipynb``): the record the grading process stored in the cell's metadata (:func:`coursekit.guard.outcome`:
    ``item``, ``points``, ``max_points``, ``status``, ``mistakes``, ``reason``), keyed by item ("p2"). Only check cells
    are read (locked, graded, not an answer cell: the cells the grading process scored and wrote the record into);
    a record on any other cell is not the grader's and is left out, and so is a cell with none. A status that is not
    one of :data:`COLUMNS` reads as "not_scored". An unreadable file raises (``OSError``, ``ValueError``)."""
    from .guard import OUTCOME_KEY

    nb = json.loads(notebook.read_text())
    out: dict[str, dict] = {}
    for cell in nb.get("cells", []):
        md = cell.get("metadata", {}) if isinstance(cell, dict) else {}
        nbg = md.get("nbgrader") or {}
        if cell.get("cell_type") != "code" or not nbg.get("grade") or nbg.get("solution"):
            continue
        rec = md.get(OUTCOME_KEY)
        if not (isinstance(rec, dict) and isinstance(rec.get("item"), str)):
            continue
        item = rec["item"].split(".", 1)[-1]
        if item in out:
            continue
        rec = dict(rec)
        if rec.get("status") not in COLUMNS:
            rec["reason"] = f"an outcome the report does not know ({str(rec.get('status'))[:40]!r})"
            rec["status"] = "not_scored"
        rec["mistakes"] = [str(m) for m in rec.get("mistakes") or [] if isinstance(m, str)]
        try:
            rec["points"] = float(rec.get("points", 0.0))
        except (TypeError, ValueError):
            rec["points"] = 0.0
        out[item] = rec
    return out


def _gradebook(course: Path, lessons: list[str]) -> tuple[list[str], dict[str, dict[str, dict]]]:
    """(every student id, {lesson: {student: submission}}) from nbgrader's gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    subs: dict[str, dict[str, dict]] = {aid: {} for aid in lessons}
    with Gradebook(f"sqlite:///{Path(course) / 'gradebook.db'}") as gb:
        students = sorted(s.id for s in gb.students)
        for aid in lessons:
            try:
                assignment = gb.find_assignment(aid)
            except MissingEntry:
                continue
            for sub in assignment.submissions:
                subs[aid][sub.student.id] = {"score": float(sub.score), "max_score": float(sub.max_score),
                                             "late_seconds": float(sub.total_seconds_late or 0)}
    return students, subs


def collect(course: str | Path, lessons: Iterable[str], roster: Iterable[str] | dict[str, Iterable[str]] | None = None,
            known: Iterable[str] | None = None) -> dict[str, Any]:
    """The class report of the graded ``lessons`` (lesson ids, e.g. "02-lora-inside-one-matmul") in ``course``.

    ``roster``: the class's students, who count as "missing" where they handed nothing in: one list for every
    lesson, or ``{lesson: students}`` (the example class: each lesson's own example students); default the
    gradebook's students (nbgrader's roster, and everyone graded). ``known``: every lesson id of the course, to name
    the lesson a misplaced folder seems to be (default ``lessons``).

    Returns ``{"lessons": [...], "students": [...], "misplaced": [...]}``. Each lesson: ``lesson``, ``students`` (of
    the class), ``handed_in``, ``graded``, ``zero`` (scored 0 for a reason), ``missing``, ``misplaced``, ``late``,
    ``max_score``, ``totals`` (the graded students' scores, sorted) and ``items``: per item ``item``, ``title``,
    ``points``, the counts of :data:`COLUMNS` over the graded submissions, ``answered`` (not blank and scored),
    ``mistakes`` (``{label: count}``, most common first), ``mistake_students`` (``{label: [students]}``),
    ``lost_by`` (students who lost points on it) and ``points_lost``; items sorted by ``lost_by``, then
    ``points_lost``, then the lesson's order. Each student row: ``student``, ``lesson``, ``status`` ("graded",
    "zero", "missing" or "misplaced"), ``score``, ``max_score``, ``late``, ``reason`` (why zero; for "misplaced"
    where it is), ``move`` (what to do with a misplaced one), ``ignored`` (files set aside), ``not_scored`` (items
    the grader could not score, with why) and ``items`` (``{item: {"status", "points", "max_points",
    "mistakes"}}``). ``misplaced``: what sits in ``submitted/`` outside any lesson folder (``student``, ``where``,
    ``lesson``, ``move``). Raises FileNotFoundError when ``course`` has no gradebook.
    """
    from .grading import lesson_items
    from .submissions import misplaced as find_misplaced, scored_zero

    course = Path(course)
    if not (course / "gradebook.db").is_file():
        raise FileNotFoundError(f"{course} has no gradebook.db: grade the class first (coursekit grade)")
    lessons = list(lessons)
    students, subs = _gradebook(course, lessons)
    lost = find_misplaced(course / "submitted", list(known) if known is not None else lessons)
    report: dict[str, Any] = {"lessons": [], "students": [],
                              "misplaced": [{"student": m.student, "where": m.where, "lesson": m.lesson, "move": m.move}
                                            for m in lost]}
    for aid in lessons:
        if roster is None:
            klass = set(students)
        elif isinstance(roster, dict):
            klass = set(roster.get(aid, ()))
        else:
            klass = set(roster)
        klass |= set(subs[aid])  # whoever handed this lesson in belongs to the class
        moved = {m.student: m for m in lost if m.lesson == aid and m.student not in subs[aid]}
        klass |= set(moved)
        items = dict(lesson_items(aid[:2]))
        counts = {k: {c: 0 for c in COLUMNS} | {"mistakes": {}, "who": {}, "points_lost": 0.0, "lost_by": 0} for k in items}
        totals, zero, late = [], 0, 0
        for sid in sorted(klass):
            sub = subs[aid].get(sid)
            row = {"student": sid, "lesson": aid, "status": "missing", "score": 0.0, "max_score": 0.0, "late": False,
                   "reason": "", "move": "", "ignored": [], "not_scored": [], "items": {}}
            status = _status(course, aid, sid) if sub is not None else {}
            notebook = course / "autograded" / sid / aid / f"{aid}.ipynb"
            if sub is None and sid in moved:
                row.update(status="misplaced", reason=f"handed in at {moved[sid].where}", move=moved[sid].move)
            elif status.get("status") == "zero" and (not notebook.is_file() or scored_zero(notebook)):
                # (graded since, by the formgrader's button: the gradebook's score, not the old zero, counts)
                row.update(status="zero", reason=str(status.get("reason", "")))
                zero += 1
            elif sub is not None and notebook.is_file():
                row.update(status="graded", score=sub["score"], max_score=sub["max_score"], late=sub["late_seconds"] > 0,
                           ignored=[str(x) for x in status.get("ignored", []) if isinstance(x, str)])
                totals.append(sub["score"])
                late += row["late"]
                try:
                    got = outcomes(notebook)
                except (OSError, ValueError):
                    got = {}
                for k, it in items.items():
                    rec = got.get(k) or {"status": "not_scored", "points": 0.0, "mistakes": [],
                                         "reason": "no outcome recorded (graded before coursekit recorded outcomes?)"}
                    c = counts[k]
                    c[rec["status"]] += 1
                    for label in rec.get("mistakes", []):
                        c["mistakes"][label] = c["mistakes"].get(label, 0) + 1
                        c["who"].setdefault(label, []).append(sid)
                    lost_points = float(it.points) - float(rec.get("points", 0.0))
                    if lost_points > 1e-9:
                        c["points_lost"] += lost_points
                        c["lost_by"] += 1
                    if rec["status"] == "not_scored":
                        row["not_scored"].append(f"{k}: {rec.get('reason', '')}")
                    row["items"][k] = {"status": rec["status"], "points": float(rec.get("points", 0.0)),
                                       "max_points": float(it.points), "mistakes": list(rec.get("mistakes", []))}
            elif sub is not None:
                row.update(status="zero", reason="no autograded notebook (graded before, or its folder was removed)")
                zero += 1
            report["students"].append(row)
        order = list(items)
        rows = []
        for k, it in items.items():
            c = counts[k]
            ranked = sorted(c["mistakes"].items(), key=lambda kv: (-kv[1], kv[0]))
            rows.append({"item": k, "title": it.title, "points": float(it.points),
                         **{col: c[col] for col in COLUMNS},
                         "answered": len(totals) - c["blank"] - c["not_scored"],
                         "mistakes": dict(ranked),
                         "mistake_students": {label: sorted(c["who"][label]) for label, _ in ranked},
                         "lost_by": c["lost_by"], "points_lost": round(c["points_lost"], 6)})
        rows.sort(key=lambda r: (-r["lost_by"], -r["points_lost"], order.index(r["item"])))
        handed = len(totals) + zero  # every submission handed in was graded or scored 0 for a reason
        report["lessons"].append({
            "lesson": aid, "students": len(klass), "handed_in": handed, "graded": len(totals), "zero": zero,
            "missing": len(klass) - handed - len(moved), "misplaced": len(moved), "late": late,
            "max_score": float(sum(it.points for it in items.values())), "totals": sorted(totals), "items": rows})
    placed = {(r["student"], r["reason"]) for r in report["students"] if r["status"] == "misplaced"}
    rows_of = {(r["student"], r["lesson"]): r for r in report["students"]}
    for m in lost:  # every misplaced folder gets its line, whichever lesson it seems to be
        same = rows_of.get((m.student, m.lesson))
        if same is not None and same["status"] == "zero" and not same["move"]:
            same["move"] = m.move  # e.g. a lesson folder doubled by unzipping: scored 0, and the move that fixes it
            continue
        if (m.student, f"handed in at {m.where}") not in placed:
            report["students"].append({"student": m.student, "lesson": m.lesson, "status": "misplaced", "score": 0.0,
                                       "max_score": 0.0, "late": False, "reason": f"handed in at {m.where}",
                                       "move": m.move, "ignored": [], "not_scored": [], "items": {}})
    return report


# --------------------------------------------------------------------------- files


#: A cell starting with one of these is read as a formula by a spreadsheet (OWASP, "CSV Injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def inert_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string that starts like a formula gets a leading apostrophe
    (OWASP's rule for CSV injection); numbers and other strings are kept."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def _csv(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: inert_cell(v) for k, v in r.items()})
    return buf.getvalue()


def _items_csv(report: dict) -> str:
    rows = []
    for les in report["lessons"]:
        for r in les["items"]:
            rows.append({**r, "lesson": les["lesson"],
                         "mistakes": "; ".join(f"{label} ({n})" for label, n in r["mistakes"].items())})
    return _csv(rows, ["lesson", "item", "title", "points", "answered", *COLUMNS, "lost_by", "points_lost", "mistakes"])


def _outcome_text(items: dict) -> str:
    """A student's items in one cell: ``p1 right 3/3; p2 mistake [alpha] 0.75/3; …``."""
    return "; ".join(f"{k} {o['status']}" + (f" [{', '.join(o['mistakes'])}]" if o["mistakes"] else "")
                     + f" {o['points']:g}/{o['max_points']:g}" for k, o in items.items())


def _students_csv(report: dict) -> str:
    rows = [{**r, "not_scored": "; ".join(r["not_scored"]), "ignored": "; ".join(r.get("ignored", [])),
             "items": _outcome_text(r.get("items", {}))} for r in report["students"]]
    return _csv(rows, ["lesson", "student", "status", "score", "max_score", "late", "reason", "move", "ignored",
                       "not_scored", "items"])


_COLOURS = {"right": "#4c9a2a", "partial": "#a3c95e", "mistake": "#d9822b", "wrong": "#c23b22", "blank": "#bbbbbb",
            "not_scored": "#6b6b6b"}
_NAMES = {"right": "right", "partial": "partly right", "mistake": "a named mistake", "wrong": "wrong another way",
          "blank": "blank", "not_scored": "not scored"}


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _item_bars(les: dict) -> str:
    """One horizontal bar per item (the worst on top), split into the outcome columns."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = les["items"]
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(rows) + 1.4))
    left = [0] * len(rows)
    y = list(range(len(rows)))[::-1]
    for col in COLUMNS:
        vals = [r[col] for r in rows]
        ax.barh(y, vals, left=left, color=_COLOURS[col], label=_NAMES[col], height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(y, [r["item"] for r in rows])
    ax.set_xlabel("submissions graded")
    ax.set_title("each item's outcomes (the most lost on top)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    return _png(fig)


def _totals_hist(les: dict) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.6))
    bins = max(5, min(20, int(les["max_score"]) + 1)) if les["max_score"] else 5
    ax.hist(les["totals"], bins=bins, range=(0, max(les["max_score"], 1)), color="#4a6fa5")
    ax.set_xlabel(f"lesson total (of {les['max_score']:g} points)")
    ax.set_ylabel("students")
    ax.set_title(f"lesson totals, {les['graded']} graded submissions")
    fig.tight_layout()
    return _png(fig)


def _html(report: dict, names: bool) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\"><title>What the class got wrong</title>",
             "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}td:first-child,th:first-child,"
             "td.text{text-align:left}</style></head><body>", "<h1>What the class got wrong</h1>"]
    for les in report["lessons"]:
        parts.append(f"<h2>{e(les['lesson'])}</h2>")
        parts.append(f"<p>{les['students']} students: {les['graded']} graded, {les['zero']} scored 0 for a reason, "
                     f"{les['missing']} did not hand in, {les['misplaced']} handed in at the wrong place; "
                     f"{les['late']} late.</p>")
        if not les["graded"]:
            continue
        parts.append(f"<img alt=\"outcomes per item of {e(les['lesson'])}\" src=\"data:image/png;base64,{_item_bars(les)}\">")
        parts.append(f"<img alt=\"lesson totals of {e(les['lesson'])}\" src=\"data:image/png;base64,{_totals_hist(les)}\">")
        parts.append("<table><tr><th>item</th><th>points</th>" + "".join(f"<th>{e(_NAMES[c])}</th>" for c in COLUMNS)
                     + "<th>lost points</th><th class=\"text\">named mistakes (count)</th></tr>")
        for r in les["items"]:
            mistakes = "; ".join(f"{e(label)} ({n}" + (f": {e(', '.join(r['mistake_students'][label]))}" if names else "")
                                 + ")" for label, n in r["mistakes"].items())
            parts.append(f"<tr><td>{e(r['item'])}: {e(r['title'])}</td><td>{r['points']:g}</td>"
                         + "".join(f"<td>{r[c]}</td>" for c in COLUMNS)
                         + f"<td>{r['lost_by']} of {les['graded']}</td><td class=\"text\">{mistakes}</td></tr>")
        parts.append("</table>")
    rows = [r for r in report["students"] if r["status"] != "graded" or r["late"] or r["not_scored"]]
    parts.append("<h2>Submissions to look at</h2>")
    if names:
        parts.append("<table><tr><th>student</th><th>lesson</th><th>status</th><th class=\"text\">why</th></tr>")
        for r in rows:
            why = "; ".join(x for x in (r["reason"], r.get("move", ""), "late" if r["late"] else "",
                                        "; ".join(r["not_scored"])) if x)
            parts.append(f"<tr><td>{e(r['student'])}</td><td>{e(r['lesson'])}</td><td>{e(r['status'])}</td>"
                         f"<td class=\"text\">{e(why)}</td></tr>")
        parts.append("</table>")
    else:
        parts.append(f"<p>{sum(r['status'] == 'missing' for r in rows)} missing, "
                     f"{sum(r['status'] == 'misplaced' for r in rows)} at the wrong place, "
                     f"{sum(r['status'] == 'zero' for r in rows)} scored 0 for a reason, {sum(r['late'] for r in rows)} "
                     f"late, {sum(bool(r['not_scored']) for r in rows)} with a check the grader could not score. "
                     f"Names are in students.csv (or run with --names).</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_submissions_csv(course: str | Path, lessons: Iterable[str], dest: str | Path,
                          known: Iterable[str] | None = None, roster: Any = None) -> Path:
    """Beside grades.csv: one line per student and lesson with ``status`` (graded, zero for a reason, missing, or
    misplaced with the ``move`` to make), the score, the reason, the files set aside and each item's outcome, so that
    a 0 and a notebook never handed in are different things in a spreadsheet. ``known`` and ``roster``: see
    :func:`collect`."""
    dest = Path(dest)
    dest.write_text(_students_csv(collect(course, lessons, roster=roster, known=known)))
    return dest


def write(report: dict, out: str | Path, names: bool = False) -> list[Path]:
    """Save ``report`` (:func:`collect`) in ``out``: report.json, items.csv, students.csv and report.html (students
    named only when ``names``). Returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"report.json": json.dumps(report, indent=1, sort_keys=True) + "\n", "items.csv": _items_csv(report),
             "students.csv": _students_csv(report), "report.html": _html(report, names)}
    for name, text in files.items():
        (out / name).write_text(text)
    return [out / name for name in files]


def format_text(report: dict, top: int = 5) -> str:
    """A few lines for the terminal: per lesson the ``top`` items the most students lost points on, each with its
    named mistakes (most common first) and how many were not scored."""
    lines = []
    for les in report["lessons"]:
        lines.append(f"{les['lesson']}: {les['graded']} graded, {les['zero']} zero for a reason, {les['missing']} missing"
                     + (f", {les['misplaced']} misplaced" if les.get("misplaced") else ""))
        for r in les["items"][:top]:
            if not r["lost_by"]:
                break
            named = ", ".join(f"{label} ({n})" for label, n in r["mistakes"].items())
            lines.append(f"  {r['item']:>4} lost by {r['lost_by']} of {les['graded']}: {r['blank']} blank, "
                         f"{r['not_scored']} not scored" + (f"; named mistakes: {named}" if named else ""))
    return "\n".join(lines)
