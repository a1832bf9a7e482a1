"""A tiny pre-norm decoder block with LoRA adapters on any of its seven projections.

Llama-style block (Touvron et al. 2023, arXiv:2302.13971; transformers' ``LlamaDecoderLayer``), one
sequence of T positions of width d, row-vector convention, NumPy float64, no RoPE, no bias::

    u1 = RMSNorm(x; g1)                      T × d
    q, k, v = u1 W_q, u1 W_k, u1 W_v         T × d        (each optionally + s (u1 A) B)
    C  = causal attention per head           n_heads × T × d_h      (coursekit.attention)
    mh = merge_heads(C)                      T × d
    o  = mh W_o                              T × d        (+ s (mh A_o) B_o)
    h  = x + o                               the first residual add
    u2 = RMSNorm(h; g2)
    G, U = u2 W_gate, u2 W_up                T × f        (each optionally adapted)
    H  = SiLU(G) ⊙ U                         T × f        (coursekit.mlp)
    dn = H W_down                            T × d        (+ s (H A_down) B_down)
    y  = h + dn                              the second residual add

Every adapter consumes **its own projection's input** (lesson 10): q/k/v see u1, o sees the merged
heads, gate/up see u2, down sees H.

RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467; ``LlamaRMSNorm``), per row::

    ρ = sqrt(mean(x²) + eps),   x̂ = x / ρ,   y = x̂ ⊙ g
    dg = Σ_rows dy ⊙ x̂,   dx = (dy ⊙ g − x̂ · mean(dy ⊙ g ⊙ x̂)) / ρ

Backward walks the same graph in reverse: at each residual add the incoming gradient goes to both
operands, and where one tensor feeds several projections (u1 → q, k, v; u2 → gate, up) their input
gradients add. Each projection's backward is lesson 05's (:func:`coursekit.lora.lora_backward`).

``detach``: projections whose frozen base product X W is cut out of the graph (PyTorch's
``(X @ W).detach()``, or running a frozen module under ``torch.no_grad()``). The forward value is
unchanged; backward drops that product's input gradient D Wᵀ. A projection without an adapter whose
base is detached passes **no** gradient at all, which is how a "blanket detach of a frozen layer"
starves the adapters below it.

Names follow PEFT: ``r``, ``lora_alpha``, ``target_modules`` (here ``"q"`` … ``"down"``, the
suffixes of SmolLM2's ``q_proj`` … ``down_proj``), ``s = lora_alpha / r``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from . import attention, lora, mlp

__all__ = [
    "PROJECTIONS",
    "ATTENTION",
    "MLP",
    "HF_NAMES",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "block_shapes",
    "init_block",
    "block_forward",
    "block_backward",
    "projection_backward",
    "torch_block_forward",
    "projection_shapes",
    "adapter_count",
    "factor_count",
    "lora_param_count",
]

ATTENTION = ("q", "k", "v", "o")
MLP = ("gate", "up", "down")
PROJECTIONS = ATTENTION + MLP
"""The seven linear projections of a Llama-style block, in forward order."""

HF_NAMES = {p: f"{p}_proj" for p in PROJECTIONS}
"""Our short names → the module names in transformers' Llama (``q_proj`` … ``down_proj``)."""

_INPUT = {"q": "u1", "k": "u1", "v": "u1", "o": "mh", "gate": "u2", "up": "u2", "down": "H"}


def _check_targets(targets: Iterable[str], argname: str = "targets") -> tuple[str, ...]:
    if isinstance(targets, str):
        raise TypeError(f"{argname} must be a collection of projection names such as ('q', 'v'), got the string {targets!r}.")
    out = tuple(targets)
    bad = [t for t in out if t not in PROJECTIONS]
    if bad:
        raise ValueError(f"{argname} holds unknown projection names {bad}; choose among {list(PROJECTIONS)}.")
    if len(set(out)) != len(out):
        raise ValueError(f"{argname} lists a projection twice: {list(out)}.")
    return out


def _float2d(name: str, a: Any) -> None:
    if not isinstance(a, np.ndarray) or not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must be a floating NumPy array, got {type(a).__name__} {getattr(a, 'dtype', '')}.")
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (T × width, one sequence), got shape {a.shape}.")


def _check_finite(**arrays: Any) -> None:
    """Every entry of each floating array is finite; else ValueError naming it and its first bad index
    ("x[2, 0] is nan"). Other arguments are left to the type checks of the function that uses them."""
    for name, a in arrays.items():
        bad = lora.nonfinite_entry(name, a) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else None
        if bad:
            raise ValueError(f"{bad}; every entry of {name} must be finite, or it spreads NaN through the whole block.")


