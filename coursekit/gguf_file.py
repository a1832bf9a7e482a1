"""The shipped GGUF file: its metadata, its tensor table, the Q4_1 block encoding, and what NF4 adds.

GGUF is a container: a header of key–value metadata, a table of tensors (name, shape, type, offset)
and the tensor bytes. Each tensor has its own type (F32, F16, Q8_0, Q4_1, ...). Reading uses the
``gguf`` package (``gguf.GGUFReader``, memory-mapped); the Q4_1 decoder here is our own and is checked
bit for bit against ``gguf.quants.dequantize`` (tests/test_gguf_file.py).

Q4_1 (ggml ``block_q4_1``, ``ggml-common.h``; decoder ``dequantize_row_q4_1`` in ``ggml-quants.c``):
one block = 32 weights in 20 bytes::

    bytes 0..1   d   float16 (little-endian)   the step
    bytes 2..3   m   float16                   the block minimum
    bytes 4..19  qs  16 bytes of 4-bit codes   byte j: low nibble = element j, high nibble = element j + 16

    w[j] = d · q[j] + m   (computed in float32)

So the low nibbles hold elements 0..15 and the high nibbles 16..31 (not interleaved), and the cost is
(2 + 2 + 16) · 8 / 32 = 5 bits per weight.

Shapes: GGUF lists a tensor's dimensions innermost first (``ne0, ne1`` = in, out); the reader's
``tensor.data`` and :func:`dequantize_tensor` use the row-major ``nn.Linear`` layout, out × in
(m × d), and a Q4_1 row of d weights is d / 32 consecutive blocks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

__all__ = [
    "Q4_1_BLOCK",
    "Q4_1_BYTES",
    "PROJECTIONS",
    "HF_NAMES",
    "TensorInfo",
    "open_reader",
    "metadata",
    "tensor_table",
    "type_summary",
    "bits_per_weight",
    "q4_1_fields",
    "dequantize_q4_1",
    "dequantize_tensor",
    "linear_tensors",
    "unpermute_rope_rows",
    "relative_error",
    "nf4_round_trip",
    "q4_1_round_trip",
    "requantization_errors",
]

Q4_1_BLOCK = 32  # weights per block
Q4_1_BYTES = 20  # bytes per block: fp16 d, fp16 m, 16 bytes of nibbles

# The seven linear projections of a Llama block: GGUF name -> transformers (PEFT target_modules) name.
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
HF_NAMES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
            "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table.

    name: GGUF name (``blk.0.attn_q.weight``). type: ggml type name (``"Q4_1"``, ``"F32"``, ...).
    shape: row-major shape as stored (out × in for a weight matrix; GGUF's ``ne`` reversed).
    n_elements, n_bytes: counts in the file. bits_per_weight: 8 · n_bytes / n_elements.
    """

    name: str
    type: str
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.n_bytes / self.n_elements


def open_reader(path: str | os.PathLike | None = None):
    """A memory-mapped ``gguf.GGUFReader`` of ``path`` (default: the embedded model,
    :func:`coursekit.model.gguf_path`). Takes ~2–3 s (the tokenizer's 49,152-entry arrays are parsed)."""
    import gguf

    if path is None:
        from .model import gguf_path

        path = gguf_path()
    return gguf.GGUFReader(os.fspath(path), "r")


