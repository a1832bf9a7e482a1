"""What a submission folder may hold, what the grader refuses, what it sets aside, and what sits in the wrong place.

A submission is data, looked at before nbgrader touches it (nbgrader copies what it finds, following links, as the
user who grades). Three kinds of thing can sit in ``submitted/<student>/<lesson>/``:

- **the lesson's files**: ``<lesson>.ipynb`` and any file the lesson's release folder ships (:func:`lesson_files`).
  Only these reach the sandboxed kernel (coursekit.guard.GuardedExecute) and a grading worker;
- **nbgrader's own files**: ``timestamp.txt`` (when it was handed in) and ``submission_secret.txt`` (what
  ``nbgrader release_feedback`` names the feedback by), which ``nbgrader submit`` and ``nbgrader collect`` add
  (:data:`NBGRADER_FILES`);
- **anything else**: regular files a student's download, zip or LMS added (``notes.txt``, ``.ipynb_checkpoints/``,
  ``__MACOSX/``). They are *ignored*: kept out of the sandbox, named in the feedback
  (:class:`TidyAutograded`) and in ``submissions.csv``, removed from the autograded copy (so that nothing of them
  reaches the feedback folder, which ``nbgrader release_feedback`` hands out), and never a reason for 0 points.

What is *refused* (0 points, the reason in the feedback and the score table; :func:`refusal`) is what cannot be
read as data without trusting it: a symbolic or hard link, a device, pipe or socket, a file over
:data:`MAX_FILE_BYTES`, a folder over :data:`MAX_FOLDER_BYTES` or :data:`MAX_ENTRIES` entries.

:func:`misplaced` finds what sits where no lesson folder is (``ana/00/``, a notebook outside any lesson folder, a
lesson folder inside another folder, a lesson folder doubled by unzipping), each with the move that fixes it.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from nbformat.notebooknode import NotebookNode
from traitlets import Unicode

from nbgrader.preprocessors import NbGraderPreprocessor

#: A submitted file larger than this is refused (a lesson's notebook with its outputs is well under 10 MB).
MAX_FILE_BYTES = 32 << 20
#: A submission folder holding more than this, all files together, is refused.
MAX_FOLDER_BYTES = 64 << 20
#: A submission folder with more files and folders than this is refused (a lesson needs one).
MAX_ENTRIES = 256
#: Files nbgrader itself adds to a submission folder: ``nbgrader submit`` writes the time it was handed in and the
#: secret that names its feedback, and ``nbgrader collect`` copies both into ``submitted/``.
NBGRADER_FILES = ("timestamp.txt", "submission_secret.txt")
#: Written by the course's ``nbgrader collect`` (coursekit.exchange.LinkSafeCollect) in place of the symbolic links
#: it did not copy: their paths, one per line. A folder holding it is refused like one holding a link.
LINKS_NOT_COLLECTED = "links-not-collected.txt"


def lesson_files(release: Path | None, aid: str) -> set[str]:
    """The files of a submission of ``aid`` that the grader reads (relative paths): its notebook and the files the
    lesson's release folder ships (``release/<aid>/``). Nothing else of the folder reaches the sandbox."""
    names = {f"{aid}.ipynb"}
    folder = None if release is None else Path(release) / aid
    if folder is not None and folder.is_dir():
        names |= {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}
    return names


