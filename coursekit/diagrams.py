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

Conventions: row vectors (X is n × d, W d × m, A d × r, B r × m). Bad input (a width that is not a positive
integer) raises ValueError naming the argument.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["adapted_projection", "block_targets", "quantized_passes", "TARGET_MODULES"]

#: The seven linear layers of a Llama block, in the order a token meets them (PEFT's ``target_modules`` names).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_FILL = {"data": "white", "frozen": "#e6e6e6", "adapter": "#d6e6f7", "op": "#fff5d6"}


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
