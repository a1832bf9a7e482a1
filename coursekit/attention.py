"""Causal scaled dot-product attention, single- and multi-head, forward and backward.

One head, row-vector convention (Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762,
eq. 1; lesson 08 derives the backward pass)::

    Q : T × d_h     queries, one row per position      K : T × d_h   keys      V : T × d_v   values
    S = Q Kᵀ / √d_h  (+ −inf where query t may not see key u)      T × T   scores
    P = softmax(S)   row-wise, the row maximum subtracted first     T × T   probabilities
    C = P V                                                         T × d_v context

Backward, with ``dC = dL/dC`` arriving from downstream (the same rules as the backward pass of
FlashAttention, Dao et al. 2022, arXiv:2205.14135, appendix B.2)::

    dV = Pᵀ dC                               T × d_v
    dP = dC Vᵀ                               T × T
    dS = P ⊙ (dP − rowsum(dP ⊙ P))           T × T   (the softmax step, :func:`softmax_backward`)
    dQ = dS K / √d_h                         T × d_h
    dK = dSᵀ Q / √d_h                        T × d_h

``rowsum`` sums over the keys (the last axis) and is broadcast back across each row. Masked
positions have P = 0 exactly, so they get zero probability *and* zero dS: nothing flows through a
connection the mask removed.

Leading dimensions (batch, heads) are allowed and must agree exactly between Q, K and V: shapes
``(..., T, d_h)``. The causal mask lets query t attend to keys u ≤ t, as PyTorch's
``scaled_dot_product_attention(..., is_causal=True)`` does.

Multi-head attention (:func:`mha_forward`) projects ``Q = X Wq``, ``K = X Wk``, ``V = X Wv``
(each W is d × (n_heads · d_h), the row-vector layout; ``nn.Linear.weight`` is its transpose),
splits the columns into heads, attends per head, merges the heads back and projects ``Y = C Wo``.
Each projection is an ordinary linear layer: a LoRA adapter on q/k/v/o receives dQ, dK, dV and
dY respectively as its upstream gradient D, and lesson 05's rule applies per projection.

NumPy float64 is the reference. The single-head functions, :func:`softmax_backward`,
:func:`split_heads`, :func:`merge_heads` and the multi-head pair also accept torch tensors (all
arguments of one library and one floating dtype); the arithmetic is the same. The forward
functions reject a NaN or inf entry in their inputs (Q, K, V; X and the weights), naming the first.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .lora import _dtype_name, _is_torch, nonfinite_entry  # one definition of "is this a tensor" for the kernels

__all__ = [
    "AttentionShapeError",
    "AttentionDtypeError",
    "AttentionValueError",
    "causal_mask",
    "attention_forward",
    "attention_backward",
    "softmax_forward",
    "softmax_backward",
    "split_heads",
    "merge_heads",
    "repeat_kv",
    "repeat_kv_backward",
    "mha_forward",
    "mha_backward",
]


class AttentionShapeError(ValueError):
    """An argument has the wrong number of dimensions or a size that does not fit the others."""


class AttentionDtypeError(TypeError):
    """An argument is not floating point (or not boolean, for a mask), or arguments mix dtypes or libraries."""


class AttentionValueError(ValueError):
    """An input has a NaN or infinite entry (the message names the first)."""


# --------------------------------------------------------------------------- NumPy / torch helpers


def _check_floats(**arrays: Any) -> bool:
    """Every array is floating point, of one library and one dtype; returns True for torch."""
    kinds = {}
    for name, a in arrays.items():
        if _is_torch(a):
            kinds[name] = "torch"
            if not a.is_floating_point():
                raise AttentionDtypeError(f"{name} must be floating point, got dtype {_dtype_name(a)}; use .double().")
        elif isinstance(a, np.ndarray):
            kinds[name] = "numpy"
            if not np.issubdtype(a.dtype, np.floating):
                raise AttentionDtypeError(
                    f"{name} must be floating point, got dtype {a.dtype}; use .astype(np.float64)."
                )
        else:
            raise AttentionDtypeError(
                f"{name} must be a NumPy array or a torch tensor, got {type(a).__name__}; "
                f"wrap lists with np.asarray(..., dtype=np.float64)."
            )
    if len(set(kinds.values())) > 1:
        raise AttentionDtypeError(f"mixed NumPy arrays and torch tensors: {kinds}; use one library for all arguments.")
    dtypes = {name: _dtype_name(a) for name, a in arrays.items()}
    if len(set(dtypes.values())) > 1:
        raise AttentionDtypeError(f"all arguments must share one dtype, got {dtypes}.")
    return "torch" in kinds.values()


def _check_finite(**arrays: Any) -> None:
    """Every entry is finite; else AttentionValueError naming the tensor and its first bad index."""
    for name, a in arrays.items():
        bad = nonfinite_entry(name, a)
        if bad:
            raise AttentionValueError(
                f"{bad}; every entry of {name} must be finite: one NaN in a score row makes the whole softmax row NaN. "
                f"Look where {name} was computed (a division by zero, log(0), an overflow)."
            )


def _T(x: Any) -> Any:
    """Swap the last two axes (a batched matrix transpose), NumPy or torch."""
    return x.swapaxes(-1, -2)


def _rowsum(x: Any) -> Any:
    return x.sum(dim=-1, keepdim=True) if _is_torch(x) else x.sum(axis=-1, keepdims=True)


def _where(cond: Any, a: Any, b: Any) -> Any:
    if _is_torch(a):
        import torch

        return torch.where(cond, a, b if _is_torch(b) else torch.as_tensor(b, dtype=a.dtype))
    return np.where(cond, a, b)


def _exp(x: Any) -> Any:
    return x.exp() if _is_torch(x) else np.exp(x)


def _isfinite(x: Any) -> Any:
    if _is_torch(x):
        import torch

        return torch.isfinite(x)
    return np.isfinite(x)


def _as_bool_mask(mask: Any, like: Any) -> Any:
    """A mask in the library of ``like``: NumPy bool array, or torch bool tensor on like's device."""
    if _is_torch(like):
        import torch

        return torch.as_tensor(mask, dtype=torch.bool, device=like.device)
    return np.asarray(mask, dtype=bool)


