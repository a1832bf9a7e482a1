"""Graded items of lesson 15, "NF4 and double quantization"."""

from __future__ import annotations

import functools
from functools import lru_cache

import numpy as np
import torch

from ... import quant
from ..checkers import Case, Mistake
from .. import Array, Choice, Function, Numeric

READ_LEVELS = "(Lesson 15, 'Sixteen levels from normal quantiles'.)"
READ_BLOCK = "(Lesson 15, 'Quantizing one block by hand'.)"
READ_BLOCK_SECTION = "Reread 'Quantizing one block by hand' in Know this."
READ_PACK = "(Lesson 15, 'Two codes per byte'.)"
READ_DQ = "(Lesson 15, 'Double quantization'.)"
READ_BITS = "(Lesson 15, 'Bits per parameter, counted'.)"


# --------------------------------------------------------------------------- references


def _grid_levels(offset: float, n_pos: int, n_neg: int) -> torch.Tensor:
    """Φ⁻¹ at ``n_pos`` (and mirrored ``n_neg``) evenly spaced probabilities from ``offset`` towards 0.5,
    on bitsandbytes' float32 grid, in float64 (unnormalised, unsorted halves)."""
    pos = torch.special.ndtri(torch.linspace(offset, 0.5, n_pos + 1)[:-1].double())
    neg = -torch.special.ndtri(torch.linspace(offset, 0.5, n_neg + 1)[:-1].double())
    return pos, neg


def nf4_levels(offset):
    """Reference for p1: the 16 NF4 levels for a given outermost quantile ``offset``, sorted, fp32.

    8 positive quantiles, 7 negative ones and an exact 0, divided by the largest (so the ends are ±1).
    At ``offset = quant.NF4_OFFSET`` this is ``quant.nf4_code()`` (bitsandbytes' table) bit for bit.
    """
    pos, neg = _grid_levels(float(offset), 8, 7)
    values = torch.cat([neg.float(), torch.zeros(1), pos.float()]).sort().values
    return (values / values.max()).numpy()


def quantize_block_nf4(x, levels):
    """Reference for p2: one block (fewer than 64 values, even count) quantized as bitsandbytes does.

    Returns ``(packed, absmax)``: uint8 bytes of shape ``(n // 2,)`` (element 2i in the high nibble) and
    the block's absmax as a float. ``levels`` is the NF4 table (the cases always pass bitsandbytes' table).
    """
    t = torch.as_tensor(np.asarray(x, dtype=np.float32))
    packed, state = quant.quantize_4bit(t, blocksize=64, quant_type="nf4")
    return packed.reshape(-1).numpy(), float(state.absmax[0])


@lru_cache(maxsize=None)
def clean_ties() -> tuple[float, ...]:
    """NF4 midpoints that are exactly halfway between their two levels in float32 *and* float64, so that
    every correct method (midpoint search in either precision, or nearest level with the first index on a
    tie) gives the lower code. Tie cases use only these."""
    c32 = quant.nf4_code().numpy()
    c64 = c32.astype(np.float64)
    out = []
    for i in range(15):
        m = np.float32((c32[i] + c32[i + 1]) / np.float32(2))
        if m - c32[i] == c32[i + 1] - m and np.float64(m) - c64[i] == c64[i + 1] - np.float64(m):
            out.append(float(m))
    return tuple(out)


# --------------------------------------------------------------------------- P1 cases and mistakes


def _p1_public() -> list[Case]:
    return [Case(dict(offset=quant.NF4_OFFSET), "offset 0.9677083 (bitsandbytes' table)"),
            Case(dict(offset=0.99), "offset 0.99")]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(dict(offset=float(np.round(rng.uniform(0.9, 0.995), 6)))) for _ in range(4)]


