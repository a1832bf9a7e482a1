"""Graded items of lesson 16, "Training through a quantized base"."""

from __future__ import annotations

import numpy as np

from ..checkers import Case, Mistake
from .. import Choice, Function, Ordering

READ_GRADIENT = "(Lesson 16, 'How a gradient reaches the adapter through a frozen quantized base'.)"
READ_BLOCK = "(Lesson 15, 'Quantizing one block by hand'.)"
READ_BACKENDS = "(Lesson 16, 'Backends: what runs on this machine'.)"


# --------------------------------------------------------------------------- p1: the input gradient of a 4-bit layer


def _nf4_table() -> np.ndarray:
    from ... import quant

    return quant.nf4_code().double().numpy()


def dequantize(codes, absmax, code, blocksize) -> np.ndarray:
    """Ŵ[i, j] = code[codes[i, j]] · absmax[(i·d + j) // blocksize]: blocks run over the **flattened** (row-major)
    m × d weight, as in bitsandbytes (so a block can span two rows). Returns float64, m × d."""
    codes = np.asarray(codes)
    m, d = codes.shape
    flat = np.arange(m * d) // int(blocksize)
    return np.asarray(code, dtype=np.float64)[codes] * np.asarray(absmax, dtype=np.float64)[flat].reshape(m, d)


def quantized_linear_backward(D, codes, absmax, code, blocksize):
    """Reference for p1: ∂L/∂X of Y = X Ŵᵀ (``Linear4bit``, weight m × d) for the upstream gradient D (n × m).

    Computed as the vector–Jacobian product of the forward through torch autograd (what ``MatMul4Bit.backward``
    computes: ``grad_output @ dequantize_4bit(weight)``). Returns n × d, float64.
    """
    import torch

    W_hat = torch.tensor(dequantize(codes, absmax, code, blocksize))
    D_t = torch.tensor(np.asarray(D, dtype=np.float64))
    X = torch.zeros(D_t.shape[0], W_hat.shape[1], dtype=torch.float64, requires_grad=True)
    (dX,) = torch.autograd.grad(torch.nn.functional.linear(X, W_hat), X, grad_outputs=D_t)
    return dX.numpy()


