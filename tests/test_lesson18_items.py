"""Lesson 18 ("GGUF"): graded items score right answers fully, typical wrong answers less, with the
diagnostics a student needs; the references agree with gguf.quants; the notebook matches the registry."""

from pathlib import Path

import nbformat
import numpy as np
import pytest

from coursekit.grading import check
from coursekit.grading.lessons import lesson18
from coursekit.grading.lessons.lesson18 import ITEMS

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "18-gguf" / "18-gguf.ipynb"


def _fields(block_bytes):
    b = np.asarray(block_bytes, dtype=np.uint8).reshape(-1, 20)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    return b, d, m, b[:, 4:]


def right_dequantize(block_bytes):
    b, d, m, qs = _fields(block_bytes)
    return d * np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) + m


def right_input_grad(D, packed):
    return D @ right_dequantize(packed).astype(np.float64).reshape(packed.shape[0], -1)


RIGHT = {"w1": "d", "w2": "c", "w3": 0.015, "p1": {"b", "c", "d"}, "p2": right_dequantize, "p3": right_input_grad,
         "p4": ["norms", "attn_v", "attn_v_q8_0", "attn_output", "up_gguf", "token_embd", "up_bf16"], "p5": "c", "p6": 0.0785 * 15 / 31, "p7": "a"}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def test_notebook_loads_no_model():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "load_model(" not in src and "from_pretrained(" not in src


# --------------------------------------------------------------------------- references


def test_references_agree_with_gguf_on_hidden_cases():
    rng = np.random.default_rng(0)
    for case in list(ITEMS["p2"].public()) + list(ITEMS["p2"].hidden(rng)):
        b = case.kwargs["block_bytes"]
        ours = lesson18.dequantize_q4_1(b)
        theirs = gguf.quants.dequantize(b, gguf.GGMLQuantizationType.Q4_1).reshape(-1, 32)
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    for case in list(ITEMS["p3"].public()) + list(ITEMS["p3"].hidden(rng)):
        D, packed = case.kwargs["D"], case.kwargs["packed"]
        W = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q4_1).astype(np.float64)
        np.testing.assert_allclose(lesson18.q4_1_input_grad(D, packed), D @ W, rtol=1e-12)


def test_readable_public_block():
    w = lesson18.dequantize_q4_1(ITEMS["p2"].public()[0].kwargs["block_bytes"])[0]
    np.testing.assert_array_equal(w[:16], 0.5 * np.arange(16) - 4)
    np.testing.assert_array_equal(w[16:], 0.5 * (15 - np.arange(16)) - 4)


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"18.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_float64_and_torch_decoders_are_right_too():
    import torch

    def f64(block_bytes):
        b, d, m, qs = _fields(block_bytes)
        return d.astype(np.float64) * np.concatenate([qs & 0x0F, qs >> 4], axis=1) + m.astype(np.float64)

    def torch_dec(block_bytes):
        b = torch.from_numpy(np.asarray(block_bytes, dtype=np.uint8).reshape(-1, 20).copy())
        d = b[:, 0:2].contiguous().view(torch.float16).float()
        m = b[:, 2:4].contiguous().view(torch.float16).float()
        qs = b[:, 4:]
        return d * torch.cat([qs & 15, qs >> 4], dim=1).float() + m

    def pure_python(block_bytes):  # nested lists, struct-decoded float16 ('e'), Python floats
        import struct

        out = []
        for row in np.asarray(block_bytes, dtype=np.uint8):
            d, m = struct.unpack("<ee", bytes(row[:4]))
            out.append([d * (x & 15) + m for x in row[4:]] + [d * (x >> 4) + m for x in row[4:]])
        return out

    assert check("18.p2", f64, hidden=True).full
    assert check("18.p2", pure_python, hidden=True).full
    assert check("18.p2", torch_dec, hidden=True).full


def test_hidden_cases_are_deterministic_and_defeat_hard_coding():
    a = check("18.p2", right_dequantize, hidden=True).text()
    assert a == check("18.p2", right_dequantize, hidden=True).text() and a.count("hidden case") == 6
    publics = [c.kwargs["block_bytes"] for c in ITEMS["p2"].public()]

    def lookup(block_bytes):
        for b in publics:
            if b.shape == block_bytes.shape and np.array_equal(b, block_bytes):
                return right_dequantize(b)
        return np.zeros((len(block_bytes), 32), dtype=np.float32)

    assert check("18.p2", lookup, hidden=False).full
    assert check("18.p2", lookup, hidden=True).points == pytest.approx(4 * 3 / 9)