def refusal(folder: Path) -> str | None:
    """Why ``folder`` is not plain data (plain words for the student), looked at without following any link: the
    folder is a link; it holds a symbolic or hard link, a device, pipe or socket, a file over :data:`MAX_FILE_BYTES`,
    more than :data:`MAX_FOLDER_BYTES` in all or more than :data:`MAX_ENTRIES` entries. None when it is plain data."""
    folder = Path(folder)
    if folder.is_symlink() or folder.parent.is_symlink():
        return ("your submission folder is a symbolic link. Hand in the lesson's folder itself, with the notebook "
                "file in it.")
    marker = folder / LINKS_NOT_COLLECTED
    if marker.is_file() and not marker.is_symlink():
        try:
            with open(marker, "rb") as f:
                head = f.read(2048)
            lines = head.decode("utf-8", "replace").splitlines()
            names = [n for n in (lines[:-1] if len(head) == 2048 else lines) if n.strip()]  # no name cut in two
        except OSError:
            names = []
        said = f" ({shown(names, 3)})" if names else ""
        return (f"it held a symbolic link or another entry that is not a file{said}, which nbgrader collect did not "
                "copy: hand in the files themselves (the notebook saved by Jupyter), not links to them.")
    total = entries = 0
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted([*dirnames, *filenames]):
            entries += 1
            if entries > MAX_ENTRIES:
                return (f"it holds more than {MAX_ENTRIES} files and folders. Hand in the lesson's notebook, not a "
                        "whole folder tree.")
            p = Path(dirpath) / name
            rel = p.relative_to(folder).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                return (f"it holds a symbolic link ({rel}), which the grader does not follow: hand in the files "
                        "themselves (the notebook saved by Jupyter), not links to them.")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                return f"it holds {rel}, which is not a regular file (a device, pipe or socket): hand in files only."
            if st.st_nlink != 1:
                return (f"{rel} is a hard link to another file: hand in the files themselves (the notebook saved by "
                        "Jupyter), not links to them.")
            if st.st_size > MAX_FILE_BYTES:
                return (f"{rel} is {st.st_size >> 20} MB, more than the {MAX_FILE_BYTES >> 20} MB a submitted file may "
                        "have (clear the notebook's outputs, or leave large files out).")
            total += st.st_size
            if total > MAX_FOLDER_BYTES:
                return (f"its files hold more than {MAX_FOLDER_BYTES >> 20} MB together (clear the notebook's outputs, "
                        "or leave large files out).")
    return None


def ignored(folder: Path, aid: str, release: Path | None = None) -> list[str]:
    """The files of the submission in ``folder`` that the grader sets aside (relative paths, sorted): every file
    that is neither one of :func:`lesson_files` nor one of nbgrader's own (:data:`NBGRADER_FILES`). A folder of
    them is named once, with a slash (``.ipynb_checkpoints/``)."""
    keep = lesson_files(release, aid) | set(NBGRADER_FILES)
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(folder).as_posix()
            if rel not in keep:
                top, _, rest = rel.partition("/")
                out.add(f"{top}/" if rest and not any(k.startswith(top + "/") for k in keep) else rel)
    return sorted(out)


def shown(names: list[str], most: int = 5) -> str:
    """``names`` joined for a sentence, the first ``most`` of them and how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def nested_notebook(folder: Path, aid: str) -> str | None:
    """Where ``<aid>.ipynb`` sits when it is not directly in ``folder`` but in a folder inside it (a lesson folder
    doubled by unzipping: ``<aid>/<aid>.ipynb``), as a path relative to ``folder``; None otherwise."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / f"{aid}.ipynb").is_file():
        return None
    found = sorted(p.relative_to(folder).as_posix() for p in folder.glob(f"*/{aid}.ipynb") if p.is_file())
    found += sorted(p.relative_to(folder).as_posix() for p in folder.glob(f"*/*/{aid}.ipynb") if p.is_file())
    return next((f for f in found if not f.startswith(".")), None)


