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


def measured_dequantizations(first_input_needs_grad=False):
    """Count the native dequantize calls of one forward and backward through two frozen NF4 weights in a row, each
    with a trainable adapter beside it (00.p3's set-up), with the probe's recorder on bitsandbytes' CPU library."""
    import torch
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from coursekit import probes

    g = torch.Generator().manual_seed(0)
    (q1, s1), (q2, s2) = (F.quantize_4bit(torch.randn(64, 64, generator=g), blocksize=64, quant_type="nf4")
                          for _ in range(2))
    A1, A2 = (torch.randn(64, 4, generator=g).requires_grad_() for _ in range(2))
    B1, B2 = (torch.zeros(4, 64).requires_grad_() for _ in range(2))
    x = torch.randn(3, 64, generator=g).requires_grad_(first_input_needs_grad)
    calls, fallback = [], []
    with probes._spies(calls, fallback):
        h = bnb.matmul_4bit(x, q1.t(), quant_state=s1) + (x @ A1) @ B1
        y = bnb.matmul_4bit(h, q2.t(), quant_state=s2) + (h @ A2) @ B2
        y.sum().backward()
    assert B1.grad.abs().sum() > 0 and A2.grad is not None  # both adapters received their gradients
    return sum("dequantize" in c for c in calls) + len(fallback)


RIGHT = {
    "w1": "b", "w2": "a", "w3": "b", "p1": {"a", "c"}, "p2": "b", "p5": {"a"},
    "p3": 3,
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
    ("p3", 4, "x is data and needs none"),
    ("p3", 2, "counts the forward pass only"),
    ("p3", 1, "rebuilds both weights first"),
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
    return RIGHT[item]


def test_p3_key_is_what_bitsandbytes_does_here():
    """The key counts what the installed bitsandbytes does: two forward dequantizations and one backward one (W₁'s
    input is data, so backward skips it); with an input that needs a gradient, W₁ is rebuilt in backward too."""
    from coursekit.grading.lessons.lesson00 import _dequant_count

    assert measured_dequantizations() == ITEMS["p3"].expected() == RIGHT["p3"] == 3
    assert measured_dequantizations(first_input_needs_grad=True) == _dequant_count(first_input_needs_grad=True) == 4


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
