"""coursekit.gguf_file: our Q4_1 decoder is bit-exact with gguf.quants; the shipped file's table is what
lesson 18 says it is; the NF4 re-quantization helpers measure what they claim."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from coursekit import gguf_file as gf  # noqa: E402

Q4_1 = gguf.GGMLQuantizationType.Q4_1


def _random_blocks(rng, n):
    b = rng.integers(0, 256, size=(n, 20), dtype=np.uint8)
    b[:, 0:2] = np.abs(rng.standard_normal(n) * 0.01).astype(np.float16).view(np.uint8).reshape(n, 2)
    b[:, 2:4] = (-np.abs(rng.standard_normal(n) * 0.1)).astype(np.float16).view(np.uint8).reshape(n, 2)
    return b


def test_decoder_is_bit_exact_with_gguf_on_random_blocks():
    rng = np.random.default_rng(0)
    b = _random_blocks(rng, 257)
    ours = gf.dequantize_q4_1(b)
    theirs = gguf.quants.dequantize(b, Q4_1).reshape(-1, 32)
    assert ours.dtype == np.float32 and ours.shape == (257, 32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_decoder_is_bit_exact_on_extreme_scales():
    rng = np.random.default_rng(1)
    b = _random_blocks(rng, 64)
    d = np.array([6e-8, 1e-5, 1.0, 65504.0] * 16, dtype=np.float16)  # subnormal, small, one, max
    m = np.array([1e-4, 0.0, -1.0, -65504.0] * 16, dtype=np.float16)
    b[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    b[:, 2:4] = m.view(np.uint8).reshape(-1, 2)
    with np.errstate(over="ignore"):
        ours = gf.dequantize_q4_1(b)
        theirs = gguf.quants.dequantize(b, Q4_1).reshape(-1, 32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_nibble_order_low_half_then_high_half():
    b = np.zeros((1, 20), dtype=np.uint8)
    b[0, 0:2] = np.array([1.0], dtype=np.float16).view(np.uint8)  # d = 1, m = 0: w = q
    b[0, 4:] = np.arange(16, dtype=np.uint8) | (np.uint8(15) - np.arange(16, dtype=np.uint8)) << 4
    w = gf.dequantize_q4_1(b)[0]
    np.testing.assert_array_equal(w[:16], np.arange(16))
    np.testing.assert_array_equal(w[16:], 15 - np.arange(16))
    np.testing.assert_array_equal(w, gguf.quants.dequantize(b, Q4_1).reshape(32))
    d, m, q = gf.q4_1_fields(b)
    assert d.dtype == np.float16 and d[0] == 1 and m[0] == 0 and q.shape == (1, 32)


def test_round_trip_matches_gguf_and_bounds_the_error():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    back = gf.q4_1_round_trip(w)
    assert np.array_equal(back, gguf.quants.dequantize(gguf.quants.quantize(w, Q4_1), Q4_1).reshape(w.shape))
    blocks = w.reshape(-1, 32)
    step = (blocks.max(1) - blocks.min(1)) / 15
    # half a step, plus a little for d and m being rounded to float16
    assert np.all(np.abs(back - w).reshape(-1, 32) <= step[:, None] * 0.52)


def test_bits_per_weight_of_the_types():
    assert gf.bits_per_weight("Q4_1") == 5.0
    assert gf.bits_per_weight("Q4_0") == 4.5
    assert gf.bits_per_weight("Q8_0") == 8.5
    assert gf.bits_per_weight("F32") == 32.0


def test_relative_error_and_nf4_round_trip():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    assert gf.relative_error(w, w) == 0.0
    e = gf.relative_error(gf.nf4_round_trip(w), w)
    assert 0.05 < e < 0.15
    with pytest.raises(ValueError):
        gf.relative_error(w, w.T)


def test_unpermute_is_a_row_permutation():
    w = np.arange(12 * 2).reshape(12, 2)
    u = gf.unpermute_rope_rows(w, n_head=3)
    assert sorted(map(tuple, u)) == sorted(map(tuple, w))
    assert not np.array_equal(u, w)


@pytest.fixture(scope="module")
def reader():
    from coursekit import model

    try:
        model.gguf_path()
    except model.ModelNotInstalledError as e:
        pytest.skip(str(e))
    return gf.open_reader()


def test_shipped_file_table(reader):
    table = gf.tensor_table(reader)
    types = gf.type_summary(table)
    assert len(table) == 272
    assert types["Q4_1"]["tensors"] == 210 and types["F32"]["tensors"] == 61 and types["Q8_0"]["tensors"] == 1
    assert types["Q4_1"]["bits_per_weight"] == 5.0 and types["Q8_0"]["bits_per_weight"] == 8.5
    by = {t.name: t for t in table}
    assert by["token_embd.weight"].type == "Q8_0" and by["token_embd.weight"].shape == (49152, 576)
    assert by["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert "output.weight" not in by  # tied embeddings
    meta = gf.metadata(reader)
    assert meta["llama.block_count"] == 30 and meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.tokens"].startswith("[array of 49152")


def test_real_tensor_decodes_bit_exactly(reader):
    t = next(t for t in reader.tensors if t.name == "blk.0.attn_v.weight")
    ours = gf.dequantize_tensor(t)
    theirs = gguf.quants.dequantize(t.data, t.tensor_type)
    assert ours.shape == (192, 576)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_requantization_errors_of_one_layer(reader):
    rows = [(i, p, t) for i, p, t in gf.linear_tensors(reader)]
    assert len(rows) == 210 and rows[0][:2] == (0, "attn_q")
    i, p, t = rows[2]
    w = gf.dequantize_tensor(t)
    e = gf.relative_error(gf.nf4_round_trip(w), w)
    assert 0.05 < e < 0.15


def test_nf4_round_trip_is_bitsandbytes():
    import logging

    import torch

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    import bitsandbytes.functional as bnbF

    w = np.random.default_rng(4).standard_normal((192, 576)).astype(np.float32)
    q, state = bnbF.quantize_4bit(torch.from_numpy(w), blocksize=64, quant_type="nf4")
    assert np.array_equal(gf.nf4_round_trip(w), bnbF.dequantize_4bit(q, state).numpy())
