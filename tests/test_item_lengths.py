"""No keyed option gives itself away by its length (issue class: "the key is the longest option, carrying its own
'because …'"). Every single-answer choice item of every lesson, counted (key in the instructor's key file) or formative
(key in the item table): its options are read from the lesson's markdown, as the student sees them."""

from __future__ import annotations

import importlib
import json
import re
from collections import Counter
from pathlib import Path

import nbformat
import pytest

from coursekit import course
from coursekit.grading import Choice

ROOT = Path(__file__).resolve().parents[1]
LESSONS = course.lesson_ids(ROOT)

#: At most this share of the items may have their key as the strictly longest option (a third: with four options of
#: unrelated lengths a key is the longest about a quarter of the time).
LONGEST_SHARE = 1 / 3
#: ... and at least this share: keys that are never the longest give themselves away the other way (a student learns to
#: drop the longest option).
LEAST_SHARE = 1 / 8
#: No key may be longer than this many times the longest other option.
MOST_RATIO = 1.5
#: No letter may be the key of more than this share of the items, nor of fewer than LEAST_LETTER_SHARE (with four
#: options an even spread is a quarter each): answering one letter everywhere must score about what guessing scores.
MOST_LETTER_SHARE = 0.30
LEAST_LETTER_SHARE = 0.20
#: In a lesson with at least this many single-answer items, no one letter may be the key of more than half of them.
LESSON_RUN = 4


def _options(source: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*[-*]\s*([a-h])\)\s*(.+?)\s*$", source, re.M))


def single_answer_items(kind: str = "lessons") -> list[tuple[str, str, str, dict[str, str]]]:
    """(lesson, item, key, {letter: option text}) for every single-answer choice whose options the lesson lists
    (``kind``: "lessons", what students get, or "solutions", their source)."""
    out = []
    for lid in LESSONS:
        nn = lid[:2]
        table = importlib.import_module(f"coursekit.grading.lessons.lesson{nn}").ITEMS
        key_file = ROOT / "autograder" / "keys" / f"{nn}.json"
        counted = json.loads(key_file.read_text())["keys"] if key_file.is_file() else {}
        nb = nbformat.read(ROOT / kind / lid / f"{lid}.ipynb", as_version=4)
        markdown = [c.source for c in nb.cells if c.cell_type == "markdown"]
        for item, spec in table.items():
            if not isinstance(spec, Choice) or spec.multi:
                continue
            key = spec.key if spec.formative else counted.get(item)
            cell = next((m for m in markdown if re.search(rf"\*\*{item[0].upper()}{item[1:]}\b", m)), None)
            opts = _options(cell or "")
            if isinstance(key, str) and key in opts and len(opts) >= 2:
                out.append((nn, item, key, opts))
    return out


ITEMS = single_answer_items()


def _ratio(key: str, opts: dict[str, str]) -> float:
    return len(opts[key]) / max(len(v) for k, v in opts.items() if k != key)


def test_the_items_are_found():
    assert len(ITEMS) >= 40, len(ITEMS)


def test_the_key_is_the_longest_option_about_as_often_as_chance_makes_it():
    longest = [f"{nn}.{item}" for nn, item, key, opts in ITEMS if _ratio(key, opts) > 1]
    assert LEAST_SHARE * len(ITEMS) <= len(longest) <= LONGEST_SHARE * len(ITEMS), (
        f"the key is the longest option in {len(longest)} of {len(ITEMS)} items: {', '.join(longest)}")


def test_the_key_is_seldom_the_shortest_option():
    shortest = [f"{nn}.{item}" for nn, item, key, opts in ITEMS
                if len(opts[key]) < min(len(v) for k, v in opts.items() if k != key)]
    assert len(shortest) <= LONGEST_SHARE * len(ITEMS), (
        f"the key is the shortest option in {len(shortest)} of {len(ITEMS)} items: {', '.join(shortest)}")


def test_no_letter_is_the_key_much_more_often_than_the_others():
    """Lengths aside, the key's letter must not give it away: when the key was b in half of the items, answering b
    everywhere scored half of the single-answer points."""
    letters = sorted({k for _, _, _, opts in ITEMS for k in opts})
    assert all(len(opts) == 4 for _, _, _, opts in ITEMS), "the bounds below assume four options per item"
    counts = Counter(key for _, _, key, _ in ITEMS)
    for letter in letters:
        assert LEAST_LETTER_SHARE * len(ITEMS) <= counts[letter] <= MOST_LETTER_SHARE * len(ITEMS), (
            f"{letter} is the key of {counts[letter]} of {len(ITEMS)} single-answer items "
            f"({dict(sorted(counts.items()))}): reorder some items' options")


def test_no_lesson_keys_most_of_its_items_with_one_letter():
    per_lesson: dict[str, Counter] = {}
    for nn, _, key, _ in ITEMS:
        per_lesson.setdefault(nn, Counter())[key] += 1
    runs = {nn: c for nn, c in per_lesson.items()
            if sum(c.values()) >= LESSON_RUN and c.most_common(1)[0][1] > sum(c.values()) / 2}
    assert not runs, f"one letter keys most of a lesson's single-answer items: {runs}"


@pytest.mark.parametrize("nn, item, key, opts", ITEMS, ids=[f"{nn}.{item}" for nn, item, _, _ in ITEMS])
def test_no_key_stands_out_by_its_length(nn, item, key, opts):
    assert _ratio(key, opts) <= MOST_RATIO, (
        f"{nn}.{item}: the key ({key}) has {len(opts[key])} characters, "
        f"{_ratio(key, opts):.2f} times the longest other option")


