"""Graded items of lesson 18, "GGUF"."""

from __future__ import annotations

import functools

import numpy as np

from ... import gguf_file
from ..checkers import Case, Mistake
from .. import Choice, Function, Numeric, Ordering

READ_Q4_1 = "(Lesson 18, 'Inside a Q4_1 block'.)"
READ_ROUTE_TWO = "(Lesson 18, 'Route two: a packed kernel with its own backward'.)"
READ_LOST = "(Lesson 18, 'What Q4_1 already lost'.)"


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


# W3: Q4_1's quantizer, run by hand on one value: a block whose weights run from W3["lo"] to W3["hi"] (m = min,
# d = (max − min) / 15, both stored as float16) and its weight W3["w"], (w − m) / d = 8.8, rounded to code 9.
W3 = dict(lo=-0.030, hi=0.045, w=0.014)


def w3_block() -> np.ndarray:
    """A 32-weight block spanning [lo, hi] evenly, with W3["w"] as its element 5 (float32, shape (1, 32))."""
    block = np.linspace(W3["lo"], W3["hi"], 32).astype(np.float32)
    block[5] = W3["w"]
    return block[None, :]


def _w3_expected() -> float:
    """W3's weight after gguf's reference Q4_1 quantizer and decoder (coursekit.gguf_file.q4_1_round_trip)."""
    return float(gguf_file.q4_1_round_trip(w3_block())[0, 5])


def _w3_grid(steps: int = 15, rounding=np.round) -> float:
    """W3 worked on a grid of ``steps`` steps over the block's range, float16 d and m, the code from ``rounding``."""
    lo, hi, w = W3["lo"], W3["hi"], W3["w"]
    d, m = np.float32(np.float16((hi - lo) / steps)), np.float32(np.float16(lo))
    return float(d * np.float32(rounding((np.float32(w) - m) / d)) + m)


def _w3_mistakes():
    lo, hi, w = W3["lo"], W3["hi"], W3["w"]
    q = round((w - lo) / ((hi - lo) / 15))
    return [
        Mistake("truncated", _w3_grid(rounding=np.floor), "you dropped the fraction of (w − m) / d = 8.8: the quantizer "
                "rounds to the nearest level, code 9, not down to 8. " + READ_Q4_1),
        Mistake("16 steps", _w3_grid(steps=16), "you divided the range into 16 steps: 16 levels m, m + d, …, m + 15d span "
                "15 steps, so d = (max − min) / 15 and the largest weight is a level too. " + READ_Q4_1),
        Mistake("code", float(q), "that is the code q; the question asks for the weight it decodes to, w = d · q + m. "
                + READ_Q4_1),
        Mistake("no minimum", _w3_grid() - float(np.float16(lo)), "you left out the minimum: d · q is the distance above m, "
                "and the decoder adds m back, w = d · q + m. " + READ_Q4_1),
        Mistake("Q4_0", float(_q4_0_round_trip(w3_block())[5]), "that is Q4_0's symmetric grid, d · (q − 8) with d set by the "
                "largest |w|; Q4_1 shifts its grid to the block's minimum, w = d · q + m. " + READ_Q4_1),
    ]


def _q4_0_round_trip(block: np.ndarray) -> np.ndarray:
    """gguf's reference Q4_0 quantizer and decoder on one block (the symmetric format W3's Q4_0 mistake uses)."""
    import gguf

    t = gguf.GGMLQuantizationType.Q4_0
    return gguf.quants.dequantize(gguf.quants.quantize(np.asarray(block, dtype=np.float32), t), t).ravel()


# P6 predicts a format the lesson does not run: ggml's Q5_1, Q4_1 with 5-bit codes (0…31) on the same blocks of 32, the same
# float16 d and m and the same min/max quantizer, so d = (max − min) / 31 instead of / 15. The lesson's step estimate (each
# weight's rounding error uniform over one step, ‖W − Ŵ‖² ≈ Σ 32 · d²/12) makes the error proportional to d: Q4_1's
# measured 0.078 on the lesson's Gaussian W times 15/31. The key is measured: gguf's Q5_1 quantizer on that W.
P6_SEED, P6_SHAPE, P6_STD = 18, (1536, 576), 0.05
P6_RTOL = 0.01   # the prompt says "graded to 1 %": the 15/31 prediction lands within 0.1 %, "halved" is 3 % off


def p6_weight() -> np.ndarray:
    """The lesson's synthetic weight: W ~ N(0, 0.05²), 1536 × 576 (ffn_gate's shape), seed 18, float32."""
    return (P6_STD * np.random.default_rng(P6_SEED).standard_normal(P6_SHAPE)).astype(np.float32)


def gguf_error(type_name: str, W: np.ndarray | None = None) -> float:
    """‖Ŵ − W‖ / ‖W‖ after gguf's reference quantizer and decoder of ``type_name`` (e.g. "Q4_1", "Q5_1")."""
    import gguf

    W = p6_weight() if W is None else W
    t = gguf.GGMLQuantizationType[type_name]
    W_hat = gguf.quants.dequantize(gguf.quants.quantize(W, t), t).reshape(W.shape)
    return gguf_file.relative_error(W_hat, W)


@functools.lru_cache(maxsize=None)
def _lesson_error(type_name: str) -> float:
    return gguf_error(type_name)


def _p6_expected() -> float:
    return _lesson_error("Q5_1")