def metadata(reader, max_items: int = 8) -> dict[str, Any]:
    """The key–value header as a dict; arrays longer than ``max_items`` become ``"[array of N <type>]"``."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if len(field.types) > 1 and len(field.data) > max_items:  # an array (tokens, merges, ...)
            out[key] = f"[array of {len(field.data)} {field.types[-1].name.lower()}]"
        else:
            out[key] = field.contents()
    return out


def tensor_table(reader) -> list[TensorInfo]:
    """Every tensor in file order: name, ggml type, row-major shape, element and byte counts."""
    return [TensorInfo(t.name, t.tensor_type.name, tuple(int(s) for s in reversed(t.shape)),
                       int(t.n_elements), int(t.n_bytes)) for t in reader.tensors]


def type_summary(table: Iterable[TensorInfo]) -> dict[str, dict[str, float]]:
    """Per ggml type: number of tensors, elements, bytes and bits per weight, largest type first."""
    acc: dict[str, dict[str, float]] = {}
    for t in table:
        a = acc.setdefault(t.type, {"tensors": 0, "elements": 0, "bytes": 0})
        a["tensors"] += 1
        a["elements"] += t.n_elements
        a["bytes"] += t.n_bytes
    for a in acc.values():
        a["bits_per_weight"] = 8.0 * a["bytes"] / a["elements"]
    return dict(sorted(acc.items(), key=lambda kv: -kv[1]["bytes"]))


def bits_per_weight(type_name: str) -> float:
    """Storage cost of a ggml type in bits per weight, from ``gguf.GGML_QUANT_SIZES`` (block size, bytes)."""
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return 8.0 * nbytes / block


# --------------------------------------------------------------------------- Q4_1


def _as_blocks(block_bytes: Any) -> np.ndarray:
    b = np.ascontiguousarray(np.asarray(block_bytes, dtype=np.uint8))
    if b.size % Q4_1_BYTES:
        raise ValueError(f"Q4_1 data must be a whole number of {Q4_1_BYTES}-byte blocks; got {b.size} bytes")
    return b.reshape(-1, Q4_1_BYTES)


def q4_1_fields(block_bytes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split Q4_1 blocks into their fields.

    block_bytes: uint8, any shape holding whole 20-byte blocks (e.g. (n_blocks, 20) or a reader's
    (rows, d/32·20)). Returns d (n_blocks,) float16, m (n_blocks,) float16, q (n_blocks, 32) uint8
    codes 0..15 in element order (low nibbles → 0..15, high nibbles → 16..31).
    """
    b = _as_blocks(block_bytes)
    d = b[:, 0:2].copy().view("<f2")[:, 0]
    m = b[:, 2:4].copy().view("<f2")[:, 0]
    qs = b[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return d, m, q


def dequantize_q4_1(block_bytes: Any) -> np.ndarray:
    """w = d · q + m per block (ggml ``dequantize_row_q4_1``), in float32 like gguf.quants.

    block_bytes: uint8 (n_blocks, 20) (or anything holding whole blocks). Returns float32 (n_blocks, 32).
    """
    d, m, q = q4_1_fields(block_bytes)
    return d.astype(np.float32)[:, None] * q.astype(np.float32) + m.astype(np.float32)[:, None]


def dequantize_tensor(tensor) -> np.ndarray:
    """A reader tensor as float32 in row-major (out × in) layout: our decoder for Q4_1, gguf.quants otherwise."""
    import gguf

    shape = tuple(int(s) for s in reversed(tensor.shape))
    if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1:
        return dequantize_q4_1(tensor.data).reshape(shape)
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def linear_tensors(reader) -> Iterator[tuple[int, str, Any]]:
    """(layer, projection, reader tensor) for every linear weight of every block, in layer order, then
    the order of :data:`PROJECTIONS`."""
    by_name = {t.name: t for t in reader.tensors}
    layers = int(reader.fields["llama.block_count"].contents())
    for i in range(layers):
        for p in PROJECTIONS:
            yield i, p, by_name[f"blk.{i}.{p}.weight"]


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of attn_q / attn_k (its converter reorders each head's rows for
    its RoPE kernel; transformers' GGUF loader reverses it). A pure row permutation of an out × in matrix."""
    w = np.asarray(w)
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --------------------------------------------------------------------------- errors


def relative_error(approx: Any, ref: Any) -> float:
    """‖approx − ref‖_F / ‖ref‖_F, in float64 (NumPy arrays or torch tensors of the same shape)."""
    a, r = (np.asarray(x.detach().cpu().double().numpy() if hasattr(x, "detach") else x, dtype=np.float64) for x in (approx, ref))
    if a.shape != r.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {r.shape}")
    return float(np.linalg.norm(a - r) / np.linalg.norm(r))


def nf4_round_trip(w: Any, blocksize: int = 64) -> np.ndarray:
    """NF4(w): quantize to NF4 and dequantize again (:mod:`coursekit.quant`, bit-exact with bitsandbytes'
    quantize_4bit / dequantize_4bit, quant_type="nf4"), as QLoRA's loader does to each linear weight.

    w: float32 array (any shape; blocks of ``blocksize`` run over the flattened tensor). Returns float32
    of w's shape. No double quantization: it only rounds the stored absmax (lesson 15).
    """
    import torch

    from . import quant

    t = torch.as_tensor(np.array(w, dtype=np.float32, copy=True))
    return quant.round_trip_4bit(t, blocksize=blocksize, quant_type="nf4").numpy()


def q4_1_round_trip(w: Any) -> np.ndarray:
    """Q4_1(w) with gguf's reference quantizer (min/max per 32, d = (max − min)/15, round), decoded again.
    w: float32 array whose last dimension is a multiple of 32. Returns float32 of w's shape."""
    import gguf

    w = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
    packed = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    return dequantize_q4_1(packed).reshape(w.shape)


def requantization_errors(reader, blocksize: int = 64, progress: Callable[[Iterable], Iterable] | None = None) -> np.ndarray:
    """‖NF4(Ŵ) − Ŵ‖_F / ‖Ŵ‖_F for every linear layer, Ŵ = the file's dequantized Q4_1 weight.

    Returns float64 (layers, 7), columns in the order of :data:`PROJECTIONS`. ``progress`` wraps the
    iteration (e.g. ``tqdm.auto.tqdm``). About 10 s for the 210 weights of the embedded model on two cores.
    """
    layers = int(reader.fields["llama.block_count"].contents())
    out = np.full((layers, len(PROJECTIONS)), np.nan)
    items: Iterable = list(linear_tensors(reader))
    if progress is not None:
        items = progress(items)
    for i, p, t in items:
        w = dequantize_tensor(t)
        out[i, PROJECTIONS.index(p)] = relative_error(nf4_round_trip(w, blocksize), w)
    return out
