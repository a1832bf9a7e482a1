"""Lesson 00's graded items: right answers score full, typical wrong answers score less and say why,
with and without the autograder's hidden cases; notebook points equal item points."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from coursekit.grading import check
from coursekit.grading.lessons.lesson00 import ITEMS

NB = Path(__file__).resolve().parents[1] / "solutions" / "00-setup-and-probes" / "00-setup-and-probes.ipynb"


def right_pack(codes):
    q = np.asarray(codes).astype(np.int64)
    if q.size % 2:
        q = np.concatenate([q, [0]])
    return ((q[0::2] << 4) | q[1::2]).astype(np.uint8)


def low_first_pack(codes):
    q = np.asarray(codes).astype(np.int64)
    if q.size % 2:
        q = np.concatenate([q, [0]])
    return ((q[1::2] << 4) | q[0::2]).astype(np.uint8)


def int64_pack(codes):
    return right_pack(codes).astype(np.int64)


def no_pad_pack(codes):
    q = np.asarray(codes).astype(np.int64)
    n = q.size // 2 * 2
    return ((q[0:n:2] << 4) | q[1:n:2]).astype(np.uint8)


def _threads():
    import torch

    return torch.get_num_threads()


RIGHT = {
    "w1": "b", "w2": "a", "w3": "b", "p1": {"a", "c"}, "p2": "b", "p5": {"a"},
    "p3": None,  # filled at test time from the machine
    "p4": right_pack,
    "p6": 576 * 1536 // 2 + 576 * 1536 // 64 * 4,
    "p7": ["lookup", "default", "dequant", "linear", "again"],
}

# item, wrong answer, text the feedback must contain
WRONG = [
    ("w1", "a", "not an error"),
    ("w1", "c", "Nothing moves to a GPU"),
    ("w2", "b", "not 4"),
    ("w2", "c", "two 4-bit codes, not four"),
    ("w3", "a", "can be fewer than os.cpu_count()"),
    ("w3", "c", "binds Python code, not torch's C++ kernels"),
    ("p1", {"a", "b"}, "C++ CPU kernel"),
    ("p1", {"a", "c", "d"}, "LUT quantizer"),
    ("p1", {"c"}, "whatever the weight's shape"),
    ("p2", "a", "same shape and dtype"),
    ("p2", "d", "may round the last bits differently"),
    ("p5", {"a", "b"}, "575 rows change nothing"),
    ("p5", {"c"}, "575, is odd"),
    ("p6", 576 * 1536 // 2, "add one fp32 absmax"),
    ("p6", 576 * 1536 + 576 * 1536 // 64 * 4, "half a byte"),
    ("p6", 576 * 1536 // 2 + 576 * 1536 // 64, "as double quantization does"),
    ("p6", 576 * 1536 // 2 + 576 * 1536 // 128 * 4, "one absmax per 64 bytes"),
    ("p6", 576 * 1536 * 4, "number of bits"),
    ("p6", 576 * 1536 * 2, "bf16"),
    ("p6", "lots", "single number"),
    ("p7", ["default", "lookup", "dequant", "linear", "again"], "position 1"),
    ("p4", low_first_pack, "LOW nibble"),
    ("p4", no_pad_pack, "pad with one 0 code"),
    ("p4", int64_pack, "dtype is int64"),
    ("p4", 42, "should be a function"),
]


def right(item):
    return _threads() if item == "p3" else RIGHT[item]


def test_every_item_has_a_right_answer_here():
    assert set(ITEMS) == set(RIGHT)


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item", sorted(RIGHT))
def test_right_answers_score_full(item, hidden):
    fb = check(f"00.{item}", right(item), hidden=hidden)
    assert fb.full, fb.text()
    assert fb.points == ITEMS[item].points


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item,answer,text", WRONG)
def test_wrong_answers_score_less_and_teach(item, answer, text, hidden):
    fb = check(f"00.{item}", answer, hidden=hidden)
    assert not fb.full, fb.text()
    assert text in fb.text(), fb.text()


def test_p3_wrong_thread_count():
    fb = check("00.p3", _threads() + 1, hidden=False)
    assert fb.points == 0 and "not right" in fb.text()


def test_p4_hidden_cases_catch_a_hard_coded_answer():
    table = {(1, 2): [0x12], (15, 0, 3, 9): [0xF0, 0x39], (7, 8, 5): [0x78, 0x50], tuple(range(16)): right_pack(np.arange(16))}

    def hard_coded(codes):
        return np.asarray(table.get(tuple(int(c) for c in codes), [0]), dtype=np.uint8)

    public = check("00.p4", hard_coded, hidden=False)
    graded = check("00.p4", hard_coded, hidden=True)
    assert public.full
    assert graded.points < ITEMS["p4"].points / 2, graded.text()
    assert "hidden case" in graded.text()


def test_p4_stub_scores_zero():
    def stub(codes):
        raise NotImplementedError()

    fb = check("00.p4", stub, hidden=True)
    assert fb.points == 0 and "NotImplementedError" in fb.text()


def test_notebook_points_match_items():
    nb = json.loads(NB.read_text())
    graded = {}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("grade"):
            src = "".join(cell["source"])
            item = src.split('grade("00.')[1].split('"')[0]
            graded[item] = meta["points"]
            assert meta["grade_id"] == f"{item}_test" and meta["locked"]
            assert src.count("grade(") == 1, "a test cell is one call (after its import)"
    assert graded == {k: v.points for k, v in ITEMS.items()}
    assert not any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


def test_p3_is_scored_against_what_the_students_kernel_saw_not_the_grader():
    """The thread count depends on the machine and the thread settings the notebook ran under (a grading worker
    runs kernels with one thread, a serial run with the machine's): the grading process scores it against what the
    student's own kernel saw, which travels with the answer, so every way of grading gives the same points."""
    from coursekit import protocol
    from coursekit.grading import score_record

    def record(answer, seen):
        return {"item": "00.p3", "answer": protocol.encode(answer), "seen": seen}

    here = _threads()
    other = here + 3  # a kernel that ran with other settings than this grading process
    fb = score_record("00.p3", record(other, {"torch_threads": other, "cpu_count": 64}))
    assert fb.full, fb.text()
    fb = score_record("00.p3", record(here, {"torch_threads": other, "cpu_count": 64}))
    assert fb.points == 0 and "not right" in fb.text(), fb.text()
    fb = score_record("00.p3", record(64, {"torch_threads": other, "cpu_count": 64}))
    assert fb.points == 0 and "os.cpu_count()" in fb.text() and fb.mistakes == ["os"], fb.text()
    for seen in (None, {}, {"torch_threads": "4", "cpu_count": 8}, {"torch_threads": 10**9, "cpu_count": 8},
                 {"torch_threads": True, "cpu_count": 8}):  # nothing usable reached the grader
        rec = record(here, seen)
        fb = score_record("00.p3", rec)
        assert fb.points == 0 and "did not reach the grader" in fb.text(), (seen, fb.text())


def test_every_value_answer_carries_what_the_kernel_saw():
    from coursekit.grading import SEEN, answer_record, seen_here

    rec = answer_record("00.p3", 2)
    assert set(rec["seen"]) == set(SEEN) and rec["seen"] == seen_here()