def _check_eps(eps: Any) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)) or not 0 < eps < np.inf:
        raise ValueError(f"eps must be a finite positive number (RMSNorm's rms_norm_eps, 1e-5 in SmolLM2), got {eps!r}.")


# --------------------------------------------------------------------------- RMSNorm


def rmsnorm_forward(x: np.ndarray, g: np.ndarray, eps: float = 1e-5) -> tuple[np.ndarray, dict]:
    """``y = x / sqrt(mean(x², last axis) + eps) ⊙ g``.

    Args: x (T × d) float; g (d,) the gain; eps > 0 (SmolLM2's ``rms_norm_eps`` is 1e-5).
    Returns ``(y, cache)``, y of x's shape. Raises ValueError if g is not (d,), eps is not a finite
    number > 0, or x or g has a NaN or inf entry (named); TypeError for non-float x.
    Source: Zhang & Sennrich 2019, eq. 4; transformers ``LlamaRMSNorm``.
    """
    _float2d("x", x)
    g = np.asarray(g)
    if g.shape != (x.shape[-1],):
        raise ValueError(f"g must have shape ({x.shape[-1]},) (one gain per feature of x, which is {x.shape}), got {g.shape}.")
    _check_eps(eps)
    _check_finite(x=x, g=g)
    rho = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x / rho
    return xhat * g, {"xhat": xhat, "rho": rho, "g": g}


def rmsnorm_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """Backward of :func:`rmsnorm_forward`: ``(dx, dg)``.

    ``dg = Σ_rows dy ⊙ x̂`` (d,); ``dx = (dŷ − x̂ · mean(dŷ ⊙ x̂)) / ρ`` with ``dŷ = dy ⊙ g`` (T × d).
    Raises ValueError if dy does not have y's shape.
    """
    xhat, rho, g = cache["xhat"], cache["rho"], cache["g"]
    if np.shape(dy) != xhat.shape:
        raise ValueError(f"dy must have the shape of y, {xhat.shape}, got {np.shape(dy)}.")
    dg = np.sum(dy * xhat, axis=0)
    dxhat = dy * g
    dx = (dxhat - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True)) / rho
    return dx, dg


# --------------------------------------------------------------------------- shapes and a random block


def block_shapes(d: int, f: int, kv_width: int | None = None) -> dict[str, tuple[int, int]]:
    """Row-vector shapes (d_in, d_out) of the seven projections of a block of width d and MLP width f.

    ``kv_width`` is the output width of k and v (grouped-query attention; default d). The toy block
    of this module needs kv_width = d; the counting functions accept any.
    """
    kv = d if kv_width is None else kv_width
    return {"q": (d, d), "k": (d, kv), "v": (d, kv), "o": (d, d), "gate": (d, f), "up": (d, f), "down": (f, d)}


def init_block(rng: np.random.Generator, d: int = 8, n_heads: int = 2, f: int = 12, targets: Iterable[str] = PROJECTIONS,
               r: int = 2, zero_B: bool = False) -> tuple[dict, dict]:
    """A random float64 block and rank-r adapters on ``targets``, for tests and the lesson.

    Returns ``(weights, adapters)``: ``weights`` maps ``"W_q"`` … ``"W_down"`` to (d_in × d_out) arrays
    (scaled by 1/√d_in) and ``"g1"``, ``"g2"`` to gains near 1; ``adapters`` maps each target to
    ``(A, B)`` with A d_in × r and B r × d_out. ``zero_B=True`` gives PEFT's initialisation (B = 0).
    """
    targets = _check_targets(targets)
    if d % n_heads:
        raise ValueError(f"d = {d} must be divisible by n_heads = {n_heads}.")
    weights = {f"W_{p}": rng.standard_normal(sh) / np.sqrt(sh[0]) for p, sh in block_shapes(d, f).items()}
    weights["g1"] = 1.0 + 0.1 * rng.standard_normal(d)
    weights["g2"] = 1.0 + 0.1 * rng.standard_normal(d)
    shapes = block_shapes(d, f)
    adapters = {}
    for p in targets:
        din, dout = shapes[p]
        A = rng.standard_normal((din, r)) / np.sqrt(din)
        B = np.zeros((r, dout)) if zero_B else 0.5 * rng.standard_normal((r, dout))
        adapters[p] = (A, B)
    return weights, adapters


