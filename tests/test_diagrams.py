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