# --------------------------------------------------------------------------- wrong answers


def _decoder(order=None, with_m=True, center=0, swap_dm=False):
    def fn(block_bytes):
        b, d, m, qs = _fields(block_bytes)
        lo, hi = qs & 0x0F, qs >> 4
        if order == "interleaved":
            q = np.stack([lo, hi], axis=2).reshape(len(b), 32)
        elif order == "interleaved-hi":
            q = np.stack([hi, lo], axis=2).reshape(len(b), 32)
        elif order == "swapped":
            q = np.concatenate([hi, lo], axis=1)
        else:
            q = np.concatenate([lo, hi], axis=1)
        q = q.astype(np.float32) - center
        if swap_dm:
            d, m = m, d
        return d * q + (m if with_m else 0)
    return fn


def minus_m(block_bytes):
    b, d, m, qs = _fields(block_bytes)
    return d * np.concatenate([qs & 0x0F, qs >> 4], axis=1) - m


def signed_high(block_bytes):
    b, d, m, qs = _fields(block_bytes)
    s = qs.view(np.int8)
    return d * np.concatenate([s & 0x0F, s >> 4], axis=1) + m


def unshifted_high(block_bytes):
    b, d, m, qs = _fields(block_bytes)
    return d * np.concatenate([qs & 0x0F, qs & 0xF0], axis=1) + m


def float16_math(block_bytes):
    b = np.asarray(block_bytes, dtype=np.uint8).reshape(-1, 20)
    d, m, qs = b[:, 0:2].copy().view(np.float16), b[:, 2:4].copy().view(np.float16), b[:, 4:]
    return d * np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float16) + m


def bfloat16_result(block_bytes):
    import torch

    return torch.from_numpy(right_dequantize(block_bytes)).to(torch.bfloat16)


def bits_as_ints(block_bytes):
    b, _, _, qs = _fields(block_bytes)
    d = b[:, 0:2].copy().view(np.uint16).astype(np.float32)
    m = b[:, 2:4].copy().view(np.uint16).astype(np.float32)
    return d * np.concatenate([qs & 0x0F, qs >> 4], axis=1) + m


def big_endian(block_bytes):
    b, _, _, qs = _fields(block_bytes)
    d = b[:, 0:2].copy().view(">f2").astype(np.float32)
    m = b[:, 2:4].copy().view(">f2").astype(np.float32)
    return d * np.concatenate([qs & 0x0F, qs >> 4], axis=1) + m


def fp32_header(block_bytes):
    b = np.asarray(block_bytes, dtype=np.uint8).reshape(-1, 20)
    d = b[:, 0:4].copy().view(np.float32)
    m = b[:, 4:8].copy().view(np.float32)
    qs = b[:, 8:]
    return d * np.concatenate([qs & 0x0F, qs >> 4], axis=1) + m


