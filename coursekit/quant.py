"""Quantization the course teaches, written out: toy INT4, blockwise absmax, NF4/FP4 and double quantization.

Everything here is plain torch (or NumPy for the toy and absmax teaching kernels) on the CPU, and the
4-bit path is **bit-exact with bitsandbytes 0.50.2 on CPU**: the same packed bytes, the same absmax,
the same double-quantization state, the same dequantized values (``tests/test_quant.py`` compares
every allowed blocksize, several shapes and the three float dtypes with exact equality).

Sources, section by section:

* NF4 table: QLoRA (Dettmers et al. 2023, arXiv:2305.14314) §3 "4-bit NormalFloat"; bitsandbytes
  ``functional.create_normal_map`` (offset 0.9677083, 8 positive and 7 negative quantiles, exact 0,
  scaled to ±1).
* FP4 table: bitsandbytes ``functional.get_4bit_type("fp4")`` (e2m1, listed in bit-pattern order).
* Blockwise 4-bit quantization: bitsandbytes ``backends/default/ops.py`` ``quantize_4bit`` (the op has
  no CPU kernel; this pure-torch default is what runs on CPU) and ``_dequantize_4bit_compute``.
* Double quantization: bitsandbytes ``functional.quantize_4bit`` (``compress_statistics=True``):
  offset = mean of absmax, the centred absmax quantized with the 8-bit dynamic map in blocks of 256
  by the CPU C++ kernel ``quantize_cpu_impl`` (``csrc/cpu_ops.cpp``), which looks codes up in a
  65,536-entry table rather than searching for the nearest code.
* The course's notes on bitsandbytes' 4-bit path, checked against the installed package:
  ``docs/bitsandbytes-4bit.md`` §1–§4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from .gradcheck import entry_name

__all__ = [
    "BLOCKSIZES", "NF4_OFFSET", "QuantState", "QuantError",
    "toy_int4", "absmax_quantize", "absmax_dequantize", "absmax_round_trip",
    "nf4_code", "fp4_code", "dynamic_map", "code_for",
    "pack_nibbles", "unpack_nibbles",
    "quantize_4bit", "dequantize_4bit", "quantize_blockwise", "dequantize_blockwise",
    "bits_per_parameter", "measured_bits_per_parameter",
]

#: Block sizes bitsandbytes accepts for 4-bit quantization (``functional.quantize_4bit``).
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)

#: The outermost probability of NF4's quantile grid, bitsandbytes' ``create_normal_map`` default (its documentation:
#: empirically optimized). ½[(1 − 1/30) + (1 − 1/32)] matches it to seven digits (a reconstruction, not the QLoRA
#: paper's formula, which takes midpoints of neighbouring quantiles; see docs/bitsandbytes-4bit.md).
NF4_OFFSET = 0.9677083

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class QuantError(ValueError):
    """Bad input to a quantizer: wrong type, dtype, shape, blocksize, quant_type or state, or an empty tensor."""


def _check_positive_int(name: str, v: Any, meaning: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
        raise QuantError(f"{name} must be a positive integer ({meaning}), got {v!r}")
    return int(v)


def _check_tensor(name: str, x: Any, what: str) -> torch.Tensor:
    if not torch.is_tensor(x):
        raise QuantError(f"{name} must be a torch.Tensor ({what}), got {type(x).__name__}")
    return x


def _check_state(quant_state: Any, made_by: str) -> Any:
    """quant_state carries what dequantization reads (a QuantState, or bitsandbytes' own); else name what it must be."""
    missing = [a for a in ("absmax", "shape", "code", "dtype", "blocksize") if not hasattr(quant_state, a)]
    if missing:
        raise QuantError(
            f"quant_state must be the QuantState that {made_by} returned with the codes (the second element of its "
            f"(codes, state) pair), got {type(quant_state).__name__}"
            + (f" without {missing}" if quant_state is not None else "")
        )
    _check_positive_int("quant_state.blocksize", quant_state.blocksize, "values per block")
    return quant_state


# --------------------------------------------------------------------------- teaching kernels (NumPy)


def toy_int4(W: Any, step: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """A toy INT4 base, the one of lesson 14: ``code = round(W / step)``, ``Ŵ = step · code``.

    Args:
        W: array-like of floats, any shape.
        step: the quantization step (0.2 in lesson 14), a finite number > 0.
    Returns:
        ``(codes, W_hat)``: int8 codes in −8..7 and the float64 reconstruction, both W's shape.
    Raises:
        QuantError: a step that is not a finite number > 0, a non-finite entry, or a code outside the
            signed 4-bit range −8..7 (the weight needs a larger step).
    Source: round-to-nearest uniform quantization, ``W = (W / 0.2).round() * 0.2`` in torch (lesson 14).
    NumPy rounds halves to even, as torch.round does.
    """
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, float, np.integer, np.floating)) \
            or not 0 < step < np.inf:
        raise QuantError(f"step must be a finite positive number (the quantization step), got {step!r}")
    W = np.asarray(W, dtype=np.float64)
    if not np.isfinite(W).all():
        raise QuantError("W has a NaN or infinite entry; a quantizer needs finite weights.")
    codes = np.round(W / step)
    if codes.size and (codes.min() < -8 or codes.max() > 7):
        bad = np.unravel_index(np.argmax(np.abs(codes)), codes.shape)
        raise QuantError(f"{entry_name('W', bad)} = {W[bad]:g} gives code {int(codes[bad])}, outside the signed 4-bit range "
                         f"-8..7; use a step of at least {np.abs(W).max() / 7.5:.3g}.")
    return codes.astype(np.int8), step * codes


