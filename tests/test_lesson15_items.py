"""Lesson 15 ("NF4 and double quantization"): graded items score right answers fully, the recognised
mistakes (nibbles swapped, ties rounded up, no division by absmax, symmetric 8+8 levels, 32-bit nested
absmax) lose points with a diagnosis, and the references agree with bitsandbytes bit for bit."""

import logging
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from coursekit import quant
from coursekit.grading import check
from coursekit.grading.lessons import lesson15 as L
from coursekit.grading.lessons.lesson15 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "15-nf4-and-double-quantization" / "15-nf4-and-double-quantization.ipynb"


# --------------------------------------------------------------------------- right answers (written independently)


def right_levels(offset):
    pos = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double()).float()
    neg = -torch.special.ndtri(torch.linspace(offset, 0.5, 8)[:-1].double()).float()
    v = torch.cat([neg, torch.zeros(1), pos]).sort().values
    return v / v.max()


def right_levels_float64(offset):
    """A float64 probability grid: not bit-exact with bitsandbytes, but within the tolerance."""
    p_pos = np.linspace(offset, 0.5, 9)[:-1]
    p_neg = np.linspace(offset, 0.5, 8)[:-1]
    pos = torch.special.ndtri(torch.tensor(p_pos)).numpy()
    neg = -torch.special.ndtri(torch.tensor(p_neg)).numpy()
    v = np.sort(np.concatenate([neg, [0.0], pos]))
    return v / v.max()


def right_block(x, levels):
    x = np.asarray(x, dtype=np.float32)
    levels = np.asarray(levels, dtype=np.float32)
    am = np.abs(x).max()
    mids = (levels[:-1] + levels[1:]) / np.float32(2)
    q = np.searchsorted(mids, np.clip(x / am, -1, 1), side="left")
    return ((q[0::2] << 4) | q[1::2]).astype(np.uint8), float(am)


def right_block_argmin(x, levels):
    """Nearest level by distance, first index on a tie: also right (the tie cases are exact in fp32 and fp64)."""
    x = np.asarray(x, dtype=np.float32)
    am = np.abs(x).max()
    q = np.argmin(np.abs((x / am)[:, None] - np.asarray(levels)[None, :]), axis=1)
    return (q[0::2] * 16 + q[1::2]).tolist(), am


