"""A wrong number or array says which section to reread: every counted Numeric and Array item (lesson 03's config
item included) names a heading of its lesson, under the top-level part it names (or a top-level part itself), and its feedback ends with it
when the answer is a well-formed wrong one that no named mistake explains (not when it is right or malformed,
nor after a named mistake's own message)."""

from __future__ import annotations

import re

import nbformat
import pytest

from coursekit.grading import Array, Numeric, check, lesson_items
from conftest import ROOT  # tests/conftest.py

LESSONS = [f"{i:02d}" for i in range(20)]
ITEMS = [(n, i, it) for n in LESSONS for i, it in lesson_items(n).items() if isinstance(it, (Numeric, Array)) and it.points]


def _headings(lesson: str) -> list[tuple[int, str]]:
    (path,) = (ROOT / "lessons").glob(f"{lesson}-*/{lesson}-*.ipynb")
    return [(len(m.group(1)), m.group(2).strip()) for c in nbformat.read(path, as_version=4).cells
            if c.cell_type == "markdown" for m in re.finditer(r"^(#+) (.+)$", c.source, re.M)]


def test_there_are_value_items_to_check():
    assert len(ITEMS) >= 30


@pytest.mark.parametrize("num, iid, item", ITEMS, ids=[f"{n}.{i}" for n, i, _ in ITEMS])
def test_every_value_item_names_a_section_of_its_lesson(num, iid, item):
    m = re.fullmatch(r"Reread '(.+?)'(?: in (.+))?\.", item.reread)
    assert m, f"{num}.{iid}: reread is {item.reread!r}, not \"Reread '<section>' in <part>.\""
    section, part = m.groups()
    heads = _headings(num)
    at = next((k for k, (_, text) in enumerate(heads) if text.startswith(section)), None)
    assert at is not None, f"{num}.{iid}: no heading of lesson {num} starts with {section!r}"
    if part is None:  # a part of its own ("Reread 'Real-world reps'.")
        assert heads[at][0] == 2, (num, iid, section, heads[at])
        return
    above = next(text for level, text in reversed(heads[: at + 1]) if level == 2)
    assert above.startswith(part), (num, iid, section, above)


def test_a_wrong_number_ends_with_its_section_and_nothing_else_does():
    item = lesson_items("17")["p1"]
    right = item.expected()
    assert check("17.p1", right).full and not any("Reread" in line for line in check("17.p1", right).lines)
    wrong = check("17.p1", right * 3.7 + 11)
    assert not wrong.full and wrong.lines[-1] == item.reread
    assert not any(item.reread in line for line in check("17.p1", "lots").lines)   # malformed: its form, no section
    for m in item.mistakes():  # a named mistake explains itself (a unit or rounding slip needs no section)
        fb = check("17.p1", m.value)
        assert fb.lines[0].endswith(m.message) and not any(item.reread in line for line in fb.lines), fb.lines


def test_a_wrong_array_ends_with_its_section():
    item = lesson_items("05")["p6"]
    want = item.expected()
    import numpy as np

    fb = check("05.p6", np.asarray(want, dtype=float) + 1.0)
    assert not fb.full and fb.lines[-1] == item.reread
    for malformed in (None, np.full(np.shape(want), np.nan)):
        assert not any(item.reread in line for line in check("05.p6", malformed).lines)
    low = check("05.p6", np.asarray(want, dtype=np.float16))  # right formula, too few bits: the dtype is the fault
    assert not low.full and any("Compute in float64" in line for line in low.lines), low.lines
    assert not any(item.reread in line for line in low.lines), low.lines


def test_the_right_numbers_in_another_shape_get_no_section():
    """A flat list for a 1 × 2 row, or the transpose, is a slip of form: the checker names the shape, and the lesson's
    section would send a student who computed the right numbers back to reread it. Wrong numbers in a wrong shape
    still end with the section."""
    import numpy as np

    for iid in ("05.p6",):  # (06.p4 was the other 1 × 2 row; it now asks for a number)
        item = lesson_items(iid[:2])[iid[3:]]
        want = np.asarray(item.expected(), dtype=float)
        assert want.ndim == 2 and want.shape[0] == 1 and want.size > 1, (iid, want.shape)
        for reshaped in (want.reshape(-1).tolist(), want.T.copy(), want.reshape(-1, 1)):
            fb = check(iid, reshaped)
            assert not fb.full and not any(item.reread in line for line in fb.lines), (iid, np.shape(reshaped), fb.lines)
        fb = check(iid, (want.reshape(-1) * 3 + 1).tolist())
        assert not fb.full and fb.lines[-1] == item.reread, (iid, fb.lines)


def test_a_malformed_config_gets_its_form_and_no_section():
    """Lesson 03's config item: a well-formed wrong config ends with its section, a malformed one only says its form."""
    item = lesson_items("03")["p5"]
    for bad in ({}, {"rank_pattern": "x"}, {"rank_pattern": {1: 2}, "alpha_pattern": {}}):
        assert not any(item.reread in line for line in check("03.p5", bad).lines), bad
    wrong = check("03.p5", {"rank_pattern": {}, "alpha_pattern": {}})
    assert not wrong.full and sum(item.reread in line for line in wrong.lines) == 1, wrong.lines


def test_a_flat_row_keeps_its_note_and_the_section_last():
    """14.p4 reads a flat list as the 1 × m row it stands for, with a note; the section to reread stays the last line."""
    import numpy as np

    item = lesson_items("14")["p4"]
    flat = (np.asarray(item.expected(), dtype=float).reshape(-1) * 3 + 1).tolist()
    fb = check("14.p4", flat)
    assert not fb.full and fb.lines[-1] == item.reread, fb.lines
    assert any("is flat" in line for line in fb.lines[:-1]), fb.lines