def _blocks(flat: np.ndarray, blocksize: int) -> list[np.ndarray]:
    return [flat[i:i + blocksize] for i in range(0, flat.size, blocksize)]


def absmax_quantize(x: Any, bits: int = 8, blocksize: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric blockwise absmax quantization to signed integers (the int8/int4 warm-up of lesson 14).

    The tensor is flattened in row-major order and cut into blocks of ``blocksize`` values (the last
    block may be shorter). In each block ``absmax = max |x|`` and ``code = round(x / absmax · Q)`` with
    ``Q = 2**(bits − 1) − 1`` (127 for int8, 7 for int4); an all-zero block keeps absmax 0 and codes 0.

    Args:
        x: array-like of floats, any shape, at least one element.
        bits: 8 or 4.
        blocksize: values per block, ≥ 1.
    Returns:
        ``(codes, absmax)``: int8 codes of shape ``(n,)`` and float64 absmax of shape ``(ceil(n / blocksize),)``.
    Raises:
        QuantError: empty input, non-finite values, bits not 4 or 8, blocksize < 1.
    Source: Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (arXiv:2110.02861) §2.
    """
    if bits not in (4, 8) or isinstance(bits, bool):
        raise QuantError(f"bits must be 4 or 8, got {bits!r}")
    blocksize = _check_positive_int("blocksize", blocksize, "values per block")
    if x is None:
        raise QuantError("x must be an array of floats, got None")
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    if flat.size == 0:
        raise QuantError("cannot quantize an empty tensor")
    if not np.isfinite(flat).all():
        raise QuantError("x has a NaN or infinite entry; a quantizer needs finite values.")
    q = 2 ** (bits - 1) - 1
    codes, absmax = [], []
    for blk in _blocks(flat, int(blocksize)):
        am = float(np.abs(blk).max())
        absmax.append(am)
        codes.append(np.zeros(blk.size) if am == 0 else np.round(blk / am * q))
    return np.concatenate(codes).astype(np.int8), np.array(absmax)


def absmax_dequantize(codes: Any, absmax: Any, shape: tuple[int, ...] | None = None, bits: int = 8,
                      blocksize: int = 64) -> np.ndarray:
    """Inverse of :func:`absmax_quantize`: ``x̂ = code / Q · absmax[block]`` (float64, reshaped to ``shape``).

    Raises:
        QuantError: bits not 4 or 8, blocksize not a positive integer, codes or absmax None, the number
            of absmax values does not match ``ceil(len(codes) / blocksize)``, or ``shape`` does not hold
            ``len(codes)`` values.
    """
    if bits not in (4, 8) or isinstance(bits, bool):
        raise QuantError(f"bits must be 4 or 8, got {bits!r}")
    blocksize = _check_positive_int("blocksize", blocksize, "values per block, as given to absmax_quantize")
    for name, a in (("codes", codes), ("absmax", absmax)):
        if a is None:
            raise QuantError(f"{name} must be the array absmax_quantize returned, got None")
    codes = np.asarray(codes, dtype=np.float64).reshape(-1)
    absmax = np.asarray(absmax, dtype=np.float64).reshape(-1)
    nb = -(-codes.size // blocksize)
    if absmax.size != nb:
        raise QuantError(f"absmax has {absmax.size} values, but {codes.size} codes in blocks of {blocksize} "
                         f"need {nb}")
    out = codes / (2 ** (bits - 1) - 1) * np.repeat(absmax, blocksize)[:codes.size]
    if shape is not None:
        if int(np.prod(shape)) != codes.size:
            raise QuantError(f"shape {tuple(shape)} holds {int(np.prod(shape))} values, but there are {codes.size} codes")
        out = out.reshape(shape)
    return out


def absmax_round_trip(x: torch.Tensor, bits: int = 4, blocksize: int = 64) -> torch.Tensor:
    """``absmax_dequantize(*absmax_quantize(x, bits, blocksize), x.shape, bits, blocksize)`` bit for bit, in torch
    and without a Python loop over blocks (fast enough for every weight of a model).

    Same arithmetic in float64 as the NumPy kernels: ``code = round(x / absmax · Q)`` (halves to even),
    ``x̂ = code / Q · absmax`` with ``Q = 2**(bits − 1) − 1``; an all-zero block comes back as zeros.
    Args:
        x: float tensor (float32, bfloat16 or float16), any shape, at least one element.
        bits: 8 or 4.
        blocksize: values per block of the row-major flattened tensor, ≥ 1 (the last block may be shorter).
    Returns:
        float64 tensor of x's shape: the reconstruction (cast it to the dtype the model computes in).
    Raises:
        QuantError: as :func:`absmax_quantize` (bad bits or blocksize, empty or non-finite x), or x not a float tensor.
    Source: Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (arXiv:2110.02861) §2.
    """
    if bits not in (4, 8) or isinstance(bits, bool):
        raise QuantError(f"bits must be 4 or 8, got {bits!r}")
    blocksize = _check_positive_int("blocksize", blocksize, "values per block")
    x = _check_float_tensor("x", x)
    flat = x.detach().reshape(-1).double().cpu()
    n = flat.numel()
    if not torch.isfinite(flat).all():
        raise QuantError("x has a NaN or infinite entry; a quantizer needs finite values.")
    nb = -(-n // blocksize)
    blocks = torch.cat([flat, flat.new_zeros(nb * blocksize - n)]).reshape(nb, blocksize)  # zeros leave absmax alone
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    q = 2 ** (bits - 1) - 1
    codes = torch.where(absmax == 0, torch.zeros_like(blocks), torch.round(blocks / absmax * q))
    return (codes / q * absmax).reshape(-1)[:n].reshape(x.shape)


# --------------------------------------------------------------------------- code tables (torch, fp32)


@lru_cache(maxsize=None)
def _nf4() -> torch.Tensor:
    # Quantile points on bitsandbytes' float32 grid (torch.linspace), the inverse normal CDF in float64,
    # then float32 as bitsandbytes stores them; padding zeros collapse to the single exact 0.
    grid_pos = torch.linspace(NF4_OFFSET, 0.5, 9)[:-1].double()
    grid_neg = torch.linspace(NF4_OFFSET, 0.5, 8)[:-1].double()
    pos = torch.special.ndtri(grid_pos).float()      # 8 positive levels
    neg = (-torch.special.ndtri(grid_neg)).float()   # 7 negative levels
    values = torch.cat([neg, torch.zeros(1), pos]).sort().values
    return values / values.max()


def nf4_code() -> torch.Tensor:
    """The 16 NF4 levels, sorted (index = code), fp32, shape ``(16,)``: 7 negatives, an exact 0 at index 7,
    8 positives, ending at exactly −1 and +1.

    Derivation: the positive levels are Φ⁻¹ at 8 evenly spaced probabilities from ``NF4_OFFSET`` down to
    (but excluding) 0.5, the negative levels the mirror of 7 such points; both sets are divided by the
    largest, Φ⁻¹(0.9677083) ≈ 1.848. Equal to ``bitsandbytes.functional.get_4bit_type("nf4")`` bit for bit.
    Source: QLoRA (arXiv:2305.14314) §3; bitsandbytes ``functional.create_normal_map``.
    Returns a fresh copy (safe to modify).
    """
    return _nf4().clone()


@lru_cache(maxsize=None)
def _fp4() -> torch.Tensor:
    # e2m1 with exponent bias 2, in bit-pattern order: bit 3 is the sign, bits 2..0 index the magnitudes.
    magnitudes = [0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0]
    return torch.tensor(magnitudes + [-m if m else 0.0 for m in magnitudes], dtype=torch.float32) / 12.0


def fp4_code() -> torch.Tensor:
    """The 16 FP4 (e2m1) levels in **bit-pattern order** (index = code; bit 3 is the sign), fp32, shape ``(16,)``.

    Unlike NF4 the table is not sorted. Index 8 ("−0") holds +0.0, as in bitsandbytes' Python table.
    Equal to ``bitsandbytes.functional.get_4bit_type("fp4")``. Source: bitsandbytes ``functional.py``.
    """
    return _fp4().clone()


@lru_cache(maxsize=None)
def _dynamic() -> torch.Tensor:
    # bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent
    # i = 0..6, the midpoints of linspace(0.1, 1, 2**i + 1) scaled by ±10**(i − 6); then 0 and 1.
    data: list[float] = []
    for i in range(7):
        edges = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32)
        means = (edges[:-1] + edges[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    return torch.tensor(sorted(data), dtype=torch.float32)


def dynamic_map() -> torch.Tensor:
    """The 8-bit signed dynamic map of double quantization: 256 sorted fp32 values from −0.99297 to 1.0,
    with 0 at index 127. Equal to ``bitsandbytes.functional.create_dynamic_map()``.
    Source: Dettmers, "8-Bit Approximations for Parallelism in Deep Learning" (arXiv:1511.04561);
    bitsandbytes ``functional.create_dynamic_map``."""
    return _dynamic().clone()


def code_for(quant_type: str) -> torch.Tensor:
    """The 16-entry table of ``quant_type`` ("nf4" or "fp4"). Raises QuantError for anything else."""
    if quant_type == "nf4":
        return nf4_code()
    if quant_type == "fp4":
        return fp4_code()
    raise QuantError(f"quant_type must be 'nf4' or 'fp4', got {quant_type!r}")


# --------------------------------------------------------------------------- packing


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte, bitsandbytes' order: element 2i in the **high** nibble, 2i+1 in the low one.

    Args:
        codes: integer tensor of n codes in 0..15 (any shape; flattened row-major).
    Returns:
        uint8 tensor of shape ``((n + 1) // 2, 1)``; an odd n is padded with code 0 in the last low nibble.
    Raises:
        QuantError: not a tensor, a code outside 0..15, or a non-integer tensor.
    Source: bitsandbytes ``backends/default/ops.py``: ``packed = (q[::2] << 4) | q[1::2]``.
    """
    _check_tensor("codes", codes, "integer 4-bit codes")
    if codes.is_floating_point() or codes.is_complex():
        raise QuantError(f"codes must be an integer tensor, got {codes.dtype}")
    q = codes.reshape(-1).to(torch.int64)
    if q.numel() and (q.min() < 0 or q.max() > 15):
        raise QuantError(f"4-bit codes must lie in 0..15; found {int(q.min())}..{int(q.max())}")
    if q.numel() % 2:
        q = torch.cat([q, q.new_zeros(1)])
    q8 = q.to(torch.uint8)
    return ((q8[0::2] << 4) | q8[1::2]).unsqueeze(1)


def unpack_nibbles(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: the first ``n`` codes as int64, shape ``(n,)``.

    Raises QuantError if ``packed`` is not a tensor, ``n`` not a non-negative integer or more than the bytes hold."""
    _check_tensor("packed", packed, "the packed bytes of pack_nibbles")
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
        raise QuantError(f"n must be a non-negative integer (how many codes to unpack), got {n!r}")
    if packed.dtype != torch.uint8:
        packed = packed.contiguous().view(torch.uint8)
    flat = packed.reshape(-1).to(torch.int64)
    if n > 2 * flat.numel():
        raise QuantError(f"{flat.numel()} bytes hold at most {2 * flat.numel()} codes, asked for {n}")
    out = torch.empty(2 * flat.numel(), dtype=torch.int64)
    out[0::2] = flat >> 4
    out[1::2] = flat & 0xF
    return out[:n]


# --------------------------------------------------------------------------- 4-bit quantization


@dataclass
class QuantState:
    """What dequantization needs, named as in ``bitsandbytes.functional.QuantState``.

    Attributes:
        absmax: fp32 ``(ceil(n / blocksize),)`` scales, or (double quantization) their uint8 codes.
        shape: the original tensor's shape.
        code: the 16-entry (4-bit) or 256-entry (8-bit) fp32 table.
        dtype: the original dtype; dequantization returns it.
        blocksize: values per block.
        quant_type: "nf4", "fp4" or "dynamic" (the 8-bit map of double quantization).
        offset: fp32 0-dim tensor (double quantization: the mean subtracted from absmax), else None.
        state2: the QuantState of the 8-bit absmax quantization, else None.
    """

    absmax: torch.Tensor
    shape: torch.Size
    code: torch.Tensor
    dtype: torch.dtype
    blocksize: int
    quant_type: str
    offset: torch.Tensor | None = None
    state2: "QuantState | None" = field(default=None, repr=False)

    @property
    def nested(self) -> bool:
        """True when the absmax values are themselves quantized (double quantization)."""
        return self.state2 is not None


def _check_float_tensor(name: str, A: Any) -> torch.Tensor:
    if not torch.is_tensor(A):
        raise QuantError(f"{name} must be a torch.Tensor, got {type(A).__name__}")
    if A.dtype not in _FLOATS:
        raise QuantError(f"{name} must be float32, bfloat16 or float16 (as in bitsandbytes), got {A.dtype}")
    if A.numel() == 0:
        raise QuantError(f"cannot quantize an empty tensor ({name} has shape {tuple(A.shape)})")
    return A


def _check_blocksize(blocksize: Any) -> int:
    if blocksize not in BLOCKSIZES:
        raise QuantError(f"blocksize must be one of {BLOCKSIZES} (bitsandbytes' allowed sizes), got {blocksize!r}")
    return int(blocksize)


def quantize_4bit(A: torch.Tensor, blocksize: int = 64, quant_type: str = "nf4",
                  compress_statistics: bool = False) -> tuple[torch.Tensor, QuantState]:
    """Blockwise 4-bit quantization with bitsandbytes' CPU layout and rounding.

    Steps (bitsandbytes 0.50.2, ``backends/default/ops.py``):

    1. Flatten row-major and cast to fp32. Blocks run over the **flat** tensor, ignoring rows.
    2. Full blocks: ``absmax = max |x|``; ``scaled = clamp(x · (1 / max(absmax, 1e-38)), −1, 1)``
       (a multiplication by an fp32 reciprocal). An all-zero block stores absmax 0.
    3. A shorter last block: ``am = max(max |x|, 1e-38)`` (stored clamped) and ``scaled = clamp(x / am, −1, 1)``
       (a true division).
    4. Code = number of the 15 table midpoints strictly below ``scaled`` (``torch.bucketize``, right=False):
       a value exactly on a midpoint takes the **lower** code. FP4 then maps rank to bit pattern.
    5. Pack two codes per byte (:func:`pack_nibbles`); an odd count is padded with the code of 0.0.
    6. ``compress_statistics=True`` (double quantization): ``offset = mean(absmax)``, then
       ``absmax − offset`` is quantized with :func:`quantize_blockwise` (8-bit dynamic map, blocks of 256).

    Args:
        A: float32/bfloat16/float16 tensor, any shape, at least one element.
        blocksize: one of :data:`BLOCKSIZES`; bitsandbytes' default is 64.
        quant_type: "nf4" (the course's default) or "fp4" (bitsandbytes' own default).
        compress_statistics: double quantization of the absmax values.
    Returns:
        ``(packed, state)``: uint8 ``((n + 1) // 2, 1)`` and a :class:`QuantState` (absmax fp32
        ``(ceil(n / blocksize),)``, or uint8 of that shape with ``state2`` when compressed).
    Raises:
        QuantError: wrong type or dtype, empty tensor, bad blocksize or quant_type, a NaN/inf in A.
    """
    q, absmax, code = _codes_4bit(A, blocksize, quant_type)
    blocksize = int(blocksize)
    packed = pack_nibbles(q)
    if not compress_statistics:
        return packed, QuantState(absmax=absmax, shape=A.shape, code=code, dtype=A.dtype, blocksize=blocksize,
                                  quant_type=quant_type)
    offset = absmax.mean()
    qabsmax, state2 = quantize_blockwise(absmax - offset, blocksize=256)
    return packed, QuantState(absmax=qabsmax, shape=A.shape, code=code, dtype=A.dtype, blocksize=blocksize,
                              quant_type=quant_type, offset=offset, state2=state2)


def _codes_4bit(A: torch.Tensor, blocksize: int, quant_type: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1 to 4 of :func:`quantize_4bit`: ``(codes, absmax, code table)``, the codes (int32 for nf4, int64 for fp4) of
    ``n`` values (+ 1 pad when n is odd), before packing. Checks its inputs as quantize_4bit documents."""
    A = _check_float_tensor("A", A)
    blocksize = _check_blocksize(blocksize)
    code = code_for(quant_type)
    flat = A.detach().reshape(-1).float().cpu()
    n = flat.numel()
    full = n - n % blocksize
    absmax = flat[:full].reshape(-1, blocksize).abs().max(dim=-1).values
    am = flat[full:].abs().max().clamp(min=1e-38) if full < n else None
    # A block's max |x| is NaN or inf exactly when the block holds a NaN or an inf (torch's max propagates NaN):
    # checking the absmax values checks every value, at 1/blocksize of the cost.
    if not (torch.isfinite(absmax).all() and (am is None or torch.isfinite(am))):
        i = int((~torch.isfinite(flat)).nonzero()[0])
        raise QuantError(f"A has a non-finite value {flat[i].item()} at flat index {i}; absmax scaling needs finite values")
    scaled = torch.clamp(flat[:full].reshape(-1, blocksize) * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if am is not None:
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / am, -1, 1)])
    if n % 2:  # bitsandbytes pads the *scaled* values with one 0.0, so the pad nibble is the code of 0
        scaled = torch.cat([scaled, scaled.new_zeros(1)])
    order = torch.argsort(code)
    bounds = (code[order[:-1]] + code[order[1:]]) / 2
    q = torch.bucketize(scaled, bounds, right=False, out_int32=True)  # codes 0..15: int32 halves the memory
    if quant_type == "fp4":
        q = order[q]
    return q, absmax, code