RIGHT = {"w1": "b", "w2": "d", "w3": "a", "p1": right_levels, "p2": right_block, "p3": [0, 7],
         "p4": 0.1690, "p5": 56_180, "p6": "c", "p7": ["a", "c", "e"], "p8": [0, -1_769_472]}


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def test_notebook_loads_the_model_at_most_once_after_every_graded_item():
    """The lesson reads single tensors (safe_open) for everything it teaches and grades; the whole model is loaded
    only by the held-out loss comparison in Real-world reps (quantloss.stored_comparison, which loads it in bf16 when
    the comparison is not stored yet), after the last graded cell."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    src = "\n".join(s for _, s in code)
    assert "from_pretrained" not in src and "load_model(" not in src and "safe_open" in src
    loads = [i for i, s in code if "stored_comparison(" in s]
    assert len(loads) == 1 and src.count("stored_comparison(") == 1
    last_graded = max(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade"))
    reps = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## Real-world reps"))
    assert loads[0] > reps > last_graded


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"15.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


@pytest.mark.parametrize("fn", [right_levels_float64, lambda offset: right_levels(offset).numpy().tolist()])
def test_other_right_levels_pass(fn):
    assert check("15.p1", fn, hidden=True).full


def test_argmin_and_torch_blocks_pass():
    def torch_block(x, levels):
        t, lv = torch.from_numpy(x), torch.as_tensor(levels)
        am = t.abs().max()
        q = torch.bucketize(t / am, (lv[:-1] + lv[1:]) / 2)
        return (q[0::2] << 4) | q[1::2], am

    assert check("15.p2", right_block_argmin, hidden=True).full
    assert check("15.p2", torch_block, hidden=True).full


# --------------------------------------------------------------------------- references vs bitsandbytes


def test_references_match_bitsandbytes():
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    bnbF = pytest.importorskip("bitsandbytes.functional")
    table = bnbF.get_4bit_type("nf4", device="cpu")
    assert torch.equal(torch.from_numpy(L.nf4_levels(quant.NF4_OFFSET)), table)
    rng = np.random.default_rng(0)
    cases = [c.kwargs for c in ITEMS["p2"].public()] + [c.kwargs for c in ITEMS["p2"].hidden(rng)]
    for kw in cases:
        packed, st = bnbF.quantize_4bit(torch.from_numpy(kw["x"]), blocksize=64, quant_type="nf4")
        ours, am = L.quantize_block_nf4(**kw)
        assert np.array_equal(packed.flatten().numpy(), ours) and st.absmax.item() == am


def test_tie_cases_really_tie():
    ties = L.clean_ties()
    assert len(ties) >= 4 and 0.03979015 in [round(t, 8) for t in ties]
    kw = ITEMS["p2"].public()[2].kwargs
    x = kw["x"]
    scaled = x / np.abs(x).max()
    mids = (kw["levels"][:-1] + kw["levels"][1:]) / np.float32(2)
    assert np.isin(scaled, mids).sum() == 2
    assert x[np.argmax(np.abs(x))] < 0


def test_hidden_cases_are_deterministic_and_defeat_hard_coding():
    a = check("15.p2", right_block, hidden=True).text()
    assert a == check("15.p2", right_block, hidden=True).text() and a.count("hidden case") == 6
    fb = check("15.p1", lambda offset: right_levels(quant.NF4_OFFSET), hidden=True)
    # hidden cases name the mistake and explain it in words, without quoting their own offsets
    hidden_part = fb.text().split("hidden case", 1)[1]
    assert fb.points < 3 and "'ignored offset'. You returned bitsandbytes' table" in hidden_part
    assert "build the probability grid from the offset" in hidden_part and "asks for offset" not in hidden_part


# --------------------------------------------------------------------------- wrong answers


def _levels_with(build):
    def fn(offset):
        pos = torch.special.ndtri(torch.linspace(offset, 0.5, 9)[:-1].double()).float()
        neg7 = -torch.special.ndtri(torch.linspace(offset, 0.5, 8)[:-1].double()).float()
        return build(pos, neg7)
    return fn


@pytest.mark.parametrize(
    "fn, text",
    [
        (_levels_with(lambda p, n: (lambda v: v / v.max())(torch.cat([-p, p]).sort().values)), "8 negative and 8 positive"),
        (_levels_with(lambda p, n: torch.cat([n, torch.zeros(1), p]).sort().values), "divide by the largest"),
        (_levels_with(lambda p, n: (lambda v: -v.flip(0) / v.max())(torch.cat([n, torch.zeros(1), p]).sort().values)),
         "8 negative and 7 positive"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_level_mistakes(fn, text, hidden):
    fb = check("15.p1", fn, hidden=hidden)
    assert fb.points == 0 and text in fb.text(), fb.text()


def _block_with(codes_fn, pack=lambda q: (q[0::2] << 4) | q[1::2], scale=lambda x: np.abs(x).max()):
    def fn(x, levels):
        am = scale(x)
        mids = (levels[:-1] + levels[1:]) / np.float32(2)
        return pack(codes_fn(np.clip(x / am, -1, 1), mids, x)), float(am)
    return fn


LEFT = lambda s, m, x: np.searchsorted(m, s, side="left")


@pytest.mark.parametrize(
    "fn, text, partial",
    [
        (_block_with(LEFT, pack=lambda q: (q[1::2] << 4) | q[0::2]), "bitsandbytes puts element 2i in the HIGH nibble", False),
        (_block_with(lambda s, m, x: np.searchsorted(m, s, side="right")), "got the UPPER code", True),
        (_block_with(lambda s, m, x: np.searchsorted(m, np.clip(x, -1, 1))), "without dividing by the block's absmax", False),
        (_block_with(LEFT, pack=lambda q: q), "pack two per byte", False),
        (_block_with(LEFT, scale=lambda x: x.max()), "max(x) instead of max(|x|)", True),
    ],
)
def test_block_mistakes(fn, text, partial):
    fb = check("15.p2", fn, hidden=True)
    assert fb.points < 4 and text in fb.text(), fb.text()
    assert (fb.points > 0) == partial, fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("p3", [5, 7], "every block is divided by its own absmax"),
        ("p3", [0, 0], "whose code is not 0000"),
        ("p3", [7, 0], "sits in the HIGH nibble"),
        ("p3", [15, 7], "Dividing by max(x) made it +1"),
        ("p3", [0, 8], "NF4 has an exact zero level"),
        ("p4", -0.0455, "from the HIGH nibble"),
        ("p4", 0.0845, "ignore rows"),
        ("p4", 5.5, "index into the NF4 table"),
        ("p5", 58_752, "storage without double quantization"),
        ("p5", 57_056, "blocksize 128: 110,592 / 128 = 864 blocks"),
        ("p5", 111_476, "a byte holds two 4-bit codes"),
        ("p5", 56_176, "one fp32 number (4 bytes) short"),
        ("p5", 56_177.5, "whole fp32 numbers"),
        ("p5", 449_440, "the count in bits"),
    ],
)
def test_value_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"15.{item_id}", answer)
    assert not fb.full and text in fb.text(), fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "exact 0"),
        ("w1", "c", "positive one"),
        ("w2", "a", "absmax values"),
        ("w3", "c", "no 4-bit arithmetic"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"15.{item_id}", answer)
    assert fb.points == 0 and text in fb.text()


def test_multi_choice_partial_credit():
    fb = check("15.p7", ["a", "c"])
    assert fb.points == pytest.approx(2 * 2 / 3) and "Q4_1 stores the block's minimum" in fb.text()
    fb = check("15.p7", ["a", "b", "c", "e"])
    assert fb.points == pytest.approx(2 * 2 / 3) and "number their levels differently" in fb.text()


def test_p7_key_is_each_statement_run_here():
    """P7's key, computed: each statement checked against bitsandbytes, torch's float8_e4m3fn and gguf's Q4_1 quantizer."""
    import json

    import bitsandbytes.functional as bnbF
    import torch
    from safetensors import safe_open

    from coursekit import gguf_file, model as cmodel

    nf4, fp4 = bnbF.get_4bit_type("nf4", device="cpu"), bnbF.get_4bit_type("fp4", device="cpu")
    true = set()
    if nf4[0] == -1 and fp4[0] == 0:                                           # a) the nibble 0000 in each table
        true.add("a")
    with safe_open(str(cmodel.prepare_model(progress=False) / "model.safetensors"), framework="pt") as f:
        W = f.get_tensor("model.layers.0.mlp.gate_proj.weight")
    packed, state = bnbF.quantize_4bit(W, blocksize=64, quant_type="nf4")
    codes = quant.unpack_nibbles(packed, W.numel()).long()
    scale = state.absmax.repeat_interleave(64)
    rel = {name: ((table[codes] * scale).reshape(W.shape) - W.float()).norm().item() / W.float().norm().item()
           for name, table in (("nf4", nf4), ("as fp4", fp4))}
    assert round(rel["nf4"], 3) == 0.093 and rel["as fp4"] > 1                  # b's hint quotes both
    if rel["as fp4"] < 2 * rel["nf4"]:                                         # b) "about as close"
        true.add("b")
    e2m1_max = 6.0
    if float(np.log2(1.5 / e2m1_max)).is_integer():                            # c) an E8M0 scale is a power of two
        true.add("c")
    e4m3 = torch.tensor(1 / 6).to(torch.float8_e4m3fn).float().item()
    assert e4m3 == 0.171875                                                   # d's hint quotes the nearest E4M3 value
    if e4m3 == torch.tensor(1 / 6).item():                                     # d) 1/6 held exactly
        true.add("d")
    x = np.linspace(0.5, 1.0, 32, dtype=np.float32)
    err_q41 = np.abs(gguf_file.q4_1_round_trip(x) - x).max()
    err_nf4 = np.abs(quant.round_trip_4bit(torch.from_numpy(x), blocksize=64, quant_type="nf4").numpy() - x).max()
    assert 0.01 < err_q41 < 0.02 and 0.12 < err_nf4 < 0.14                    # e's hint: about 0.016 and 0.13
    if err_q41 < err_nf4:                                                      # e) the asymmetric grid
        true.add("e")
    keys = json.loads((ROOT / "autograder" / "keys" / "15.json").read_text())["keys"]
    assert sorted(true) == keys["p7"] == RIGHT["p7"]


