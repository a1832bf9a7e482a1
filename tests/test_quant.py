"""coursekit.quant against bitsandbytes 0.50.2 on CPU: exact equality (packed bytes, absmax, the double
quantization state, dequantized values), never a tolerance; plus the teaching kernels and the errors."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from coursekit import quant as Q

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

# bitsandbytes wraps its torch fallback in torch.compile (_try_torch_compile); the eager function underneath is
# the same arithmetic without minutes of compiling and recompiling for every shape.
_dequantize_4bit_eager = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)

# Odd counts, partial last blocks, 1-D and 3-D, rows shorter than a block, rows of different scale.
SHAPES = [(7,), (3, 33), (5, 80), (64, 64), (2, 3, 64), (129, 257), (1, 1000), (300, 512)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _weight(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows = shape[0] if len(shape) > 1 else 1
    scale = torch.rand(rows, *([1] * (len(shape) - 1)), generator=g) * 3
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def _bnb_torch_dequant(packed, state):
    """bitsandbytes' own pure-torch dequantization (never the AVX512 kernel, see probes.self_test)."""
    absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset if state.nested else state.absmax
    return _dequantize_4bit_eager(packed.reshape(-1), absmax.float(), state.code, state.blocksize, state.shape, state.dtype)


def test_tables_equal_bitsandbytes():
    assert torch.equal(Q.nf4_code(), F.get_4bit_type("nf4", device="cpu"))
    assert torch.equal(Q.fp4_code(), F.get_4bit_type("fp4", device="cpu"))
    assert torch.equal(Q.dynamic_map(), F.create_dynamic_map())


def test_nf4_table_shape_facts():
    c = Q.nf4_code()
    assert c[0] == -1 and c[15] == 1 and c[7] == 0
    assert (c < 0).sum() == 7 and (c > 0).sum() == 8
    assert torch.all(c[1:] > c[:-1])
    assert Q.NF4_OFFSET == pytest.approx(0.5 * ((1 - 1 / 30) + (1 - 1 / 32)), abs=1e-7)


@pytest.mark.parametrize("compress_statistics", [False, True], ids=["plain", "double-quant"])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", Q.BLOCKSIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_bit_exact_with_bitsandbytes(dtype, blocksize, quant_type, compress_statistics):
    for i, shape in enumerate(SHAPES):
        A = _weight(shape, dtype, seed=1000 * blocksize + i)
        pb, sb = F.quantize_4bit(A, blocksize=blocksize, quant_type=quant_type, compress_statistics=compress_statistics)
        pc, sc = Q.quantize_4bit(A, blocksize=blocksize, quant_type=quant_type, compress_statistics=compress_statistics)
        where = f"shape {shape}"
        assert pc.dtype == torch.uint8 and pc.shape == pb.shape, where
        assert torch.equal(pb, pc), f"{where}: packed bytes differ at {(pb != pc).nonzero()[:3].tolist()}"
        assert sc.absmax.dtype == sb.absmax.dtype and torch.equal(sb.absmax, sc.absmax), f"{where}: absmax"
        assert sc.shape == sb.shape and sc.dtype == sb.dtype and sc.blocksize == sb.blocksize
        assert torch.equal(sc.code, sb.code)
        assert sc.nested == sb.nested == compress_statistics
        if compress_statistics:
            assert sc.offset.dtype == torch.float32 and torch.equal(sb.offset, sc.offset), where
            assert torch.equal(sb.state2.absmax, sc.state2.absmax), f"{where}: nested absmax"
            assert torch.equal(sb.state2.code, sc.state2.code) and sc.state2.blocksize == sb.state2.blocksize == 256
        # Dequantized values: exactly bitsandbytes' own torch path (FP4's −0/+0 compare equal by value).
        d = Q.dequantize_4bit(pc, sc)
        assert d.dtype == dtype and d.shape == A.shape
        assert torch.equal(_bnb_torch_dequant(pb, sb).reshape(shape), d), f"{where}: dequantized values"


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [32, 64, 128, 256])
def test_equal_to_the_public_dequantize_where_its_cpu_kernel_is_right(blocksize, quant_type):
    """bitsandbytes' public dequantize_4bit (the native CPU kernel here) on 2-D shapes whose rows are whole
    blocks. Rows that are not (e.g. (5, 80) at 64, or SmolLM2's 576-wide rows at 128) hit an AVX512 bug:
    see probes.self_test."""
    for shape in [(576, 2 * blocksize), (192, 4 * blocksize), (64, 1536)]:
        for dtype in (torch.float32, torch.bfloat16):
            A = _weight(shape, dtype, seed=blocksize)
            p, s = F.quantize_4bit(A, blocksize=blocksize, quant_type=quant_type, compress_statistics=True)
            assert torch.equal(F.dequantize_4bit(p, s), Q.dequantize_4bit(*Q.quantize_4bit(A, blocksize, quant_type, True)))