def p1_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    offset = float(kw["offset"])
    pos8, neg7 = _grid_levels(offset, 8, 7)
    pos8 = pos8.float()
    right = nf4_levels(offset)
    symmetric = torch.cat([-pos8, pos8]).sort().values
    raw = torch.cat([neg7.float(), torch.zeros(1), pos8]).sort().values
    # Most messages quote only the fixed shape of the table (16 levels, 8 + 7 + 0): they are their own hints.
    msgs = {
        "symmetric 8+8": "you built 8 negative and 8 positive levels, mirror images with no level at 0. NF4 takes 8 quantiles "
                         "on the positive side and 7 on the negative side, plus an exact 0, so that a zero weight (and the "
                         f"padding) is stored exactly. {READ_LEVELS}",
        "mirrored": "your table has 8 negative and 7 positive levels: the extra quantile belongs to the positive side "
                    f"(bitsandbytes: 9 grid points for the positive half, 8 for the negative one, 0.5 dropped). {READ_LEVELS}",
        "descending": "you have the right 16 levels in descending order; sort them ascending, so that the index is the code "
                      f"(code 0 is −1, code 15 is +1). {READ_LEVELS}",
        "not sorted": "you have the right 16 levels, but not sorted: Φ⁻¹ of linspace(offset, 0.5, …) runs from the outside "
                      f"in, so sort the concatenated table ascending (index = code). {READ_LEVELS}",
    }
    out = [
        Mistake("symmetric 8+8", (symmetric / symmetric.max()).numpy(), msgs["symmetric 8+8"], hint=msgs["symmetric 8+8"]),
        Mistake("not normalised", raw.numpy(),
                f"your levels end at ±Φ⁻¹(offset) ≈ ±{float(pos8.max()):.4f}: divide by the largest so that they end at "
                f"exactly −1 and +1 (the block's absmax maps to ±1). {READ_LEVELS}",
                hint=f"your levels end at ±Φ⁻¹(offset), not at ±1: divide by the largest so that they end at exactly −1 "
                     f"and +1 (the block's absmax maps to ±1). {READ_LEVELS}"),
        Mistake("mirrored", -right[::-1], msgs["mirrored"], hint=msgs["mirrored"]),
    ]
    unsorted = torch.cat([neg7.float(), torch.zeros(1), pos8])       # negative half ascending, positive half descending
    out += [
        Mistake("descending", right[::-1].copy(), msgs["descending"], hint=msgs["descending"]),
        Mistake("not sorted", (unsorted / unsorted.max()).numpy(), msgs["not sorted"], hint=msgs["not sorted"]),
    ]
    if abs(offset - quant.NF4_OFFSET) > 1e-9:
        out.append(Mistake("ignored offset", nf4_levels(quant.NF4_OFFSET),
                           f"you returned bitsandbytes' table for offset 0.9677083, but this case asks for offset {offset:g}: "
                           f"build the probability grid from the offset argument. {READ_LEVELS}",
                           hint=f"you returned bitsandbytes' table (offset 0.9677083), but this case asks for another "
                                f"offset: build the probability grid from the offset argument. {READ_LEVELS}"))
    return {"levels": out}


# --------------------------------------------------------------------------- P2 cases and mistakes


def _levels32() -> np.ndarray:
    return quant.nf4_code().numpy()


HAND_BLOCK = np.array([1.2, -0.5, 0.0795803, -2.0, 0.3, 0.0, -0.9, 1.6], dtype=np.float32)
"""The block of the notebook's 'Quantizing one block by hand' (absmax 2, one exact tie at 0.0795803 / 2)."""


def _block_case(rng: np.random.Generator, ties: int = 0, negative_absmax: bool = False) -> dict:
    n = int(rng.choice([8, 12, 16, 24, 32]))
    x = rng.standard_normal(n)
    if ties:
        # A power-of-two absmax makes x / absmax exact, so a value placed at absmax · midpoint is a true tie.
        am = 2.0 ** -int(rng.integers(1, 5))
        x = x / np.abs(x).max() * am * 0.97
        spots = rng.choice(n, size=ties + 1, replace=False)
        x[spots[0]] = -am if negative_absmax else am
        for j in spots[1:]:
            x[j] = am * float(rng.choice(clean_ties()))
    else:
        # absmax below 1, so that a block quantized without dividing by it gets different codes
        x = x / np.abs(x).max() * float(rng.uniform(0.05, 0.6))
        i = int(np.argmax(np.abs(x)))
        if negative_absmax == (x[i] > 0):
            x = -x
    return dict(x=x.astype(np.float32), levels=_levels32())


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(1515)
    return [
        Case(dict(x=HAND_BLOCK.copy(), levels=_levels32()), "the block quantized by hand in Know this"),
        Case(_block_case(rng), "16 or so values of a weight, absmax below 1"),
        Case(_block_case(rng, ties=2, negative_absmax=True), "absmax from a negative value, two exact ties"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_block_case(rng, ties=(2 if i % 2 else 0), negative_absmax=(i in (1, 2)))) for i in range(6)]


