"""Rotary position embedding (RoPE), forward and backward, in the layout Llama-style models use.

SmolLM2 (a Llama) rotates every query and key head after ``q_proj`` / ``k_proj`` and before the scores
Q Kᵀ / √d_h. Source: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
arXiv:2104.09864, eq. 13-16 and 34; the layout is transformers' ``LlamaRotaryEmbedding`` and
``apply_rotary_pos_emb`` (``modeling_llama.py``).

For one head vector x of even width d at position t, frequency i = 0 … d/2 − 1 rotates the pair
(x[i], x[i + d/2]) — the first half against the second half, not neighbouring entries — by the angle
θ_{t,i} = t · base^(−2i/d)::

    cos, sin : T × d      cos[t] = [cos θ_{t,0}, …, cos θ_{t,d/2−1}, cos θ_{t,0}, …]   (the half repeated)
    rotate_half(x) = [−x[d/2:], x[:d/2]]
    rope(x)  = x ⊙ cos + rotate_half(x) ⊙ sin                    = R_t x

R_t is block-diagonal with 2 × 2 rotations, so it is orthogonal: R_tᵀ R_t = I, norms and dot products of
vectors at the same position are kept. The backward of a linear map is its transpose, and the transpose of
a rotation is the rotation by −θ::

    dx = R_tᵀ dy = dy ⊙ cos − rotate_half(dy) ⊙ sin                (:func:`rope_backward`)

(−rotate_half is rotate_halfᵀ, and sin is the same in both halves, so rotate_half(dy ⊙ sin) = rotate_half(dy) ⊙ sin.)
So the adapter on ``q_proj`` receives D = Rᵀ dQ_rot, the gradient at the rotated queries rotated back, not dQ_rot.

NumPy float64 is the reference; torch tensors work too (one library per call, the shapes below).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["rotate_half", "rope_cos_sin", "rope_forward", "rope_backward"]


def _check(x: Any, cos: Any, sin: Any, name: str) -> None:
    for n, a in ((name, x), ("cos", cos), ("sin", sin)):
        if a is None or not hasattr(a, "shape"):
            raise TypeError(f"{n} must be an array or tensor, got {type(a).__name__}.")
    if x.ndim < 2 or x.shape[-1] % 2:
        raise ValueError(f"{name} must have shape (..., T, d) with an even head width d, got {tuple(x.shape)}.")
    if tuple(cos.shape) != tuple(sin.shape) or tuple(cos.shape) != tuple(x.shape[-2:]):
        raise ValueError(f"cos and sin must both have shape (T, d) = {tuple(x.shape[-2:])} (the last two axes of {name}), "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}.")


def rotate_half(x: Any) -> Any:
    """[−x[..., d/2:], x[..., :d/2]] along the last axis (width d, even): the 90° turn of every (i, i + d/2) pair.

    Shape (..., d) in, the same shape out. Source: transformers' ``rotate_half`` (Llama)."""
    h = x.shape[-1] // 2
    first, second = x[..., :h], x[..., h:]
    if hasattr(x, "new_empty"):  # torch
        import torch

        return torch.cat((-second, first), dim=-1)
    return np.concatenate((-second, first), axis=-1)


def rope_cos_sin(T: int, head_dim: int, base: float = 10000.0, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The rotation tables for positions start … start + T − 1: ``(cos, sin)``, each T × head_dim float64.

    θ_{t,i} = t · base^(−2i / head_dim) for i < head_dim / 2, repeated for the second half (RoFormer eq. 15 in
    transformers' half-split layout; ``base`` is the config's ``rope_theta``: 100,000 for SmolLM2-135M).
    transformers computes the same angles in float32, so its tables differ from these by float32 rounding.
    Raises ValueError for T < 1, an odd or non-positive head_dim, or base ≤ 1."""
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < 1:
        raise ValueError(f"T must be a positive integer, got {T!r}.")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even integer, got {head_dim!r}.")
    if not base > 1:
        raise ValueError(f"base (rope_theta) must be greater than 1, got {base!r}.")
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(start, start + T, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate((angles, angles), axis=-1)
    return np.cos(angles), np.sin(angles)


def rope_forward(x: Any, cos: Any, sin: Any) -> Any:
    """Rotate queries or keys: x ⊙ cos + rotate_half(x) ⊙ sin = R_t x at each position t.

    x: (..., T, d) (leading axes: batch, heads); cos, sin: (T, d) from :func:`rope_cos_sin` (or transformers'
    rotary module, batch axis dropped). Returns x's shape and dtype. Raises ValueError on mismatched shapes or an
    odd d; TypeError when an argument is not an array."""
    _check(x, cos, sin, "x")
    return x * cos + rotate_half(x) * sin


def rope_backward(dy: Any, cos: Any, sin: Any) -> Any:
    """The gradient at RoPE's input from the gradient at its output: R_tᵀ dy = dy ⊙ cos − rotate_half(dy) ⊙ sin.

    The rotation by −θ (R_t is orthogonal, so its transpose is its inverse). dy: (..., T, d); cos, sin: (T, d), the
    tables the forward used. Returns dy's shape and dtype. Raises as :func:`rope_forward`."""
    _check(dy, cos, sin, "dy")
    return dy * cos - rotate_half(dy) * sin