def test_ties_go_to_the_lower_code_and_zero_blocks_store_zero():
    c = Q.nf4_code()
    mids = (c[:-1] + c[1:]) / 2
    # One block of 64: the value 1.0 sets absmax = 1, the rest are the 15 midpoints exactly.
    A = torch.zeros(64)
    A[0] = 1.0
    A[1:16] = mids
    p, s = Q.quantize_4bit(A, blocksize=64)
    codes = Q.unpack_nibbles(p, 64)
    assert codes[1:16].tolist() == list(range(15)), "a value on a midpoint takes the lower code"
    pb, _ = F.quantize_4bit(A, blocksize=64, quant_type="nf4")
    assert torch.equal(p, pb)
    z, sz = Q.quantize_4bit(torch.zeros(128), blocksize=64)
    assert sz.absmax.tolist() == [0.0, 0.0] and torch.equal(Q.dequantize_4bit(z, sz), torch.zeros(128))


def test_packing_order_high_nibble_first():
    assert Q.pack_nibbles(torch.tensor([1, 2, 15])).reshape(-1).tolist() == [0x12, 0xF0]
    assert Q.unpack_nibbles(torch.tensor([[0x12], [0xF0]], dtype=torch.uint8), 3).tolist() == [1, 2, 15]
    with pytest.raises(Q.QuantError, match="0..15"):
        Q.pack_nibbles(torch.tensor([16]))