def round_trip_4bit(A: torch.Tensor, blocksize: int = 64, quant_type: str = "nf4") -> torch.Tensor:
    """``dequantize_4bit(*quantize_4bit(A, blocksize, quant_type))`` bit for bit, without packing the codes into
    bytes and unpacking them again (about twice as fast on a whole model's weights). No double quantization.

    Args and errors: as :func:`quantize_4bit`. Returns a tensor of A's shape and dtype: what loading A in 4 bits
    and decoding it gives (the weight QLoRA's frozen base computes with)."""
    q, absmax, code = _codes_4bit(A, blocksize, quant_type)
    n = A.numel()
    out = code.float()[q[:n]] * absmax.repeat_interleave(blocksize)[:n]
    return out.reshape(A.shape).to(A.dtype)


def _absmax_fp32(state: QuantState) -> torch.Tensor:
    if state.nested:
        return dequantize_blockwise(state.absmax, state.state2) + state.offset
    return state.absmax.float()


def dequantize_4bit(packed: torch.Tensor, quant_state: QuantState) -> torch.Tensor:
    """``Ŵ[i] = code[q_i] · absmax[i // blocksize]`` in fp32, cast once (round to nearest even) to the
    original dtype and reshaped to the original shape.

    With double quantization the absmax values are first rebuilt as
    ``dequantize_blockwise(qabsmax) + offset`` (fp32), as bitsandbytes does.

    Args:
        packed: uint8 tensor from :func:`quantize_4bit` (any other dtype is reinterpreted as bytes).
        quant_state: its :class:`QuantState`.
    Returns:
        Tensor of ``quant_state.shape`` and ``quant_state.dtype``.
    Raises:
        QuantError: packed is not a tensor; quant_state is not a quantization state (e.g. None, or the
            packed tensor passed twice); the byte count or the absmax count does not fit the shape and blocksize.
    Source: bitsandbytes ``functional.dequantize_4bit`` and ``backends/default/ops.py`` ``_dequantize_4bit_compute``.
    """
    _check_tensor("packed", packed, "the uint8 codes quantize_4bit returned")
    st = _check_state(quant_state, "quantize_4bit")
    n = int(np.prod(tuple(st.shape))) if len(st.shape) else 1
    if packed.dtype != torch.uint8:
        packed = packed.contiguous().view(torch.uint8)
    if packed.numel() != (n + 1) // 2:
        raise QuantError(f"packed has {packed.numel()} bytes; a tensor of shape {tuple(st.shape)} ({n} values) "
                         f"packs into {(n + 1) // 2}")
    nb = -(-n // st.blocksize)
    if st.absmax.numel() != nb:
        raise QuantError(f"quant_state.absmax has {st.absmax.numel()} values; {n} values in blocks of "
                         f"{st.blocksize} need {nb}")
    absmax = _absmax_fp32(st)
    values = st.code.float()[unpack_nibbles(packed, n)]
    out = values * absmax.repeat_interleave(st.blocksize)[:n]
    return out.reshape(st.shape).to(st.dtype)


# --------------------------------------------------------------------------- 8-bit blockwise (double quantization)


@lru_cache(maxsize=None)
def _lut(code_key: tuple[float, ...]) -> torch.Tensor:
    # bitsandbytes' CPU quantizer (csrc/cpu_ops.cpp, quantize_cpu_impl) looks codes up in a table over
    # 65,536 evenly spaced points of [-1, 1]: entry i counts the fp32 midpoints of the sorted code that
    # lie strictly below the grid point -1 + 2i/65535.
    code = torch.tensor(code_key, dtype=torch.float32)
    mids = 0.5 * (code[:-1] + code[1:])
    grid = torch.arange(65536, dtype=torch.float32) * 2.0 / 65535.0 - 1.0
    return torch.searchsorted(mids, grid, right=False).to(torch.int64)


def quantize_blockwise(A: torch.Tensor, code: torch.Tensor | None = None,
                       blocksize: int = 256) -> tuple[torch.Tensor, QuantState]:
    """8-bit blockwise quantization as bitsandbytes' **CPU** kernel does it (the step double quantization
    applies to the absmax values).

    Per block: ``absmax = max |x|`` (an all-zero block gets absmax 0 and code 0); ``v = clamp(x · (1/absmax),
    −1, 1)``; ``i = trunc(((v + 1) · 0.5) · 65535 + 0.5)``; ``code index = LUT[i]`` where ``LUT[i]`` counts the
    code midpoints below ``−1 + 2i/65535``. All in fp32. This is *not* exact nearest-code search: near 0 the
    dynamic map is finer than the 65,536-point grid, and a nearest-code search disagrees with bitsandbytes
    on a few codes in a thousand.

    Args:
        A: float32/bfloat16/float16 tensor, any shape, at least one element.
        code: a sorted 256-entry fp32 table; default :func:`dynamic_map`.
        blocksize: values per block (bitsandbytes uses 256 for double quantization).
    Returns:
        ``(q, state)``: uint8 codes of A's shape and a QuantState with fp32 absmax ``(ceil(n / blocksize),)``.
    Raises:
        QuantError: wrong type/dtype, empty tensor, non-finite values, blocksize < 1, a code table that
            is not a sorted 1-D tensor of finite levels.
    Source: bitsandbytes ``backends/cpu/ops.py`` (``quantize_blockwise``) → ``csrc/cpu_ops.cpp``;
    ``docs/bitsandbytes-4bit.md`` §3.
    """
    A = _check_float_tensor("A", A)
    blocksize = _check_positive_int("blocksize", blocksize, "values per block")
    if code is not None:
        _check_tensor("code", code, "a sorted table of 8-bit levels, e.g. dynamic_map()")
        c = code.float().cpu()
        if c.ndim != 1 or c.numel() < 2 or not torch.isfinite(c).all() or (c.diff() < 0).any():
            raise QuantError(f"code must be a sorted 1-D table of at least 2 finite levels (e.g. dynamic_map(), "
                             f"256 entries), got shape {tuple(code.shape)}")
    code = dynamic_map() if code is None else code.float().cpu()
    flat = A.detach().reshape(-1).float().cpu()
    if not torch.isfinite(flat).all():
        raise QuantError("A has a NaN or infinite value; blockwise quantization needs finite values")
    n = flat.numel()
    nb = -(-n // blocksize)
    padded = torch.cat([flat, flat.new_zeros(nb * blocksize - n)]).reshape(nb, blocksize)
    absmax = padded.abs().max(dim=1).values
    inv = torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))
    v = torch.clamp(padded * inv.view(-1, 1), -1.0, 1.0)
    idx = ((((v + 1.0) * 0.5) * 65535.0) + 0.5).to(torch.int64)  # truncation, as the C++ cast to uint16
    q = _lut(tuple(code.tolist()))[idx]
    q = torch.where((absmax > 0).view(-1, 1), q, torch.zeros_like(q))
    q = q.reshape(-1)[:n].to(torch.uint8).reshape(A.shape)
    return q, QuantState(absmax=absmax, shape=A.shape, code=code, dtype=A.dtype, blocksize=blocksize,
                         quant_type="dynamic")


