"""Diagrams the lessons draw: where adapters sit and how one adapted projection computes, drawn with matplotlib.

Every label is computed from the arguments (shapes from the widths passed in, or from a model's config), so a
diagram cannot drift from the code it pictures; ``tests/test_diagrams.py`` reads the labels back and checks
that no two boxes overlap. Each function returns a ``matplotlib.figure.Figure`` and shows nothing by itself
(a notebook cell that ends with the figure displays it).

* :func:`adapted_projection`: one adapted projection, ``Y = X W + s (X A) B`` (Hu et al. 2021, "LoRA: Low-Rank
  Adaptation of Large Language Models", arXiv:2106.09685, §4.1), as a graph of its five operations with shapes.
* :func:`block_targets`: a pre-norm Llama block (Touvron et al. 2023, "LLaMA", arXiv:2302.13971, §2) with its
  seven linear layers, PEFT's ``target_modules`` names, and the tensor each one consumes.
* :func:`quantized_passes`: forward and backward through a frozen 4-bit base with an adapter (Dettmers et al.
  2023, "QLoRA", arXiv:2305.14314, §3): the base is dequantized in both passes and receives no gradient.
* Backward graphs, one per backward lesson: :func:`projection_backward_graph` (lesson 05, one adapted projection),
  :func:`attention_backward_graph` (lesson 08), :func:`mlp_backward_graph` (lesson 09, the gated MLP) and
  :func:`block_backward_graph` (lesson 10, a pre-norm block). Grey arrows run forward; red arrows carry each gradient
  back, labelled in the lesson's notation; a red + marks a fork of the forward pass, where the branches' gradients
  add; frozen weights get no gradient, adapters get ∇A and ∇B. ``tests/test_diagrams.py`` also checks that no two
  texts overlap and that every fork has its +.
* :func:`causal_shift` (lesson 04): which label each logit of a causal LM is scored against, with labels aligned with
  the inputs (the model shifts once) and with labels shifted by hand first (the model shifts again).

Conventions: row vectors (X is n × d, W d × m, A d × r, B r × m). Bad input (a width that is not a positive
integer) raises ValueError naming the argument.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

import numpy as np

__all__ = ["adapted_projection", "block_targets", "quantized_passes", "projection_backward_graph",
           "attention_backward_graph", "mlp_backward_graph", "block_backward_graph", "causal_shift", "TARGET_MODULES"]

#: The seven linear layers of a Llama block, in the order a token meets them (PEFT's ``target_modules`` names).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_FILL = {"data": "white", "frozen": "#e6e6e6", "adapter": "#d6e6f7", "op": "#fff5d6", "label": "#eef6e9",
         "ignored": "#e6e6e6"}


def _widths(**kw: Any) -> None:
    for name, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _box(ax, xy: tuple[float, float], text: str, kind: str = "data", size: float = 9):
    """A rounded, filled box of text centred at ``xy``; returns the Text (arrows attach to its outline)."""
    return ax.text(*xy, text, ha="center", va="center", fontsize=size, gid=f"box:{kind}",
                   bbox=dict(boxstyle="round,pad=0.35", fc=_FILL[kind], ec="#555555", lw=0.9))


def _arrow(ax, a, b, color: str = "#333333", label: str = "") -> None:
    """An arrow from box ``a`` to box ``b`` (Texts from :func:`_box`), clipped at both outlines."""
    ax.annotate("", xy=b.get_position(), xytext=a.get_position(),
                arrowprops=dict(arrowstyle="-|>", color=color, lw=1.2, patchA=a.get_bbox_patch(),
                                patchB=b.get_bbox_patch(), shrinkA=2, shrinkB=2))
    if label:
        (x0, y0), (x1, y1) = a.get_position(), b.get_position()
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, label, ha="center", va="bottom", fontsize=7.5,
                color="#444444", gid="edge")


def _canvas(width: float, height: float, xlim: tuple[float, float], ylim: tuple[float, float], title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    plt.close(fig)  # returned, not shown: the cell that ends with it displays it once
    return fig, ax


def adapted_projection(n: int, d: int, m: int, r: int, s: float | None = None):
    """One adapted projection as a computational graph: the frozen base GEMM ``X W`` (n × m), the adapter path
    ``Z = X A`` (n × r) then ``Z B`` (n × m), the scale ``s`` and the add that gives ``Y`` (n × m).

    n: token rows; d: input width; m: output width; r: adapter rank (positive integers). s: the scale
    lora_alpha / r, printed when given. Returns a Figure. Raises ValueError for a width that is not a positive
    integer. Source: LoRA (arXiv:2106.09685) §4.1, Eq. (3), in the course's row-vector form.
    """
    _widths(n=n, d=d, m=m, r=r)
    scale = "× s" if s is None else f"× s = {s:g}"
    fig, ax = _canvas(10.5, 3.6, (0, 10.5), (0, 4), f"One adapted projection: Y = X W + s (X A) B   (r = {r})")
    X = _box(ax, (0.8, 2.0), f"X\n{n} × {d}")
    base = _box(ax, (4.2, 3.3), f"X W\nW: {d} × {m}, frozen", "frozen")
    A = _box(ax, (2.9, 0.8), f"Z = X A\nA: {d} × {r}", "adapter")
    B = _box(ax, (5.4, 0.8), f"Z B\nB: {r} × {m}", "adapter")
    S = _box(ax, (7.3, 0.8), scale, "op")
    add = _box(ax, (8.2, 2.0), "+", "op", size=12)
    Y = _box(ax, (9.7, 2.0), f"Y\n{n} × {m}")
    _arrow(ax, X, base)
    _arrow(ax, X, A)
    _arrow(ax, A, B, label=f"{n} × {r}")
    _arrow(ax, B, S, label=f"{n} × {m}")
    _arrow(ax, S, add)
    _arrow(ax, base, add, label=f"{n} × {m}")
    _arrow(ax, add, Y)
    return fig


def _config_widths(config: Any) -> dict[str, int]:
    get = (lambda k: config[k]) if isinstance(config, Mapping) else (lambda k: getattr(config, k))
    try:
        d, f, heads, kv = (int(get(k)) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                  "num_key_value_heads"))
    except (KeyError, AttributeError, TypeError) as e:
        raise ValueError(f"config needs hidden_size, intermediate_size, num_attention_heads and "
                         f"num_key_value_heads (a transformers config or a dict), got {config!r}") from e
    _widths(hidden_size=d, intermediate_size=f, num_attention_heads=heads, num_key_value_heads=kv)
    if d % heads or heads % kv:
        raise ValueError(f"num_attention_heads ({heads}) must divide hidden_size ({d}) and be a multiple of "
                         f"num_key_value_heads ({kv})")
    return {"d": d, "f": f, "kv": kv * (d // heads), "heads": heads, "kv_heads": kv}


def block_targets(config: Any, T: str | int = "T"):
    """A pre-norm Llama block drawn bottom to top, with the seven linear layers that LoRA can adapt
    (:data:`TARGET_MODULES`), each labelled with its weight shape (in × out) and the tensor it consumes.

    config: a transformers ``LlamaConfig`` (e.g. ``AutoConfig.from_pretrained(...)``) or a dict with
    ``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``. k_proj and v_proj are
    narrower under grouped-query attention: num_key_value_heads × head_dim outputs. T: the sequence length shown
    in the shapes (a name or an int). Returns a Figure. Raises ValueError for a config without those widths.
    Source: LLaMA (arXiv:2302.13971) §2; transformers ``LlamaDecoderLayer``.
    """
    w = _config_widths(config)
    d, f, kv = w["d"], w["f"], w["kv"]
    fig, ax = _canvas(9.5, 10, (0, 10), (0, 14),
                      f"A Llama block and its seven adapter targets\n(hidden {d}, MLP {f}, "
                      f"{w['heads']} query / {w['kv_heads']} key-value heads)")
    grey = "#999999"
    x = _box(ax, (1.2, 0.6), f"x, the residual stream\n{T} × {d}")
    n1 = _box(ax, (5.6, 1.8), "RMSNorm → u1", "op")
    qkv = [_box(ax, (xc, 3.3), f"{name}\n{d} × {out}\nreads u1 ({T} × {d})", "adapter")
           for xc, name, out in ((3.1, "q_proj", d), (5.6, "k_proj", kv), (8.1, "v_proj", kv))]
    att = _box(ax, (5.6, 4.8), "attention per head: softmax(Q Kᵀ/√d_h) V,\nheads merged → mh", "op")
    o = _box(ax, (5.6, 6.1), f"o_proj\n{d} × {d}\nreads mh ({T} × {d})", "adapter")
    h = _box(ax, (1.2, 7.1), f"h = x + o\n{T} × {d}", "op")
    n2 = _box(ax, (5.6, 8.1), "RMSNorm → u2", "op")
    gate = _box(ax, (4.0, 9.6), f"gate_proj\n{d} × {f}\nreads u2 ({T} × {d})", "adapter")
    up = _box(ax, (7.2, 9.6), f"up_proj\n{d} × {f}\nreads u2 ({T} × {d})", "adapter")
    act = _box(ax, (5.6, 11.0), f"H = SiLU(G) ⊙ U\n{T} × {f}", "op")
    down = _box(ax, (5.6, 12.3), f"down_proj\n{f} × {d}\nreads H ({T} × {f})", "adapter")
    y = _box(ax, (1.2, 13.4), f"y = h + down\n{T} × {d}", "op")
    _arrow(ax, x, n1)
    for t in qkv:
        _arrow(ax, n1, t)
        _arrow(ax, t, att)
    _arrow(ax, att, o)
    _arrow(ax, o, h)
    _arrow(ax, x, h, color=grey)
    _arrow(ax, h, n2)
    _arrow(ax, n2, gate)
    _arrow(ax, n2, up)
    _arrow(ax, gate, act)
    _arrow(ax, up, act)
    _arrow(ax, act, down)
    _arrow(ax, down, y)
    _arrow(ax, h, y, color=grey)
    ax.text(9.9, 0.1, "blue: the linear layers LoRA adapts (weight in × out);\neach adapter's A has as many rows as "
            "its layer's input\nhas columns. Grey: the residual stream.", ha="right", va="bottom", fontsize=7.5,
            color="#444444", gid="legend")
    return fig


def quantized_passes(d: int, m: int, r: int):
    """Forward and backward through one adapted layer on a frozen 4-bit base, side by side.

    Forward: the base dequantizes its codes to Ŵ (m × d, stored out × in) and computes X Ŵᵀ; the adapter adds
    s (X A) B. Backward: D = ∂L/∂Y comes in; the base is dequantized again and passes D Ŵ down to X but keeps no
    gradient (its codes are frozen); the adapter gets ∇B = s Zᵀ D and ∇A = s Xᵀ D Bᵀ. d, m, r: widths (positive
    integers), shown in the shapes. Returns a Figure. Raises ValueError for a bad width.
    Source: QLoRA (arXiv:2305.14314) §3, Eq. (5)-(6); bitsandbytes ``MatMul4Bit`` (no weight gradient).
    """
    import matplotlib.pyplot as plt

    _widths(d=d, m=m, r=r)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    plt.close(fig)
    text = {False: {"X": f"X\nn × {d}", "base": f"4-bit codes → dequantize\nŴ: {m} × {d}, frozen",
                    "A": f"A: {d} × {r}", "B": f"B: {r} × {m}", "Y": f"Y = X Ŵᵀ + s Z B\nn × {m}"},
            True: {"X": f"∇X = D Ŵ + s D Bᵀ Aᵀ\nn × {d}", "base": "dequantize again → Ŵ\nno gradient for the codes",
                   "A": f"∇A = s Xᵀ D Bᵀ\n{d} × {r}", "B": f"∇B = s Zᵀ D\n{r} × {m}", "Y": f"D = ∂L/∂Y\nn × {m}"}}
    pos = {"X": (1.0, 2.0), "base": (5.0, 3.2), "A": (3.0, 0.8), "B": (7.0, 0.8), "Y": (9.0, 2.0)}
    kinds = {"X": "data", "Y": "data", "base": "frozen", "A": "adapter", "B": "adapter"}
    edges = (("X", "base"), ("X", "A"), ("A", "B"), ("base", "Y"), ("B", "Y"))
    for ax, back in zip(axes, (False, True)):
        ax.set_xlim(-0.4, 10.4)
        ax.set_ylim(0, 4)
        ax.axis("off")
        ax.set_title("backward: D flows down; the base passes it on and keeps nothing" if back
                     else "forward: the base is dequantized for every matmul", fontsize=10)
        boxes = {k: _box(ax, xy, text[back][k], kinds[k], size=8.5) for k, xy in pos.items()}
        for a, b in edges:
            src, dst = (boxes[b], boxes[a]) if back else (boxes[a], boxes[b])
            _arrow(ax, src, dst, color="#c0392b" if back else "#1f5fa8")
    return fig


# --- Backward graphs (lessons 05, 08, 09, 10) -------------------------------------------------------------------
# Grey arrows run forward; red arrows carry a gradient back and are labelled with it, in the lesson's notation. A red
# "+" node sits where the forward pass forks: the gradients of the branches meet there and add. A dashed grey arrow
# back to a frozen weight is the gradient that is never formed.

_FWD, _BWD, _DEAD = "#8a8a8a", "#c0392b", "#9a9a9a"


def _sum(ax, xy: tuple[float, float]):
    """A red ⊕ where the gradients of a fork's branches add (the forward pass forked there)."""
    return ax.text(*xy, "+", ha="center", va="center", fontsize=11, fontweight="bold", color=_BWD, gid="box:sum",
                   bbox=dict(boxstyle="circle,pad=0.2", fc="#fbe3e0", ec=_BWD, lw=1.1))