def test_numeric_expected_values_come_from_coursekit():
    assert ITEMS["p5"].expected() == 56_180  # 55,296 codes + 864 absmax codes + 4 · 4 second-level absmax + 4 offset
    assert ITEMS["p4"].expected() == pytest.approx(0.1689576, abs=1e-6)   # table[0x6B & 0xF = 11] · absmax[1] = 0.33792 · 0.5


def test_p4_key_and_mistakes_are_bitsandbytes_dequantizing_the_printed_bytes():
    """P4's key, measured: bitsandbytes' own dequantize_4bit on a 3 × 50 NF4 weight whose bytes 50..52 and absmax are
    the ones the task prints; each named mistake is the hand decoder run with that mistake, and differs from the key."""
    import bitsandbytes.functional as bnbF

    packed, state = bnbF.quantize_4bit(torch.randn(*L.P4_SHAPE, generator=torch.Generator().manual_seed(0)),
                                       blocksize=64, quant_type="nf4")
    assert tuple(packed.shape) == (75, 1) and state.absmax.numel() == 3      # three blocks over 150 values, not rows
    for position, byte in L.P4_BYTES.items():
        packed[position, 0] = byte
    state.absmax = torch.tensor(L.P4_ABSMAX, dtype=torch.float32)
    W_hat = bnbF.dequantize_4bit(packed, state).reshape(L.P4_SHAPE)
    assert W_hat[L.P4_ENTRY].item() == L.p4_decode() == ITEMS["p4"].expected()
    assert check("15.p4", W_hat[L.P4_ENTRY].item()).full
    by_label = {m.label: m.value for m in ITEMS["p4"].mistakes()}
    assert by_label == {"nibbles swapped": L.p4_decode(odd_in_high=True),
                        "absmax per row": L.p4_decode(blocks_per_row=True), "code as level": L.p4_decode(table=False)}
    # each mistake, run by bitsandbytes where it can be: the swapped nibble of byte 51, the absmax of row 2
    swapped = packed.clone()
    swapped[51, 0] = ((L.P4_BYTES[51] & 0xF) << 4) | (L.P4_BYTES[51] >> 4)
    assert bnbF.dequantize_4bit(swapped, state).reshape(L.P4_SHAPE)[L.P4_ENTRY].item() == by_label["nibbles swapped"]
    assert W_hat[L.P4_ENTRY].item() / L.P4_ABSMAX[1] * L.P4_ABSMAX[2] == pytest.approx(by_label["absmax per row"], rel=1e-6)
    for value in by_label.values():
        assert not check("15.p4", value).full