def _pack(codes: np.ndarray) -> np.ndarray:
    c = np.asarray(codes, dtype=np.int64)
    return ((c[0::2] << 4) | c[1::2]).astype(np.uint8)


def p2_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    x = np.asarray(kw["x"], dtype=np.float32)
    levels = np.asarray(kw["levels"], dtype=np.float32)
    mids = (levels[:-1] + levels[1:]) / np.float32(2)
    am = np.abs(x).max()
    scaled = np.clip(x / am, -1, 1)
    q = np.searchsorted(mids, scaled, side="left")
    signed_max = x.max()
    swapped_msg = ("your two codes sit in the wrong halves of each byte: bitsandbytes puts element 2i in the HIGH nibble "
                   f"and element 2i+1 in the LOW one, byte = (code[2i] << 4) | code[2i+1]. {READ_PACK}")
    raw_msg = ("you looked the raw values up in the table without dividing by the block's absmax first: the levels "
               f"live in [−1, 1], the weights do not. {READ_BLOCK}")
    signed_msg = ("your bytes are signed (int8, −128..127): the codes are right, but a byte whose high nibble is 8 or more "
                  "came out negative. Return them as integers 0..255 (np.uint8, torch.uint8 or plain ints). "
                  f"{READ_PACK}")
    out = [
        Mistake("nibbles swapped", (q[1::2] << 4) | q[0::2], swapped_msg, hint=swapped_msg),
        Mistake("ties rounded up", _pack(np.searchsorted(mids, scaled, side="right")),
                "a scaled value exactly on a midpoint between two levels got the UPPER code; bitsandbytes gives it the "
                "lower one (torch.bucketize with right=False: the code is the number of midpoints strictly below the "
                f"value). {READ_BLOCK}"),
        Mistake("forgot to divide by absmax", _pack(np.searchsorted(mids, np.clip(x, -1, 1), side="left")), raw_msg,
                hint=raw_msg),
        Mistake("signed bytes", _pack(q).astype(np.int8), signed_msg, hint=signed_msg),
        Mistake("codes not packed", q,
                f"you returned the {len(q)} codes, one per value; pack two per byte ({len(q) // 2} bytes), element 2i in "
                f"the high nibble. {READ_PACK}",
                hint=f"you returned the codes one per value; pack two per byte (half as many bytes as values), element "
                     f"2i in the high nibble. {READ_PACK}"),
    ]
    if signed_max != am:
        out.insert(0, Mistake("signed max", _pack(np.searchsorted(mids, np.clip(x / signed_max, -1, 1), side="left")),
                              "you scaled by max(x) instead of max(|x|): in this block the largest magnitude is a "
                              f"negative value. absmax means the largest absolute value. {READ_BLOCK}"))
    am_out = []
    if signed_max != am:
        am_out.append(Mistake("signed max", signed_max,
                              "absmax is max(|x|), the largest magnitude; you returned max(x), and here the largest "
                              f"magnitude is negative. {READ_BLOCK}"))
    return {"packed": out, "absmax": am_out}


# --------------------------------------------------------------------------- P3 .. P5

# P3: the last byte of an odd-length weight. 129 values in blocks of 64 make two full blocks and a third that holds w[128]
# alone; 129 codes fill 64.5 bytes, so bitsandbytes pads the scaled values with one 0 before packing.
P3_N = 129
P3_PEAK = (100, 2.0)          # the tensor's largest magnitude, in block 1
P3_LAST = -0.3                # w[128], alone in the last block