@pytest.mark.parametrize(
    "fn, text",
    [
        (_decoder("interleaved"), "you interleaved the nibbles (byte j"),
        (_decoder("interleaved-hi"), "bitsandbytes' NF4 packing"),
        (_decoder("swapped"), "the other way round"),
        (_decoder(with_m=False), "you forgot the minimum m"),
        (_decoder(with_m=False, center=8), "you decoded Q4_0"),
        (_decoder(center=8), "you subtracted 8"),
        (_decoder(swap_dm=True), "you swapped d and m"),
        (bits_as_ints, "as integers (uint16)"),
        (big_endian, "big-endian"),
        (fp32_header, "you treated d (and m) as float32"),
        (minus_m, "you subtracted m"),
        (signed_high, "signed (int8) view"),
        (unshifted_high, "did not shift it down"),
        (float16_math, "you computed d·q + m in float16"),
        (bfloat16_result, "rounded to bfloat16"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_decoder_mistakes_lose_points_with_a_diagnosis(fn, text, hidden, capsys):
    fb = check("18.p2", fn, hidden=hidden)
    assert fb.points < 4 and text in fb.text(), fb.text()
    assert capsys.readouterr().err == ""  # misread bytes give inf/NaN: the grader must not warn on stderr


@pytest.mark.parametrize(
    "fn, text",
    [
        (lambda D, packed: D @ right_dequantize(packed).reshape(packed.shape[0], -1).T, "you multiplied by Ŵᵀ"),
        (lambda D, packed: np.zeros((D.shape[0], packed.shape[1] // 20 * 32)), "frozen is not detached"),
        (lambda D, packed: D @ _decoder("interleaved")(packed).reshape(packed.shape[0], -1), "your Ŵ is decoded wrongly: you interleaved"),
        (lambda D, packed: D @ _decoder(with_m=False)(packed).reshape(packed.shape[0], -1), "your Ŵ is decoded wrongly: you forgot the minimum"),
    ],
)
def test_input_grad_mistakes(fn, text, capsys):
    fb = check("18.p3", fn, hidden=True)
    assert fb.points < 3 and text in fb.text(), fb.text()
    assert capsys.readouterr().err == ""


def test_function_stub_and_non_function():
    def stub(block_bytes):
        raise NotImplementedError()

    assert check("18.p2", stub).points == 0
    fb = check("18.p2", "dequantize_q4_1")
    assert fb.points == 0 and "should be a function" in fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "each tensor in the file carries its own type"),
        ("w1", "c", "runs nothing"),
        ("w1", "b", "not a training state"),
        ("w2", "a", "has no offset"),
        ("w2", "b", "the middle of a bin of width d"),
        ("w2", "d", "takes d for the whole range"),
        ("p5", "a", "An average over weights counts weights, not tensors"),
        ("p5", "b", "only about a fifth of the weights are embedding weights"),
        ("p5", "d", "A Q4_1 weight costs 5 bits, not 4"),
        ("p7", "b", "add in quadrature, not linearly"),
        ("p7", "c", "a full fresh rounding"),
        ("p7", "d", "essentially NF4's own error"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"18.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


@pytest.mark.parametrize(
    "answer, text",
    [({"a", "b", "c", "d"}, "doubling the matrix costs more than the cheaper type saves"),
     ({"b", "c", "d", "e"}, "32 / 5.74 ≈ 5.57 times"),
     ({"b", "c", "d", "f"}, "0.1 is not a float16 number"),
     ({"b", "d"}, "(c) is missing from your set. True: a Q4_1 block holds 32 consecutive weights of one row"),
     ({"c", "d"}, "(b) is missing from your set. True: ffn_up is 1536 × 576")],
)
def test_multi_choice_partial_credit(answer, text):
    fb = check("18.p1", answer)
    assert 0 <= fb.points < 2 and text in fb.text(), fb.text()


def test_p1_key_is_each_statement_measured_in_the_file():
    """P1's key, measured on the course's own file and with gguf's reference quantizer: (a) the tensor bytes with the
    embedding untied into two Q4_1 matrices; (b) ffn_down's bytes against ffn_up's in every block; (c) every row of every
    Q4_1 tensor decoded from its own bytes against the whole tensor decoded; (d) the embedding's bytes against 13
    blocks' projections; (e) the F32 size against the file's tensor bytes; (f) a block of 32 weights of 0.1 quantized
    and decoded. Every number the hints quote is asserted too."""
    import json

    from coursekit import gguf_file as gf
    from coursekit import model as cmodel

    reader = gf.open_reader(cmodel.gguf_path())
    table = gf.tensor_table(reader)
    by_name = {t.name: t for t in table}
    n = sum(t.n_elements for t in table)
    n_bytes = sum(t.n_bytes for t in table)
    emb = by_name["token_embd.weight"]
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    emb_as_q4_1 = gguf.quants.quantize(np.zeros(emb.shape, dtype=np.float32), q4_1).nbytes
    untied = n_bytes - emb.n_bytes + 2 * emb_as_q4_1
    block_bytes = [sum(by_name[f"blk.{i}.{p}.weight"].n_bytes for p in gf.PROJECTIONS) for i in range(30)]

    def rows_decode_alone(t):
        full = gf.dequantize_q4_1(t.data).reshape(t.data.shape[0], -1)
        return all(np.array_equal(gf.dequantize_q4_1(t.data[r:r + 1]).reshape(-1), full[r]) for r in (0, t.data.shape[0] // 2, t.data.shape[0] - 1))

    constant = np.full(32, 0.1, dtype=np.float32)
    decoded = gguf.quants.dequantize(gguf.quants.quantize(constant, q4_1), q4_1)
    truth = {
        "a": untied < n_bytes,
        "b": all(by_name[f"blk.{i}.ffn_down.weight"].n_bytes == by_name[f"blk.{i}.ffn_up.weight"].n_bytes
                 and by_name[f"blk.{i}.ffn_down.weight"].shape[::-1] == by_name[f"blk.{i}.ffn_up.weight"].shape
                 for i in range(30)),
        "c": all(rows_decode_alone(t) for t in reader.tensors if t.tensor_type == q4_1 and t.name.startswith("blk.0.")),
        "d": emb.n_bytes > 13 * max(block_bytes),
        "e": 4 * n > 6 * n_bytes,
        "f": np.array_equal(decoded, constant),
    }
    keys = json.loads((ROOT / "autograder" / "keys" / "18.json").read_text())
    assert {k for k, v in truth.items() if v} == set(keys["keys"]["p1"]) == RIGHT["p1"]
    # (c) for every Q4_1 tensor, not only layer 0's: each row is a whole number of 32-weight blocks
    assert all(t.shape[-1] % 32 == 0 for t in table if t.type == "Q4_1")
    hints = keys["hints"]["p1"]
    assert f"{emb.n_bytes:,}" in hints["a"] and f"2 × {emb_as_q4_1:,} = {2 * emb_as_q4_1:,}" in hints["a"]
    up = by_name["blk.0.ffn_up.weight"]
    assert f"{up.n_elements:,} / 32 × 20 = {up.n_bytes:,}" in hints["b"]
    assert len(set(block_bytes)) == 1 and 8 * block_bytes[0] == 5 * 3_538_944
    assert (f"{block_bytes[0]:,} bytes" in hints["d"] and f"{13 * block_bytes[0]:,}" in hints["d"]
            and f"{14 * block_bytes[0]:,}" in hints["d"] and f"{emb.n_bytes:,}" in hints["d"])
    assert f"{32 / round(8 * n_bytes / n, 2):.2f}" in hints["e"] and abs(4 * n / n_bytes - 5.57) < 0.005
    assert f"{decoded[0]:.7f}" in hints["f"] and decoded[0] == np.float32(np.float16(0.1))


def test_ordering_names_the_first_misplaced_step():
    fb = check("18.p4", ["norms", "attn_v", "attn_v_q8_0", "attn_output", "up_gguf", "up_bf16", "token_embd"])   # bf16 taken as small
    assert 0 < fb.points < 2 and "at 16 bits instead of 8.5" in fb.text(), fb.text()
    fb = check("18.p4", ["attn_v", "norms", "attn_v_q8_0", "attn_output", "up_gguf", "token_embd", "up_bf16"])   # F32 taken as large
    assert 0 < fb.points < 2 and "more than all the F32 norms" in fb.text(), fb.text()
    fb = check("18.p4", ["norms", "attn_v", "attn_output", "attn_v_q8_0", "up_gguf", "token_embd", "up_bf16"])   # 8.5 bits taken to outweigh 3× the weights
    assert 0 < fb.points < 2 and "more than the v_projs would take even as Q8_0" in fb.text(), fb.text()
    fb = check("18.p4", ["norms", "attn_v", "attn_output", "up_gguf", "attn_v_q8_0", "token_embd", "up_bf16"])   # Q8_0 taken as large
    assert 0 < fb.points < 2 and "3 × 5 bits outweighs 8.5" in fb.text(), fb.text()


def test_p4_key_is_the_bytes_measured_in_the_file_and_on_route_one():
    """P4's key, measured: the GGUF tensors' bytes from the course's own file (the 30 o_proj, v_proj and up_proj
    tensors summed), the v_proj tensors' bytes as Q8_0 from gguf's reference Q8_0 quantizer run on each decoded v_proj
    (what the converter would have written), and the bf16 copies' bytes from the decoded up_proj tensors in bf16. The
    hints quote these sizes, and one block's share of each. The prompt's claim is checked too: of the seven sizes only
    the embedding's and the norms' are printed whole (the tensor table prints layer 0's tensors one by one). No piece is
    NF4: lesson 15 grades NF4's bits per parameter already."""
    import json

    import torch

    from coursekit import gguf_file as gf

    reader = gf.open_reader()
    by_name = {t.name: t for t in gf.tensor_table(reader)}
    raw = {t.name: t for t in reader.tensors}
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    v_q8_bytes, bf16_bytes = [], []
    for layer in range(30):
        v = gf.dequantize_tensor(raw[f"blk.{layer}.attn_v.weight"])
        assert v.shape == (192, 576) and by_name[f"blk.{layer}.attn_v.weight"].type == "Q4_1"
        v_q8_bytes.append(gguf.quants.quantize(np.ascontiguousarray(v, dtype=np.float32), q8_0).nbytes)
        up = torch.from_numpy(gf.dequantize_tensor(raw[f"blk.{layer}.ffn_up.weight"])).bfloat16()
        assert up.shape == (1536, 576) and by_name[f"blk.{layer}.ffn_up.weight"].type == "Q4_1"
        bf16_bytes.append(up.numel() * up.element_size())
    norms = [t for name, t in by_name.items() if name.endswith("norm.weight")]

    def all_30(kind):
        return sum(by_name[f"blk.{layer}.{kind}.weight"].n_bytes for layer in range(30))

    sizes = {
        "attn_v": all_30("attn_v"),
        "attn_v_q8_0": sum(v_q8_bytes),
        "attn_output": all_30("attn_output"),
        "norms": sum(t.n_bytes for t in norms),
        "token_embd": by_name["token_embd.weight"].n_bytes,
        "up_gguf": all_30("ffn_up"),
        "up_bf16": sum(bf16_bytes),
    }
    one_block = {"attn_v": by_name["blk.0.attn_v.weight"].n_bytes, "attn_v_q8_0": v_q8_bytes[0],
                 "attn_output": by_name["blk.0.attn_output.weight"].n_bytes,
                 "up_gguf": by_name["blk.0.ffn_up.weight"].n_bytes, "up_bf16": bf16_bytes[0]}
    assert set(sizes) == set(ITEMS["p4"].labels)
    assert len(norms) == 61 and all(t.type == "F32" for t in norms) and by_name["token_embd.weight"].type == "Q8_0"
    assert {name for name, t in by_name.items() if t.type == "F32"} == {t.name for t in norms}   # the F32 row the prompt cites
    # Q8_0 as the hints describe it, and as the file stores the embedding: 34 bytes per 32 weights, 8.5 bits per weight
    assert gguf.GGML_QUANT_SIZES[q8_0] == (32, 34) and gf.bits_per_weight("Q8_0") == 8.5
    assert by_name["token_embd.weight"].n_bytes == by_name["token_embd.weight"].n_elements * 34 // 32
    # the prompt: layer 0's q, k and gate tensors, printed in the table, have the shapes and types of its o, v and up
    for printed, asked in (("attn_q", "attn_output"), ("attn_k", "attn_v"), ("ffn_gate", "ffn_up")):
        a, b = by_name[f"blk.0.{printed}.weight"], by_name[f"blk.0.{asked}.weight"]
        assert (a.shape, a.type, a.n_bytes) == (b.shape, b.type, b.n_bytes)
    assert round(sizes["norms"] / one_block["attn_v"]) == 2                                   # "about two blocks' worth"
    order = sorted(sizes, key=sizes.get)
    ratios = [sizes[b] / sizes[a] for a, b in zip(order, order[1:])]
    assert min(ratios) > 1.2, sizes                                                # no near-tie
    keys = json.loads((ROOT / "autograder" / "keys" / "18.json").read_text())
    assert order == keys["keys"]["p4"] == RIGHT["p4"]
    hints = keys["hints"]["p4"]
    for label, n in sizes.items():                                               # each hint quotes its piece's bytes
        assert f"{n:,}" in hints[label], label
    for label, n in one_block.items():                                           # and one block's share
        assert f"{n:,}" in hints[label], label
    n_up = 30 * 1536 * 576
    assert f"{n_up:,}" in hints["up_bf16"] and n_up < by_name["token_embd.weight"].n_elements
    # the ratios the hints quote
    assert sizes["attn_v_q8_0"] / sizes["attn_v"] == 1.7 and "1.7 times their Q4_1 bytes" in hints["attn_v_q8_0"]
    assert round(sizes["up_gguf"] / sizes["attn_output"], 2) == 2.67 and "2.67 times the weights" in hints["attn_output"]
    assert by_name["blk.0.attn_output.weight"].n_elements == 3 * by_name["blk.0.attn_v.weight"].n_elements
    assert "NF4" not in "".join(ITEMS["p4"].labels.values()) + "".join(hints.values())


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w3", 0.02, "not right (tolerance"),
        ("p6", 0.05, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"18.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p6_key_is_gguf_q5_1_on_the_lessons_gaussian_and_the_step_estimate_predicts_it():
    """P6's key, run: gguf's reference Q5_1 quantizer on the lesson's Gaussian W (seed 18, N(0, 0.05²), 1536 × 576), 0.0379.
    The lesson's step estimate, Q4_1's measured error times 15/31 (the step d = (max − min) / 31 instead of / 15), lands
    within 0.1 % of it; the estimate applied to Q5_1's own stored d (32 · d² / 12 per block) within 5 %. Each named mistake
    is that arithmetic done the mistaken way on the measured Q4_1 error, and each is outside the 1 % tolerance."""
    from coursekit.grading.lessons.lesson18 import P6_RTOL, gguf_error, p6_weight

    W = p6_weight()
    np.testing.assert_array_equal(W, (0.05 * np.random.default_rng(18).standard_normal((1536, 576))).astype(np.float32))
    q41, q51 = gguf_error("Q4_1", W), gguf_error("Q5_1", W)
    assert ITEMS["p6"].expected() == q51 and round(q41, 4) == 0.0782 and round(q51, 4) == 0.0379
    assert abs(q41 * 15 / 31 / q51 - 1) < 1e-3 and check("18.p6", q41 * 15 / 31).full
    assert check("18.p6", RIGHT["p6"]).full and check("18.p6", round(q41, 3) * 15 / 31).full

    # the step estimate on Q5_1's own blocks: d in the first two bytes of each 24-byte block, 32 · d² / 12 per block
    t = gguf.GGMLQuantizationType.Q5_1
    packed = gguf.quants.quantize(W, t).reshape(-1, 24)
    d = packed[:, 0:2].copy().view(np.float16).astype(np.float64).ravel()
    estimate = np.sqrt(np.sum(32 * d**2 / 12)) / np.linalg.norm(W.astype(np.float64))
    assert abs(estimate / q51 - 1) < 0.05 and gguf.GGML_QUANT_SIZES[t] == (32, 24)    # the lesson checks Q4_1 to 5 %

    variants = {
        "you halved Q4_1's error": q41 / 2,
        "you scaled by (15/31)²": q41 * (15 / 31) ** 2,
        "you scaled by the storage cost": q41 * 5 / 6,
        "you scaled by the code widths": q41 * 4 / 5,
        "that is Q4_1's own error": q41,
    }
    for text, value in variants.items():
        assert abs(value / q51 - 1) > P6_RTOL
        fb = check("18.p6", value)
        assert fb.points == 0 and text in fb.text(), (text, value, fb.text())


def test_w2_key_is_gguf_s_q4_1_decoder_and_code_0_alone_does_not_settle_it():
    """W2's key, run: the options as the notebook prints them, evaluated on the stored d, m and codes of gguf's reference
    Q4_1 quantizer applied to the lesson's Gaussian W. The keyed decoder is gguf.quants.dequantize bit for bit; each
    wrong one is not. What the explanations say of each option is measured on the same blocks: code 0 decodes to m for
    the key and for (d), so checking that code 0 gives the minimum leaves two options standing; it decodes to 0 for
    (a) and to m + d/2 for (b); code 15 decodes to the block's max for the key (up to the float16 rounding of d and m), to
    m + d for (d) and to max + d/2 for (b), and the quantizer gives each block's min code 0 and its max code 15."""
    import re

    from coursekit.grading.lessons.lesson18 import p6_weight

    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("**W2.**"))
    opts = dict(re.findall(r"^- ([a-d])\) w = (.+?)\s*$", cell, re.M))
    assert sorted(opts) == list("abcd")
    key = ITEMS["w2"].key
    assert key == RIGHT["w2"] and opts[key] == "d · q + m"

    W = p6_weight().reshape(-1, 32)
    t = gguf.GGMLQuantizationType.Q4_1
    packed = gguf.quants.quantize(W, t).reshape(-1, 20)
    theirs = gguf.quants.dequantize(packed, t).reshape(-1, 32)
    d = packed[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = packed[:, 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([packed[:, 4:] & 0x0F, packed[:, 4:] >> 4], axis=1).astype(np.float32)

    def decode(expr, q):
        return eval(expr.replace("·", "*").replace("−", "-"), {}, {"d": d, "m": m, "q": q})

    decoded = {k: np.broadcast_to(decode(e, q), W.shape).astype(np.float32) for k, e in opts.items()}
    assert np.array_equal(decoded[key].view(np.uint32), theirs.view(np.uint32))
    for k in set(opts) - {key}:
        assert not np.allclose(decoded[k], theirs, atol=1e-3), k

    rows = np.arange(len(W))
    assert (q[rows, W.argmin(1)] == 0).all() and (q[rows, W.argmax(1)] == 15).all()
    code0 = {k: decode(e, np.float32(0)) for k, e in opts.items()}
    code15 = {k: decode(e, np.float32(15)) for k, e in opts.items()}
    assert {k for k, v in code0.items() if np.array_equal(np.broadcast_to(v, m.shape), m)} == {key, "d"}
    assert np.array_equal(np.broadcast_to(code0["a"], m.shape), np.zeros_like(m))
    np.testing.assert_allclose(code0["b"], m + d / 2, rtol=1e-6)
    mn, mx = W.min(1, keepdims=True), W.max(1, keepdims=True)
    # in steps d: the key's code 0 and code 15 miss the block's min and max by the float16 rounding of d and m only
    assert (np.abs(code0[key] - mn) / d).max() < 0.02 and (np.abs(code15[key] - mx) / d).max() < 0.02
    np.testing.assert_allclose(code15["d"], m + d, rtol=1e-6)
    assert (np.abs(code15["b"] - (mx + d / 2)) / d).max() < 0.02


def test_w2s_quantizer_gives_each_weight_the_nearest_level_placed_with_d_and_m_before_float16():
    """What W2 and W3 say of the quantizer, measured on the lesson's W: every code gguf stores is the nearest of the 16
    levels m + d·j with d and m as computed in float32 (up to exact ties), while with the float16 d and m the file
    stores a few weights would be nearer another level; so the prompts place the levels with d and m in float32."""
    from coursekit.grading.lessons.lesson18 import p6_weight

    W = p6_weight().reshape(-1, 32)
    _, d16, m16, qs = _fields(gguf.quants.quantize(W, gguf.GGMLQuantizationType.Q4_1))
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int64)
    mn, mx = W.min(1, keepdims=True), W.max(1, keepdims=True)
    j = np.arange(16, dtype=np.float32)

    def stored_code_is_nearest(d, m):
        dist = np.abs(W[:, :, None] - (m[:, :, None] + d[:, :, None] * j))
        return np.take_along_axis(dist, q[:, :, None], -1) <= dist.min(-1, keepdims=True) * (1 + 1e-6) + 1e-12

    assert stored_code_is_nearest((mx - mn) / np.float32(15), mn).all()
    as_stored = stored_code_is_nearest(d16, m16)
    assert 0 < (~as_stored).mean() < 0.01, (~as_stored).mean()


def test_p7_key_is_measured():
    """P7 asks for NF4(Q8_0(W)) against W on the lesson's Gaussian weight (seed 18, N(0, 0.05²), 1536 × 576). Measure it
    and check that the keyed option (a, about 0.092) is the nearest of the four numbers the options quote; (d), which also
    adds in quadrature, is what Q4_1's error in Q8_0's place gives."""
    import json

    from coursekit import gguf_file as gf

    W = (0.05 * np.random.default_rng(18).standard_normal((1536, 576))).astype(np.float32)
    t = gguf.GGMLQuantizationType.Q8_0
    W_q8 = gguf.quants.dequantize(gguf.quants.quantize(W, t), t).reshape(W.shape)
    q8 = gf.relative_error(W_q8, W)
    both = gf.relative_error(gf.nf4_round_trip(W_q8), W)
    np.testing.assert_allclose(q8, 0.005, atol=0.001)                      # the 0.005 the question quotes
    quoted = {"a": 0.092, "b": 0.097, "c": 0.005, "d": 0.12}
    nearest = min(quoted, key=lambda k: abs(quoted[k] - both))
    key = json.loads((ROOT / "autograder" / "keys" / "18.json").read_text())["keys"]["p7"]
    assert nearest == key == RIGHT["p7"], (both, nearest, key)
    assert abs(both - quoted["a"]) < 0.001 < abs(both - quoted["b"])
    # (d), run: quadrature with Q4_1's error in place of Q8_0's is the lesson's NF4(Q4_1(W)), about 0.12
    W_q41 = gf.q4_1_round_trip(W)
    assert abs(np.hypot(gf.relative_error(W_q41, W), gf.relative_error(gf.nf4_round_trip(W_q41), W_q41)) - quoted["d"]) < 0.005


def test_p5_key_is_the_file_measured_with_its_embedding_quantized_to_q4_1():
    """P5's key, run: the shipped file's tensor table (5.74 bits per weight), with token_embd.weight decoded from Q8_0 and
    quantized to Q4_1 by gguf's reference quantizer and its bytes counted, averages 5.007 bits per weight (c, "about 5.0").
    Each wrong option is the arithmetic done the mistaken way: the shipped average (a), 5.74 − 3.5 (b), and 4-bit codes
    without d and m (d); each is further from the measurement than the key. The hints' numbers are checked too."""
    import json

    from coursekit import gguf_file as gf
    from coursekit import model as cmodel

    reader = gf.open_reader(cmodel.gguf_path())
    table = gf.tensor_table(reader)
    n = sum(t.n_elements for t in table)
    shipped = 8 * sum(t.n_bytes for t in table) / n
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    W_emb = gguf.quants.dequantize(emb.data, emb.tensor_type)
    packed = gguf.quants.quantize(W_emb, gguf.GGMLQuantizationType.Q4_1)
    other = sum(t.n_bytes for t in table if t.name != "token_embd.weight")
    as_q4_1 = 8 * (other + packed.nbytes) / n
    assert len(table) == 272 and round(shipped, 2) == 5.74 and round(as_q4_1, 3) == 5.007
    share = emb.n_elements / n
    assert round(emb.n_elements / 1e6, 1) == 28.3 and round(n / 1e6, 1) == 134.5 and round(share, 2) == 0.21
    assert round(shipped - as_q4_1, 2) == 0.74 and gf.bits_per_weight("Q8_0") - gf.bits_per_weight("Q4_1") == 3.5
    codes_only = 8 * sum(t.n_bytes for t in table if t.type == "F32") / n + 4 * (n - sum(
        t.n_elements for t in table if t.type == "F32")) / n                      # (d): 4-bit codes, no d and m
    quoted = {"a": shipped, "b": shipped - 3.5, "c": 5.0, "d": codes_only}
    assert round(codes_only, 1) == 4.0 and round(shipped - 3.5, 1) == 2.2
    nearest = min(quoted, key=lambda k: abs(quoted[k] - as_q4_1))
    key = json.loads((ROOT / "autograder" / "keys" / "18.json").read_text())["keys"]["p5"]
    assert nearest == key == RIGHT["p5"] == "c"
    assert all(abs(v - as_q4_1) > 0.5 for k, v in quoted.items() if k != "c")

    # The notebook's options quote these numbers, and the key's text is neither the longest nor the shortest.
    import re

    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("**P5 (predict).**"))
    opts = dict(re.findall(r"^- ([a-d])\) (.+?)\s*$", cell, re.M))
    assert sorted(opts) == list("abcd")
    for k, v in quoted.items():
        assert opts[k].startswith(f"about {v:.{2 if k == 'a' else 1}f}:"), (k, v, opts[k])
    others = [len(v) for k, v in opts.items() if k != key]
    assert min(others) < len(opts[key]) < max(others), {k: len(v) for k, v in opts.items()}


def test_w3_key_is_gguf_quantizing_the_block_and_each_mistake_is_a_variant_run():
    """W3's key, run: gguf's reference Q4_1 quantizer on a block from −0.030 to 0.045 holding 0.014, decoded by gguf:
    0.01501 (code 9 of float16 d = 0.005 and m = −0.030; 0.015 passes). Each named mistake is the same block worked a
    mistaken way: the code rounded down, a 16-step grid, the code itself, the decode without m, and gguf's Q4_0."""
    from coursekit.grading.lessons.lesson18 import W3, w3_block

    block = w3_block()
    t = gguf.GGMLQuantizationType.Q4_1
    packed = gguf.quants.quantize(block, t)
    decoded = gguf.quants.dequantize(packed, t).ravel()
    d, m = packed[0, 0:2].copy().view(np.float16)[0], packed[0, 2:4].copy().view(np.float16)[0]
    q = np.concatenate([packed[0, 4:] & 0x0F, packed[0, 4:] >> 4])
    assert (float(block.min()), float(block.max())) == (np.float32(W3["lo"]), np.float32(W3["hi"]))
    assert q[5] == 9 and d == np.float16(0.005) and m == np.float16(-0.030)
    assert ITEMS["w3"].expected() == float(decoded[5]) and check("18.w3", float(decoded[5])).full
    assert check("18.w3", RIGHT["w3"]).full and abs(decoded[5] - 0.015) < 2e-5

    d32, m32 = np.float32(d), np.float32(m)
    x = np.float32(W3["w"])
    d16 = np.float32(np.float16((W3["hi"] - W3["lo"]) / 16))
    q40 = gguf.GGMLQuantizationType.Q4_0
    variants = {
        "you dropped the fraction": d32 * np.floor((x - m32) / d32) + m32,
        "into 16 steps": d16 * np.round((x - m32) / d16) + m32,
        "that is the code q": float(q[5]),
        "you left out the minimum": d32 * np.float32(q[5]),
        "Q4_0's symmetric grid": gguf.quants.dequantize(gguf.quants.quantize(block, q40), q40).ravel()[5],
    }
    for text, value in variants.items():
        fb = check("18.w3", float(value))
        assert not fb.full and text in fb.text(), (text, value, fb.text())
