"""coursekit.diagrams: every label comes from the arguments, the boxes never overlap, bad widths are refused."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")

import pytest

from coursekit import diagrams

SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3}


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _boxes(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the figures come back closed (a cell displays them once), so draw on Agg
    canvas.draw()
    renderer = canvas.get_renderer()
    return [(t.get_text(), t.get_bbox_patch().get_window_extent(renderer)) for ax in fig.axes for t in ax.texts
            if (t.get_gid() or "").startswith("box:")]


def _overlaps(fig) -> list[tuple[str, str]]:
    return [(a, b) for (a, ea), (b, eb) in itertools.combinations(_boxes(fig), 2) if ea.overlaps(eb)]


@pytest.mark.parametrize("n, d, m, r", [(4, 6, 5, 2), (4, 576, 576, 16), (1, 2, 2, 1)])
def test_adapted_projection_labels_every_shape(n, d, m, r):
    fig = diagrams.adapted_projection(n, d, m, r, s=0.5)
    text = "\n".join(_texts(fig))
    for shape in (f"{n} × {d}", f"{d} × {m}", f"{d} × {r}", f"{r} × {m}", f"{n} × {r}", f"{n} × {m}"):
        assert shape in text, shape
    assert "s = 0.5" in text and "frozen" in text
    assert len(_boxes(fig)) == 7 and not _overlaps(fig)


def test_block_targets_names_the_seven_targets_and_their_inputs():
    fig = diagrams.block_targets(SMOLLM2)
    boxes = [t for t, _ in _boxes(fig)]
    adapters = [t for ax in fig.axes for t in ax.texts if t.get_gid() == "box:adapter"]
    assert [t.get_text().split("\n")[0] for t in adapters] == list(diagrams.TARGET_MODULES)
    by_name = {t.get_text().split("\n")[0]: t.get_text() for t in adapters}
    # Grouped-query attention: 3 key/value heads of 576 / 9 = 64 → k_proj and v_proj map 576 to 192.
    assert "576 × 192" in by_name["k_proj"] and "576 × 192" in by_name["v_proj"] and "576 × 576" in by_name["q_proj"]
    assert "reads mh" in by_name["o_proj"] and "reads H (T × 1536)" in by_name["down_proj"]
    assert all("reads u2" in by_name[k] for k in ("gate_proj", "up_proj"))
    assert all("reads u1" in by_name[k] for k in ("q_proj", "k_proj", "v_proj"))
    assert not _overlaps(fig), _overlaps(fig)
    assert len(boxes) == 14


def test_block_targets_reads_a_transformers_config():
    from transformers import LlamaConfig

    fig = diagrams.block_targets(LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                             num_key_value_heads=2), T=5)
    text = "\n".join(_texts(fig))
    assert "k_proj\n64 × 32" in text and "reads u1 (5 × 64)" in text


def test_quantized_passes_show_no_gradient_for_the_base():
    fig = diagrams.quantized_passes(576, 576, 16)
    fwd, bwd = ("\n".join(t.get_text() for t in ax.texts) for ax in fig.axes)
    assert "∇A = s Xᵀ D Bᵀ\n576 × 16" in bwd and "∇B = s Zᵀ D\n16 × 576" in bwd and "no gradient" in bwd
    assert "∇" not in fwd and "frozen" in fwd
    assert not _overlaps(fig)


@pytest.mark.parametrize("call, msg", [
    (lambda: diagrams.adapted_projection(4, 0, 5, 2), "d must be a positive integer"),
    (lambda: diagrams.adapted_projection(4, 6, 5, 2.5), "r must be a positive integer"),
    (lambda: diagrams.quantized_passes(None, 5, 2), "d must be a positive integer"),
    (lambda: diagrams.block_targets({"hidden_size": 576}), "config needs hidden_size"),
    (lambda: diagrams.block_targets(dict(SMOLLM2, num_attention_heads=7)), "must divide hidden_size"),
])
def test_bad_widths_are_refused(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


# --- Backward graphs -----------------------------------------------------------------------------------------------

ALL_SEVEN = ("q", "k", "v", "o", "gate", "up", "down")


def _texts_and_extents(fig):
    """Every visible text of the figure (boxes by their outline, labels and legend by their own extent)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    return [(t.get_text(), (t.get_bbox_patch() or t).get_window_extent(renderer)) for ax in fig.axes
            for t in ax.texts if t.get_text()]


def _text_overlaps(fig) -> list[tuple[str, str]]:
    return [(a, b) for (a, ea), (b, eb) in itertools.combinations(_texts_and_extents(fig), 2) if ea.overlaps(eb)]


