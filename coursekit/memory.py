"""The memory ledger: persistent training tensors, counted in bytes, one bucket at a time.

A single headline number hides where memory goes; a ledger splits it into buckets (seed 002,
section 7, "Count memory in separate buckets")::

    bucket          full fine-tuning      LoRA                 QLoRA
    base_weights    N · 2 B (bf16)        N · 2 B (bf16)       N · 0.5 B (4-bit codes)
    base_grads      N · 2 B (bf16)        0 (frozen)           0 (frozen)
    base_moments    N · 2 · 4 B (Adam)    0 (frozen)           0 (frozen)
    adapter         0 (no adapter)        a · (2 + 2 + 2·4) B  a · (2 + 2 + 2·4) B

N is the base parameter count and a the adapter's. Adam (and AdamW) keeps two moment buffers per
trainable parameter (Kingma & Ba 2015), assumed fp32 here; weights and gradients are bf16. For
N = 7e9 and a = 20e6 this gives the seed's partial totals: 84 GB, 14.24 GB and 3.74 GB.

Units: every function returns **bytes** (floats, because a 4-bit code is half a byte); GB means
decimal gigabytes, 1 GB = 1e9 bytes, as in the seed. The totals are deliberately partial: they leave
out activations, quantization metadata (see :func:`nf4_metadata_bytes`), fp32 master copies,
attention buffers, temporary dequantized weights, kernel workspace and allocator overhead.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Mapping

__all__ = [
    "GB",
    "METHODS",
    "BUCKETS",
    "BYTES_PER_PARAM",
    "ledger",
    "total",
    "to_gb",
    "nf4_metadata_bytes",
]

GB = 1e9
"""Bytes in one decimal gigabyte (the seed's unit)."""

METHODS = ("full", "lora", "qlora")
"""Training methods the ledger knows: full fine-tuning, LoRA on a 16-bit base, QLoRA on a 4-bit base."""

BUCKETS = ("base_weights", "base_grads", "base_moments", "adapter")
"""Ledger buckets, in the order of the seed's table."""

BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "nf4": 0.5, "fp4": 0.5}
"""Storage bytes of one value in each format (4-bit formats pack two codes into a byte)."""


def _count(name: str, value: object) -> float:
    """A parameter count: a finite, non-negative real number (7e9 is accepted as well as 7_000_000_000)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number of parameters, got {type(value).__name__} {value!r}.")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite, non-negative parameter count, got {value!r}.")
    return v


def _method(method: object) -> str:
    m = method.strip().lower() if isinstance(method, str) else method
    if m not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(repr(x) for x in METHODS)}.")
    return m


def ledger(
    n_params: float,
    n_adapter: float = 0,
    method: str = "lora",
    *,
    weight_bytes: float = 2.0,
    grad_bytes: float = 2.0,
    moment_bytes: float = 4.0,
    n_moments: int = 2,
    code_bits: float = 4.0,
) -> dict[str, float]:
    """Bytes of the persistent training tensors, by bucket (seed 002, section 7).

    Args:
        n_params: parameters in the base model, N (e.g. 7e9).
        n_adapter: trainable adapter parameters, a (e.g. 20e6). Ignored for ``"full"``: full
            fine-tuning trains the base itself and has no adapter (the seed's "Not included").
        method: ``"full"``, ``"lora"`` or ``"qlora"`` (case-insensitive).
        weight_bytes: bytes per stored 16-bit weight (base under full/LoRA, adapter always); 2 for bf16.
        grad_bytes: bytes per gradient entry of a trainable parameter; 2 for bf16.
        moment_bytes: bytes per optimizer moment entry; 4 for fp32.
        n_moments: optimizer buffers per trainable parameter; 2 for Adam/AdamW (m and v).
        code_bits: bits per base weight under QLoRA; 4 for NF4 (QLoRA, Dettmers et al. 2023,
            arXiv:2305.14314). Block scales are *not* included: see :func:`nf4_metadata_bytes`.

    Returns:
        ``{"base_weights", "base_grads", "base_moments", "adapter"}`` → bytes (float). The adapter
        bucket holds its weights, gradients and moments: ``a · (weight + grad + n_moments · moment)``.

    Raises:
        TypeError: a count is not a number. ValueError: a negative or non-finite count, or an
        unknown method.

    Example: ``ledger(7e9, 20e6, "qlora")`` → base_weights 3.5e9, adapter 0.24e9 (3.74 GB in all).
    """
    n = _count("n_params", n_params)
    a = _count("n_adapter", n_adapter)
    m = _method(method)
    for name, v in (("weight_bytes", weight_bytes), ("grad_bytes", grad_bytes), ("moment_bytes", moment_bytes),
                    ("n_moments", n_moments), ("code_bits", code_bits)):
        _count(name, v)
    optimizer_bytes = n_moments * moment_bytes
    if m == "full":
        return {
            "base_weights": n * weight_bytes,
            "base_grads": n * grad_bytes,
            "base_moments": n * optimizer_bytes,
            "adapter": 0.0,
        }
    # LoRA and QLoRA freeze the base: no gradient and no optimizer state for it.
    base = n * weight_bytes if m == "lora" else n * code_bits / 8
    return {
        "base_weights": base,
        "base_grads": 0.0,
        "base_moments": 0.0,
        "adapter": a * (weight_bytes + grad_bytes + optimizer_bytes),
    }


def total(buckets: Mapping[str, float]) -> float:
    """The partial total of a ledger, in bytes (the seed's "Partial total" row)."""
    return float(sum(buckets.values()))


def to_gb(n_bytes: float) -> float:
    """Bytes → decimal gigabytes (1 GB = 1e9 bytes)."""
    return float(n_bytes) / GB


def nf4_metadata_bytes(n_params: float, blocksize: int = 64, double_quant: bool = True, blocksize2: int = 256) -> float:
    """Bytes of NF4 block scales (the "+ quantization metadata" of the seed's QLoRA column).

    Without double quantization each block of ``blocksize`` weights keeps one fp32 absmax: 32/64 =
    0.5 extra bits per weight. With it (QLoRA, arXiv:2305.14314, section 3), the absmax values are
    themselves quantized to 8 bits, with one fp32 constant per ``blocksize2`` of them: 8/64 +
    32/(64·256) ≈ 0.127 extra bits per weight. The parameters are treated as one flat tensor
    (real models block each tensor separately, which adds a few partial blocks).

    Returns bytes (float). Raises ValueError on a negative count or a non-positive block size.
    """
    n = _count("n_params", n_params)
    for name, b in (("blocksize", blocksize), ("blocksize2", blocksize2)):
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise ValueError(f"{name} must be a positive integer, got {b!r}.")
    blocks = math.ceil(n / blocksize)
    if not double_quant:
        return 4.0 * blocks
    return 1.0 * blocks + 4.0 * math.ceil(blocks / blocksize2)