def test_function_stub_and_non_function():
    def stub(x, levels):
        raise NotImplementedError()

    assert check("15.p2", stub).points == 0
    fb = check("15.p1", "nf4")
    assert fb.points == 0 and "should be a function" in fb.text()


# --------------------------------------------------------------------------- right answers written differently, near misses


@pytest.mark.parametrize(
    "convert",
    [lambda p: bytes(p.tolist()), lambda p: bytearray(p.tolist()), lambda p: p.reshape(-1, 1),
     lambda p: torch.from_numpy(p).reshape(-1, 1), lambda p: torch.from_numpy(p.astype(np.int64)), lambda p: p.tolist()],
    ids=["bytes", "bytearray", "numpy (n, 1)", "torch uint8 (n, 1)", "torch int64", "list"],
)
def test_packed_bytes_in_other_containers_pass(convert):
    def fn(x, levels):
        packed, am = right_block(x, levels)
        return convert(packed), am

    fb = check("15.p2", fn, hidden=True)
    assert fb.full, fb.text()


def test_signed_bytes_are_named():
    fb = check("15.p2", lambda x, levels: (right_block(x, levels)[0].astype(np.int8), right_block(x, levels)[1]), hidden=True)
    assert not fb.full and "your bytes are signed" in fb.text(), fb.text()