def _outside(fig) -> list[str]:
    box = fig.bbox
    return [t for t, e in _texts_and_extents(fig) if e.x0 < box.x0 or e.x1 > box.x1 or e.y0 < box.y0 or e.y1 > box.y1]


def _graph(fig):
    """The drawn graph read back: box outline → (text, kind, index), and the arrows as (kind, label, source, target)."""
    ax = fig.axes[0]
    boxes = {id(t.get_bbox_patch()): (t.get_text(), t.get_gid()[4:], i) for i, t in enumerate(ax.texts)
             if (t.get_gid() or "").startswith("box:")}                     # (text, kind, a unique index)
    arrows = []
    for t in ax.texts:
        gid = t.get_gid() or ""
        if gid.split(":")[0] in ("fwd", "bwd", "dead"):
            kind, label = gid.split(":", 1)
            patch = t.arrow_patch
            arrows.append((kind, label, boxes[id(patch.patchA)], boxes[id(patch.patchB)]))
    return boxes, arrows


def _labels(fig) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == "edge")


def _check_forks_add(fig) -> None:
    """Every tensor the forward pass forks (two or more forward arrows out, to tensors rather than parameters) gets its
    gradient from a red +, which collects a red arrow from every branch; no + sits anywhere else."""
    _, arrows = _graph(fig)
    fwd_out: dict = {}
    for kind, _, src, dst in arrows:
        if kind == "fwd":
            fwd_out.setdefault(src, []).append(dst)
    forks = {src for src, dsts in fwd_out.items() if len(dsts) >= 2}
    sums = {dst for kind, _, _, dst in arrows if dst[1] == "sum"}
    assert forks, "the graph has no fork"
    fed = {}
    for s_node in sums:
        into = [src for kind, _, src, dst in arrows if kind == "bwd" and dst == s_node]
        out = [dst for kind, _, src, dst in arrows if kind == "bwd" and src == s_node]
        assert len(out) == 1, (s_node, out)
        fed[out[0]] = into
    assert set(fed) == forks, (set(fed), forks)
    for node, into in fed.items():
        assert sorted(into) == sorted(fwd_out[node]), (node, into, fwd_out[node])   # one gradient per branch


def _check_readable(fig) -> None:
    assert fig.get_figwidth() <= 11.5                          # notebook width
    assert min(t.get_fontsize() for ax in fig.axes for t in ax.texts if t.get_text()) >= 8
    assert not _text_overlaps(fig), _text_overlaps(fig)
    assert not _outside(fig), _outside(fig)


@pytest.mark.parametrize("n, d, m, r, s", [(4, 6, 5, 2, 0.5), (4096, 1536, 1536, 64, 0.125), (1, 1, 1, 1, None)])
def test_projection_backward_graph_labels_lesson_05s_gradients(n, d, m, r, s):
    fig = diagrams.projection_backward_graph(n, d, m, r, s=s)
    labels, text = _labels(fig), "\n".join(_texts(fig))
    for grad in ("∇B = s Zᵀ D", "dZ = s D Bᵀ", "∇A = Xᵀ dZ", "∇X = D Wᵀ + dZ Aᵀ", "D Wᵀ", "dZ Aᵀ", "s D"):
        assert grad in labels, grad
    for shape in (f"X\n{n} × {d}", f"W   {d} × {m}", f"A   {d} × {r}", f"B   {r} × {m}", f"Z = X A\n{n} × {r}"):
        assert shape in text, shape
    assert ("lora_alpha / r = " + format(s, "g")) in text if s is not None else "s = lora_alpha / r" in text
    boxes, arrows = _graph(fig)
    # the frozen W receives only the dashed arrow of a gradient that is never formed; A and B each get theirs
    into = lambda kind_of_box: [(k, lab) for k, lab, _, dst in arrows if dst[1] == kind_of_box and k != "fwd"]
    assert into("frozen") == [("dead", "no ∇W: frozen")]
    assert sorted(lab for _, lab in into("adapter")) == ["∇A = Xᵀ dZ", "∇B = s Zᵀ D"]
    _check_forks_add(fig)
    _check_readable(fig)