def check(folder: Path, aid: str, release: Path | None = None) -> str | None:
    """Why the submission in ``folder`` cannot be autograded (plain words for the student), or None.

    Refused first (:func:`refusal`), and for a ``timestamp.txt`` nbgrader cannot parse (nbgrader stops on it). Then the
    notebook must be ``<aid>.ipynb`` directly in the folder (one a folder
    too deep is named, :func:`nested_notebook`; a renamed one too), non-empty, UTF-8 JSON that nbformat reads, and
    the lesson's own notebook (its answer and check cells). Other files are not a reason (:func:`ignored`)."""
    folder = Path(folder)
    why = refusal(folder)
    if why is not None:
        return why
    stamp = nbgrader_file(folder, "timestamp.txt")
    if stamp is not None and stamp.strip():
        from nbgrader.utils import parse_utc

        try:
            parse_utc(stamp.strip())
        except Exception:  # noqa: BLE001  (nbgrader itself stops on it with an AttributeError: say what it is)
            return ("its timestamp.txt (nbgrader's record of when it was handed in) is not a time nbgrader can read. "
                    "Hand it in again with nbgrader submit, or without that file.")
    nb_path = folder / f"{aid}.ipynb"
    if not nb_path.is_file():
        deeper = nested_notebook(folder, aid)
        if deeper:
            return (f"your notebook is one folder too deep ({deeper}; unzipped into a folder of its own?). The grader "
                    f"reads {aid}/{aid}.ipynb: the instructor can move it up one level and grade again.")
        others = sorted(p.name for p in folder.glob("*.ipynb"))
        if others:
            return (f"no notebook named {aid}.ipynb was handed in (found {', '.join(others)}). The grader only reads "
                    f"{aid}.ipynb: rename your notebook back to that name and hand it in again.")
        return f"no notebook named {aid}.ipynb was handed in. Hand in the lesson's notebook, {aid}.ipynb."
    raw = nb_path.read_bytes()
    if not raw.strip():
        return f"{aid}.ipynb is an empty file ({len(raw)} bytes): it holds no notebook. Save the notebook in Jupyter and hand it in again."
    cells = release_cells(release, aid)
    why = too_many_cells(_cells_in(raw, cells), cells)
    if why is not None:  # counted while parsing, which stops one cell past the limit; nbformat never reads it
        return why
    import nbformat

    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    except UnicodeDecodeError:
        return f"{aid}.ipynb is not a text file (it is not UTF-8), so it is not a notebook. Hand in the .ipynb file Jupyter saves."
    except Exception as e:
        kind = "is not JSON" if "JSON" in type(e).__name__ or "json" in str(e).lower()[:200] else "is not a notebook nbformat can read"
        return (f"{aid}.ipynb {kind} ({type(e).__name__}: {str(e).splitlines()[0][:120]}). It may have been edited in a "
                f"text editor or cut short. Open it in Jupyter, save it, and hand it in again.")
    return _not_this_lesson(nb, aid)


#: A submission may have this many times the release notebook's cells, and :data:`EXTRA_CELLS` more, before it is
#: refused (a student adds a few scratch cells; 200,000 empty cells cost the grading process minutes and a gigabyte).
CELLS_FACTOR = 3
EXTRA_CELLS = 200
#: The cell limit when the release notebook is not at hand (every lesson has fewer than 200 cells).
MAX_CELLS = 1000


def cell_limit(release: int | None) -> int:
    """The most cells a submission may have, given the release notebook's ``release`` cells (None: unknown)."""
    return MAX_CELLS if release is None else CELLS_FACTOR * release + EXTRA_CELLS


class _Enough(Exception):
    pass


def _cells_in(raw: bytes, release: int | None) -> int:
    """How many objects with a ``cell_type`` key the JSON ``raw`` holds (its cells, whatever escapes spell the key),
    counted while parsing; the parse stops one past :func:`too_many_cells`'s limit, so a notebook of a million cells
    costs no more than one at the limit. 0 when ``raw`` is not JSON (check says why afterwards)."""
    import json

    limit = cell_limit(release)
    seen = 0

    def hook(pairs):
        nonlocal seen
        if any(k == "cell_type" for k, _ in pairs):
            seen += 1
            if seen > limit:
                raise _Enough
        return None  # nothing is kept: the count is all

    try:
        json.loads(raw, object_pairs_hook=hook)
    except _Enough:
        pass
    except (ValueError, RecursionError):
        return 0
    return seen


def release_cells(release: Path | None, aid: str) -> int | None:
    """How many cells the release notebook ``release/<aid>/<aid>.ipynb`` has, or None when there is none."""
    import json

    path = None if release is None else Path(release) / aid / f"{aid}.ipynb"
    if path is None or not path.is_file():
        return None
    try:
        return len(json.loads(path.read_text()).get("cells", []))
    except (OSError, ValueError, AttributeError):
        return None


def too_many_cells(count: int, release: int | None) -> str | None:
    """Why a notebook of ``count`` cells is refused, given the release notebook's ``release`` cells (None: unknown,
    :data:`MAX_CELLS` applies), or None."""
    limit = cell_limit(release)
    if count <= limit:
        return None
    return (f"the notebook has more than {limit} cells, and the lesson's has "
            f"{release if release is not None else 'far fewer'}: that is not a submission the grader runs. Start again "
            "from the lesson's notebook, answer it, and hand it in.")