def test_double_quant_lut_differs_from_nearest_code():
    """bitsandbytes' CPU 8-bit quantizer uses a 65,536-point table: near 0 it disagrees with an exact
    nearest-code search, and coursekit follows the table."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512 * 256, generator=g) * 1e-3
    q, s = Q.quantize_blockwise(x)
    qb, sb = F.quantize_blockwise(x, blocksize=256)
    assert torch.equal(q, qb) and torch.equal(s.absmax, sb.absmax)
    scaled = (x.reshape(-1, 256) / s.absmax.view(-1, 1)).reshape(-1)
    nearest = (scaled.unsqueeze(1) - Q.dynamic_map()).abs().argmin(dim=1)
    assert 0 < int((nearest != q.to(torch.int64)).sum()) < x.numel() // 100


def test_bits_per_parameter_formula_and_measured():
    assert Q.bits_per_parameter(64) == 4.5
    assert Q.bits_per_parameter(64, compress_statistics=True) == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))
    assert round(Q.bits_per_parameter(64, True), 3) == 4.127
    W = torch.randn(1024, 1024)
    for cs, expected in ((False, 4.5), (True, 4 + 8 / 64 + (32 * 64 + 32) / 1024**2)):
        p, s = Q.quantize_4bit(W, compress_statistics=cs)
        assert Q.measured_bits_per_parameter(p, s) == pytest.approx(expected)
        pb, sb = F.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=cs)
        assert Q.measured_bits_per_parameter(pb, sb) == Q.measured_bits_per_parameter(p, s)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 700), blocksize=st.sampled_from(Q.BLOCKSIZES[:4]), quant_type=st.sampled_from(["nf4", "fp4"]),
       cs=st.booleans(), seed=st.integers(0, 2**16), scale=st.floats(1e-6, 1e4))
def test_random_sizes_match_bitsandbytes(n, blocksize, quant_type, cs, seed, scale):
    A = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale
    pb, sb = F.quantize_4bit(A, blocksize=blocksize, quant_type=quant_type, compress_statistics=cs)
    pc, sc = Q.quantize_4bit(A, blocksize=blocksize, quant_type=quant_type, compress_statistics=cs)
    assert torch.equal(pb, pc)
    assert torch.equal(sb.absmax, sc.absmax)
    assert torch.equal(_bnb_torch_dequant(pb, sb).reshape(-1), Q.dequantize_4bit(pc, sc))


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from([(1,), (7,), (64,), (3, 100), (129, 64), (2, 4096)]), blocksize=st.sampled_from(Q.BLOCKSIZES[:4]),
       quant_type=st.sampled_from(["nf4", "fp4"]), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 2**16))
def test_the_round_trip_without_packing_is_dequantize_of_quantize_bit_for_bit(shape, blocksize, quant_type, dtype, seed):
    A = (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)
    want = Q.dequantize_4bit(*Q.quantize_4bit(A, blocksize=blocksize, quant_type=quant_type))
    got = Q.round_trip_4bit(A, blocksize=blocksize, quant_type=quant_type)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.float(), want.float())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("n, at", [(130, 0), (130, 70), (130, 129), (64, 63)])
def test_a_non_finite_value_is_found_through_its_blocks_absmax_and_named(bad, n, at):
    A = torch.randn(n, generator=torch.Generator().manual_seed(0))
    A[at] = bad
    for fn in (Q.quantize_4bit, Q.round_trip_4bit):
        with pytest.raises(Q.QuantError, match=f"non-finite value {bad} at flat index {at};"):
            fn(A, blocksize=64)


# --------------------------------------------------------------------------- teaching kernels


def test_toy_int4_names_the_entry_out_of_range():
    with pytest.raises(Q.QuantError, match=r"^W\[0, 1\] = 5 gives code 25"):
        Q.toy_int4([[0.1, 5.0]])
    with pytest.raises(Q.QuantError, match=r"^W = 100 gives code 500"):
        Q.toy_int4(100.0)


def test_toy_int4_matches_the_seed():
    codes, W_hat = Q.toy_int4([[0.63, -0.47], [0.28, 0.91]])
    assert codes.tolist() == [[3, -2], [1, 5]]
    np.testing.assert_allclose(W_hat, [[0.6, -0.4], [0.2, 1.0]])
    with pytest.raises(Q.QuantError, match="outside the signed 4-bit range"):
        Q.toy_int4([[2.0]])
    with pytest.raises(Q.QuantError, match="positive"):
        Q.toy_int4([[0.1]], step=0)


@pytest.mark.parametrize("bits,qmax", [(8, 127), (4, 7)])
def test_absmax_round_trip_and_error_bound(bits, qmax):
    x = np.random.default_rng(0).normal(size=(10, 30))
    codes, absmax = Q.absmax_quantize(x, bits=bits, blocksize=64)
    assert codes.dtype == np.int8 and absmax.shape == (5,) and np.abs(codes).max() == qmax
    xh = Q.absmax_dequantize(codes, absmax, x.shape, bits=bits, blocksize=64)
    bound = np.repeat(absmax, 64)[:300].reshape(x.shape) / qmax / 2
    assert np.all(np.abs(xh - x) <= bound + 1e-12)


def test_absmax_all_zero_block_and_bad_input():
    codes, absmax = Q.absmax_quantize(np.zeros(10), blocksize=4)
    assert absmax.tolist() == [0, 0, 0] and not codes.any()
    with pytest.raises(Q.QuantError, match="empty"):
        Q.absmax_quantize([])
    with pytest.raises(Q.QuantError, match="bits"):
        Q.absmax_quantize([1.0], bits=3)
    with pytest.raises(Q.QuantError, match="need 2"):
        Q.absmax_dequantize(np.zeros(10), np.ones(3), blocksize=8)


@pytest.mark.parametrize("bad,match", [
    (lambda: Q.quantize_4bit(torch.zeros(4, dtype=torch.float64)), "float32, bfloat16 or float16"),
    (lambda: Q.quantize_4bit(np.zeros(4)), "torch.Tensor"),
    (lambda: Q.quantize_4bit(torch.zeros(0)), "empty"),
    (lambda: Q.quantize_4bit(torch.zeros(4), blocksize=48), "blocksize must be one of"),
    (lambda: Q.quantize_4bit(torch.zeros(4), quant_type="int4"), "quant_type"),
    (lambda: Q.quantize_4bit(torch.tensor([1.0, float("nan")])), "non-finite value nan at flat index 1"),
])
def test_clear_errors(bad, match):
    with pytest.raises(Q.QuantError, match=match):
        bad()


def test_dequantize_rejects_a_state_from_another_tensor():
    p, s = Q.quantize_4bit(torch.randn(8, 64))
    p2, _ = Q.quantize_4bit(torch.randn(8, 128))
    with pytest.raises(Q.QuantError, match="packs into 256"):
        Q.dequantize_4bit(p2, s)
    s.absmax = s.absmax[:3]
    with pytest.raises(Q.QuantError, match="need 8"):
        Q.dequantize_4bit(p, s)


def test_quantize_does_not_touch_its_input():
    A = torch.randn(3, 64, requires_grad=True)
    before = A.detach().clone()
    Q.quantize_4bit(A, compress_statistics=True)
    assert torch.equal(A.detach(), before)