def p3_weight() -> torch.Tensor:
    """P3's weight (float32, 1-D): evenly spread values in [−1.5, 1.5], w[100] = 2.0 and w[128] = −0.3."""
    w = torch.linspace(-1.5, 1.5, P3_N)
    w[P3_PEAK[0]] = P3_PEAK[1]
    w[-1] = P3_LAST
    return w


def p3_last_byte_codes(*, blocksize: int = 64, signed_max: bool = False, pad_code: int | None = None,
                       swapped: bool = False, table: torch.Tensor | None = None, ties_up: bool = False) -> list[int]:
    """P3: ``[high nibble, low nibble]`` of the last packed byte of :func:`p3_weight`, quantized as bitsandbytes does
    (blocks of ``blocksize`` over the flat tensor, each divided by its own absmax, the odd count padded with a scaled 0,
    ``torch.bucketize`` on the table's midpoints, element 2i in the high nibble). The flags run the likely mistakes: a
    block divided by max(x) instead of max(|x|), the padding written as the nibble ``pad_code`` instead of the code of
    0, the two nibbles read the other way round, another table (``table``) and ties sent up. tests/test_lesson15_items.py
    checks the default against bitsandbytes' ``quantize_4bit``."""
    w = p3_weight()
    levels = (quant.nf4_code() if table is None else table).float()
    mids = (levels[:-1] + levels[1:]) / 2
    scaled = []
    for start in range(0, P3_N, blocksize):
        block = w[start:start + blocksize]
        scale = block.max() if signed_max else block.abs().max()
        scaled.append(torch.clamp(block / scale, -1, 1))
    codes = torch.bucketize(torch.cat(scaled + [torch.zeros(1)]), mids, right=ties_up)  # the pad: a scaled 0
    if pad_code is not None:
        codes[-1] = pad_code
    high, low = int(codes[-2]), int(codes[-1])           # element 128 (even): the high nibble
    return [low, high] if swapped else [high, low]


def p3_symmetric_table() -> torch.Tensor:
    """The 8 + 8 table with no zero (the mistake of P1 and W1): NF4's 8 positive quantiles and their mirror images."""
    pos8, _ = _grid_levels(quant.NF4_OFFSET, 8, 7)
    levels = torch.cat([-pos8, pos8]).sort().values
    return levels / levels.max()


def _p3_mistakes() -> list[Mistake]:
    at, peak = P3_PEAK
    return [
        Mistake("one absmax for the tensor", p3_last_byte_codes(blocksize=256),
                f"you divided w[128] by the tensor's largest magnitude, {peak:g} (w[{at}]). The blocks run over the flat "
                f"tensor 64 values at a time: {P3_N} values make two full blocks and a third that holds w[128] alone, "
                f"and every block is divided by its own absmax. {READ_BLOCK}"),
        Mistake("padding as 0000", p3_last_byte_codes(pad_code=0),
                f"the other half of the last byte is padding ({P3_N} codes fill {P3_N / 2:g} bytes), and the padding is "
                f"a value, a scaled 0, quantized like the others: NF4 stores it exactly, on its zero level, whose code "
                f"is not 0000. {READ_LEVELS}"),
        Mistake("nibbles swapped", p3_last_byte_codes(swapped=True),
                f"w[128] is element 2i of its byte (128 is even), so its code sits in the HIGH nibble and the padding in "
                f"the low one. {READ_PACK}"),
        Mistake("signed max", p3_last_byte_codes(signed_max=True),
                f"a block of one value is divided by its own magnitude, max(|x|), and w[128] is negative: "
                f"{P3_LAST:g} / {abs(P3_LAST):g} = −1, the lowest level. Dividing by max(x) made it +1. {READ_BLOCK}"),
        Mistake("no zero level, tie up", p3_last_byte_codes(table=p3_symmetric_table(), ties_up=True),
                "the padding, a scaled 0, got the code above the middle of the table, as if 0 lay on a midpoint "
                "between two levels and the tie went up. NF4 has an exact zero level (8 positive levels, 7 negative "
                f"ones and 0), so the padding is stored exactly on it. {READ_LEVELS}"),
    ]