def _check_block(x: np.ndarray, weights: Mapping, adapters: Mapping, n_heads: int) -> None:
    _float2d("x", x)
    d = x.shape[1]
    missing = [k for k in [f"W_{p}" for p in PROJECTIONS] + ["g1", "g2"] if k not in weights]
    if missing:
        raise KeyError(f"weights is missing {missing}; expected W_q … W_down (d_in × d_out) and the gains g1, g2.")
    f = weights["W_gate"].shape[1]
    for p, (din, dout) in block_shapes(d, f).items():
        W = weights[f"W_{p}"]
        _float2d(f"W_{p}", W)
        if W.shape != (din, dout):
            hint = " (transposed? nn.Linear stores out × in; use weight.T)" if W.shape == (dout, din) else ""
            raise ValueError(f"W_{p} must have shape {(din, dout)} for x of width {d} and f = {f}, got {W.shape}{hint}.")
    if not isinstance(n_heads, (int, np.integer)) or n_heads <= 0 or d % n_heads:
        raise ValueError(f"n_heads must be a positive integer dividing d = {d}, got {n_heads!r}.")
    _check_targets(adapters, "adapters")
    for p, AB in adapters.items():
        if not (isinstance(AB, (tuple, list)) and len(AB) == 2):
            raise TypeError(f"adapters[{p!r}] must be a pair (A, B), got {type(AB).__name__}.")
    _check_finite(x=x, **{k: np.asarray(weights[k]) for k in [f"W_{p}" for p in PROJECTIONS] + ["g1", "g2"]})
    _check_finite(**{f"{f}_{p}": a for p, AB in adapters.items() for f, a in zip("AB", AB)})


# --------------------------------------------------------------------------- forward and backward


def _proj_forward(p: str, X: np.ndarray, weights: Mapping, adapters: Mapping, s: float) -> tuple[np.ndarray, dict]:
    W = weights[f"W_{p}"]
    if p in adapters:
        A, B = adapters[p]
        return lora.lora_forward(X, W, A, B, s)
    return X @ W, {"X": X, "W": W}


def block_forward(x: np.ndarray, weights: Mapping[str, np.ndarray], adapters: Mapping[str, tuple] | None = None,
                  s: float = 1.0, n_heads: int = 2, eps: float = 1e-5, detach: Iterable[str] = ()) -> tuple[np.ndarray, dict]:
    """Forward pass of the block (module docstring), returning ``(y, cache)``.

    Args:
        x: T × d float64, one sequence.
        weights: ``"W_q"`` … ``"W_down"`` (d_in × d_out, row-vector; ``nn.Linear.weight.T``), ``"g1"``, ``"g2"`` (d,).
        adapters: projection name → ``(A, B)``, A d_in × r, B r × d_out; any subset of :data:`PROJECTIONS`.
        s: the adapter scale ``lora_alpha / r``, shared by every adapter (one LoraConfig).
        n_heads: attention heads; d_h = d / n_heads. eps: RMSNorm's epsilon.
        detach: projections whose frozen base product is cut from the graph (used by backward only).

    Returns ``(y, cache)``: y is T × d; ``cache`` holds every intermediate by the module docstring's
    names (``"x"``, ``"u1"``, ``"q"``, ``"k"``, ``"v"``, ``"mh"``, ``"o"``, ``"h"``, ``"u2"``, ``"G"``,
    ``"U"``, ``"H"``, ``"y"``), the sub-caches ``"norm1"``, ``"norm2"``, ``"attn"``, ``"swiglu"``,
    ``"proj"`` (name → the :func:`coursekit.lora.lora_forward` cache, or ``{"X", "W"}`` for an
    unadapted projection), and ``"s"``, ``"n_heads"``, ``"adapters"``, ``"detach"``.

    Raises KeyError for a missing weight; ValueError for a wrong shape, an unknown projection name in
    ``adapters`` or ``detach``, n_heads not dividing d, a NaN or inf entry (named: "x[1, 3] is nan",
    "A_q[0, 1] is inf"), eps not > 0, or s not finite; TypeError for non-float arrays or s not a number.
    """
    adapters = dict(adapters or {})
    _check_block(x, weights, adapters, n_heads)
    lora._check_scale(s)
    detach = frozenset(_check_targets(detach, "detach"))
    proj = {}

    def P(p: str, X: np.ndarray) -> np.ndarray:
        Y, proj[p] = _proj_forward(p, X, weights, adapters, s)
        return Y

    u1, c_n1 = rmsnorm_forward(x, weights["g1"], eps)
    q, k, v = P("q", u1), P("k", u1), P("v", u1)
    C, c_att = attention.attention_forward(*(attention.split_heads(t, n_heads) for t in (q, k, v)), causal=True)
    mh = attention.merge_heads(C)
    o = P("o", mh)
    h = x + o
    u2, c_n2 = rmsnorm_forward(h, weights["g2"], eps)
    G, U = P("gate", u2), P("up", u2)
    H, c_sw = mlp.swiglu_forward(G, U)
    dn = P("down", H)
    y = h + dn
    cache = dict(x=x, u1=u1, q=q, k=k, v=v, mh=mh, o=o, h=h, u2=u2, G=G, U=U, H=H, y=y,
                 norm1=c_n1, norm2=c_n2, attn=c_att, swiglu=c_sw, proj=proj,
                 s=s, n_heads=n_heads, adapters=adapters, detach=detach)
    return y, cache