def _not_this_lesson(nb, aid: str) -> str | None:
    """Why a readable notebook is not a submission of ``aid``: it has no cells, or none of the lesson's answer cells
    (nbgrader would restore the missing cells and grade a blank lesson, with a traceback for every check), and then
    which lesson's notebook it is, when its first heading or cells say so."""
    if not nb.cells:
        return (f"{aid}.ipynb is a notebook with no cells in it: nothing to grade. Open the lesson's notebook in Jupyter, "
                f"answer it, save it, and hand it in again.")
    ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells}
    ids.discard(None)
    checks = {m.group(1)[:2] for c in nb.cells if c.cell_type == "code"
              for m in re.finditer(r"""grade\(\s*["'](\d\d)\.""", c.source)}
    if ids and checks and aid[:2] not in checks:
        other = sorted(checks)[0]
        return (f"{aid}.ipynb holds lesson {other}'s notebook, not lesson {aid[:2]}'s (its checks are lesson {other}'s). "
                f"Hand in lesson {aid[:2]}'s notebook under this name.")
    if not ids:
        return (f"{aid}.ipynb has none of the lesson's answer and check cells (it is not the lesson's notebook, or they "
                f"were deleted). Start again from the lesson's notebook, answer it, and hand it in.")
    return None


# --------------------------------------------------------------------------- student names

#: Characters a student's folder name may not hold: nbgrader's glob patterns (it finds ``submitted/<student>/<lesson>``
#: with :func:`glob.glob`, so ``*`` would match every student and ``[a]lice`` another one) and path separators.
NAME_PATTERN_CHARS = "*?[]/\\"


#: Letters that show as nothing (Hangul fillers, the blank Braille pattern): a name of them looks empty or like another.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def name_problem(name: str) -> str | None:
    """Why ``name`` (a folder of ``submitted/``) cannot be a student's id, in plain words, or None when it can: it is
    empty, starts or ends with a space, starts with ``.`` or ``-``, is not in Unicode's NFC form, or holds a glob
    character or separator (:data:`NAME_PATTERN_CHARS`), a line break or another control or formatting character
    (Unicode category C: a right-to-left override would make a table lie), a space other than U+0020 or an
    invisible letter, or no letter or digit at all. A student id is data: nbgrader would read such a name as a
    pattern, or a table would show another name."""
    import unicodedata

    if any(unicodedata.category(c).startswith("C") for c in name):
        return "the folder's name holds a line break or another control character"
    bad = sorted({c for c in name if c in NAME_PATTERN_CHARS})
    if bad:
        return (f"the folder's name holds {' '.join(bad)}, which nbgrader reads as a pattern matching other students' "
                "folders")
    if not name or name != name.strip():
        return "the folder's name is empty or starts or ends with a space"
    if name[0] in ".-":
        return "the folder's name starts with . or - (a hidden folder, or one a command would read as an option)"
    if unicodedata.normalize("NFC", name) != name:
        return "the folder's name is not in Unicode's composed form (NFC): another folder can look the same"
    if any((unicodedata.category(c) == "Zs" and c != " ") or c in _BLANK_LETTERS for c in name) \
            or not any(c.isalnum() for c in name):
        return "the folder's name holds an invisible character, or no letter or digit"
    return None


def shown_name(name: str) -> str:
    """``name`` for a table or a message: control and formatting characters written as escapes (``\\n``,
    ``\\u202e``), nothing else changed."""
    import unicodedata

    return "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c).startswith("C") else c
                   for c in name)


def safe_name(name: str) -> str:
    """A name :func:`name_problem` accepts, made from ``name`` (its refused characters as ``-``) for the rename the
    instructor is told to make."""
    import unicodedata

    name = unicodedata.normalize("NFC", name)
    out = "".join("-" if c in NAME_PATTERN_CHARS or c in _BLANK_LETTERS or unicodedata.category(c).startswith("C")
                  or (unicodedata.category(c) == "Zs" and c != " ") else c for c in name)
    out = out.strip().lstrip(".-").strip()
    return out if any(c.isalnum() for c in out) else "student"


def student_folders(submitted: Path) -> list[Path]:
    """The folders of ``submitted`` whose names are student ids (:func:`name_problem` accepts them), sorted."""
    if not Path(submitted).is_dir():
        return []
    return sorted(p for p in Path(submitted).iterdir() if p.is_dir() and name_problem(p.name) is None)