def _link(ax, a, b, *, back: bool = False, label: str = "", rad: float = 0.0, t: float = 0.5, side: int = 1,
          gap: float = 5.0, dead: bool = False) -> None:
    """An arrow from box ``a`` to box ``b``: forward (grey), backward (red, carrying the gradient ``label``), or a
    gradient that is not formed (``dead``: dashed grey). ``rad`` bends it (matplotlib's arc3: the control point sits
    rad × the arrow's length to the side). The label sits ``gap`` points off the curve at the fraction ``t`` of its
    length, on the outer side of the bend (``side`` picks the side of a straight arrow: +1 right of its direction)."""
    color = _DEAD if dead else (_BWD if back else _FWD)
    kind = "dead" if dead else ("bwd" if back else "fwd")
    ax.annotate("", xy=b.get_position(), xytext=a.get_position(), gid=f"{kind}:{label}",
                arrowprops=dict(arrowstyle="-|>", color=color, lw=1.5 if back and not dead else 1.0,
                                ls="--" if dead else "-", connectionstyle=f"arc3,rad={rad}",
                                patchA=a.get_bbox_patch(), patchB=b.get_bbox_patch(), shrinkA=3, shrinkB=3))
    if not label:
        return
    # arc3's curve, in display units: a quadratic Bézier from a to b through control point mid + rad (dy, −dx).
    to_px = ax.transData.transform
    p1, p2 = np.asarray(to_px(a.get_position()), float), np.asarray(to_px(b.get_position()), float)
    dx, dy = p2 - p1
    c = (p1 + p2) / 2 + rad * np.array([dy, -dx])
    point = (1 - t) ** 2 * p1 + 2 * t * (1 - t) * c + t ** 2 * p2
    tangent = 2 * (1 - t) * (c - p1) + 2 * t * (p2 - c)
    normal = np.array([tangent[1], -tangent[0]]) / np.hypot(*tangent)   # right of the direction of travel
    normal *= np.sign(rad) if rad else side
    at = point + normal * gap * ax.figure.dpi / 72
    ha = "left" if normal[0] > 0.35 else "right" if normal[0] < -0.35 else "center"
    va = "bottom" if normal[1] > 0.35 else "top" if normal[1] < -0.35 else "center"
    ax.text(*ax.transData.inverted().transform(at), label, ha=ha, va=va, fontsize=8.5,
            color=_DEAD if dead else _BWD, fontstyle="italic" if dead else "normal", gid="edge",
            bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.8))