@pytest.mark.parametrize(
    "fn, text",
    [
        (lambda offset: right_levels(offset).flip(0), "descending order"),
        (_levels_with(lambda p, n: (lambda v: v / v.max())(torch.cat([n, torch.zeros(1), p]))), "but not sorted"),
    ],
)
def test_level_order_mistakes(fn, text):
    fb = check("15.p1", fn, hidden=True)
    assert fb.points == 0 and text in fb.text(), fb.text()


def _bnb_last_byte_codes(w, blocksize=64):
    bnbF = pytest.importorskip("bitsandbytes.functional")
    packed, state = bnbF.quantize_4bit(w, blocksize=blocksize, quant_type="nf4")
    last = int(packed.reshape(-1)[-1])
    return [last >> 4, last & 0xF], state


def test_p3_key_and_mistakes_are_measured_with_bitsandbytes():
    """P3's key is the last packed byte bitsandbytes writes for the weight the question describes, and its by-hand
    quantizer (which runs every named mistake) agrees with bitsandbytes and coursekit.quant; each named mistake is that
    quantizer run the mistaken way, and "one absmax for the tensor" is also what bitsandbytes writes with one block."""
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    w = L.p3_weight()
    assert w.numel() == 129 and w.abs().max() == 2.0 == w[100] and w[128] == np.float32(-0.3)
    key, state = _bnb_last_byte_codes(w)
    assert state.absmax.numel() == 3 and state.absmax[-1] == np.float32(0.3)       # w[128] alone in the third block
    packed_ck, _ = quant.quantize_4bit(w, blocksize=64, quant_type="nf4")
    assert int(packed_ck.reshape(-1)[-1]) == key[0] * 16 + key[1]
    assert L.p3_last_byte_codes() == key == RIGHT["p3"] == list(ITEMS["p3"].expected())
    assert quant.nf4_code()[key[0]] == -1 and quant.nf4_code()[key[1]] == 0         # −1 · 0.3, and the pad on zero
    assert L.p3_last_byte_codes(blocksize=256) == _bnb_last_byte_codes(w, blocksize=256)[0]
    sym = L.p3_symmetric_table()
    assert sym.numel() == 16 and (sym > 0).sum() == 8 and not (sym == 0).any()
    named = {m.label: list(m.value) for m in ITEMS["p3"].mistakes()}
    assert len({tuple(v) for v in named.values()} | {tuple(key)}) == len(named) + 1   # all different, none the key
    for label, value in named.items():
        fb = check("15.p3", value)
        assert fb.points == 0.5 and fb.mistakes == [label], (label, fb.text())


@pytest.mark.parametrize("answer, text", [("a", "the 8-bit dynamic map is not symmetric"),
                                          ("b", "Rounding loses nothing"), ("d", "It is the other way round")])