# --------------------------------------------------------------------------- masks and softmax


def causal_mask(T: int) -> np.ndarray:
    """The causal allowed-mask: a (T, T) bool array, True where query t may attend key u (u ≤ t).

    Lower triangle including the diagonal, as ``torch.nn.functional.scaled_dot_product_attention``
    builds it for ``is_causal=True`` (``torch.ones(T, T, dtype=torch.bool).tril()``).
    Raises ValueError if T is not a positive integer.
    """
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T <= 0:
        raise ValueError(f"T must be a positive integer (the sequence length), got {T!r}.")
    return np.tril(np.ones((int(T), int(T)), dtype=bool))


def softmax_forward(S: Any, allowed: Any = None) -> Any:
    """Row-wise softmax over the last axis, with the row maximum subtracted (no overflow).

    Args:
        S: scores, float array (..., Tq, Tk). allowed: optional bool array broadcastable to S;
            False entries get probability exactly 0.
    Returns P shaped like S: each row sums to 1 over its allowed entries. A row with no allowed
    entry (every key masked) is all zeros, not NaN, as in PyTorch's ``scaled_dot_product_attention``
    (a plain ``torch.softmax`` over a row of −inf returns NaN).
    −inf in S is allowed (an additive mask); NaN or +inf at an allowed entry raises AttentionValueError
    naming the first.
    Source: the numerically stable softmax, e.g. Goodfellow, Bengio & Courville, *Deep Learning*, 4.1.
    """
    _check_floats(S=S)
    if allowed is not None:
        S = _where(_as_bool_mask(allowed, S), S, -math.inf)
    _check_finite(S=_where(S == -math.inf, 0.0, S))  # −inf is a masked score; NaN and +inf are errors
    m = S.amax(dim=-1, keepdim=True) if _is_torch(S) else S.max(axis=-1, keepdims=True)
    m = _where(_isfinite(m), m, 0.0)  # a fully masked row has max −inf; −inf − (−inf) would be NaN
    E = _exp(S - m)
    Z = _rowsum(E)
    return E / _where(Z > 0, Z, 1.0)