def _legend(ax, xy: tuple[float, float], *lines: str) -> None:
    text = ("grey arrows: the forward pass · red: the gradient each edge carries back (it has its tensor's shape)\n"
            "red +: the forward pass forked here, so the gradients of the branches add")
    ax.text(*xy, "\n".join((text,) + lines), ha="left", va="bottom", fontsize=8, color="#444444", gid="legend",
            linespacing=1.4)


def _adapter_line(s: float | None) -> str:
    _check_scale(s)
    value = "" if s is None else f" = {s:g}"
    return (f"grey boxes: frozen weights, no ∇W formed · blue: an adapter, scaled by s = lora_alpha / r{value}; it gets "
            "∇A, ∇B\nand adds its path to its projection's input gradient (lesson 05)")


def _check_scale(s: Any) -> None:
    if s is not None and (isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s)):
        raise ValueError(f"s must be a finite number (lora_alpha / r) or None, got {s!r}")


def _scale_text(s: float | None) -> str:
    return "× s\ns = lora_alpha / r" if s is None else f"× s\ns = lora_alpha / r = {s:g}"


def projection_backward_graph(n: int, d: int, m: int, r: int, s: float | None = None):
    """The backward pass of one adapted projection ``Y = X W + s (X A) B`` as a graph (lesson 05).

    Tensors are boxes with their shapes; grey arrows run forward, red arrows carry the gradient back, labelled in
    lesson 05's notation: D = ∂L/∂Y reaches both operands of the add; the scale passes s D to Z B, so
    ∇B = s Zᵀ D and dZ = s D Bᵀ; ∇A = Xᵀ dZ; X fed both W and A, so its two gradients add:
    ∇X = D Wᵀ + dZ Aᵀ. The frozen W gets no gradient (a dashed arrow: ∇W = Xᵀ D is never formed).

    n: token rows; d: input width; m: output width; r: adapter rank (positive integers). s: the scale
    lora_alpha / r, printed when given. Returns a Figure. Raises ValueError for a width that is not a positive
    integer. Source: LoRA (arXiv:2106.09685) §4.1; the product rule ∂L/∂P = D Qᵀ, ∂L/∂Q = Pᵀ D for Y = P Q.
    """
    _widths(n=n, d=d, m=m, r=r)
    _check_scale(s)
    fig, ax = _canvas(11, 6.0, (0, 11), (-0.9, 5.7), "Backward through one adapted projection: "
                      "Y = X W + s (X A) B")
    X = _box(ax, (0.8, 2.9), f"X\n{n} × {d}")
    plus_x = _sum(ax, (2.6, 2.9))
    W = _box(ax, (4.3, 5.1), f"W   {d} × {m}\nfrozen", "frozen")
    XW = _box(ax, (4.3, 3.75), f"X W\n{n} × {m}", "op")
    Z = _box(ax, (4.3, 1.55), f"Z = X A\n{n} × {r}", "op")
    A = _box(ax, (4.3, 0.1), f"A   {d} × {r}", "adapter")
    ZB = _box(ax, (6.6, 1.55), f"Z B\n{n} × {m}", "op")
    B = _box(ax, (6.6, 0.1), f"B   {r} × {m}", "adapter")
    S = _box(ax, (8.4, 1.55), _scale_text(s), "op", size=8.5)
    add = _box(ax, (9.0, 2.9), "+", "op", size=12)
    Y = _box(ax, (10.3, 2.9), f"Y\n{n} × {m}")
    for a, b in ((X, XW), (X, Z), (W, XW), (A, Z), (Z, ZB), (B, ZB), (ZB, S), (S, add), (XW, add), (add, Y)):
        _link(ax, a, b)
    _link(ax, Y, add, back=True, label="D", rad=0.35)
    _link(ax, add, XW, back=True, label="D", rad=0.12)
    _link(ax, add, S, back=True, label="D", rad=-0.3)
    _link(ax, S, ZB, back=True, label="s D", rad=0.45)
    _link(ax, ZB, B, back=True, label="∇B = s Zᵀ D", rad=-0.45)
    _link(ax, ZB, Z, back=True, label="dZ = s D Bᵀ", rad=0.45)
    _link(ax, Z, A, back=True, label="∇A = Xᵀ dZ", rad=-0.45)
    _link(ax, XW, W, back=True, dead=True, label="no ∇W: frozen", rad=-0.45)
    _link(ax, XW, plus_x, back=True, label="D Wᵀ", rad=0.2)
    _link(ax, Z, plus_x, back=True, label="dZ Aᵀ", rad=-0.2)
    _link(ax, plus_x, X, back=True, label="∇X = D Wᵀ + dZ Aᵀ", side=-1, gap=17)
    _legend(ax, (0.05, -0.85), "dashed: the frozen W, whose gradient ∇W = Xᵀ D is never formed")
    return fig