# --------------------------------------------------------------------------- in the wrong place


@dataclass(frozen=True)
class Misplaced:
    """Something in ``submitted/`` that no lesson folder holds, so nothing of it was graded: ``student``, ``where``
    (its path under ``submitted/``), ``lesson`` (the lesson it seems to be, or "") and ``move`` (what the instructor
    does about it, one sentence)."""

    student: str
    where: str
    lesson: str
    move: str
    why: str = ""  # set when the place is not the reason (a student folder whose name is refused)

    @property
    def text(self) -> str:
        """One line for the score table."""
        if self.why:
            return f"{self.where} was not graded: {self.why}. {self.move[0].upper() + self.move[1:]}, then grade again."
        what = (f"{self.where} is not a lesson folder, so nothing in it was graded" if self.where.endswith("/") and
                not self.where.endswith(f"{self.lesson}/{self.lesson}/") else
                f"{self.where} is a lesson folder inside the lesson's folder, so it was not graded"
                if self.where.endswith("/") else f"{self.where} sits outside any lesson folder, so it was not graded")
        return f"{what}: {self.move}, then grade again."

    def __str__(self) -> str:
        return self.text


def misplaced(submitted: Path, lessons: Iterable[str]) -> list[Misplaced]:
    """What in ``submitted`` (``<student>/<lesson>/``) no lesson folder holds, each with what to do: a folder named by
    a lesson's number or another name of it (``00/``, ``lesson-02``), a notebook directly in the student's folder,
    a lesson folder nested one level too deep, a lesson folder doubled by unzipping (``<lesson>/<lesson>/``).
    Nothing in it was graded; the instructor moves it and grades again. ``lessons``: every lesson id of the course
    (the student may have handed in any of them)."""
    known = list(lessons)
    out: list[Misplaced] = []
    submitted = Path(submitted)
    if not submitted.is_dir():
        return out

    def lesson_of(name: str) -> str | None:
        digits = re.sub(r"\D", "", name.split("-", 1)[0]) or re.sub(r"\D", "", name)[:2]
        return next((k for k in known if digits and k.startswith(f"{int(digits):02d}-")), None) if digits else None

    for student in sorted(p for p in submitted.iterdir() if p.is_dir() and not p.is_symlink()):
        problem = name_problem(student.name)
        if problem is not None:  # nothing of it is graded; each lesson folder in it is listed under its lesson
            who = shown_name(student.name)
            move = f"rename the folder {who!r} to a plain name (e.g. {safe_name(student.name)!r})"
            found = [e.name for e in sorted(student.iterdir()) if e.is_dir() and e.name in known]
            if student.name.startswith(".") and not found:
                continue  # a hidden folder (.ipynb_checkpoints) holding no lesson: not a student's
            for aid in found or [""]:
                out.append(Misplaced(who, f"{who}/{aid + '/' if aid else ''}", aid, move, why=problem))
            continue
        for entry in sorted(student.iterdir()):
            if entry.name.startswith("."):
                continue
            where = f"{student.name}/{entry.name}"
            if entry.name in known:
                deeper = nested_notebook(entry, entry.name) if entry.is_dir() and not entry.is_symlink() else None
                if deeper:
                    inner = deeper.rsplit("/", 1)[0]
                    out.append(Misplaced(student.name, f"{where}/{inner}/", entry.name,
                                         f"move what {where}/{inner}/ holds up one level, into {where}/"))
                continue
            if entry.is_dir() and not entry.is_symlink():
                inner = [q.name for q in entry.iterdir() if q.is_dir() and q.name in known]
                guess = inner[0] if inner else lesson_of(entry.name)
                if guess is None:
                    for nb in entry.glob("*.ipynb"):
                        guess = lesson_of(nb.stem)
                        if guess:
                            break
                todo = (f"move {where}/{guess} up one level, to {student.name}/{guess}" if inner else
                        f"rename it to {student.name}/{guess}" if guess else
                        f"it names no lesson: put each notebook at {student.name}/<lesson>/<lesson>.ipynb")
                out.append(Misplaced(student.name, f"{where}/", guess or "", todo))
            elif entry.suffix == ".ipynb":
                guess = lesson_of(entry.stem)
                todo = (f"move it to {student.name}/{guess}/{guess}.ipynb" if guess else
                        f"put it at {student.name}/<lesson>/<lesson>.ipynb")
                out.append(Misplaced(student.name, where, guess or "", todo))
    return out