def softmax_backward(P: Any, dP: Any) -> Any:
    """The softmax step of attention's backward: ``dS = P ⊙ (dP − rowsum(dP ⊙ P))``.

    Args:
        P: probabilities, float array (..., Tq, Tk), each row a softmax over the last axis (keys).
        dP: the upstream gradient dL/dP, same shape and dtype as P.
    Returns dS = dL/dS, shaped like P. The row sum runs over the last axis (keys) and is broadcast
    back across the row; where P = 0 (masked) dS is exactly 0.

    Why: the Jacobian of one softmax row is diag(p) − p pᵀ, so dS_j = p_j (dP_j − Σ_k dP_k p_k).
    Source: Dao et al. 2022 (FlashAttention, arXiv:2205.14135), appendix B.2, eq. for dS; lesson 08.
    Raises AttentionShapeError if the shapes differ, AttentionDtypeError for non-float input.
    """
    _check_floats(P=P, dP=dP)
    if tuple(P.shape) != tuple(dP.shape):
        raise AttentionShapeError(f"dP must have the shape of P {tuple(P.shape)}, got {tuple(dP.shape)}.")
    return P * (dP - _rowsum(dP * P))


# --------------------------------------------------------------------------- single head


def _check_qkv(Q: Any, K: Any, V: Any) -> None:
    _check_floats(Q=Q, K=K, V=V)
    for name, a in (("Q", Q), ("K", K), ("V", V)):
        if a.ndim < 2:
            raise AttentionShapeError(
                f"{name} must have shape (..., T, d_h) with at least 2 dimensions, got {tuple(a.shape)}; "
                f"a single position is shape (1, d_h)."
            )
    if Q.ndim != K.ndim or Q.ndim != V.ndim or Q.shape[:-2] != K.shape[:-2] or Q.shape[:-2] != V.shape[:-2]:
        raise AttentionShapeError(
            f"Q, K and V must share their leading (batch/head) dimensions exactly, got Q {tuple(Q.shape)}, "
            f"K {tuple(K.shape)}, V {tuple(V.shape)}."
        )
    if K.shape[-1] != Q.shape[-1]:
        raise AttentionShapeError(
            f"K must have Q's head width d_h = {Q.shape[-1]} in its last axis (Q Kᵀ contracts it), got K {tuple(K.shape)}."
        )
    if V.shape[-2] != K.shape[-2]:
        raise AttentionShapeError(
            f"V must have one row per key: V.shape[-2] = {V.shape[-2]} but K has {K.shape[-2]} keys "
            f"(K {tuple(K.shape)}, V {tuple(V.shape)})."
        )


def _allowed(Q: Any, K: Any, mask: Any, causal: bool) -> Any:
    """The combined bool allowed-mask, broadcastable to (..., Tq, Tk)."""
    Tq, Tk = Q.shape[-2], K.shape[-2]
    lead = tuple(Q.shape[:-2])
    allowed = None
    if causal:
        if Tq != Tk:
            raise AttentionShapeError(
                f"a causal mask needs as many queries as keys (self-attention), got Q {tuple(Q.shape)} and K {tuple(K.shape)}; "
                f"pass causal=False for cross-attention."
            )
        allowed = causal_mask(Tq)
    if mask is not None:
        dt = _dtype_name(mask) if (_is_torch(mask) or isinstance(mask, np.ndarray)) else type(mask).__name__
        if dt != "bool":
            raise AttentionDtypeError(
                f"mask must be a boolean array (True = may attend), got {dt}; an additive mask of 0/−inf "
                f"converts with mask = (additive == 0)."
            )
        mshape = tuple(mask.shape)
        if len(mshape) < 2 or mshape[-2:] != (Tq, Tk):
            raise AttentionShapeError(f"mask must have shape (Tq, Tk) = {(Tq, Tk)} or (..., {Tq}, {Tk}), got {mshape}.")
        try:
            np.broadcast_shapes(mshape[:-2], lead)
        except ValueError:
            raise AttentionShapeError(f"mask's leading shape {mshape[:-2]} does not broadcast to Q's {lead}.") from None
        if len(mshape[:-2]) > len(lead) or np.broadcast_shapes(mshape[:-2], lead) != lead:
            raise AttentionShapeError(f"mask's leading shape {mshape[:-2]} must broadcast to Q's {lead}, not enlarge it.")
        m = _as_bool_mask(mask, Q)
        allowed = m if allowed is None else (_as_bool_mask(allowed, Q) & m)
    if allowed is None:
        return None
    return _as_bool_mask(allowed, Q)