# P4: read one entry of a stored NF4 weight back from its bytes. A 3 × 50 weight (150 values) has three blocks of 64
# over the flattened tensor (the last one short), so three absmax values, one per block, not one per row.
P4_SHAPE = (3, 50)
P4_ENTRY = (2, 3)                                  # flat index 2 · 50 + 3 = 103: block 1, byte 51, low nibble
P4_ABSMAX = (0.8, 0.5, 0.25)
P4_BYTES = {50: 0x9C, 51: 0x6B, 52: 0x4F}         # the bytes the task prints, by position in the packed codes


def p4_decode(*, blocks_per_row: bool = False, odd_in_high: bool = False, table: bool = True) -> float:
    """P4: the value bitsandbytes' dequantization gives for W[P4_ENTRY], decoded by hand from P4_BYTES and P4_ABSMAX
    (``code[q] · absmax[block]`` in fp32). The flags run the likely mistakes: one block (and absmax) per row, element
    2i+1 read from the high nibble, the code itself used as the level. tests/test_lesson15_items.py checks the
    default against bitsandbytes' ``dequantize_4bit`` on those bytes."""
    row, col = P4_ENTRY
    flat = row * P4_SHAPE[1] + col                 # blocks run over the flattened, row-major tensor
    block = row if blocks_per_row else flat // 64
    byte = P4_BYTES[flat // 2]
    odd = flat % 2 == 1
    q = (byte >> 4) if (odd == odd_in_high) else (byte & 0xF)   # element 2i in the high nibble, 2i+1 in the low one
    level = quant.nf4_code()[q] if table else torch.tensor(float(q))
    return float(level * torch.tensor(P4_ABSMAX[block], dtype=torch.float32))


def _p4_mistakes() -> list[Mistake]:
    row, col = P4_ENTRY
    flat = row * P4_SHAPE[1] + col
    return [
        Mistake("nibbles swapped", p4_decode(odd_in_high=True),
                f"you read W[{row}, {col}]'s code from the HIGH nibble. Its flat index {flat} is odd, element 2i+1 of "
                f"its byte, and bitsandbytes puts element 2i+1 in the LOW nibble: code = byte & 0xF. {READ_PACK}"),
        Mistake("absmax per row", p4_decode(blocks_per_row=True),
                f"you scaled by the absmax of row {row}, but bitsandbytes' blocks run over the flattened tensor and "
                f"ignore rows: W[{row}, {col}] is flat element {flat}, in block {flat} // 64 = {flat // 64}. That there "
                f"are three absmax values for three rows is a coincidence of 150 values in blocks of 64. {READ_BLOCK}"),
        Mistake("code as level", p4_decode(table=False),
                f"you multiplied the code itself by absmax; a code is an index into the NF4 table, and dequantization "
                f"is table[code] · absmax. {READ_BLOCK}"),
    ]


# P5: every byte of a double-quantized NF4 weight, for a shape and blocksize no cell runs. k_proj of SmolLM2's first layer
# (192 × 576 = 110,592 values) in blocks of 128 has 864 blocks, and 864 absmax codes make 3 whole groups of 256 and a
# partial fourth, which keeps its own fp32 absmax as a short last block does.
P5_SHAPE = (192, 576)
P5_BLOCKSIZE = 128
P5_GROUP = 256                # double quantization's blocksize over the absmax values


def p5_stored_bytes(*, blocksize: int = P5_BLOCKSIZE, double_quant: bool = True, codes_per_byte: int = 2,
                    whole_groups: bool = False, formula: bool = False) -> float:
    """P5: the bytes ``bnbF.quantize_4bit(W, blocksize, quant_type="nf4", compress_statistics=double_quant)`` stores for
    a P5_SHAPE weight: the packed codes, one absmax per block (fp32, or a uint8 code with double quantization), with
    double quantization one fp32 absmax per group of 256 blocks (the last group partial) and one fp32 offset. The flags
    run the likely mistakes: one code per byte, the partial group dropped, the per-parameter formula of 'Bits per
    parameter, counted' multiplied out (its 32/(256·B) bits per weight, plus the offset). tests/test_lesson15_items.py
    checks the default, and each variant that bitsandbytes can run, against bitsandbytes' own tensors."""
    n = P5_SHAPE[0] * P5_SHAPE[1]
    blocks = -(-n // blocksize)
    if formula:
        return n * quant.bits_per_parameter(blocksize, compress_statistics=double_quant) / 8 + 4 * double_quant
    codes = -(-n // codes_per_byte)
    if not double_quant:
        return float(codes + 4 * blocks)
    groups = blocks // P5_GROUP if whole_groups else -(-blocks // P5_GROUP)
    return float(codes + blocks + 4 * groups + 4)


def _p5_mistakes() -> list[Mistake]:
    n = P5_SHAPE[0] * P5_SHAPE[1]
    blocks = n // P5_BLOCKSIZE
    return [
        Mistake("no double quantization", p5_stored_bytes(double_quant=False),
                f"that is an fp32 absmax per block, 4 bytes each: storage without double quantization. With it, each of the "
                f"{blocks} blocks keeps a 1-byte code, and the fp32 numbers are one per group of {P5_GROUP} blocks plus the "
                f"offset. {READ_DQ}"),
        Mistake("blocksize 64", p5_stored_bytes(blocksize=64),
                f"that counts blocks of 64, the default the lesson used for gate_proj; this weight is stored with blocksize "
                f"{P5_BLOCKSIZE}: {n:,} / {P5_BLOCKSIZE} = {blocks} blocks. {READ_BLOCK}"),
        Mistake("one code per byte", p5_stored_bytes(codes_per_byte=1),
                f"a byte holds two 4-bit codes, so the codes take {n:,} / 2 bytes. {READ_PACK}"),
        Mistake("one fp32 short", p5_stored_bytes(whole_groups=True),
                f"you are one fp32 number (4 bytes) short. {blocks} absmax values make {blocks // P5_GROUP} whole groups of "
                f"{P5_GROUP} and a partial one, which keeps its own fp32 absmax as a short last block does; and the offset "
                f"is stored once. {READ_DQ}"),
        Mistake("per-parameter formula", p5_stored_bytes(formula=True),
                f"the formula 4 + 8/B + 32/(256·B) spreads the second-level absmax over the weights as a fraction of a bit; "
                f"the tensor stores whole fp32 numbers, one per group of {P5_GROUP} blocks, and {blocks} blocks need "
                f"{-(-blocks // P5_GROUP)} of them. {READ_BITS}"),
        Mistake("bits", 8 * p5_stored_bytes(), f"that is the count in bits; the question asks for bytes. {READ_BITS}"),
    ]


# --------------------------------------------------------------------------- items


def _as_byte_array(packed):
    """bytes / bytearray / memoryview as a uint8 array, and bitsandbytes' own (n, 1) layout (or (1, n)) as 1-D:
    both are the same bytes written differently."""
    if isinstance(packed, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(packed), dtype=np.uint8).copy()
    shape = getattr(packed, "shape", None)
    if shape is not None and len(shape) == 2 and 1 in tuple(shape):
        return packed.reshape(-1)
    return packed


class _BlockFunction(Function):
    """P2: the packed bytes may come back as bytes, bytearray, a list, or NumPy / torch (n,), (n, 1) arrays."""

    def check(self, answer, ctx):
        if callable(answer):
            student = answer

            @functools.wraps(student)
            def answer(*args, **kwargs):
                out = student(*args, **kwargs)
                if isinstance(out, (tuple, list)) and len(out) == 2:
                    out = (_as_byte_array(out[0]), out[1])
                return out

        return super().check(answer, ctx)


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 9

# P8: gate_proj of SmolLM2's first layer, NF4 with blocksize 64 and fp32 absmax (no double quantization).
P8_SHAPE = (1536, 576)
READ_DTYPE = "(Lesson 15, 'Storage dtype and compute dtype'.)"


def p8_stored_bytes(shape: tuple[int, int] = P8_SHAPE, blocksize: int = 64) -> int:
    """Bytes a Linear4bit stores for an NF4 weight without double quantization: two 4-bit codes per uint8 byte plus one
    fp32 absmax per block (bitsandbytes' Params4bit and QuantState). compute_dtype appears nowhere in it."""
    n = shape[0] * shape[1]
    return n // 2 + n // blocksize * 4


def p8_temporary_bytes(compute_dtype: torch.dtype, shape: tuple[int, int] = P8_SHAPE) -> int:
    """Bytes of the dequantized weight one forward matmul creates: gemm_4bit dequantizes to the input's dtype, which
    Linear4bit has cast to compute_dtype (bitsandbytes/backends/default/ops.py, _gemm_4bit_default_impl)."""
    return shape[0] * shape[1] * torch.tensor([], dtype=compute_dtype).element_size()


def p8_byte_changes() -> np.ndarray:
    """[Δ stored, Δ temporary] in bytes, from compute_dtype float32 to bfloat16 (negative: fewer bytes)."""
    stored = p8_stored_bytes()          # the same for either compute dtype
    return np.array([stored - stored, p8_temporary_bytes(torch.bfloat16) - p8_temporary_bytes(torch.float32)], dtype=np.float64)


def _p8_mistakes() -> list[Mistake]:
    stored, d_tmp = p8_stored_bytes(), p8_byte_changes()[1]
    n = P8_SHAPE[0] * P8_SHAPE[1]
    return [
        Mistake("halved storage", [-stored / 2, d_tmp],
                f"compute_dtype does not touch what the layer stores: the codes stay uint8 (two per byte) and absmax stays fp32, "
                f"{stored:,} bytes either way. Only the temporary dequantized weight follows compute_dtype. {READ_DTYPE}"),
        Mistake("halved absmax", [-n // 64 * 2, d_tmp],
                f"absmax is stored in fp32 whatever compute_dtype is (or as 8-bit codes with double quantization): the stored "
                f"bytes do not change. {READ_DTYPE}"),
        Mistake("no temporary", [0, 0],
                f"the stored bytes do not change, but every forward dequantizes the whole weight, code[q] · absmax, to "
                f"compute_dtype before F.linear: {n:,} values at 4 bytes in fp32, at 2 in bf16. {READ_DTYPE}"),
        Mistake("sign or size", [0, -d_tmp],
                f"the size is right and the sign is not: the bf16 temporary is {-d_tmp:,.0f} bytes smaller than the fp32 one, "
                f"so the change is negative. {READ_DTYPE}"),
        Mistake("whole fp32 temporary", [0, -2 * -d_tmp],
                f"that removes the whole fp32 temporary; the bf16 weight still takes 2 bytes per value. {READ_DTYPE}"),
        Mistake("bits", [0, 8 * d_tmp], f"that is the change in bits; the question asks for bytes. {READ_DTYPE}"),
    ]


ITEMS = {
    "w1": Choice(
        "how many NF4 levels, and where",
        0,
        key="b",
        explain={
            "a": "Eight and eight with no zero would be symmetric, but then a zero weight (and bitsandbytes' padding) could not be stored exactly. NF4 spends one level on an exact 0. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
            "b": "Sixteen codes cannot hold a symmetric set and an exact zero (8 + 8 has no zero, 7 + 0 + 7 leaves a code unused), so NF4 takes 8 positive normal quantiles, 7 negative ones and an exact 0, all divided by Φ⁻¹(offset) ≈ 1.848 so that the ends are exactly −1 and +1. Every code is used, and a zero weight (or the padding of an odd tensor) is stored exactly. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
            "c": "The side with the extra level is the positive one: 8 positive quantiles, 7 negative ones. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
            "d": "All 16 codes are used: the 16th level goes to the positive side, it is not left empty. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
        },
    ),
    "w2": Choice(
        "what double quantization compresses",
        0,
        key="d",
        explain={
            "a": "The 4-bit codes are left alone. What is quantized a second time are the quantization constants, the per-block absmax values. (Lesson 15, 'Double quantization'.)",
            "b": "The adapter is not quantized at all in QLoRA; double quantization is about the frozen base's metadata. (Lesson 15, 'Double quantization'.)",
            "c": "Activations are not touched by bitsandbytes' 4-bit storage; double quantization shrinks the per-block scales of the stored weight. (Lesson 15, 'Double quantization'.)",
            "d": "Every block of 64 weights keeps an fp32 absmax, 0.5 extra bits per weight. Double quantization subtracts their mean (one fp32 offset) and quantizes the centred values to uint8 codes with the 8-bit dynamic map, in blocks of 256 that each keep one fp32 absmax, so the overhead drops to 8/64 + 32/(64 · 256) ≈ 0.127 bits; the 4-bit codes stay as they were. (Lesson 15, 'Double quantization'.)",
        },
    ),
    "w3": Choice(
        "what a Linear4bit stores, and what its matmul runs in",
        0,
        key="a",
        explain={
            "a": "Storage and compute are separate: the weight is packed uint8 bytes, two NF4 codes each, plus a quant_state with the absmax (fp32 per block, or uint8 codes with an fp32 scale per 256 blocks and an offset when double quantized). On every forward the layer casts the input to compute_dtype, dequantizes code[q] · absmax (computed in fp32, rounded once to bf16), runs F.linear in bf16 and casts the output back to the input's dtype. (Lesson 15, 'Storage dtype and compute dtype'.)",
            "b": "The bf16 weights are gone after quantization: the layer keeps only the codes and scales, and dequantizes them on every forward. (Lesson 15, 'Storage dtype and compute dtype'.)",
            "c": "There is no 4-bit arithmetic on this path: the codes are looked up in the table, multiplied by absmax, and the matmul runs in compute_dtype. (Lesson 15, 'Storage dtype and compute dtype'.)",
            "d": "compute_dtype is the dtype of the dequantized weight and of the matmul, not of a saved file; the stored weight is uint8. (Lesson 15, 'Storage dtype and compute dtype'.)",
        },
    ),
    "p1": Function(
        "implement nf4_levels(offset)",
        3,
        name="nf4_levels",
        reference=nf4_levels,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("levels",),
        mistakes=p1_mistakes,
        rtol=1e-5,  # a float64 or a float32 probability grid both pass; the notebook checks bit-exactness
        atol=1e-6,
    ),
    "p2": _BlockFunction(
        "implement quantize_block_nf4(x, levels)",
        4,
        name="quantize_block_nf4",
        reference=quantize_block_nf4,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("packed", "absmax"),
        mistakes=p2_mistakes,
        rtol=0,
        atol=0,
    ),
    "p3": Array(
        "predict the two codes of the last packed byte of a 129-value NF4 weight (blocksize 64)",
        2,
        name="codes",
        expected=lambda: p3_last_byte_codes(),
        rtol=0,
        atol=0,
        mistakes=_p3_mistakes,
        reread=READ_BLOCK_SECTION,
    ),
    "p4": Numeric(
        "predict the value bitsandbytes dequantizes for W[2, 3] of a 3 × 50 NF4 weight from its bytes and absmax",
        1,
        name="value",
        expected=lambda: p4_decode(),
        rtol=1e-3,  # the prompt asks for 3 significant digits
        mistakes=_p4_mistakes,
        reread=READ_BLOCK_SECTION,
    ),
    "p5": Numeric(
        f"predict every byte a {P5_SHAPE[0]} × {P5_SHAPE[1]} NF4 weight stores with blocksize {P5_BLOCKSIZE} and double quantization",
        1,
        name="stored_bytes",
        expected=lambda: p5_stored_bytes(),
        rtol=0,
        atol=0.5,  # a whole number of bytes
        mistakes=_p5_mistakes,
        unit="bytes",
        reread="Reread 'Double quantization' in Know this.",
    ),
    "p6": Choice(
        "which blocks get their absmax back exactly after double quantization",
        2,
    ),
    "p7": Choice(
        "which predictions about the 4-bit formats' contracts are true",
        2,
        options="abcde",
        multi=True,
    ),
    "p8": Array(
        "bytes that change when gate_proj's Linear4bit computes in bf16 instead of fp32: [stored, temporary weight]",
        1,
        name="byte_changes",
        expected=lambda: p8_byte_changes(),
        rtol=1e-6,
        atol=0.5,
        mistakes=_p8_mistakes,
        reread="Reread 'Storage dtype and compute dtype' in Know this.",
    ),
}