# --------------------------------------------------------------------------- what nbgrader's exchange needs


def nbgrader_file(submitted: Path | None, name: str) -> str | None:
    """The text of nbgrader's file ``name`` (:data:`NBGRADER_FILES`) in the submission folder ``submitted``, when it is
    one that can be read as data on its own: a regular file, no link of any kind, at most 4 kB. None otherwise."""
    if submitted is None:
        return None
    p = Path(submitted) / name
    try:
        st = p.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > 4096:
        return None
    return p.read_text(errors="replace")


def releasable(folder: Path, submitted: Path | None) -> None:
    """Make ``folder`` (a feedback folder ``feedback/<student>/<lesson>/``, or the autograded copy nbgrader makes the
    feedback from) one that ``nbgrader release_feedback`` can release: it reads ``timestamp.txt`` and
    ``submission_secret.txt`` beside every feedback page and stops, for the whole class, at the first folder without
    them. Each is copied from the submission folder ``submitted`` when it is plain data there (:func:`nbgrader_file`:
    what ``nbgrader collect`` brought, so that the student's ``fetch_feedback`` finds the page); a submission handed in
    another way gets the time it was graded and a fresh secret (its feedback is then released under a name only the
    course's own copy knows)."""
    from datetime import datetime, timezone

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in NBGRADER_FILES:
        dest = folder / name
        if dest.is_file() and not dest.is_symlink():
            continue
        text = nbgrader_file(submitted, name)
        if text is None:
            text = (datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f %Z") if name == "timestamp.txt"
                    else secrets.token_hex(64))
        dest.unlink(missing_ok=True)
        dest.write_text(text)


# --------------------------------------------------------------------------- the note in the feedback


def inert_markdown(name: str, most: int = 80) -> str:
    """Text a student chose (a file name, a reason that quotes one), as markdown that renders as that text and nothing
    else: no HTML, link, emphasis or line break (the instructor's formgrader renders the cell); cut after ``most``
    characters."""
    import html

    name = "".join(ch if ch.isprintable() else "?" for ch in name)
    name = name if len(name) <= most else name[:most] + "…"
    return re.sub(r"([\\`*_{}\[\]()+\-.!|~>])", r"\\\1", html.escape(name, quote=False))


#: The id of the first cell of the autograded copy a submission scored 0 for a reason gets instead of a graded one
#: (coursekit.course.record_zero): the release notebook, with the reason in that cell.
ZERO_CELL_ID = "coursekit-scored-zero"


def scored_zero(notebook: Path) -> bool:
    """Whether the autograded notebook ``notebook`` is the copy a 0 for a reason leaves (:data:`ZERO_CELL_ID`), not a
    graded one (an autograde run since, such as the formgrader's button, replaces it)."""
    import json

    try:
        cells = json.loads(Path(notebook).read_text()).get("cells") or []
    except (OSError, ValueError, AttributeError):
        return False
    return bool(cells) and isinstance(cells[0], dict) and cells[0].get("id") == ZERO_CELL_ID


#: The id of the cell :class:`TidyAutograded` puts at the top of an autograded notebook.
NOTE_CELL_ID = "coursekit-ignored-files"