def attention_forward(Q: Any, K: Any, V: Any, mask: Any = None, causal: bool = True) -> tuple[Any, dict]:
    """Scaled dot-product attention ``C = softmax(Q Kᵀ / √d_h + mask) V``.

    Args:
        Q: (..., T, d_h) queries. K: (..., T, d_h) keys. V: (..., T, d_v) values. One floating dtype,
            all NumPy (reference, float64) or all torch. Leading dims (batch, heads) must be equal.
        mask: optional extra bool allowed-mask, (T, T) or (..., T, T) broadcastable to the scores;
            True = may attend. Combined (logical and) with the causal mask.
        causal: apply the causal mask (query t sees keys u ≤ t). With ``causal=False`` Q may have a
            different number of positions than K and V (cross-attention).

    Returns:
        ``(C, cache)``: C is (..., T, d_v) in the inputs' dtype. ``cache`` holds Q, K, V, the
        probabilities P (..., T, T), the combined mask ``allowed`` (bool, or None) and
        ``scale = 1/√d_h``, for :func:`attention_backward`. Masked entries of P are exactly 0; a
        query with no allowed key gets a zero row of P (and C), not NaN.

    Raises:
        AttentionShapeError: a shape does not fit (message names the argument, expected vs actual).
        AttentionDtypeError: non-float Q/K/V, non-bool mask, mixed dtypes or libraries.
        AttentionValueError: a NaN or inf entry in Q, K or V (the message names it, e.g. "Q[0, 2, 1] is nan").

    Source: Vaswani et al. 2017, eq. 1; PyTorch docs of
    ``torch.nn.functional.scaled_dot_product_attention`` (scale 1/√d_h, ``is_causal``).
    """
    _check_qkv(Q, K, V)
    _check_finite(Q=Q, K=K, V=V)
    allowed = _allowed(Q, K, mask, causal)
    scale = 1.0 / math.sqrt(Q.shape[-1])
    S = (Q @ _T(K)) * scale
    P = softmax_forward(S, allowed)
    C = P @ V
    return C, {"Q": Q, "K": K, "V": V, "P": P, "allowed": allowed, "scale": scale}


def attention_backward(dC: Any, cache: dict) -> tuple[Any, Any, Any]:
    """Backward pass of :func:`attention_forward`: ``(dQ, dK, dV)`` from ``dC = dL/dC``.

    ``dV = Pᵀ dC``, ``dP = dC Vᵀ``, ``dS = P ⊙ (dP − rowsum(dP ⊙ P))`` (:func:`softmax_backward`),
    ``dQ = dS K / √d_h``, ``dK = dSᵀ Q / √d_h``. Masked positions get dS = 0 exactly.
    Shapes: dC like C (..., T, d_v); dQ like Q, dK like K, dV like V.

    Raises AttentionShapeError if dC does not have C's shape; AttentionDtypeError for a dtype or
    library that differs from the forward's. Source: Dao et al. 2022, appendix B.2; lesson 08.
    """
    Q, K, V, P, allowed, scale = (cache[k] for k in ("Q", "K", "V", "P", "allowed", "scale"))
    _check_floats(dC=dC, V=V)
    want = tuple(P.shape[:-1]) + (V.shape[-1],)
    if tuple(dC.shape) != want:
        raise AttentionShapeError(f"dC must have the shape of C, (..., T, d_v) = {want}, got {tuple(dC.shape)}.")
    dV = _T(P) @ dC
    dP = dC @ _T(V)
    dS = softmax_backward(P, dP)
    if allowed is not None:  # already 0 there (P = 0); make it exact even for inf/NaN in dP
        dS = _where(allowed, dS, 0.0)
    dQ = (dS @ K) * scale
    dK = (_T(dS) @ Q) * scale
    return dQ, dK, dV


# --------------------------------------------------------------------------- heads


