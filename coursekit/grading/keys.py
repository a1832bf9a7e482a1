"""Answer keys, stored encoded so that no key sits in the package or the lessons as plain text.

A key file ``keys/<lesson>.key`` is ``base64(zlib(json) XOR pad)`` with a pad derived from the lesson
id. This keeps keys out of a casual read and out of text search; it is not cryptography (issue
"The grader under fire" hardens it). Instructors edit keys with::

    coursekit keys show 02             # print the JSON
    coursekit keys write 02 keys.json  # encode a JSON object into keys/02.key

A key file holds one JSON object: item id → key (a letter, a list of letters, a list of step
labels) plus ``"seed"``, the integer seed of the lesson's hidden cases.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

KEY_DIR = Path(__file__).with_name("keys")


def _pad(lesson: str, n: int) -> bytes:
    out, block = b"", hashlib.sha256(f"coursekit-keys:{lesson}".encode()).digest()
    while len(out) < n:
        out += block
        block = hashlib.sha256(block).digest()
    return out[:n]


def encode(lesson: str, keys: dict) -> str:
    raw = zlib.compress(json.dumps(keys, sort_keys=True).encode())
    return base64.b64encode(bytes(a ^ b for a, b in zip(raw, _pad(lesson, len(raw))))).decode() + "\n"


def decode(lesson: str, text: str) -> dict:
    raw = base64.b64decode(text.strip())
    return json.loads(zlib.decompress(bytes(a ^ b for a, b in zip(raw, _pad(lesson, len(raw))))))


@lru_cache(maxsize=None)
def load(lesson: str) -> dict[str, Any]:
    """The decoded keys of one lesson (e.g. ``"02"``). Raises FileNotFoundError naming the file."""
    path = KEY_DIR / f"{lesson}.key"
    if not path.exists():
        have = ", ".join(sorted(p.stem for p in KEY_DIR.glob("*.key")))
        raise FileNotFoundError(f"no answer keys for lesson {lesson!r} ({path} does not exist); lessons with keys: {have}.")
    return decode(lesson, path.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coursekit.grading.keys", description="Show or write a lesson's encoded answer keys.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show"); s.add_argument("lesson")
    w = sub.add_parser("write"); w.add_argument("lesson"); w.add_argument("json_file", help="JSON object, or - for stdin")
    a = p.parse_args(argv)
    if a.lesson.isdigit():
        a.lesson = f"{int(a.lesson):02d}"
    if a.cmd == "show":
        print(json.dumps(load(a.lesson), indent=2, sort_keys=True))
    else:
        src = sys.stdin.read() if a.json_file == "-" else Path(a.json_file).read_text()
        (KEY_DIR / f"{a.lesson}.key").write_text(encode(a.lesson, json.loads(src)))
        print(f"wrote {KEY_DIR / f'{a.lesson}.key'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