@pytest.mark.parametrize("adapted", [("q", "v"), ("q", "k", "v", "o"), ()])
@pytest.mark.parametrize("T, d, n_heads", [(5, 8, 2), (4096, 576, 9)])
def test_attention_backward_graph_sums_q_k_v_at_x(T, d, n_heads, adapted):
    fig = diagrams.attention_backward_graph(T, d, n_heads, adapted=adapted, s=2.0)
    labels, text = _labels(fig), "\n".join(_texts(fig))
    for grad in ("dY", "dC = dY W_oᵀ", "dP = dC Vᵀ", "dV = Pᵀ dC", "dS = P ⊙ (dP − rowsum(dP ⊙ P))",
                 "dQ = dS K / √d_h", "dK = dSᵀ Q / √d_h", "dQ W_qᵀ", "dK W_kᵀ", "dV W_vᵀ"):
        assert grad in labels, grad
    assert "dX = dQ W_qᵀ\n+ dK W_kᵀ + dV W_vᵀ" in labels
    assert ("(+ the adapter paths)" in labels) == bool({"q", "k", "v"} & set(adapted))   # the adapters' share of dX
    assert ("dC = dY W_oᵀ (+ adapter path)" in labels) == ("o" in adapted)
    assert f"{n_heads} × {T} × {T}" in text and f"d_h = {d // n_heads}" in fig.axes[0].get_title()
    _, arrows = _graph(fig)
    adapter_grads = sorted(lab for k, lab, _, dst in arrows if k == "bwd" and dst[1] == "adapter")
    assert adapter_grads == sorted(f"∇A_{p}, ∇B_{p}" for p in adapted)
    assert all(f"no ∇W_{p} (frozen)" in text for p in "qkvo")
    _check_forks_add(fig)
    _check_readable(fig)


@pytest.mark.parametrize("adapted", [("gate", "up", "down"), ("down",), ()])
@pytest.mark.parametrize("n, d, f", [(4, 3, 5), (4096, 576, 1536)])
def test_mlp_backward_graph_adds_gate_and_up_at_x(n, d, f, adapted):
    fig = diagrams.mlp_backward_graph(n, d, f, adapted=adapted, s=0.5)
    labels, text = _labels(fig), "\n".join(_texts(fig))
    for grad in ("dY", "dH", "dH ⊙ U", "dG = dH ⊙ U ⊙ SiLU′(G)", "dU = dH ⊙ SiLU(G)", "dG W_gateᵀ", "dU W_upᵀ",
                 "dX = dG W_gateᵀ + dU W_upᵀ"):
        assert grad in labels, grad
    assert f"H = SiLU(G) ⊙ U\n{n} × {f}" in text and f"X\n{n} × {d}" in text
    assert ("(+ the adapter paths)" in labels) == bool({"gate", "up"} & set(adapted))
    assert "s = lora_alpha / r = 0.5" in text
    _, arrows = _graph(fig)
    adapters = {dst[0]: lab for k, lab, _, dst in arrows if k == "bwd" and dst[1] == "adapter"}
    assert sorted(adapters.values()) == sorted(f"∇A_{p}, ∇B_{p}" for p in adapted)
    if "down" in adapted:
        assert "+ s (H A_down) B_down" in adapters                 # the down adapter reads H, not X
    _check_forks_add(fig)
    _check_readable(fig)


@pytest.mark.parametrize("adapted", [ALL_SEVEN, ("q", "v"), ()])
@pytest.mark.parametrize("T, d, f", [(5, 8, 12), (4096, 576, 1536)])
def test_block_backward_graph_shows_both_residuals_and_four_forks(T, d, f, adapted):
    fig = diagrams.block_backward_graph(T, d, f, adapted=adapted, s=2.0)
    labels = _labels(fig)
    for grad in ("dy (identity)", "dh (identity)", "dh = dy\n+ RMSNorm-backward(du2)", "dx = dh\n+ RMSNorm-backward(du1)",
                 "du2", "du1", "dG W_gateᵀ", "dU W_upᵀ", "dQ W_qᵀ", "dK W_kᵀ", "dV W_vᵀ", "dQ",
                 "dK", "dV", "dH", "dG", "dU"):
        assert grad in labels, grad
    assert ("du2 (+ the adapter paths)" in labels) == bool({"gate", "up"} & set(adapted))
    boxes, arrows = _graph(fig)
    assert sum(1 for _, kind, _ in boxes.values() if kind == "sum") == 4        # x, u1, h, u2
    inputs = {dst[0]: lab for k, lab, _, dst in arrows if k == "bwd" and dst[1] == "adapter"}
    assert sorted(inputs.values()) == sorted(f"∇A_{p}, ∇B_{p}" for p in adapted)
    expected_inputs = {"q": "u1", "k": "u1", "v": "u1", "o": "mh", "gate": "u2", "up": "u2", "down": "H"}
    assert sorted(inputs) == sorted(f"+ s ({expected_inputs[p]} A_{p}) B_{p}" for p in adapted)
    # the residual identity paths: dy goes straight from y to h's +, dh straight from h to x's +
    identity = {(lab, src[0].split("\n")[0]) for k, lab, src, dst in arrows if k == "bwd" and dst[1] == "sum"
                and "identity" in lab}
    assert identity == {("dy (identity)", "y = h + dn"), ("dh (identity)", "h = x + o")}
    _check_forks_add(fig)
    _check_readable(fig)