def _p6_mistakes():
    q41 = _lesson_error("Q4_1")
    return [
        Mistake("halved", q41 / 2, "you halved Q4_1's error because one more bit doubles the levels, 16 to 32. The error "
                "follows the step d, and 32 levels span 31 steps of the block's range where 16 span 15: d shrinks by "
                f"15/31, a little more than half. {READ_LOST}"),
        Mistake("squared", q41 * (15 / 31) ** 2, "you scaled by (15/31)², as for a mean squared error. The relative "
                "Frobenius error is a root of sums of squares, so it is proportional to the step d itself: scale by "
                f"15/31. {READ_LOST}"),
        Mistake("bits ratio", q41 * 5 / 6, "you scaled by the storage cost, 5 bits per weight for Q4_1 against 6 for Q5_1 "
                "(24 bytes per 32). The error follows the step between levels, d = (max − min) / 31 instead of / 15, not "
                f"the bits paid. {READ_LOST}"),
        Mistake("code bits ratio", q41 * 4 / 5, "you scaled by the code widths, 4 bits against 5. The error follows the "
                "step between levels, and one more bit roughly halves it: d = (max − min) / 31 instead of / 15. "
                + READ_LOST),
        Mistake("unchanged", q41, "that is Q4_1's own error. Q5_1 keeps the same blocks and the same float16 d and m, but "
                f"its 32 levels cut the block's range into 31 steps instead of 15, so every rounding is finer. {READ_LOST}"),
    ]


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 23

ITEMS = {
    "w1": Choice(
        "what a GGUF file is",
        0,
        key="d",
        explain={
            "a": "GGUF does not fix one encoding: each tensor in the file carries its own type, a float type or one of many quantized encodings. The shipped file mixes three. (Lesson 18, 'A container, not an encoding'.)",
            "b": "GGUF records tensor types and metadata, not a training state: there are no gradients or optimizer moments in the file, and nothing about it forbids or provides them. (Lesson 18, 'A container, not an encoding'.)",
            "c": "GGUF is a file format: it stores metadata and tensors and runs nothing; no autograd lives in it. (Lesson 18, 'A container, not an encoding'.)",
            "d": "A GGUF file is a header of key–value metadata (architecture, sizes, tokenizer, chat template), a tensor table (name, shape, type and offset of every tensor) and the tensor bytes, and the type belongs to each tensor, not to the file. The course's file mixes three types, and its tensor table says which tensor has which. (Lesson 18, 'A container, not an encoding'.)",
        },
    ),
    "w2": Choice(
        "how a Q4_1 block reconstructs a weight",
        0,
        key="c",
        explain={
            "a": "w = d · q has no offset: code 0 would decode to 0 and the 16 levels would run from 0 to 15d = max − min, the block's range moved to start at zero, so a block of negative weights could not be stored. Q4_1 adds the minimum back: w = d · q + m. (Lesson 18, 'Inside a Q4_1 block'.)",
            "b": "d · (q + 0.5) + m decodes each code to the middle of a bin of width d, as a quantizer that rounds down would need: code 0 gives m + d/2 and code 15 gives max + d/2, so neither the block's smallest nor its largest weight is a level, and the top half-step lies outside the block. The quantizer rounds to the nearest level, and d = (max − min) / 15 makes 16 levels 15 steps apart from min to max: w = d · q + m. (Lesson 18, 'Inside a Q4_1 block'.)",
            "c": "Q4_1 is an asymmetric grid: with m = min and d = (max − min) / 15, the 16 levels m, m + d, …, m + 15d run from the block's smallest weight to its largest in 15 equal steps, and the decoder computes w = d · q + m in float32 (ggml's dequantize_row_q4_1, gguf.quants). Code 0 gives back the minimum and code 15 the maximum, up to the float16 rounding of d and m. (Lesson 18, 'Inside a Q4_1 block'.)",
            "d": "d · q / 15 + m takes d for the whole range: code 0 does give the minimum, but code 15 would decode to m + d, one step above it, so all 16 codes would land within one step of the minimum however far above it the block's weights reach. d is already the range divided by 15, the step between neighbouring levels, so w = d · q + m reaches m + 15d = max at code 15. (Lesson 18, 'Inside a Q4_1 block'.)",
        },
    ),
    "w3": Numeric(
        "Q4_1's quantizer by hand: what 0.014 decodes to in a block from -0.030 to 0.045",
        0,
        name="decoded_weight",
        expected=_w3_expected,
        rtol=1e-3,  # the prompt asks for 3 significant digits; 0.015 passes (the float16 d makes it 0.01501)
        mistakes=_w3_mistakes,
    ),
    "p1": Choice(
        "predictions about the file's tensors, their bytes and their Q4_1 blocks",
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
        "GGUF types and route one's bf16: order seven pieces of the course's model by their bytes, smallest first",
        2,
        labels={
            "attn_output": "the 30 o_proj tensors of the GGUF file (blk.N.attn_output.weight), together",
            "attn_v": "the 30 v_proj tensors of the GGUF file (blk.N.attn_v.weight), together",
            "attn_v_q8_0": "the same 30 v_proj tensors, had the converter stored them as Q8_0 like token_embd, together",
            "norms": "all the RMSNorm weight vectors of the GGUF file, together",
            "token_embd": "token_embd.weight in the GGUF file",
            "up_bf16": "the 30 up_proj weights in the bf16 checkpoint that route one writes, together",
            "up_gguf": "the 30 up_proj tensors of the GGUF file (blk.N.ffn_up.weight), together",
        },
    ),
    "p5": Choice(
        "predict the whole file's bits per weight with the tied embedding stored as Q4_1",
        1,
    ),
    "p6": Numeric(
        "predict Q5_1's relative error on the lesson's Gaussian weight from Q4_1's and the step estimate",
        1,
        name="relative_error",
        expected=_p6_expected,
        rtol=P6_RTOL,
        mistakes=_p6_mistakes,
        reread="Reread 'What Q4_1 already lost' in Know this.",
    ),
    "p7": Choice(
        "NF4 of a Q8_0 weight, measured against the original",
        1,
    ),
}