_PROJ_INPUT = {"q": "u1", "k": "u1", "v": "u1", "o": "mh", "gate": "u2", "up": "u2", "down": "H"}
_PROJ_OUTPUT = {"q": "Q", "k": "K", "v": "V", "o": "o", "gate": "G", "up": "U", "down": "dn"}
_SUB = {"q": "q", "k": "k", "v": "v", "o": "o", "gate": "gate", "up": "up", "down": "down"}


def _targets(adapted: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(adapted, str) or not all(isinstance(p, str) for p in adapted):
        raise ValueError(f"adapted must be a collection of projection names from {allowed}, got {adapted!r}")
    unknown = sorted(set(adapted) - set(allowed))
    if unknown:
        raise ValueError(f"adapted names projections this graph does not have: {unknown}; choose from {allowed}")
    return tuple(adapted)


def _projection(ax, xy, p: str, x_in: str, out: str, adapted: bool, tag: tuple[float, float] = (0.0, 1.2),
                size: float = 8.5, rad: float = -0.6, short: bool = False):
    """A frozen projection ``out = x_in W_p`` (a grey box that forms no ∇W_p) and, when adapted, its adapter
    s (x_in A_p) B_p beside it (a blue box): a forward arrow into the projection and the red ∇A_p, ∇B_p back."""
    sub = _SUB[p]
    text = f"{p}_proj → {out}\nno ∇W_{sub}" if short else f"{p}_proj: {out} = {x_in} W_{sub}\nno ∇W_{sub} (frozen)"
    box = _box(ax, xy, text, "frozen", size=size)
    if adapted:
        params = _box(ax, (xy[0] + tag[0], xy[1] + tag[1]), f"+ s ({x_in} A_{sub}) B_{sub}", "adapter", size=size)
        _link(ax, params, box)
        _link(ax, box, params, back=True, label=f"∇A_{sub}, ∇B_{sub}", rad=rad)
    return box


def mlp_backward_graph(n: int, d: int, f: int, adapted: Any = ("gate", "up", "down"), s: float | None = None):
    """The backward pass of the gated MLP ``Y = (SiLU(X W_gate) ⊙ X W_up) W_down`` as a graph (lesson 09).

    Grey arrows run forward, red arrows carry the gradient back, labelled in lesson 09's notation: dY reaches
    down_proj, which passes dH back to the gate ⊙; the product hands each factor dH times the other
    (dU = dH ⊙ SiLU(G), and dH ⊙ U to SiLU(G), so dG = dH ⊙ U ⊙ SiLU′(G)); X fed both gate_proj and up_proj,
    so their input gradients add at the red +: dX = dG W_gateᵀ + dU W_upᵀ (+ the adapter paths). Frozen weights
    form no gradient; each adapted projection (``adapted``, a subset of ("gate", "up", "down")) sends ∇A, ∇B to its
    adapter s (X_in A) B, whose input is the projection's own (H for down_proj).

    n: token rows; d: the model width; f: the MLP width (positive integers). s: the scale lora_alpha / r, printed
    when given. Returns a Figure. Raises ValueError for a bad width or an unknown projection name.
    Source: Shazeer 2020, "GLU Variants Improve Transformer" (arXiv:2002.05202), Eq. (6) (SwiGLU); LoRA
    (arXiv:2106.09685) §4.1; transformers ``LlamaMLP``.
    """
    _widths(n=n, d=d, f=f)
    _check_scale(s)
    adapted = _targets(adapted, ("gate", "up", "down"))
    fig, ax = _canvas(11.5, 7.0, (0, 12.5), (-1.75, 6.1),
                      "Backward through the gated MLP: Y = (SiLU(X W_gate) ⊙ X W_up) W_down")
    X = _box(ax, (0.7, 2.5), f"X\n{n} × {d}")
    plus_x = _sum(ax, (2.2, 2.5))
    gate = _projection(ax, (3.9, 4.1), "gate", "X", "G", "gate" in adapted, tag=(0.0, 1.35))
    up = _projection(ax, (3.9, 0.9), "up", "X", "U", "up" in adapted, tag=(0.0, -1.35))
    act = _box(ax, (6.7, 4.1), f"SiLU(G)\n{n} × {f}", "op")
    H = _box(ax, (7.6, 2.5), f"H = SiLU(G) ⊙ U\n{n} × {f}", "op")
    down = _projection(ax, (9.6, 4.1), "down", "H", "Y", "down" in adapted, tag=(0.0, 1.35))
    Y = _box(ax, (11.7, 2.5), f"Y\n{n} × {d}")
    for a, b in ((X, gate), (X, up), (gate, act), (act, H), (up, H), (H, down), (down, Y)):
        _link(ax, a, b)
    _link(ax, Y, down, back=True, label="dY", rad=0.3)
    _link(ax, down, H, back=True, label="dH", rad=0.3)
    _link(ax, H, act, back=True, label="dH ⊙ U", rad=-0.3)
    _link(ax, act, gate, back=True, label="dG = dH ⊙ U ⊙ SiLU′(G)", rad=-0.3)
    _link(ax, H, up, back=True, label="dU = dH ⊙ SiLU(G)", rad=-0.2)
    _link(ax, gate, plus_x, back=True, label="dG W_gateᵀ", rad=-0.25)
    _link(ax, up, plus_x, back=True, label="dU W_upᵀ", rad=0.25)
    adapter_paths = "\n(+ the adapter paths)" if set(adapted) - {"down"} else ""
    _link(ax, plus_x, X, back=True, label="dX = dG W_gateᵀ + dU W_upᵀ" + adapter_paths, side=-1, gap=30, t=0.8)
    _legend(ax, (0.05, -1.7), _adapter_line(s))
    return fig


def attention_backward_graph(T: int, d: int, n_heads: int, adapted: Any = ("q", "v"), s: float | None = None):
    """The backward pass of causal multi-head attention with frozen projections as a graph (lesson 08).

    Forward, bottom to top: Q, K, V = X W_q, X W_k, X W_v; per head S = Q Kᵀ / √d_h (causal mask), P = softmax(S),
    C = P V; heads merged, Y = C W_o. Red arrows carry the gradient back in lesson 08's notation: dY → dC; C = P V
    gives dP = dC Vᵀ and dV = Pᵀ dC; the softmax gives dS = P ⊙ (dP − rowsum(dP ⊙ P)); the scores give
    dQ = dS K / √d_h and dK = dSᵀ Q / √d_h. X fed all three projections, so their input gradients add at the red +:
    dX = dQ W_qᵀ + dK W_kᵀ + dV W_vᵀ (+ the adapter paths). Frozen weights form no gradient; each adapted projection
    (``adapted``, a subset of ("q", "k", "v", "o")) sends ∇A, ∇B to its adapter (its D is dQ, dK, dV or dY).

    T: sequence length; d: model width; n_heads: number of heads, dividing d (positive integers). s: the scale
    lora_alpha / r, printed when given. Returns a Figure. Raises ValueError for a bad width, a head count that does
    not divide d, or an unknown projection name. Source: Vaswani et al. 2017 (arXiv:1706.03762) Eq. (1), §3.2.2;
    Dao et al. 2022, FlashAttention (arXiv:2205.14135) App. B.2 (the backward pass).
    """
    _widths(T=T, d=d, n_heads=n_heads)
    if d % n_heads:
        raise ValueError(f"n_heads ({n_heads}) must divide d ({d})")
    _check_scale(s)
    adapted = _targets(adapted, ("q", "k", "v", "o"))
    d_h = d // n_heads
    fig, ax = _canvas(11.5, 8.4, (-0.2, 13.3), (-1.8, 8.6),
                      f"Backward through attention: {n_heads} heads of width d_h = {d_h}, frozen projections")
    X = _box(ax, (0.7, 4.0), f"X\n{T} × {d}")
    plus_x = _sum(ax, (2.3, 3.45))
    q = _projection(ax, (4.1, 6.6), "q", "X", "Q", "q" in adapted, tag=(0.0, 1.3))
    k = _projection(ax, (4.1, 4.0), "k", "X", "K", "k" in adapted, tag=(2.5, -0.8), rad=0.4)
    v = _projection(ax, (4.1, 1.4), "v", "X", "V", "v" in adapted, tag=(0.0, -1.3))
    S = _box(ax, (6.9, 5.3), f"S = Q Kᵀ / √d_h\ncausal mask\n{n_heads} × {T} × {T}", "op")
    P = _box(ax, (9.2, 6.6), f"P = softmax(S)\n{n_heads} × {T} × {T}", "op")
    C = _box(ax, (9.9, 2.4), f"C = P V\nheads merged · {T} × {d}", "op")
    o = _projection(ax, (10.6, 4.4), "o", "C", "Y", "o" in adapted, tag=(1.9, 0.0), rad=-0.5)
    Y = _box(ax, (12.4, 6.6), f"Y\n{T} × {d}")
    for a, b in ((X, q), (X, k), (X, v), (q, S), (k, S), (S, P), (P, C), (v, C), (C, o), (o, Y)):
        _link(ax, a, b)
    _link(ax, Y, o, back=True, label="dY", rad=0.35)
    _link(ax, o, C, back=True, label="dC = dY W_oᵀ" + (" (+ adapter path)" if "o" in adapted else ""), rad=-0.5)
    _link(ax, C, P, back=True, label="dP = dC Vᵀ", rad=-0.3)
    _link(ax, C, v, back=True, label="dV = Pᵀ dC", rad=-0.12)
    _link(ax, P, S, back=True, label="dS = P ⊙ (dP − rowsum(dP ⊙ P))", rad=-0.3)
    _link(ax, S, q, back=True, label="dQ = dS K / √d_h", rad=0.3)
    _link(ax, S, k, back=True, label="dK = dSᵀ Q / √d_h", rad=-0.3)
    _link(ax, q, plus_x, back=True, label="dQ W_qᵀ", rad=0.3)
    _link(ax, k, plus_x, back=True, label="dK W_kᵀ", rad=0.3, t=0.6)
    _link(ax, v, plus_x, back=True, label="dV W_vᵀ", rad=0.25)
    adapter_paths = "\n(+ the adapter paths)" if set(adapted) - {"o"} else ""
    _link(ax, plus_x, X, back=True, label="dX = dQ W_qᵀ\n+ dK W_kᵀ + dV W_vᵀ" + adapter_paths, side=-1, gap=26)
    _legend(ax, (-0.15, -1.75), _adapter_line(s))
    return fig


def block_backward_graph(T: int, d: int, f: int, adapted: Any = ("q", "k", "v", "o", "gate", "up", "down"),
                         s: float | None = None):
    """The backward pass of a pre-norm Llama block with adapters as a graph, bottom to top (lesson 10).

    Forward: u1 = RMSNorm(x); Q, K, V from u1; attention → mh; o = mh W_o; h = x + o; u2 = RMSNorm(h); G, U from u2;
    H = SiLU(G) ⊙ U; dn = H W_down; y = h + dn. Red arrows carry the gradient back in lesson 10's notation: each
    residual add hands its gradient unchanged to both operands (the identity path: dy straight to h, dh straight to
    x), and each fork adds its branches at a red +: dh = dy + RMSNorm-backward(du2), du2 = dG W_gateᵀ + dU W_upᵀ
    (+ adapter paths), du1 from q, k and v, dx = dh + RMSNorm-backward(du1). Frozen weights form no gradient; each
    adapted projection (``adapted``, short names "q" … "down" as in ``coursekit.block``) sends ∇A, ∇B to its adapter
    s (X_in A) B, whose input is the projection's own (u1, mh, u2 or H).

    T: sequence length; d: model width; f: MLP width (positive integers). s: the scale lora_alpha / r, printed when
    given. Returns a Figure. Raises ValueError for a bad width or an unknown projection name. Source: LLaMA
    (arXiv:2302.13971) §2 and transformers ``LlamaDecoderLayer``; RMSNorm (arXiv:1910.07467); LoRA
    (arXiv:2106.09685) §4.1.
    """
    _widths(T=T, d=d, f=f)
    _check_scale(s)
    adapted = _targets(adapted, ("q", "k", "v", "o", "gate", "up", "down"))
    fig, ax = _canvas(11.5, 13.4, (-0.3, 13.5), (-1.9, 14.8), "Backward through one block: residual adds and forks")
    x = _box(ax, (0.6, 0.3), f"x\n{T} × {d}")
    plus_x = _sum(ax, (1.45, 1.9))
    n1 = _box(ax, (6.7, 0.3), f"u1 = RMSNorm(x)\n{T} × {d}", "op")
    plus_u1 = _sum(ax, (5.6, 1.8))
    proj = {p: _projection(ax, (xc, 2.7), p, "u1", p.upper(), p in adapted, tag=(1.9, 0.0), rad=-0.5, short=True)
            for p, xc in (("q", 2.7), ("k", 6.7), ("v", 10.7))}
    att = _box(ax, (6.7, 4.2), f"attention per head (lesson 08)\nheads merged → mh · {T} × {d}", "op")
    o = _projection(ax, (6.7, 5.5), "o", "mh", "o", "o" in adapted, tag=(1.9, 0.0), rad=-0.5, short=True)
    h = _box(ax, (0.6, 6.7), f"h = x + o\n{T} × {d}", "op")
    plus_h = _sum(ax, (1.45, 8.3))
    n2 = _box(ax, (6.7, 6.7), f"u2 = RMSNorm(h)\n{T} × {d}", "op")
    plus_u2 = _sum(ax, (5.8, 8.2))
    gate = _projection(ax, (3.6, 9.3), "gate", "u2", "G", "gate" in adapted, tag=(2.1, 0.0), rad=-0.5, short=True)
    up = _projection(ax, (9.3, 9.3), "up", "u2", "U", "up" in adapted, tag=(2.1, 0.0), rad=-0.5, short=True)
    H = _box(ax, (6.7, 10.7), f"H = SiLU(G) ⊙ U\n{T} × {f}", "op")
    down = _projection(ax, (6.7, 12.0), "down", "H", "dn", "down" in adapted, tag=(2.2, 0.0), rad=-0.5, short=True)
    y = _box(ax, (0.6, 13.0), f"y = h + dn\n{T} × {d}", "op")
    nxt = _box(ax, (0.6, 14.3), "the next block", "data", size=8.5)
    forward = [(x, n1), (x, h), (att, o), (o, h), (h, n2), (h, y), (n2, gate),
               (n2, up), (gate, H), (up, H), (H, down), (down, y), (y, nxt)]
    forward += [(n1, b) for b in proj.values()] + [(b, att) for b in proj.values()]
    for a, b in forward:
        _link(ax, a, b)
    _link(ax, nxt, y, back=True, label="dy", rad=-0.5)
    _link(ax, y, down, back=True, label="dy", rad=-0.15)
    _link(ax, y, plus_h, back=True, label="dy (identity)", rad=0.08)
    _link(ax, down, H, back=True, label="dH", rad=0.5)
    _link(ax, H, gate, back=True, label="dG", rad=0.3)
    _link(ax, H, up, back=True, label="dU", rad=-0.3)
    _link(ax, gate, plus_u2, back=True, label="dG W_gateᵀ", rad=0.2)
    _link(ax, up, plus_u2, back=True, label="dU W_upᵀ", rad=-0.2)
    _link(ax, plus_u2, n2, back=True, label="du2" + (" (+ the adapter paths)" if {"gate", "up"} & set(adapted) else ""),
          side=-1)
    _link(ax, n2, plus_h, back=True, label="RMSNorm-backward(du2)", rad=-0.1, t=0.5)
    _link(ax, plus_h, h, back=True, label="dh = dy\n+ RMSNorm-backward(du2)", side=-1, t=0.3)
    _link(ax, h, o, back=True, label="dh", rad=0.1)
    _link(ax, h, plus_x, back=True, label="dh (identity)", rad=0.08)
    _link(ax, o, att, back=True, label="dh W_oᵀ" + (" (+ adapter path)" if "o" in adapted else ""), rad=0.5)
    for p, b in proj.items():
        _link(ax, att, b, back=True, label=f"d{p.upper()}", rad={"q": 0.25, "k": 0.3, "v": -0.25}[p])
        _link(ax, b, plus_u1, back=True, label=f"d{p.upper()} W_{p}ᵀ", rad={"q": 0.2, "k": -0.3, "v": -0.2}[p])
    _link(ax, plus_u1, n1, back=True, label="du1", side=1)
    _link(ax, n1, plus_x, back=True, label="RMSNorm-backward(du1)", rad=-0.1, t=0.5)
    _link(ax, plus_x, x, back=True, label="dx = dh\n+ RMSNorm-backward(du1)", side=-1, t=0.3)
    _legend(ax, (-0.25, -1.85), _adapter_line(s))
    return fig


# --- The causal shift (lesson 04) ------------------------------------------------------------------------------------

_HIT, _MISS = "#2e7d32", "#c0392b"


def causal_shift(tokens: Any):
    """Which label each logit of a causal LM is scored against, drawn twice for one row of ``tokens`` (lesson 04).

    Top: ``labels = input_ids``. The model's loss shifts once: the logit at position t, which has read tokens 0…t,
    is scored against labels[t + 1] = token t + 1, the token it predicts (a green arrow); labels[0] is never scored.
    Bottom: labels shifted by hand first (labels[t] = token t + 1, −100 last, ``coursekit.objective.shift_left``) and
    then passed to the same loss, which shifts again: logit t is scored against token t + 2, a red arrow wherever that
    differs from token t + 1 (a repeated token hides the error: green). The last label, −100, is not scored.

    tokens: the row's tokens as strings, 3 to 10 of them. Returns a Figure. Raises ValueError for fewer than 3 or
    more than 10 tokens, or a token that is not a string. Source: transformers ``ForCausalLMLoss`` ("Shift so that tokens < n predict n").
    """
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens) or not 3 <= len(tokens) <= 10:
        raise ValueError(f"tokens must be a list of 3 to 10 strings, got {tokens!r}")
    tokens = list(tokens)
    T = len(tokens)
    dx = 1.3
    x0 = 2.6
    fig, ax = _canvas(10.5, 5.6, (0, max(x0 + dx * (T - 1) + 1.0, 11.4)), (-0.75, 6.0),
                      "Which label each logit is scored against")
    bands = (("aligned", "labels = input_ids: the model shifts once, logit t is scored against token t + 1",
              tokens, 5.05),
             ("hand", "labels shifted by hand, then shifted again by the model: logit t is scored against token t + 2",
              tokens[1:] + ["−100"], 2.15))
    for band, title, labels, top in bands:
        ax.text(0.05, top + 0.62, title, ha="left", va="center", fontsize=9, gid="band")
        ax.text(0.05, top, "input_ids\n(logit t has\nread 0…t)", ha="left", va="center", fontsize=8, gid="row")
        ax.text(0.05, top - 1.45, "labels\npassed", ha="left", va="center", fontsize=8, gid="row")
        ins = [_box(ax, (x0 + dx * t, top), f"{tok}\nt = {t}", "data", size=8.5) for t, tok in enumerate(tokens)]
        outs = []
        for t, lab in enumerate(labels):
            scored = t >= 1 and lab != "−100"
            outs.append(_box(ax, (x0 + dx * t, top - 1.45), lab, "label" if scored else "ignored", size=8.5))
        for t in range(T - 1):
            if labels[t + 1] == "−100":
                continue
            hit = labels[t + 1] == tokens[t + 1]
            ax.annotate("", xy=outs[t + 1].get_position(), xytext=ins[t].get_position(),
                        gid=f"{band}:{'hit' if hit else 'miss'}:{t}",
                        arrowprops=dict(arrowstyle="-|>", color=_HIT if hit else _MISS, lw=1.4,
                                        patchA=ins[t].get_bbox_patch(), patchB=outs[t + 1].get_bbox_patch(),
                                        shrinkA=2, shrinkB=2))
    ax.text(0.05, -0.7, "arrow: logit t → the label it is scored against · green: the token it predicts (t + 1) · "
            "red: another token\ngrey labels are never scored: position 0 (no logit predicts it) and −100",
            ha="left", va="bottom", fontsize=8, color="#444444", gid="legend", linespacing=1.4)
    return fig