def test_backward_graphs_are_deterministic():
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    def pixels(fig):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba()).copy()

    for make in (lambda: diagrams.projection_backward_graph(4, 6, 5, 2, s=0.5),
                 lambda: diagrams.block_backward_graph(5, 8, 12, s=2.0)):
        np.testing.assert_array_equal(pixels(make()), pixels(make()))


@pytest.mark.parametrize("call, msg", [
    (lambda: diagrams.projection_backward_graph(4, 0, 5, 2), "d must be a positive integer"),
    (lambda: diagrams.projection_backward_graph(4, 6, 5, 2, s="2"), "s must be a finite number"),
    (lambda: diagrams.attention_backward_graph(5, 8, 3), "n_heads \\(3\\) must divide d \\(8\\)"),
    (lambda: diagrams.attention_backward_graph(5, 8, 2, adapted="qv"), "adapted must be a collection"),
    (lambda: diagrams.attention_backward_graph(5, 8, 2, adapted=("q", "gate")), "does not have: \\['gate'\\]"),
    (lambda: diagrams.mlp_backward_graph(4, 3, 2.5), "f must be a positive integer"),
    (lambda: diagrams.mlp_backward_graph(4, 3, 5, adapted=("q_proj",)), "does not have"),
    (lambda: diagrams.block_backward_graph(5, 8, 12, s=float("nan")), "s must be a finite number"),
    (lambda: diagrams.block_backward_graph(True, 8, 12), "T must be a positive integer"),
])
def test_backward_graphs_refuse_bad_arguments(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


# --- The causal shift (lesson 04) ----------------------------------------------------------------------------------

TOY_VOCAB = ["<s>", "user:", "EOS", "a", "b", "c", "d", "bot:"]   # lesson 04's toy vocabulary


@pytest.mark.parametrize("ids", [(0, 1, 3, 4, 5, 6, 2), (0, 4, 4, 4, 5, 2), (3, 4, 2), (0, 1, 3, 4, 5, 6, 3, 4, 5, 2)])
def test_causal_shift_draws_the_pairs_transformers_loss_scores(ids):
    """Each arrow of the figure is one position transformers' ForCausalLMLoss scores, and its colour is measured: with
    oracle logits (a margin of 5 on the true next token) a position scored alone costs ≈ 0 where the label is the token
    the logit predicts (green) and ≈ 5 where it is not (red); aligned labels and hand-shifted ones (shift_left)."""
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    from coursekit import objective

    tokens = [TOY_VOCAB[i] for i in ids]
    fig = diagrams.causal_shift(tokens)
    drawn = {}
    for t in fig.axes[0].texts:
        parts = (t.get_gid() or "").split(":")
        if parts[0] in ("aligned", "hand"):
            drawn.setdefault(parts[0], {})[int(parts[2])] = parts[1]
    row = torch.tensor([ids])
    oracle = objective.oracle_logits(row, len(TOY_VOCAB), margin=5.0)
    for band, labels in (("aligned", row), ("hand", objective.shift_left(row))):
        measured = {}
        for j in range(1, len(ids)):
            if int(labels[0, j]) == -100:
                continue
            alone = torch.full_like(labels, -100)
            alone[0, j] = labels[0, j]
            cost = ForCausalLMLoss(oracle, alone, vocab_size=len(TOY_VOCAB)).item()
            assert cost < 0.1 or abs(cost - 5.0) < 0.1, cost
            measured[j - 1] = "hit" if cost < 0.1 else "miss"
        assert drawn[band] == measured, (band, drawn[band], measured)
    assert set(drawn["aligned"].values()) == {"hit"} and "miss" in drawn["hand"].values()
    text = "\n".join(_texts(fig))
    assert all(tok in text for tok in tokens) and "−100" in text
    _check_readable(fig)


@pytest.mark.parametrize("tokens", [["a", "b"], "a b c", ["a", 3, "c"], ["a"] * 11])
def test_causal_shift_refuses_bad_rows(tokens):
    with pytest.raises(ValueError, match="tokens must be a list of 3 to 10 strings"):
        diagrams.causal_shift(tokens)