def projection_backward(p: str, D: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Backward of one projection of the block: ``(dX, dA, dB)`` for its upstream gradient D.

    dX is the gradient of the projection's input (u1, mh, u2 or H): ``D Wᵀ + dZ Aᵀ`` (lesson 05), or
    only ``dZ Aᵀ`` if the base product is detached, or ``D Wᵀ`` alone without an adapter (then
    dA = dB = None). A detached projection without an adapter returns dX = 0.
    Raises ValueError for an unknown name.
    """
    if p not in PROJECTIONS:
        raise ValueError(f"p must be one of {list(PROJECTIONS)}, got {p!r}.")
    pc, detached = cache["proj"][p], p in cache["detach"]
    if "A" in pc:
        dX, dA, dB = lora.lora_backward(D, pc)
        if detached:  # the base product is a constant: only the adapter path dZ Aᵀ reaches X
            dX = (pc["s"] * D @ pc["B"].T) @ pc["A"].T
        return dX, dA, dB
    dX = np.zeros_like(pc["X"]) if detached else D @ pc["W"].T
    return dX, None, None


def block_backward(dy: np.ndarray, cache: dict, base_grads: bool = False) -> dict[str, np.ndarray]:
    """Backward pass of :func:`block_forward` for the upstream gradient ``dy = dL/dy`` (T × d).

    Returns a dict: ``"x"`` (T × d), and ``"A_<p>"``, ``"B_<p>"`` for every adapted projection p (A's
    and B's shapes). With ``base_grads=True`` it also returns what the frozen weights *would* get:
    ``"W_<p>" = Xᵀ D`` (zero for a detached product) and ``"g1"``, ``"g2"`` (the norm gains); by
    default, as for a frozen base, none is formed. Raises ValueError if dy is not y's shape.
    """
    if np.shape(dy) != cache["y"].shape:
        raise ValueError(f"dy must have the shape of y, {cache['y'].shape}, got {np.shape(dy)}.")
    grads: dict[str, np.ndarray] = {}

    def back(p: str, D: np.ndarray) -> np.ndarray:
        dX, dA, dB = projection_backward(p, D, cache)
        if dA is not None:
            grads[f"A_{p}"], grads[f"B_{p}"] = dA, dB
        if base_grads:
            grads[f"W_{p}"] = np.zeros_like(cache["proj"][p]["W"]) if p in cache["detach"] else cache["proj"][p]["X"].T @ D
        return dX

    # y = h + dn: the residual passes dy to h unchanged, and the MLP branch gets dy too.
    dH = back("down", dy)
    dG, dU = mlp.swiglu_backward(dH, cache["swiglu"])
    du2 = back("gate", dG) + back("up", dU)              # u2 feeds two projections: their gradients add
    dh_norm, dg2 = rmsnorm_backward(du2, cache["norm2"])
    dh = dy + dh_norm                                   # residual path + MLP path
    # h = x + o
    dmh = back("o", dh)
    n_heads = cache["n_heads"]
    dQ, dK, dV = attention.attention_backward(attention.split_heads(dmh, n_heads), cache["attn"])
    du1 = sum(back(p, attention.merge_heads(dT)) for p, dT in (("q", dQ), ("k", dK), ("v", dV)))
    dx_norm, dg1 = rmsnorm_backward(du1, cache["norm1"])
    grads["x"] = dh + dx_norm                            # residual path + attention path
    if base_grads:
        grads["g1"], grads["g2"] = dg1, dg2
    return dict(sorted(grads.items(), key=lambda kv: (kv[0] != "x", kv[0])))


# --------------------------------------------------------------------------- torch twin (autograd)


def torch_block_forward(x: Any, weights: Mapping[str, Any], adapters: Mapping[str, tuple] | None = None, s: float = 1.0,
                        n_heads: int = 2, eps: float = 1e-5, detach: Iterable[str] = ()) -> Any:
    """The same block in PyTorch, differentiated by autograd: an independent check of :func:`block_backward`.

    Arguments as :func:`block_forward`, as torch tensors (any floating dtype; use float64 to compare).
    Attention is ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``, SiLU is
    ``torch.nn.functional.silu``, and a detached projection computes ``(X @ W).detach()``.
    Returns y (T × d), a tensor in the autograd graph.
    """
    import torch
    import torch.nn.functional as F

    adapters = dict(adapters or {})
    detach = frozenset(_check_targets(detach, "detach"))

    def rms(z, g):
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps) * g

    def P(p, X):
        base = X @ weights[f"W_{p}"]
        if p in detach:
            base = base.detach()
        if p in adapters:
            A, B = adapters[p]
            base = base + s * (X @ A) @ B
        return base

    def heads(z):
        T, d = z.shape
        return z.reshape(T, n_heads, d // n_heads).transpose(0, 1)

    u1 = rms(x, weights["g1"])
    C = F.scaled_dot_product_attention(heads(P("q", u1)), heads(P("k", u1)), heads(P("v", u1)), is_causal=True)
    h = x + P("o", C.transpose(0, 1).reshape(x.shape))
    u2 = rms(h, weights["g2"])
    return h + P("down", F.silu(P("gate", u2)) * P("up", u2))


# --------------------------------------------------------------------------- counting adapters and parameters


def projection_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """Row-vector shapes (d_in, d_out) of a Llama-style model's seven projections, read from its config.

    ``config``: a transformers config (or any object / dict) with ``hidden_size``,
    ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads`` and optionally ``head_dim``
    (default hidden_size / num_attention_heads). q and o are hidden ↔ heads · head_dim; k and v project
    to num_key_value_heads · head_dim (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245).
    For SmolLM2-135M: q, o 576 ↔ 576, k, v 576 → 192, gate, up 576 → 1536, down 1536 → 576.
    Raises KeyError naming a missing field.
    """
    def get(name: str, default: Any = None) -> Any:
        val = config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)
        if val is None:
            raise KeyError(f"config has no {name!r}; projection_shapes needs hidden_size, intermediate_size, "
                           f"num_attention_heads and num_key_value_heads.")
        return int(val)

    d, f, heads = get("hidden_size"), get("intermediate_size"), get("num_attention_heads")
    kv_heads = get("num_key_value_heads", heads)
    head_dim = get("head_dim", d // heads)
    q_width = heads * head_dim
    return {"q": (d, q_width), "k": (d, kv_heads * head_dim), "v": (d, kv_heads * head_dim), "o": (q_width, d),
            "gate": (d, f), "up": (d, f), "down": (f, d)}


def _check_layers(n_layers: Any) -> int:
    if isinstance(n_layers, bool) or not isinstance(n_layers, (int, np.integer)) or n_layers <= 0:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}.")
    return int(n_layers)


def adapter_count(targets: Iterable[str], n_layers: int = 1) -> int:
    """Adapters = target modules per layer × layers (each adapted projection in each layer owns one).

    Example (lesson 10): Q/V → 2 per block; Q/K/V/O → 4; all seven → 7.
    Raises ValueError for an unknown or repeated name or a non-positive n_layers.
    """
    return len(_check_targets(targets)) * _check_layers(n_layers)


def factor_count(targets: Iterable[str], n_layers: int = 1) -> int:
    """Trainable factor matrices = 2 × adapters (each adapter owns an A and a B)."""
    return 2 * adapter_count(targets, n_layers)


def lora_param_count(shapes: Mapping[str, tuple[int, int]], targets: Iterable[str], r: int, n_layers: int = 1) -> int:
    """Trainable LoRA parameters: ``n_layers · Σ_{p in targets} r (d_in + d_out)`` (:func:`coursekit.lora.param_count`).

    ``shapes``: name → (d_in, d_out), e.g. from :func:`projection_shapes`. Equal ranks do not mean equal
    counts: each projection uses its own d and m. Raises KeyError if a target has no shape, ValueError
    for bad names, sizes, r or n_layers.
    """
    targets = _check_targets(targets)
    n_layers = _check_layers(n_layers)
    missing = [t for t in targets if t not in shapes]
    if missing:
        raise KeyError(f"shapes has no entry for {missing}; it has {sorted(shapes)}.")
    return n_layers * sum(lora.param_count(int(shapes[t][0]), int(shapes[t][1]), r) for t in targets)