class TidyAutograded(NbGraderPreprocessor):
    """Last in the autograde pipeline, in the grading process (every route: coursekit grade, nbgrader autograde, the
    formgrader's button). nbgrader has copied every file of the submission folder into the autograded copy, from
    which its feedback step copies them on into ``feedback/``, where ``nbgrader release_feedback`` hands out every
    ``.html`` file to the student. So:

    - the files the grader set aside (:func:`ignored`) are removed from the autograded copy: they never reach the
      feedback folder (a set-aside ``.html`` would be released to the student as if it were feedback);
    - a markdown cell at the top of the autograded notebook names them, which the formgrader shows and the feedback
      page starts with;
    - the autograded copy holds nbgrader's ``timestamp.txt`` and ``submission_secret.txt`` (:func:`releasable`), so
      feedback generated from it later (the formgrader's "Generate Feedback") can still be released."""

    release_directory = Unicode("", help="The course's release folder (lessons/): the files a lesson's release folder "
                                          "ships are the lesson's, not set aside.").tag(config=True)

    def preprocess(self, nb, resources):
        folder = Path((resources.get("metadata") or {}).get("path") or "")
        info = resources.get("nbgrader") or {}
        aid = str(info.get("assignment") or resources.get("unique_key") or "")
        nb.cells = [c for c in nb.cells  # an earlier run's note (a plain markdown cell of that id; nothing graded)
                    if not (c.get("id") == NOTE_CELL_ID and c.get("cell_type") == "markdown"
                            and not (c.get("metadata") or {}).get("nbgrader"))]
        release = Path(self.release_directory) if self.release_directory else None
        names = ignored(folder, aid, release) if folder.is_dir() and aid else []
        dest = self._autograded(info)
        if dest is not None:
            for name in names:
                _remove_within(dest, name)
            releasable(dest, folder if folder.is_dir() else None)
        if names:
            nb.cells.insert(0, NotebookNode(
                cell_type="markdown", id=NOTE_CELL_ID, metadata={},
                source=f"**Set aside by the grader:** you handed in {shown([inert_markdown(n) for n in names])} with "
                       f"your notebook. Only `{aid}.ipynb` is graded; the grader did not read the rest, and it cost you "
                       f"nothing."))
        return nb, resources

    def _autograded(self, info: dict) -> Path | None:
        """The autograded copy nbgrader is writing (``autograded/<student>/<lesson>/``), from the course's config."""
        from nbgrader.coursedir import CourseDirectory

        sid, aid = info.get("student"), info.get("assignment")
        if not sid or not aid:
            return None
        cd = CourseDirectory(config=self.config)
        dest = Path(cd.format_path(cd.autograded_directory, sid, aid))
        return dest if dest.is_dir() else None


class SubmissionRefused(Exception):
    """The submission folder is not plain data (:func:`refusal`): nbgrader's autograde of it stops here."""


class RefuseUnsafe(NbGraderPreprocessor):
    """First in the autograde pipeline: stop nbgrader's own autograde (a plain ``nbgrader autograde``, the formgrader's
    button) of a submission folder that :func:`refusal` refuses, with the reason in nbgrader's log and the
    formgrader's error. nbgrader then removes the autograded copy it began (it had copied the folder's other files,
    following links), so nothing a link pointed to reaches a feedback folder. ``coursekit grade`` refuses such a
    folder before nbgrader runs, and scores it 0 with the reason in the student's feedback."""

    release_directory = Unicode("", help="The course's release folder (lessons/): a notebook of many more cells than the "
                                          "lesson's is refused (too_many_cells).").tag(config=True)

    def preprocess(self, nb, resources):
        folder = Path((resources.get("metadata") or {}).get("path") or "")
        info = resources.get("nbgrader") or {}
        student = str(info.get("student") or "")
        why = name_problem(student) if student else None
        if why is None:
            why = refusal(folder) if folder.is_dir() else None
        if why is None:
            release = Path(self.release_directory) if self.release_directory else None
            why = too_many_cells(len(nb.cells), release_cells(release, str(info.get("assignment") or "")))
        if why is not None:
            raise SubmissionRefused(f"refused: {why} (coursekit grade scores it 0 with this reason in the feedback)")
        return nb, resources


def _remove_within(folder: Path, rel: str) -> None:
    """Remove ``folder/rel`` (a file, or a folder with what it holds) without following a link, and nothing outside
    ``folder``."""
    import shutil

    target = folder / rel.rstrip("/")
    try:
        if not target.resolve().is_relative_to(folder.resolve()) or target == folder:
            return
    except OSError:
        return
    if target.is_symlink() or target.is_file():
        target.unlink(missing_ok=True)
    elif target.is_dir():
        shutil.rmtree(target, ignore_errors=True)


__all__ = ["MAX_FILE_BYTES", "MAX_FOLDER_BYTES", "MAX_ENTRIES", "NBGRADER_FILES", "ZERO_CELL_ID", "scored_zero", "Misplaced", "RefuseUnsafe", "SubmissionRefused", "TidyAutograded",
           "check", "ignored", "inert_markdown", "lesson_files", "misplaced", "nbgrader_file", "nested_notebook", "refusal",
           "releasable", "shown"]
