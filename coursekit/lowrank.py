"""What a rank-r update can and cannot represent: SVD truncation, Eckart–Young residuals, and the
per-module rank and scale that PEFT's ``rank_pattern`` / ``alpha_pattern`` give each adapter.

Shapes follow the row-vector convention of :mod:`coursekit.lora`: a weight or update ``M`` is d × m,
``A`` is d × r, ``B`` is r × m, so ``rank(A B) <= r``.

Formulas and sources:

* SVD ``M = U diag(S) Vt`` with ``S`` sorted in decreasing order (``numpy.linalg.svd``).
* Best rank-k approximation (Eckart & Young 1936; Mirsky 1960 for every unitarily invariant norm)::

      M_k = U[:, :k] diag(S[:k]) Vt[:k, :]
      ||M - M_k||_F = sqrt(S[k]**2 + S[k+1]**2 + ...)      (Frobenius norm)
      ||M - M_k||_2 = S[k]                                 (spectral norm)

* PEFT's per-module overrides (``peft.utils.other.get_pattern_key``, used by
  ``LoraModel._create_and_replace``; checked against peft 0.21.2, the pinned version): a key of ``rank_pattern`` / ``alpha_pattern``
  applies to a module whose full name matches ``re.match(rf"(.*\\.)?({key})$", name)``, i.e. the key
  (a regular expression) matches the whole name or a suffix that starts after a dot; the first such
  key in the dict's order wins. Then ``scaling = lora_alpha / r`` (or ``/ sqrt(r)`` with rsLoRA).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from . import lora

__all__ = [
    "singular_values",
    "best_rank_k",
    "rank_k_residual",
    "residual_curve",
    "with_singular_values",
    "pattern_key",
    "module_lora_settings",
]


def _matrix(M: Any, name: str = "M") -> np.ndarray:
    """A 2-D float64 NumPy copy of M (NumPy array, torch tensor or nested lists); clear errors otherwise."""
    if hasattr(M, "detach"):
        M = M.detach().cpu().double().numpy()
    try:
        a = np.asarray(M)
    except Exception as e:  # ragged lists
        raise TypeError(f"{name} must be a 2-D array of numbers, got {type(M).__name__} ({e}).") from None
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool) or np.iscomplexobj(a):
        raise TypeError(f"{name} must be a real numeric array, got dtype {a.dtype}.")
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (d × m), got shape {a.shape}.")
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite entries (nan or inf); an SVD needs finite numbers.")
    return a


def _rank_arg(k: Any, kmax: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(k).__name__} {k!r}.")
    if not 0 <= int(k) <= kmax:
        raise ValueError(f"{name} must be between 0 and min(d, m) = {kmax}, got {k}.")
    return int(k)


def singular_values(M: Any) -> np.ndarray:
    """The singular values of a d × m matrix, float64, shape ``(min(d, m),)``, in decreasing order.

    Raises TypeError for non-numeric input, ValueError if M is not 2-D or has nan/inf.
    """
    return np.linalg.svd(_matrix(M), compute_uv=False)


def best_rank_k(M: Any, k: int) -> np.ndarray:
    """The best rank-k approximation ``M_k = U[:, :k] diag(S[:k]) Vt[:k, :]`` of M (Eckart–Young).

    Args:
        M: d × m matrix (NumPy, torch or nested lists), converted to float64.
        k: 0 <= k <= min(d, m). k = 0 gives zeros, k = min(d, m) gives M back (up to rounding).

    Returns:
        float64 array, d × m, of rank <= k, minimising ``||M - X||`` over rank-k X in the Frobenius
        and spectral norms. When S[k-1] == S[k] the minimiser is not unique; any choice has the same residual.

    Raises:
        TypeError: M is not numeric or k is not an integer. ValueError: M is not 2-D, has nan/inf,
        or k is outside [0, min(d, m)].
    """
    a = _matrix(M)
    k = _rank_arg(k, min(a.shape))
    U, S, Vt = np.linalg.svd(a, full_matrices=False)
    return (U[:, :k] * S[:k]) @ Vt[:k, :]


def _spectrum(sigma: Any) -> np.ndarray:
    s = np.asarray(sigma, dtype=np.float64) if not hasattr(sigma, "detach") else sigma.detach().cpu().double().numpy()
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"singular values must be a non-empty 1-D sequence, got shape {s.shape}.")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError(f"singular values must be finite and >= 0, got {s.tolist()}.")
    return np.sort(s)[::-1]


def rank_k_residual(sigma: Any, k: int, norm: str = "fro") -> float:
    """Residual of the best rank-k approximation, from the singular values alone (Eckart–Young).

    Args:
        sigma: 1-D singular values, any order (they are sorted here, largest first), all >= 0.
        k: 0 <= k <= len(sigma). norm: ``"fro"`` → ``sqrt(sum of the squared discarded values)``;
            ``"2"`` → the largest discarded value (0 when nothing is discarded).

    Returns: a float >= 0. Example: sigma = [4, 2, 1, 0.5], k = 1 → sqrt(2² + 1² + 0.5²) ≈ 2.2913.

    Raises ValueError on negative/non-finite values, an empty or non-1-D sigma, k out of range or an
    unknown norm; TypeError if k is not an integer.
    """
    s = _spectrum(sigma)
    k = _rank_arg(k, s.size)
    tail = s[k:]
    if norm == "fro":
        return float(math.sqrt(float(np.sum(tail ** 2))))
    if norm == "2":
        return float(tail[0]) if tail.size else 0.0
    raise ValueError(f"norm must be 'fro' or '2', got {norm!r}.")


def residual_curve(sigma: Any) -> np.ndarray:
    """Frobenius residuals of the best rank-k approximation for every k = 0, 1, ..., len(sigma).

    Entry k is ``sqrt(sum_{i >= k} sorted_sigma[i]**2)``: entry 0 is ``||M||_F``, the last entry is 0,
    and the curve never increases. Returns float64, shape ``(len(sigma) + 1,)``.
    Raises ValueError as :func:`rank_k_residual`.
    """
    s = _spectrum(sigma)
    tails = np.concatenate([np.cumsum((s ** 2)[::-1])[::-1], [0.0]])
    return np.sqrt(tails)


def with_singular_values(sigma: Any, d: int, m: int, rng: np.random.Generator | int | None = 0) -> np.ndarray:
    """A random d × m float64 matrix whose singular values are exactly ``sigma`` (up to rounding).

    Built as ``U diag(sigma) Vt`` with U (d × p) and V (m × p) random orthonormal columns from QR of
    Gaussian matrices, p = len(sigma) <= min(d, m). Used for synthetic "target updates" such as the
    spectrum [4, 2, 1, 0.5] of lesson 03.

    Raises ValueError if p > min(d, m), sizes are not positive integers, or sigma is invalid.
    """
    s = np.asarray(sigma, dtype=np.float64)
    _spectrum(s)  # validates
    for name, v in (("d", d), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}.")
    if s.size > min(d, m):
        raise ValueError(f"a {d} × {m} matrix has at most min(d, m) = {min(d, m)} singular values, got {s.size}.")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    U, _ = np.linalg.qr(gen.standard_normal((d, s.size)))
    V, _ = np.linalg.qr(gen.standard_normal((m, s.size)))
    return (U * s) @ V.T


def pattern_key(pattern_keys: Sequence[str], module_name: str) -> str | None:
    """The first key of ``pattern_keys`` that PEFT would apply to ``module_name``, or None.

    A key K matches when ``re.match(rf"(.*\\.)?({K})$", module_name)`` succeeds: K (a regular
    expression) must match the whole name or a dot-separated suffix of it. So ``"v_proj"`` matches
    ``"layers.1.attn.v_proj"`` but ``"proj"`` does not (no dot before it), and
    ``"layers.0.attn.v_proj"`` matches only block 0. Source: ``peft.utils.other.get_pattern_key``.
    (PEFT returns the module name itself when nothing matches; here that case is None.)
    """
    if not isinstance(module_name, str):
        raise TypeError(f"module_name must be a str, got {type(module_name).__name__}.")
    for key in pattern_keys:
        if not isinstance(key, str):
            raise TypeError(f"pattern keys must be strings (module names or regular expressions), got {key!r}.")
        if re.match(rf"(.*\.)?({key})$", module_name):
            return key
    return None


def module_lora_settings(module_name: str, r: int, lora_alpha: float, rank_pattern: Mapping[str, int] | None = None,
                         alpha_pattern: Mapping[str, float] | None = None, use_rslora: bool = False) -> dict:
    """The rank, alpha and scale one module gets under a PEFT-style ``LoraConfig``.

    ``r`` and ``lora_alpha`` are the defaults; a matching ``rank_pattern`` key replaces r, a matching
    ``alpha_pattern`` key replaces lora_alpha, independently (see :func:`pattern_key`). Overriding r
    alone therefore changes ``scaling = lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``).

    Returns ``{"r": int, "lora_alpha": float, "scaling": float, "rank_key": str | None, "alpha_key": str | None}``.
    Raises ValueError for a non-positive rank (default or from the pattern), TypeError for bad names.
    Source: PEFT ``LoraModel._create_and_replace`` and ``LoraLayer.update_layer``.
    """
    rank_pattern, alpha_pattern = dict(rank_pattern or {}), dict(alpha_pattern or {})
    rk = pattern_key(list(rank_pattern), module_name)
    ak = pattern_key(list(alpha_pattern), module_name)
    r_eff = rank_pattern[rk] if rk is not None else r
    a_eff = alpha_pattern[ak] if ak is not None else lora_alpha
    s = lora.scaling(a_eff, r_eff, use_rslora=use_rslora)  # validates r_eff and a_eff
    return {"r": int(r_eff), "lora_alpha": float(a_eff), "scaling": s, "rank_key": rk, "alpha_key": ak}