def split_heads(X: Any, n_heads: int) -> Any:
    """(..., T, d) → (..., n_heads, T, d / n_heads): column block h of X becomes head h.

    Head h takes columns ``h·d_h … (h+1)·d_h − 1`` (the layout of Hugging Face's Llama
    ``q_proj`` output, ``view(..., n_heads, d_h).transpose``). Raises AttentionShapeError if d is not
    divisible by n_heads or X has fewer than 2 dimensions; ValueError for a non-positive n_heads.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads <= 0:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}.")
    if X.ndim < 2:
        raise AttentionShapeError(f"X must have shape (..., T, d), got {tuple(X.shape)}.")
    *lead, T, d = X.shape
    if d % n_heads:
        raise AttentionShapeError(f"X's width d = {d} must be divisible by n_heads = {n_heads} (X has shape {tuple(X.shape)}).")
    return X.reshape(*lead, T, n_heads, d // n_heads).swapaxes(-2, -3)


def merge_heads(Xh: Any) -> Any:
    """(..., n_heads, T, d_h) → (..., T, n_heads · d_h), the inverse of :func:`split_heads`.

    Raises AttentionShapeError if Xh has fewer than 3 dimensions.
    """
    if Xh.ndim < 3:
        raise AttentionShapeError(f"Xh must have shape (..., n_heads, T, d_h), got {tuple(Xh.shape)}.")
    *lead, H, T, dh = Xh.shape
    return Xh.swapaxes(-2, -3).reshape(*lead, T, H * dh)


def _check_groups(X: Any, name: str, heads: Any, heads_name: str) -> int:
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads <= 0:
        raise ValueError(f"{heads_name} must be a positive integer, got {heads!r}.")
    if X.ndim < 3:
        raise AttentionShapeError(f"{name} must have shape (..., heads, T, d_h), got {tuple(X.shape)}.")
    return int(heads)


def repeat_kv(K: Any, n_rep: int) -> Any:
    """Grouped-query attention's key/value sharing: (..., H_kv, T, d_h) → (..., H_kv · n_rep, T, d_h).

    Query head h reads key/value head ``h // n_rep``: each KV head is repeated ``n_rep`` times in a row, as
    transformers' Llama ``repeat_kv`` does (SmolLM2-135M: 9 query heads, 3 KV heads, n_rep = 3, so query heads
    0-2 share KV head 0). Source: Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models
    from Multi-Head Checkpoints", arXiv:2305.13245, §2.2. Raises AttentionShapeError for fewer than 3
    dimensions; ValueError for a non-positive n_rep.
    """
    n_rep = _check_groups(K, "K", n_rep, "n_rep")
    return K.repeat_interleave(n_rep, dim=-3) if hasattr(K, "repeat_interleave") else np.repeat(K, n_rep, axis=-3)


def repeat_kv_backward(dK_rep: Any, n_kv_heads: int) -> Any:
    """The backward of :func:`repeat_kv`: (..., H, T, d_h) → (..., n_kv_heads, T, d_h).

    A KV head that ``n_rep = H / n_kv_heads`` query heads read gets the **sum** of their gradients (a tensor
    used several times collects one gradient per use): ``dK[g] = Σ_{h // n_rep = g} dK_rep[h]``. Applies to dK
    and dV alike. Raises AttentionShapeError when H is not a multiple of n_kv_heads or for fewer than 3
    dimensions; ValueError for a non-positive n_kv_heads.
    """
    n_kv = _check_groups(dK_rep, "dK_rep", n_kv_heads, "n_kv_heads")
    *lead, H, T, dh = dK_rep.shape
    if H % n_kv:
        raise AttentionShapeError(f"the number of query heads ({H}, axis -3 of dK_rep) must be a multiple of "
                                  f"n_kv_heads = {n_kv}.")
    return dK_rep.reshape(*lead, n_kv, H // n_kv, T, dh).sum(-3)


def _check_mha(X: Any, Wq: Any, Wk: Any, Wv: Any, Wo: Any, n_heads: int) -> None:
    _check_floats(X=X, Wq=Wq, Wk=Wk, Wv=Wv, Wo=Wo)
    if X.ndim < 2:
        raise AttentionShapeError(f"X must have shape (..., T, d) (row-vector convention), got {tuple(X.shape)}.")
    d = X.shape[-1]
    for name, W in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv), ("Wo", Wo)):
        if W.ndim != 2:
            raise AttentionShapeError(f"{name} must be 2-D (d_in × d_out), got shape {tuple(W.shape)}.")
    for name, W in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv)):
        if W.shape[0] != d:
            hint = " (transposed? nn.Linear stores weight as out × in; use weight.T)" if W.shape[1] == d else ""
            raise AttentionShapeError(f"{name} must have d = {d} rows (X has shape {tuple(X.shape)}), got {tuple(W.shape)}{hint}.")
    if Wk.shape != Wq.shape:
        raise AttentionShapeError(f"Wk must have Wq's shape {tuple(Wq.shape)} (Q Kᵀ needs equal head widths), got {tuple(Wk.shape)}.")
    for name, W in (("Wq", Wq), ("Wv", Wv)):
        if W.shape[1] % n_heads:
            raise AttentionShapeError(f"{name}'s output width {W.shape[1]} must be divisible by n_heads = {n_heads}.")
    if Wo.shape[0] != Wv.shape[1]:
        raise AttentionShapeError(
            f"Wo must have {Wv.shape[1]} rows (the merged heads' width, Wv.shape[1]), got {tuple(Wo.shape)}."
        )


def mha_forward(X: Any, Wq: Any, Wk: Any, Wv: Any, Wo: Any, n_heads: int, causal: bool = True) -> tuple[Any, dict]:
    """Multi-head causal self-attention ``Y = merge_heads(attention(split(X Wq), split(X Wk), split(X Wv))) Wo``.

    Args:
        X: (..., T, d) input rows. Wq, Wk: d × (n_heads · d_h). Wv: d × (n_heads · d_v).
            Wo: (n_heads · d_v) × m. Row-vector layout (``nn.Linear.weight.T``), no biases.
        n_heads: number of heads; each head attends with width d_h = Wq.shape[1] / n_heads.
        causal: causal mask per head (default True).

    Returns:
        ``(Y, cache)``: Y is (..., T, m). ``cache`` holds X, the weights, n_heads, the per-head
        attention cache and the merged context C (..., T, n_heads · d_v) for :func:`mha_backward`.

    Raises AttentionShapeError / AttentionDtypeError naming the argument (expected vs actual);
    AttentionValueError for a NaN or inf entry in X or a weight (named); ValueError for a bad n_heads.
    Source: Vaswani et al. 2017, section 3.2.2 (multi-head attention).
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads <= 0:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}.")
    _check_mha(X, Wq, Wk, Wv, Wo, n_heads)
    _check_finite(X=X, Wq=Wq, Wk=Wk, Wv=Wv, Wo=Wo)
    Qh, Kh, Vh = (split_heads(X @ W, n_heads) for W in (Wq, Wk, Wv))
    Ch, attn = attention_forward(Qh, Kh, Vh, causal=causal)
    C = merge_heads(Ch)
    Y = C @ Wo
    return Y, {"X": X, "Wq": Wq, "Wk": Wk, "Wv": Wv, "Wo": Wo, "n_heads": n_heads, "attn": attn, "C": C}