def test_p6_wrong_choices_get_their_hint(answer, text):
    fb = check("15.p6", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p6_key_is_what_bitsandbytes_rebuilds():
    """P6's key, measured: eight blocks of 64 with absmax 1, 3, 1, 3, ... (one weight of that magnitude each, the rest
    smaller), NF4 with double quantization in bitsandbytes. The decoded largest weight of a block is ±1 times its rebuilt
    absmax, so it equals the true absmax exactly where the absmax came back bit for bit: the 3s (centred to +1, the map's
    top level), not the 1s, which come back as 2 − 0.99297 = 1.00703 (the hints quote both numbers). The question leaves
    out a block at the offset itself: whether 0 comes back exactly depends on the kernel (the native lookup table does not
    give 0 its exact code; see 'Going deeper')."""
    import json

    import bitsandbytes.functional as bnbF

    absmax = torch.tensor([1.0, 3, 1, 3, 1, 3, 1, 3])
    W = torch.rand(8, 64, generator=torch.Generator().manual_seed(15)) * 0.5 - 0.25   # |w| < 0.25 elsewhere
    W[:, 7] = absmax * torch.tensor([1.0, -1, 1, 1, -1, -1, 1, -1])                   # one weight at ±absmax per block
    packed, state = bnbF.quantize_4bit(W.reshape(1, -1), blocksize=64, quant_type="nf4", compress_statistics=True)
    assert state.nested and state.offset.item() == 2.0
    rebuilt = bnbF.dequantize_4bit(packed, state).reshape(8, 64)[:, 7].abs()
    exact = {int(a) for a, r in zip(absmax.tolist(), rebuilt.tolist()) if r == a}
    back_of = {int(a): r for a, r in zip(absmax.tolist(), rebuilt.tolist())}
    measured = {frozenset({1, 3}): "a", frozenset(): "b", frozenset({3}): "c", frozenset({1}): "d"}.get(frozenset(exact))
    keys = json.loads((ROOT / "autograder" / "keys" / "15.json").read_text())
    assert measured == keys["keys"]["p6"] == RIGHT["p6"]
    assert f"{back_of[1]:.5f}" == "1.00703" and f"{quant.dynamic_map()[0].item():.5f}" == "-0.99297"
    for hint in ("a", "b", "d"):
        assert "1.00703" in keys["hints"]["p6"][hint] and "−0.99297" in keys["hints"]["p6"][hint]


def test_notebook_guards_the_native_library_comparison():
    """Without bitsandbytes' compiled library, double quantization rounds to the nearest code instead of through the
    lookup table; the notebook must check which one ran rather than fail."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "ErrorHandlerMockBNBNativeLibrary" in src
    lut_cell = next(c.source for c in nb.cells if "nearest_code_blockwise(A)" in c.source)
    assert "if bnb_native:" in lut_cell and "torch.equal(q_bnb.long(), q_near)" in lut_cell


def test_p5_key_and_mistakes_are_the_bytes_bitsandbytes_stores():
    """P5's key, measured: the bytes of every tensor bitsandbytes' quantize_4bit stores for a 192 × 576 weight (k_proj's
    shape) with blocksize 128 and double quantization. The named mistakes that bitsandbytes can run are its own tensors
    too: no double quantization, and blocksize 64; the others are counts of those tensors done the mistaken way."""
    import bitsandbytes.functional as bnbF

    def stored(packed, st):
        size = packed.numel() * packed.element_size() + st.absmax.numel() * st.absmax.element_size()
        if st.nested:
            size += st.state2.absmax.numel() * st.state2.absmax.element_size() + st.offset.numel() * st.offset.element_size()
        return size

    W = torch.randn(*L.P5_SHAPE, generator=torch.Generator().manual_seed(5))
    packed, st = bnbF.quantize_4bit(W, blocksize=L.P5_BLOCKSIZE, quant_type="nf4", compress_statistics=True)
    assert stored(packed, st) == ITEMS["p5"].expected() == RIGHT["p5"]
    assert check("15.p5", stored(packed, st)).full
    assert st.absmax.dtype == torch.uint8 and st.state2.absmax.numel() == 4 and st.state2.blocksize == L.P5_GROUP
    by_label = {m.label: m.value for m in ITEMS["p5"].mistakes()}
    assert by_label["no double quantization"] == stored(*bnbF.quantize_4bit(W, blocksize=L.P5_BLOCKSIZE, quant_type="nf4",
                                                                             compress_statistics=False))
    assert by_label["blocksize 64"] == stored(*bnbF.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=True))
    assert by_label["one code per byte"] == stored(packed, st) + packed.numel()             # a byte per code
    assert by_label["one fp32 short"] == stored(packed, st) - 4                             # the partial group left out
    assert by_label["per-parameter formula"] == W.numel() * quant.bits_per_parameter(L.P5_BLOCKSIZE, True) / 8 + 4
    assert by_label["bits"] == 8 * stored(packed, st)
    assert len(set(by_label.values()) | {stored(packed, st)}) == len(by_label) + 1           # all different from the key
    assert quant.measured_bits_per_parameter(packed, st) * W.numel() / 8 == pytest.approx(stored(packed, st))


@pytest.mark.parametrize(
    "answer, text",
    [([-248_832, -1_769_472], "does not touch what the layer stores"), ([-27_648, -1_769_472], "absmax is stored in fp32"),
     ([0, 0], "dequantizes the whole weight"), ([0, 1_769_472], "the sign is not"),
     ([0, -3_538_944], "whole fp32 temporary"), ([0, -14_155_776], "in bits")],
)
def test_p8_mistakes_are_named(answer, text):
    fb = check("15.p8", answer)
    assert not fb.full and text in fb.text(), fb.text()


def test_p8_key_is_what_bitsandbytes_does():
    """Build gate_proj's shape as a Linear4bit (NF4, blocksize 64, fp32 absmax) with each compute dtype, run one forward with
    gradients on, and measure the stored bytes and the weight F.linear receives (gemm_4bit dequantizes to the input's dtype)."""
    bnb = pytest.importorskip("bitsandbytes")
    W = (0.02 * torch.randn(1536, 576, generator=torch.Generator().manual_seed(15))).to(torch.bfloat16)
    seen, linear = [], torch.nn.functional.linear

    def spy(a, w, b=None):
        seen.append(w)
        return linear(a, w, b)

    stored, temporary = {}, {}
    for cd in (torch.float32, torch.bfloat16):
        layer = bnb.nn.Linear4bit(576, 1536, bias=False, compute_dtype=cd, compress_statistics=False, quant_type="nf4")
        layer.weight = bnb.nn.Params4bit(W, requires_grad=False, blocksize=64, compress_statistics=False, quant_type="nf4")
        layer = layer.to("cpu")
        qs = layer.weight.quant_state
        stored[cd] = layer.weight.data.numel() * layer.weight.data.element_size() + qs.absmax.numel() * qs.absmax.element_size()
        seen.clear()
        torch.nn.functional.linear = spy
        try:
            layer(torch.randn(4, 576, requires_grad=True))
        finally:
            torch.nn.functional.linear = linear
        (w,) = [t for t in seen if tuple(t.shape) == (1536, 576)]
        assert w.dtype == cd
        temporary[cd] = w.numel() * w.element_size()
    assert stored[torch.float32] == stored[torch.bfloat16] == L.p8_stored_bytes() == 497_664
    want = [stored[torch.bfloat16] - stored[torch.float32], temporary[torch.bfloat16] - temporary[torch.float32]]
    np.testing.assert_array_equal(ITEMS["p8"].expected(), want)
    assert check("15.p8", want).full
