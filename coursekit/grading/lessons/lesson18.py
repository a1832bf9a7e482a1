"""Graded items of lesson 18, "GGUF"."""

from __future__ import annotations

import numpy as np

from ... import gguf_file
from ..checkers import Case, Mistake
from .. import Choice, Function, Numeric, Ordering

READ_CONTAINER = "(Lesson 18, 'A container, not an encoding'.)"
READ_Q4_1 = "(Lesson 18, 'Inside a Q4_1 block'.)"
READ_BITS = "(Lesson 18, 'Bits per weight'.)"
READ_ROUTE_TWO = "(Lesson 18, 'Route two: a packed kernel with its own backward'.)"

# The embedding of the shipped file: 49,152 tokens × 576, stored as Q8_0 (32 int8 codes + one fp16 scale = 34 bytes per 32).
EMBED_SHAPE = (49152, 576)
# P6 asks for a configuration the file does not hold: the same vocabulary, a hidden size of 960, stored as this file stores
# its embedding (Q8_0). The shipped embedding's bytes are printed in the lesson; these must be worked out from the layout.
P6_SHAPE = (49152, 960)


# --------------------------------------------------------------------------- references


def dequantize_q4_1(block_bytes):
    """Reference for p2: float32 (n_blocks, 32), w = d·q + m (coursekit.gguf_file, bit-exact with gguf.quants)."""
    return gguf_file.dequantize_q4_1(block_bytes)


def q4_1_input_grad(D, packed):
    """Reference for p3: dX = D Ŵ (n × d) for Y = X Ŵᵀ, Ŵ (m × d) decoded from packed rows (m, d/32·20)."""
    packed = np.asarray(packed, dtype=np.uint8)
    W_hat = gguf_file.dequantize_q4_1(packed).reshape(packed.shape[0], -1).astype(np.float64)
    return np.asarray(D, dtype=np.float64) @ W_hat


# --------------------------------------------------------------------------- cases