if __name__ == "__main__":  # a report for authors: python tests/test_item_lengths.py [solutions|lessons] [NN ...]
    import sys

    kind = sys.argv[1] if len(sys.argv) > 1 else "solutions"
    only = set(sys.argv[2:])
    items = single_answer_items(kind)
    longest = [f"{nn}.{item}" for nn, item, key, opts in items if _ratio(key, opts) > 1]
    for nn, item, key, opts in items:
        if not only or nn in only:
            flag = "TOO LONG" if _ratio(key, opts) > MOST_RATIO else ("longest" if _ratio(key, opts) > 1 else "")
            print(f"{nn}.{item:4s} key {key}  ratio {_ratio(key, opts):4.2f}  {flag}")
    print(f"key strictly longest in {len(longest)} of {len(items)} "
          f"(from {LEAST_SHARE * len(items):.0f} to {int(LONGEST_SHARE * len(items))} allowed)")
    print("key letters:", dict(sorted(Counter(key for _, _, key, _ in items).items())),
          f"(each from {LEAST_LETTER_SHARE * len(items):.0f} to {int(MOST_LETTER_SHARE * len(items))} allowed)")


# ----------------------------------------------------------------------------- no key printed above its question


def _numeric_keys():
    from coursekit.capstone import CacheMiss
    from coursekit.grading import Numeric

    for lid in LESSONS:
        table = importlib.import_module(f"coursekit.grading.lessons.lesson{lid[:2]}").ITEMS
        for item, spec in table.items():
            if isinstance(spec, Numeric):
                try:
                    value = spec.expected() if callable(spec.expected) else spec.expected
                except (TypeError, CacheMiss):  # a key computed from the student's own run (the machine's thread
                    continue                       # count, the capstone's results): no fixed number to give away
                yield lid, item, float(value)


def _spellings(value: float) -> set[str]:
    """How a lesson would write ``value`` if it gave it away: an integer of four or more digits with and without
    thousands separators, a fraction to four significant digits (shorter spellings occur everywhere by chance)."""
    if value == int(value) and abs(value) >= 1000:
        return {f"{int(value):,}", f"{int(value)}", f"{int(value):_}"}
    text = f"{value:.4g}"
    digits = text.replace("-", "").replace(".", "").lstrip("0")
    return {text} if len(digits) >= 4 and "e" not in text else set()


_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,_]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def distinctive(value: float) -> bool:
    """Whether a key is a number a printed output would not show by chance: not an integer below 1000, and three or
    more significant digits."""
    if value == int(value) and abs(value) < 1000:
        return False
    return len(f"{value:.6g}".split("e")[0].replace("-", "").replace(".", "").lstrip("0")) >= 3


def printed_keys(nb, item: str, value: float) -> list[str]:
    """The numbers that cells above ``item``'s question print (their outputs in the executed notebook ``nb``) and that
    equal ``value`` to the 3 or more significant digits they are printed with: what a student would read off."""
    label = rf"\*\*{item[0].upper()}{item[1:]}\b"
    at = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and re.search(label, c.source)), None)
    assert at is not None, f"no question for {item}"
    found = []
    for i, cell in enumerate(nb.cells[:at]):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            for m in _NUMBER.finditer(text):
                digits = m.group(0).lower().split("e")[0].replace("-", "").replace(",", "").replace("_", "")
                if len(digits.replace(".", "").lstrip("0")) < 3:
                    continue
                x = float(m.group(0).replace(",", "").replace("_", ""))
                half_ulp = 0.5 * 10.0 ** (-len(digits.split(".")[1])) if "." in digits else 0.5
                if "e" not in m.group(0).lower() and abs(x - value) <= half_ulp:
                    found.append(f"cell {i} prints {m.group(0)}")
                elif "e" in m.group(0).lower() and abs(x - value) <= 5e-3 * abs(value):
                    found.append(f"cell {i} prints {m.group(0)}")
    return found


def test_printed_keys_finds_a_rounded_key_and_nothing_else():
    nb = nbformat.v4.new_notebook()
    shows = nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output("stream", text="the ratio is 2.934, 1,184.9 MB and 8.05e-09\n")])
    nb.cells = [shows, nbformat.v4.new_markdown_cell("**P2.** What is it?")]
    assert printed_keys(nb, "p2", 2.93428015) == ["cell 0 prints 2.934"]
    assert printed_keys(nb, "p2", 1184.89088) == ["cell 0 prints 1,184.9"]
    assert printed_keys(nb, "p2", 8.050040e-09) == ["cell 0 prints 8.05e-09"]
    assert printed_keys(nb, "p2", 2.9351) == [] and printed_keys(nb, "p2", 1185.2) == []


@pytest.mark.parametrize("lid, item, value", list(_numeric_keys()), ids=lambda x: str(x)[:24])
def test_no_numeric_key_is_written_above_its_question(lid, item, value):
    """The number a numeric item asks for does not appear in the lesson (prose or code) before the item's question."""
    nb = nbformat.read(ROOT / "lessons" / lid / f"{lid}.ipynb", as_version=4)
    label = rf"\*\*{item[0].upper()}{item[1:]}\b"
    at = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and re.search(label, c.source)), None)
    assert at is not None, f"{lid}: no question for {item}"
    above = "\n".join(c.source for c in nb.cells[:at])
    shown = [s for s in _spellings(value) if re.search(rf"(?<![\d.,_]){re.escape(s)}(?![\d_]|[.,]\d)", above)]
    assert not shown, f"{lid[:2]}.{item}: its key {shown[0]} is written above the question"