def _case(rng: np.random.Generator, m: int, d: int, blocksize: int, n: int = 3) -> dict:
    nb = -(-m * d // blocksize)
    return dict(
        D=rng.standard_normal((n, m)),
        codes=rng.integers(0, 16, size=(m, d)),
        absmax=rng.uniform(0.05, 2.0, size=nb),  # very different block scales: every indexing slip shows
        code=_nf4_table(),
        blocksize=blocksize,
    )


def _real_case() -> dict:
    """Codes and absmax of a real NF4 quantization (coursekit.quant, bit-exact with bitsandbytes on CPU)."""
    import torch

    from ... import quant

    g = torch.Generator().manual_seed(16)
    W = torch.randn(8, 64, generator=g) * 0.05
    packed, st = quant.quantize_4bit(W, blocksize=64, quant_type="nf4")
    codes = quant.unpack_nibbles(packed, W.numel()).reshape(8, 64).numpy().astype(np.int64)
    rng = np.random.default_rng(160)
    return dict(D=rng.standard_normal((2, 8)), codes=codes, absmax=st.absmax.double().numpy(),
                code=st.code.double().numpy(), blocksize=64)


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(16)
    return [
        Case(_case(rng, 4, 6, 8), "weight 4 × 6, blocksize 8: blocks span two rows"),
        Case(_case(rng, 4, 4, 4, n=2), "square weight 4 × 4, blocksize 4"),
        Case(_real_case(), "a real NF4 quantization: weight 8 × 64, blocksize 64"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    shapes = [(3, 5, 4), (6, 6, 8), (5, 10, 16), (7, 3, 4), (4, 12, 8)]
    return [Case(_case(rng, m, d, bs, n=int(rng.integers(1, 5)))) for m, d, bs in shapes]


def p1_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    D = np.asarray(kw["D"], dtype=np.float64)
    codes, absmax, code, bs = np.asarray(kw["codes"]), np.asarray(kw["absmax"], dtype=np.float64), kw["code"], int(kw["blocksize"])
    m, d = codes.shape
    W_hat = dequantize(codes, absmax, code, bs)
    # These three messages quote only the table's fixed range ([−1, 1], codes 0…15): they are their own hints.
    msgs = {
        "no absmax": "you multiplied by code[codes] without the blocks' absmax: a 4-bit code is a level in [−1, 1], and each "
                     f"block's absmax scales it back to the weight's size, Ŵ = code[q] · absmax[block]. {READ_BLOCK}",
        "codes as values": "you used the code indices 0…15 as if they were values: look each index up in the table first, "
                           f"code[codes], then scale by absmax. {READ_BLOCK}",
        "divided by absmax": "you divided the levels by absmax. Dividing by absmax is the quantize direction (scale the "
                             "block into [−1, 1]); dequantizing multiplies back, Ŵ = code[q] · absmax[block]. "
                             f"{READ_BLOCK}",
    }
    out = [
        Mistake("no absmax", D @ np.asarray(code, dtype=np.float64)[codes], msgs["no absmax"], hint=msgs["no absmax"]),
        Mistake("codes as values", D @ (codes * absmax[np.arange(m * d) // bs].reshape(m, d)), msgs["codes as values"],
                hint=msgs["codes as values"]),
    ]
    scale = absmax[np.arange(m * d) // bs]
    out.append(Mistake(
        "divided by absmax", D @ (np.asarray(code, dtype=np.float64)[codes] / scale.reshape(m, d)),
        msgs["divided by absmax"], hint=msgs["divided by absmax"]))
    if m > 1 and d > 1:
        out.append(Mistake(
            "blocks down the columns", D @ (np.asarray(code, dtype=np.float64)[codes] * scale.reshape(d, m).T),
            f"your blocks run down the columns (column-major order). The m × d weight is flattened row by row, so "
            f"entry (row, col) belongs to block (row · d + col) // blocksize. {READ_BACKENDS}"))
    row_bug = np.arange(m)[:, None] * (d // bs) + np.arange(d)[None, :] // bs
    if d % bs and row_bug.max() < absmax.size:
        out.append(Mistake(
            "per-row blocks", D @ (np.asarray(code, dtype=np.float64)[codes] * absmax[row_bug]),
            f"you indexed absmax per row (row · (d // blocksize) + col // blocksize). bitsandbytes takes blocks over the "
            f"flattened weight, index (row · d + col) // blocksize, so when d = {d} is not a multiple of blocksize = {bs} "
            f"a block spans two rows. (bitsandbytes 0.50.2's own AVX512 dequantize kernel has exactly this bug.) {READ_BACKENDS}",
            hint=f"you indexed absmax per row (row · (d // blocksize) + col // blocksize). bitsandbytes takes blocks over "
                 f"the flattened weight, index (row · d + col) // blocksize, so when d is not a multiple of blocksize a "
                 f"block spans two rows. (bitsandbytes 0.50.2's own AVX512 dequantize kernel has exactly this bug.) "
                 f"{READ_BACKENDS}"))
    if m == d:
        out.append(Mistake(
            "transposed", D @ W_hat.T,
            f"you multiplied by Ŵᵀ. The layer stores weight as m × d (out × in) and computes Y = X Ŵᵀ, so the input "
            f"gradient is D Ŵ (n × m times m × d): lesson 05's ∇X = D Wᵀ with W = Ŵᵀ. {READ_GRADIENT}"))
    return {"dX": out}


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 21

ITEMS = {
    "w1": Choice(
        "what NF4 places at normal quantiles",
        0,
        key="c",
        explain={
            "a": "absmax is each block's scale, stored per block (in fp32, or in 8 bits with double quantization); it is not placed anywhere. The normal quantiles are the 16 levels the scaled weights are rounded to. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
            "b": "The NF4 table is fixed: the same 16 levels for every block of every layer; only absmax changes from block to block. Nothing is computed from the layer's own ranks. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
            "c": "NF4's table is fixed: 16 levels Φ⁻¹(p) at evenly spaced probabilities, divided by the largest so they span [−1, 1], and every block is divided by its own absmax before rounding to them. Because a block's scaled weights are roughly normal, levels at equal-probability quantiles each get a similar share of them: on SmolLM2's gate_proj the NF4 codes carry 3.88 of 4 bits, against 3.49 for evenly spaced int4. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
            "d": "An evenly spaced grid is plain absmax INT4. NF4's levels crowd near 0 and thin out in the tails, where a normal distribution puts few weights. (Lesson 15, 'Sixteen levels from normal quantiles'.)",
        },
    ),
    "w2": Choice(
        "why the absmax values are centred before double quantization",
        0,
        key="a",
        explain={
            "a": "Every absmax is the largest |w| of its block, so all of them are positive, and the 8-bit dynamic map that quantizes them is signed (−0.99297 to 1): raw absmax values would land on its positive half only. Subtracting their mean (one fp32 offset, added back when the absmax is rebuilt) centres them around 0, so both halves of the code carry levels. (Lesson 15, 'Double quantization'.)",
            "b": "The offset is added back exactly when the absmax is rebuilt (dynamic_map[code] · absmax₂ + offset), so it removes no bias from anything; and the 4-bit codes were computed with the exact absmax. The subtraction is about the range of the 8-bit code. (Lesson 15, 'Double quantization'.)",
            "c": "The stored codes are uint8 indices, but the dynamic map they index is signed, from −0.99297 to 1; that signed range is why centring helps. With an unsigned map of levels there would be no negative half to waste. (Lesson 15, 'Double quantization'.)",
            "d": "The number of second-level blocks is the number of absmax values divided by 256, rounded up; subtracting one constant from every value does not change how many there are. (Lesson 15, 'Double quantization'.)",
        },
    ),
    "w3": Choice(
        "which of the recipe's four calls turns the checkpoint's linear weights into 4-bit codes",
        0,
        key="b",
        explain={
            "a": "A BitsAndBytesConfig is only a description (4 bits, NF4, double quantization, bf16 compute): it holds no weights and writes nothing, and the checkpoint on disk stays bf16. from_pretrained reads that description and quantizes each linear weight as it loads it. (Lesson 16, 'The recipe in four calls'.)",
            "b": "Given a quantization_config, from_pretrained replaces every nn.Linear except the output head by a bitsandbytes Linear4bit and quantizes each weight as it is loaded: right after the call, before any other call or any forward pass, q_proj's weight is already a Params4bit of packed uint8 codes, two per byte. (Lesson 16, 'The recipe in four calls'.)",
            "c": "prepare_model_for_kbit_training finds the linear weights already in 4 bits: it freezes every parameter, casts the parameters that stayed in 16 bits (the embedding, the norms) to fp32, leaves every Params4bit as it is, and switches gradient checkpointing on. (Lesson 16, 'What prepare_model_for_kbit_training does'.)",
            "d": "Nothing waits for the first forward pass: right after from_pretrained, before any forward, the linear weights are already Params4bit codes. Every forward (and every backward) dequantizes them again, but they are quantized once, at load. (Lesson 16, 'The recipe in four calls'.)",
        },
    ),
    "p1": Function(
        "implement quantized_linear_backward (input gradient of a 4-bit layer)",
        3,
        name="quantized_linear_backward",
        reference=quantized_linear_backward,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("dX",),
        mistakes=p1_mistakes,
        rtol=1e-5,  # float32 arithmetic (what bitsandbytes itself computes in) passes; every mistake is far off
        atol=1e-6,
    ),
    "p2": Choice(
        "an eval-mode validation pass without torch.no_grad, the repack shortcut left on: which layers repack, what it costs",
        2,
        options="abcde",
        multi=True,
    ),
    "p3": Choice(
        "what prepare_model_for_kbit_training(use_gradient_checkpointing=False) leaves on a fresh bf16 model",
        2,
        options="abcdef",
        multi=True,
    ),
    "p4": Choice(
        "reentrant checkpointing without the hook, lm_head adapted too: which adapters get a gradient",
        1,
    ),
    "p5": Choice(
        "which of SmolLM2's projections the AVX512 per-row dequantize gets wrong at blocksize 128",
        1,
    ),
    "p6": Choice(
        "two stacked adapted 4-bit layers, the lower one's base swapped for its float32 weight: which adapters' gradients change",
        1,
    ),
    "p7": Choice(
        "the input gradient of the toy 4-bit layer rebuilt with compute_dtype=torch.bfloat16",
        1,
    ),
    "p8": Ordering(
        "four versions of lesson 13's v_proj by their weights' distance from the layer trained on the NF4 base, closest first",
        2,
        labels={
            "base_nf4": "the NF4 base alone, Q(W), the adapter dropped",
            "base_orig": "the bf16 weights alone, W, no adapter",
            "merge_nf4": "the merge onto the dequantized NF4 weights, Q(W) + ΔW",
            "merge_orig": "the merge onto the bf16 weights, W + ΔW",
        },
    ),
}
