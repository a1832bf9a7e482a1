"""Answer keys of the items that count live with the instructor, never in the package or the release notebooks.

Counted choice, ordering and keyed numeric items need a key; function items need the seed of their hidden,
randomized cases; wrong choices have hints that explain them. None of that ships in ``coursekit``
(the warm-ups, worth 0 points, are the deliberate exception: their keys and explanations sit in their
``Choice`` declarations, see :class:`coursekit.grading.Choice`):
it sits in one JSON file per lesson in the instructor's key folder, ``autograder/keys/NN.json``::

    {"seed": SEED,                  # int: the hidden cases' generator seed
     "keys": {ITEM: LETTER,         # one letter; a list of letters for a multi-choice item
              ITEM: [LABEL, ...],   # an ordering: the step labels in order, or several accepted orders:
              ITEM: {"order": [LABEL, ...], "also": [[LABEL, ...], ...], "note": TEXT,
                     "critical": [LABEL or [LABEL, LABEL], ...]}},   # optional: steps (or one relation
                                                     # of two steps) whose place is all or nothing
     "hints": {ITEM: {LETTER: TEXT, ...},    # a choice: why an option is wrong, or why the key holds (every
                                            # option of a single choice; every option, true or false, of a multi-select)
               ITEM: {LABEL: TEXT, ...}}}   # an ordering: why each step takes its place (every label)

The grading process finds the folder through the environment variable ``COURSEKIT_KEYS``:
``coursekit grade``, ``autograder/nbgrader_config.py`` and the test suite point it at
``autograder/keys``. A kernel started in the course repository itself (self-study with the whole course) finds
the repository's ``autograder/keys`` while the variable is unset, so its practice checks explain a wrong answer;
``COURSEKIT_KEYS=`` (set, empty) says "no keys here" even there. No kernel that runs a student's code holds the keys: a student's machine has
neither the variable nor the folder, and in the autograde run ``coursekit.guard.GuardedExecute``
starts the kernel without the variable, in a sandbox that hides the folder. There a check only hands
the answer over, and ``coursekit.guard.ScoreAnswers`` scores it in the grading process, which alone
holds the keys and the hidden cases' seed. A kernel started with the variable (an instructor's own notebook) checks keys directly.

Instructors::

    coursekit keys show 02     # print lesson 02's key file
    coursekit keys check       # every keyed item has a key, and nothing else
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV = "COURSEKIT_KEYS"
SEED_ENV = "COURSEKIT_SEED"  # the one thing the grading kernel gets: the lesson's hidden-case seed


class KeysUnavailable(LookupError):
    """No instructor key folder here (a student's machine), or it lacks this lesson."""


#: The folder this ``coursekit`` was imported from belongs to: the course repository when it is a checkout of it
#: (an editable install, or the repository on ``sys.path``); an installed package's is site-packages' parent.
REPOSITORY = Path(__file__).resolve().parents[2]


def env_dir() -> Path | None:
    """The folder ``$COURSEKIT_KEYS`` names, or None when the variable is unset or empty."""
    d = os.environ.get(ENV, "").strip()
    return Path(d).expanduser() if d else None


def repository_keys() -> Path | None:
    """``autograder/keys`` of the course repository this package was imported from (:data:`REPOSITORY`), when it
    has one and no autograde run is under way (``NBGRADER_EXECUTION=autograde``); else None. A self-study student
    who works in the repository has the keys on disk anyway: their checks may as well explain."""
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        return None
    d = REPOSITORY / "autograder" / "keys"
    return d if d.is_dir() else None


def key_dir() -> Path | None:
    """The key folder in use: the one ``$COURSEKIT_KEYS`` names; when the variable is unset, the course repository's
    own (:func:`repository_keys`, outside an autograde run); None when the variable is set but empty (an explicit
    "no keys here") or neither exists. The kernel of the autograde run never gets the variable, runs with
    ``NBGRADER_EXECUTION=autograde`` and in a sandbox that hides the repository (coursekit.guard): no keys there."""
    if ENV not in os.environ:
        return repository_keys()
    return env_dir()


def available(lesson: str) -> bool:
    """True when the key file of ``lesson`` (e.g. "02") can be read here."""
    d = key_dir()
    return d is not None and (d / f"{lesson}.json").is_file()


_FROZEN: dict[str, str] = {}  # lesson → the key file's text as read when a grading run started


def freeze(lessons) -> None:
    """Read the key files of ``lessons`` once, now: for the rest of this grading run :func:`load` answers from
    this copy, so a submission's code that rewrites a key file on disk cannot change its own score or a
    later student's. :func:`changed_on_disk` tells whether anything did."""
    for lesson in lessons:
        load(lesson)  # raises if missing or invalid
        _FROZEN[lesson] = (key_dir() / f"{lesson}.json").read_text()


def thaw() -> list[str]:
    """End of a grading run: forget the copy; return the key files that changed on disk meanwhile."""
    changed = changed_on_disk()
    _FROZEN.clear()
    return changed


def changed_on_disk() -> list[str]:
    """The frozen key files whose text on disk is no longer what :func:`freeze` read (changed or gone)."""
    out = []
    for lesson, text in _FROZEN.items():
        path = key_dir() / f"{lesson}.json" if key_dir() else None
        try:
            now = path.read_text() if path else None
        except OSError:
            now = None
        if now != text:
            out.append(str(path))
    return out


def load(lesson: str) -> dict[str, Any]:
    """Lesson ``lesson``'s key file, read now, or during a grading run the copy :func:`freeze` read at its start
    (never an older cache: code that edits a key file cannot change the keys a later check reads). Returns ``{"seed": int, "keys": {item: key}, "hints": {item: {option: text}}}``.

    Raises KeysUnavailable naming ``$COURSEKIT_KEYS`` when the folder is not set, does not exist or lacks the
    lesson; ValueError when the file is not a valid key file.
    """
    d = key_dir()
    if d is None:
        raise KeysUnavailable(f"no answer keys here: ${ENV} is not set. Keys live with the instructor "
                              f"(autograder/keys/); `coursekit grade` sets ${ENV} for the autograde run.")
    path = d / f"{lesson}.json"
    if lesson not in _FROZEN and not path.is_file():
        have = ", ".join(sorted(p.stem for p in d.glob("*.json"))) if d.is_dir() else f"the folder {d} does not exist"
        raise KeysUnavailable(f"no answer keys for lesson {lesson!r}: {path} is missing (${ENV}={d}; found: {have or 'none'}).")
    try:
        data = json.loads(_FROZEN[lesson] if lesson in _FROZEN else path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable JSON key file: {e}") from e
    if not (isinstance(data, dict) and isinstance(data.get("seed"), int) and isinstance(data.get("keys"), dict)):
        raise ValueError(f"{path} must hold a JSON object with an int \"seed\" and a \"keys\" object; see coursekit.grading.keys.")
    data.setdefault("hints", {})
    return data


def main(argv: list[str] | None = None) -> int:
    """``coursekit keys show NN`` / ``coursekit keys check`` (instructors)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="coursekit keys", description="Show or check the instructor's answer keys ($COURSEKIT_KEYS).")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="print one lesson's key file")
    s.add_argument("lesson")
    sub.add_parser("check", help="check that every keyed item of every lesson has a key, and no key names a missing item")
    a = p.parse_args(argv)
    try:
        if a.cmd == "show":
            print(json.dumps(load(a.lesson), indent=1, ensure_ascii=False))
            return 0
        from . import key_problems

        problems = key_problems()
        print("\n".join(problems) if problems else f"every keyed item has a key ({key_dir()}).")
        return 1 if problems else 0
    except (KeysUnavailable, ValueError) as e:
        print(f"coursekit keys: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