def _weight_grad(X: Any, D: Any) -> Any:
    """Xᵀ D summed over every leading (batch) dimension: (d_in × d_out)."""
    return X.reshape(-1, X.shape[-1]).T @ D.reshape(-1, D.shape[-1])


def mha_backward(dY: Any, cache: dict, return_intermediates: bool = False) -> dict:
    """Backward pass of :func:`mha_forward`.

    Returns a dict with keys ``dX`` (X's shape), ``dWq``, ``dWk``, ``dWv``, ``dWo`` (each its
    weight's shape; summed over tokens and any leading batch dimensions). With
    ``return_intermediates=True`` it also holds the upstream gradient each projection receives —
    its D in lesson 05's notation — in the merged layout (..., T, n_heads · d_h): ``dQ``, ``dK``,
    ``dV`` (for the q/k/v projections) and ``dC`` (the gradient of o_proj's input); o_proj's own D
    is ``dY``.

    ``dWo = Cᵀ dY``, ``dC = dY Woᵀ``, then per head :func:`attention_backward`, merged back, and
    for each of q, k, v: ``dW = Xᵀ dQ`` (etc.), ``dX = dQ Wqᵀ + dK Wkᵀ + dV Wvᵀ`` (three
    branches from the same X add). Raises AttentionShapeError if dY does not have Y's shape.
    Source: Vaswani et al. 2017 section 3.2.2; the chain rule, lesson 08.
    """
    X, Wq, Wk, Wv, Wo, H, attn, C = (cache[k] for k in ("X", "Wq", "Wk", "Wv", "Wo", "n_heads", "attn", "C"))
    _check_floats(dY=dY, X=X)
    want = tuple(X.shape[:-1]) + (Wo.shape[1],)
    if tuple(dY.shape) != want:
        raise AttentionShapeError(f"dY must have the shape of Y, (..., T, m) = {want}, got {tuple(dY.shape)}.")
    dWo = _weight_grad(C, dY)
    dC = dY @ Wo.T
    dQh, dKh, dVh = attention_backward(split_heads(dC, H), attn)
    dQ, dK, dV = merge_heads(dQh), merge_heads(dKh), merge_heads(dVh)
    out = {
        "dX": dQ @ Wq.T + dK @ Wk.T + dV @ Wv.T,
        "dWq": _weight_grad(X, dQ),
        "dWk": _weight_grad(X, dK),
        "dWv": _weight_grad(X, dV),
        "dWo": dWo,
    }
    if return_intermediates:
        out.update(dQ=dQ, dK=dK, dV=dV, dC=dC)
    return out