def _blocks(rng: np.random.Generator, n: int, scale: float = 0.01, min_scale: float = 0.1) -> np.ndarray:
    """n random Q4_1 blocks (n, 20): fp16 d > 0, fp16 m (mostly negative, never 0), random nibbles."""
    b = rng.integers(0, 256, size=(n, 20), dtype=np.uint8)
    d = (np.abs(rng.standard_normal(n)) + 0.1) * scale
    m = -(np.abs(rng.standard_normal(n)) + 0.2) * min_scale * rng.choice([1, 1, 1, -1], size=n)
    b[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(n, 2)
    b[:, 2:4] = m.astype("<f2").view(np.uint8).reshape(n, 2)
    return b


def _readable_block() -> np.ndarray:
    """One block anyone can decode by hand: d = 0.5, m = −4, low nibbles 0..15, high nibbles 15..0."""
    b = np.zeros((1, 20), dtype=np.uint8)
    b[0, 0:2] = np.array([0.5], dtype="<f2").view(np.uint8)
    b[0, 2:4] = np.array([-4.0], dtype="<f2").view(np.uint8)
    lo = np.arange(16, dtype=np.uint8)
    b[0, 4:] = lo | ((15 - lo) << 4)
    return b


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(18)
    return [
        Case(dict(block_bytes=_readable_block()), "one block: d = 0.5, m = −4, low nibbles 0..15, high nibbles 15..0"),
        Case(dict(block_bytes=_blocks(rng, 3)), "three random blocks"),
        Case(dict(block_bytes=_blocks(rng, 5, scale=0.002, min_scale=0.03)), "five blocks with weight-sized scales"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(dict(block_bytes=_blocks(rng, int(rng.integers(1, 9)), scale=float(10.0 ** rng.uniform(-3, -1)),
                                          min_scale=float(10.0 ** rng.uniform(-2, 0))))) for _ in range(6)]


def _packed(rng: np.random.Generator, m: int, d: int) -> np.ndarray:
    return _blocks(rng, m * d // 32, scale=0.004, min_scale=0.03).reshape(m, d // 32 * 20)


def _p3_public() -> list[Case]:
    rng = np.random.default_rng(81)
    return [
        Case(dict(D=rng.standard_normal((2, 32)), packed=_packed(rng, 32, 32)), "square: m = d = 32, two tokens"),
        Case(dict(D=rng.standard_normal((3, 4)), packed=_packed(rng, 4, 64)), "m = 4 outputs, d = 64 inputs, three tokens"),
    ]


def _p3_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for i in range(4):
        m = 32 if i == 0 else int(rng.integers(2, 9))
        d = 32 if i == 0 else 32 * int(rng.integers(1, 4))
        out.append(Case(dict(D=rng.standard_normal((int(rng.integers(1, 4)), m)), packed=_packed(rng, m, d))))
    return out


# --------------------------------------------------------------------------- mistakes


def _decode_variants(block_bytes) -> dict[str, np.ndarray]:
    """What typical wrong decoders return for these blocks (float64), by label."""
    # Misread bytes can be inf or NaN; NumPy would warn on stderr, and a test cell with stderr scores 0.
    with np.errstate(all="ignore"):
        return _variants(block_bytes)


def _variants(block_bytes) -> dict[str, np.ndarray]:
    b = np.asarray(block_bytes, dtype=np.uint8).reshape(-1, 20)
    n = b.shape[0]
    d = b[:, 0:2].copy().view("<f2").astype(np.float64)
    m = b[:, 2:4].copy().view("<f2").astype(np.float64)
    qs = b[:, 4:].astype(np.int64)
    lo, hi = qs & 0x0F, qs >> 4
    halves = np.concatenate([lo, hi], axis=1)
    inter = np.stack([lo, hi], axis=2).reshape(n, 32)
    inter_hi = np.stack([hi, lo], axis=2).reshape(n, 32)
    swapped = np.concatenate([hi, lo], axis=1)
    # Sign and shift slips: the high nibble of an int8 view shifted arithmetically (negative for bytes ≥ 0x80), or
    # masked with 0xF0 and never shifted (16× too large).
    hi_signed = b[:, 4:].view(np.int8).astype(np.int64) >> 4
    out = {
        "interleaved": d * inter + m,
        "interleaved, high first": d * inter_hi + m,
        "halves swapped": d * swapped + m,
        "no minimum": d * halves,
        "Q4_0": d * (halves - 8),
        "Q4_0 plus m": d * (halves - 8) + m,
        "minus m": d * halves - m,
        "signed high nibble": d * np.concatenate([lo, hi_signed], axis=1) + m,
        "high nibble unshifted": d * np.concatenate([lo, qs & 0xF0], axis=1) + m,
        "d and m swapped": m * halves + d,
        "bits as integers": b[:, 0:2].copy().view("<u2").astype(np.float64) * halves + b[:, 2:4].copy().view("<u2").astype(np.float64),
        "big-endian": b[:, 0:2].copy().view(">f2").astype(np.float64) * halves + b[:, 2:4].copy().view(">f2").astype(np.float64),
    }
    # Right formula, wrong arithmetic: float16 throughout (each product and sum rounded to float16), or a float32
    # result rounded to bfloat16 on return. Both miss by far more than float32's rounding.
    d16, m16 = b[:, 0:2].copy().view("<f2"), b[:, 2:4].copy().view("<f2")
    out["float16 arithmetic"] = (d16 * halves.astype(np.float16) + m16).astype(np.float64)
    f32 = d.astype(np.float32) * halves.astype(np.float32) + m.astype(np.float32)
    out["bfloat16 result"] = _round_bf16(f32)
    # The pre-GGUF ggml layout: float d, float m (4 bytes each), then the nibbles; 20 bytes leave 12 for codes.
    d32 = b[:, 0:4].copy().view("<f4").astype(np.float64)
    m32 = b[:, 4:8].copy().view("<f4").astype(np.float64)
    q12 = b[:, 8:].astype(np.int64)
    out["fp32 header"] = d32 * np.concatenate([q12 & 0x0F, q12 >> 4], axis=1) + m32
    return out


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 (round to nearest even) → float64, without torch."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)


_MESSAGES = {
    "interleaved": "you interleaved the nibbles (byte j → elements 2j and 2j + 1). In ggml's Q4_1 the low nibbles of the 16 "
                   "code bytes are elements 0..15 and the high nibbles are elements 16..31. " + READ_Q4_1,
    "interleaved, high first": "you interleaved the nibbles with the high one first (element 2j from the high nibble): that is "
                               "bitsandbytes' NF4 packing (lesson 15), not ggml's. In Q4_1 the low nibbles are elements 0..15 "
                               "and the high nibbles 16..31. " + READ_Q4_1,
    "halves swapped": "you took the high nibbles as elements 0..15 and the low ones as 16..31: it is the other way round "
                      "(qs[j] & 0x0F is element j, qs[j] >> 4 is element j + 16). " + READ_Q4_1,
    "no minimum": "you forgot the minimum m: Q4_1 stores w = d·q + m, and m (bytes 2..3, float16) shifts every weight of "
                  "the block. Without it all 32 values are ≥ 0. " + READ_Q4_1,
    "Q4_0": "you decoded Q4_0 (w = d·(q − 8), symmetric, no minimum). Q4_1 is the asymmetric one: w = d·q + m. " + READ_Q4_1,
    "Q4_0 plus m": "you subtracted 8 from the codes (Q4_0's centring) and also added m. Q4_1 codes are 0..15 as stored: "
                   "w = d·q + m. " + READ_Q4_1,
    "minus m": "you subtracted m. Q4_1 stores the block minimum itself (usually negative) and adds it: w = d·q + m. "
               "(The K-quants, e.g. Q4_K, store a positive offset and subtract it; Q4_1 does not.) " + READ_Q4_1,
    "signed high nibble": "your high nibbles come out negative for bytes ≥ 0x80: you shifted a signed (int8) view, and >> "
                          "keeps the sign. Shift the unsigned bytes (uint8): codes are 0..15. " + READ_Q4_1,
    "high nibble unshifted": "you masked the high nibble with 0xF0 but did not shift it down: elements 16..31 come out 16 "
                             "times too large. Use qs >> 4. " + READ_Q4_1,
    "float16 arithmetic": "the formula is right, but you computed d·q + m in float16, which rounds every product and sum "
                          "(about 3 decimal digits). ggml decodes in float32: convert d and m with .astype(np.float32) "
                          "before multiplying. " + READ_Q4_1,
    "bfloat16 result": "the formula is right, but your result was rounded to bfloat16 (8 significant bits, 7 of them stored). ggml decodes in "
                       "float32: return float32 (or float64). " + READ_Q4_1,
    "d and m swapped": "you swapped d and m: bytes 0..1 are the step d, bytes 2..3 the minimum m; w = d·q + m. " + READ_Q4_1,
    "bits as integers": "you read d's and m's two bytes as integers (uint16) instead of reinterpreting them as float16: "
                        "use .view(np.float16) on the bytes (little-endian), then convert to float32. " + READ_Q4_1,
    "big-endian": "you read d and m big-endian. GGUF is little-endian: bytes [lo, hi] viewed as '<f2' (np.float16 on this "
                  "machine). " + READ_Q4_1,
    "fp32 header": "you treated d (and m) as float32, 4 bytes each: that was ggml's Q4_1 layout until May 2023 "
                   "(24-byte blocks; llama.cpp PR #1508 switched d and m to float16). In GGUF both are float16 (ggml_half): 2 + 2 + 16 = 20 bytes per 32 weights. " + READ_Q4_1,
}


# Every message above quotes only Q4_1's fixed layout (bytes 0..1, 0x0F, elements 16..31), never a case's bytes or
# shapes, so each is also the hint a hidden case shows.


def p2_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    return {"w": [Mistake(k, v, _MESSAGES[k], hint=_MESSAGES[k]) for k, v in _decode_variants(kw["block_bytes"]).items()]}


def p3_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    packed = np.asarray(kw["packed"], dtype=np.uint8)
    D = np.asarray(kw["D"], dtype=np.float64)
    m = packed.shape[0]
    W_hat = q4_1_input_grad(np.eye(m), packed)  # Ŵ, m × d
    out = [Mistake("zero", np.zeros((D.shape[0], W_hat.shape[1])),
                   "you returned zeros: the weight is frozen, but frozen is not detached (lesson 05). The base path "
                   "still carries the gradient to X: dX = D Ŵ. " + READ_ROUTE_TWO)]
    if m == W_hat.shape[1]:
        out.append(Mistake("transposed", D @ W_hat.T,
                           "you multiplied by Ŵᵀ. The layer computes Y = X Ŵᵀ with Ŵ stored m × d (out × in, one row of "
                           "blocks per output), so dX = D Ŵ: the backward walks the packed rows the other way "
                           "(transposed access). " + READ_ROUTE_TWO))
    with np.errstate(all="ignore"):
        for k, v in _decode_variants(packed).items():
            if k not in ("fp32 header", "float16 arithmetic", "bfloat16 result"):
                text = "your Ŵ is decoded wrongly: " + _MESSAGES[k]
                out.append(Mistake(k, D @ v.reshape(m, -1), text, hint=text))
    return {"dX": out}


# --------------------------------------------------------------------------- items


def _w3_mistakes():
    return [
        Mistake("codes only", 4.0, "4 bits is the code alone. Each block of 32 also stores d and m, 2 bytes each: "
                                   f"(16 + 2 + 2) bytes × 8 / 32. {READ_BITS}"),
        Mistake("one scale", 4.5, "4.5 bits is 4-bit codes plus one 16-bit number per 32 weights (Q4_0, whose 18-byte blocks "
                                  "have no minimum; by coincidence also NF4's 4 + 32/64). Q4_1 stores d and m. " + READ_BITS),
        Mistake("fp32 d and m", 6.0, "6 bits would be d and m as float32 (the pre-GGUF layout); GGUF's Q4_1 stores both as "
                                     "float16. " + READ_BITS),
        Mistake("bytes per block", 20.0, "20 is the bytes per block; the question asks for bits per weight: 20 × 8 / 32. " + READ_BITS),
        Mistake("bits per block", 160.0, "160 is the bits per block of 32 weights; divide by 32. " + READ_BITS),
        Mistake("NF4 + DQ", 4.127, "4.127 is NF4 with double quantization (lesson 15), not Q4_1. " + READ_BITS),
    ]


def _embed_bytes(bits: float, shape: tuple[int, int] = P6_SHAPE) -> float:
    return shape[0] * shape[1] * bits / 8


def _p6_mistakes():
    return [
        Mistake("assumed Q4_1", _embed_bytes(5.0), "that is the size if the embedding were Q4_1, like the projections. Measure, "
                                                  "don't assume: the file stores token_embd.weight as Q8_0 (34 bytes per 32). "
                                                  + READ_CONTAINER),
        Mistake("shipped size", _embed_bytes(8.5, EMBED_SHAPE), "that is the shipped embedding, 576 wide, as the table prints it; "
                                                               "the question asks for a hidden size of 960. " + READ_BITS),
        Mistake("bf16", _embed_bytes(16.0), "that is the embedding in bf16 (2 bytes per weight), as in route one's checkpoint; "
                                            "the question asks about the GGUF file. " + READ_CONTAINER),
        Mistake("fp32", _embed_bytes(32.0), "that is the embedding in float32; the file stores it as Q8_0. " + READ_CONTAINER),
        Mistake("8 bits flat", _embed_bytes(8.0), "that counts 8 bits per weight: Q8_0 also stores one float16 scale per 32 "
                                                  "weights, so 34 bytes per block (8.5 bits per weight). " + READ_BITS),
        Mistake("fp32 scale", _embed_bytes(9.0), "that counts Q8_0's scale as float32 (36 bytes per 32): in GGUF the scale d "
                                                 "is float16, so a block is 2 + 32 = 34 bytes. " + READ_BITS),
        Mistake("Q4_0", _embed_bytes(4.5), "that is the size at 4.5 bits per weight (Q4_0, or NF4); the file stores "
                                            "token_embd.weight as Q8_0: 34 bytes per 32 weights. " + READ_CONTAINER),
        Mistake("MiB", _embed_bytes(8.5) / 2**20, "that is the right size in MiB (2²⁰ bytes); the question asks for bytes. "
                                                  + READ_CONTAINER),
        Mistake("MB", _embed_bytes(8.5) / 1e6, "that is the right size in MB (10⁶ bytes); the question asks for bytes. "
                                               + READ_CONTAINER),
        Mistake("4 bits flat", _embed_bytes(4.0), "that counts 4 bits per weight with no block metadata, and the embedding is not "
                                                  "even 4-bit here: it is Q8_0. " + READ_CONTAINER),
    ]


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 23

ITEMS = {
    "w1": Choice(
        "what a GGUF file is",
        0,
        key="b",
        explain={
            "a": "GGUF does not fix one encoding: each tensor in the file carries its own type (F32, Q8_0, Q4_1, ...). The shipped file mixes three. (Lesson 18, 'A container, not an encoding'.)",
            "b": "A GGUF file is a header of key–value metadata (architecture, sizes, tokenizer, chat template), a tensor table (name, shape, type and offset of every tensor) and the tensor bytes, and the type belongs to each tensor, not to the file. The course's file mixes three: Q4_1 for the 210 linear projections, Q8_0 for the tied embedding and F32 for the 61 norm vectors. (Lesson 18, 'A container, not an encoding'.)",
            "c": "GGUF is a file format: it stores metadata and tensors and runs nothing; no autograd lives in it. (Lesson 18, 'A container, not an encoding'.)",
            "d": "GGUF records tensor types and metadata, not a training state: there are no gradients or optimizer moments in the file, and nothing about it forbids or provides them. (Lesson 18, 'A container, not an encoding'.)",
        },
    ),
    "w2": Choice(
        "how a Q4_1 block reconstructs a weight",
        0,
        key="c",
        explain={
            "a": "w = d·q has no offset: every weight of the block would have the sign of d. Q4_1 adds the block minimum m. (Lesson 18, 'Inside a Q4_1 block'.)",
            "b": "w = d·(q − 8) is Q4_0, the symmetric format with one scale per block. Q4_1 stores a minimum instead. (Lesson 18, 'Inside a Q4_1 block'.)",
            "c": "Q4_1 is an asymmetric grid: the quantizer takes m = the block's minimum and d = (max − min) / 15, so the 16 levels m, m + d, …, m + 15d span the block's range, and the decoder computes w = d · q + m in float32. Code 0 gives back the minimum and code 15 the maximum (up to the float16 rounding of d and m). (Lesson 18, 'Inside a Q4_1 block'.)",
            "d": "d is the step between levels and m the smallest value: w = d·q + m, not the other way round. (Lesson 18, 'Inside a Q4_1 block'.)",
        },
    ),
    "w3": Numeric(
        "bits per weight of Q4_1",
        0,
        name="bits_per_weight",
        expected=lambda: gguf_file.bits_per_weight("Q4_1"),
        rtol=1e-3,
        mistakes=_w3_mistakes,
        unit="bits",
    ),
    "p1": Choice(
        "what the shipped file stores, tensor by tensor",
        2,
        options="abcdef",
        multi=True,
    ),
    "p2": Function(
        "implement dequantize_q4_1",
        4,
        name="dequantize_q4_1",
        reference=dequantize_q4_1,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("w",),
        mistakes=p2_mistakes,
    ),
    "p3": Function(
        "implement the packed layer's input gradient dX = D Ŵ",
        3,
        name="q4_1_input_grad",
        reference=q4_1_input_grad,
        public=_p3_public,
        hidden=_p3_hidden,
        outputs=("dX",),
        mistakes=p3_mistakes,
        rtol=1e-5,
        atol=1e-6,
    ),
    "p4": Ordering(
        "route one, from the GGUF file to a QLoRA adapter: put the steps in order",
        2,
        labels={
            "adapter": "attach LoRA adapters (A, B) to the target modules",
            "bf16": "save the dequantized weights as a bf16 checkpoint",
            "dequantize": "dequantize every tensor to floats (Q4_1: w = d·q + m)",
            "nf4": "load that checkpoint with BitsAndBytesConfig: each linear weight is quantized again, to NF4",
            "read": "read the GGUF's metadata and tensor table",
            "train": "train A and B; the gradient reaches them through the frozen NF4 base",
            "validate": "merge or export the adapter and measure it again on the base you will serve",
        },
    ),
    "p5": Choice(
        "GGUF and backpropagation",
        1,
    ),
    "p6": Numeric(
        "predict the bytes of a 49,152 × 960 embedding stored as the file stores its own",
        1,
        name="embed_bytes",
        expected=lambda: _embed_bytes(gguf_file.bits_per_weight("Q8_0")),
        rtol=1e-6,
        mistakes=_p6_mistakes,
        unit="bytes",
    ),
    "p7": Choice(
        "NF4 of a Q8_0 weight, measured against the original",
        1,
    ),
}