def dequantize_blockwise(q: torch.Tensor, quant_state: QuantState) -> torch.Tensor:
    """``x̂ = code[q] · absmax[block]`` in fp32, cast to ``quant_state.dtype``, shape of ``q``.

    Raises QuantError if q is not a tensor, quant_state is not the state :func:`quantize_blockwise`
    returned, or the absmax count does not fit. Source: bitsandbytes ``csrc/cpu_ops.cpp`` ``dequantizeBlockwise8bitCpu``."""
    _check_tensor("q", q, "the uint8 codes quantize_blockwise returned")
    st = _check_state(quant_state, "quantize_blockwise")
    n = q.numel()
    if st.absmax.numel() != -(-n // st.blocksize):
        raise QuantError(f"absmax has {st.absmax.numel()} values; {n} codes in blocks of {st.blocksize} "
                         f"need {-(-n // st.blocksize)}")
    out = st.code.float()[q.reshape(-1).to(torch.int64)] * st.absmax.float().repeat_interleave(st.blocksize)[:n]
    return out.reshape(q.shape).to(st.dtype)


# --------------------------------------------------------------------------- bits per parameter


def bits_per_parameter(blocksize: int = 64, compress_statistics: bool = False, blocksize2: int = 256) -> float:
    """Storage bits per weight of blockwise 4-bit quantization (large tensors; the fixed offset is ignored).

    Without double quantization: ``4 + 32 / blocksize`` (an fp32 absmax per block): 4.5 at 64.
    With it: ``4 + 8 / blocksize + 32 / (blocksize · blocksize2)`` (an 8-bit code per block, an fp32
    scale per 256 blocks): ≈ 4.127 at 64 and 256.
    Raises QuantError for a blocksize bitsandbytes does not allow or a blocksize2 that is not a positive integer.
    Source: QLoRA (arXiv:2305.14314) §3 "Double Quantization" (0.5 → 0.127 bits of overhead).
    """
    _check_blocksize(blocksize)
    _check_positive_int("blocksize2", blocksize2, "absmax values per block of the second quantization")
    if compress_statistics:
        return 4 + 8 / blocksize + 32 / (blocksize * blocksize2)
    return 4 + 32 / blocksize


def measured_bits_per_parameter(packed: torch.Tensor, quant_state: Any) -> float:
    """Bits actually stored per weight: packed codes + absmax (+ nested absmax and the offset), counted in
    bytes from the tensors themselves, divided by the number of weights. Works for this module's
    :class:`QuantState` and for ``bitsandbytes.functional.QuantState`` alike.
    Raises QuantError if packed is not a tensor, quant_state is not a quantization state, or it describes no weights.
    """
    _check_tensor("packed", packed, "the packed codes quantize_4bit returned")
    st = _check_state(quant_state, "quantize_4bit")
    n = int(np.prod(tuple(st.shape)))
    if n == 0:
        raise QuantError(f"quant_state.shape {tuple(st.shape)} holds no weights; bits per weight is undefined")
    nbytes = packed.numel() * packed.element_size() + st.absmax.numel() * st.absmax.element_size()
    if getattr(st, "state2", None) is not None:
        nbytes += st.state2.absmax.numel() * st.state2.absmax.element_size()
        nbytes += st.offset.numel() * st.offset.element_size()
    return 8 * nbytes / n
