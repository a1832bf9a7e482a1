"""Lesson 10 ("A whole block"): graded items score right answers fully, the typical counting and block-backward
mistakes lose points with a diagnosis that names them, and the notebook's test cells agree with the item registry."""

import json
from pathlib import Path

import nbformat
import numpy as np
import pytest

from coursekit import attention, block, mlp
from coursekit.grading import check
from coursekit.grading.lessons import lesson10
from coursekit.grading.lessons.lesson10 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
LID = "10-a-whole-block"
NOTEBOOK = ROOT / "solutions" / LID / f"{LID}.ipynb"


# --------------------------------------------------------------------------- students


def _input_grad(name, D, cache, transposed=True):
    pc = cache["proj"][name]
    dX = D @ (pc["W"].T if transposed else pc["W"])
    if "A" in pc:
        dX = dX + (pc["s"] * D @ pc["B"].T) @ pc["A"].T
    return dX


def _du1(dh, cache, o_transposed=True):
    dmh = _input_grad("o", dh, cache, o_transposed)
    dQ, dK, dV = attention.attention_backward(attention.split_heads(dmh, cache["n_heads"]), cache["attn"])
    return sum(_input_grad(p, attention.merge_heads(dT), cache) for p, dT in (("q", dQ), ("k", dK), ("v", dV)))


def dx_right(dh, cache):
    return dh + block.rmsnorm_backward(_du1(dh, cache), cache["norm1"])[0]


def dx_residual_only(dh, cache):
    return dh


def dx_frozen_passes_nothing(dh, cache):
    """Only the adapters' paths go back (the frozen products treated as detached): with o unadapted, nothing reaches u1."""
    def adapter_only(name, D):
        pc = cache["proj"][name]
        return (pc["s"] * D @ pc["B"].T) @ pc["A"].T if "A" in pc else np.zeros((D.shape[0], pc["X"].shape[1]))

    dmh = adapter_only("o", dh)
    dQ, dK, dV = attention.attention_backward(attention.split_heads(dmh, cache["n_heads"]), cache["attn"])
    du1 = sum(adapter_only(p, attention.merge_heads(dT)) for p, dT in (("q", dQ), ("k", dK), ("v", dV)))
    return dh + block.rmsnorm_backward(du1, cache["norm1"])[0]


def dx_no_residual(dh, cache):
    return block.rmsnorm_backward(_du1(dh, cache), cache["norm1"])[0]


def dx_skipped_norm(dh, cache):
    return dh + _du1(dh, cache)


def dx_w_o_untransposed(dh, cache):
    return dh + block.rmsnorm_backward(_du1(dh, cache, o_transposed=False), cache["norm1"])[0]


def params_right(shapes, targets, r):
    return sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


def params_square(shapes, targets, r):
    return sum(2 * r * shapes[t][0] for t in targets)


def params_dense(shapes, targets, r):
    return sum(shapes[t][0] * shapes[t][1] for t in targets)


def params_all_shapes(shapes, targets, r):
    return sum(r * (d + m) for d, m in shapes.values())


def params_twice(shapes, targets, r):
    return 2 * params_right(shapes, targets, r)


def _dh(dy, cache):
    dH = block.projection_backward("down", dy, cache)[0]
    dG, dU = mlp.swiglu_backward(dH, cache["swiglu"])
    du2 = block.projection_backward("gate", dG, cache)[0] + block.projection_backward("up", dU, cache)[0]
    return dy + block.rmsnorm_backward(du2, cache["norm2"])[0]


def _o_grads(dh, cache, scale=None):
    A, B = cache["adapters"]["o"]
    mh, s = cache["mh"], cache["s"] if scale is None else scale
    return mh.T @ (s * dh @ B.T), s * (mh @ A).T @ dh


def o_right(dy, cache):
    return _o_grads(_dh(dy, cache), cache)


def o_residual_only(dy, cache):
    return _o_grads(dy, cache)


def o_mlp_only(dy, cache):
    return _o_grads(_dh(dy, cache) - dy, cache)


def o_missing_s(dy, cache):
    return _o_grads(_dh(dy, cache), cache, scale=1.0)


def o_swapped(dy, cache):
    dA, dB = o_right(dy, cache)
    return dB, dA


def o_from_block(dy, cache):
    g = block.block_backward(dy, cache)
    return g["A_o"], g["B_o"]


RIGHT = {"w1": "c", "w2": 5.5, "w3": "a", "p1": dx_right, "p2": params_right, "p3": 2.5,
         "p4": "b", "p5": o_right, "p6": {"a", "b", "c"}}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def _nbgrader_cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]


def test_no_key_or_case_generator_in_the_notebook():
    nb, _ = _nbgrader_cells()
    text = "\n".join(c.source for c in nb.cells if "nbgrader" in c.metadata and c.metadata["nbgrader"]["grade"])
    assert "_hidden" not in text and "keys" not in text


def test_smollm2_shapes_match_the_prepared_checkpoint():
    """The grader's shape constants are the real model's config (prepared once, shared through the cache)."""
    from coursekit.model import prepare_model

    cfg = json.loads((prepare_model(progress=False) / "config.json").read_text())
    assert {block.HF_NAMES[p]: sh for p, sh in block.projection_shapes(cfg).items()} == lesson10.SMOLLM2_SHAPES
    assert cfg["num_hidden_layers"] == lesson10.SMOLLM2_LAYERS


def test_w2_key_is_autograds_gradient_at_the_fork():
    """W2's key (5.5) measured: torch autograd through u -> (u W_gate, u W_up), frozen weights, the given output gradients."""
    import torch

    c = lesson10.W2_CASE
    u = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    G, U = u * torch.tensor(c["w_gate"], dtype=torch.float64), u * torch.tensor(c["w_up"], dtype=torch.float64)
    torch.autograd.backward([G, U], [torch.tensor(c["dG"], dtype=torch.float64), torch.tensor(c["dU"], dtype=torch.float64)])
    assert u.grad.item() == ITEMS["w2"].expected() == RIGHT["w2"]


def _p3_block_dx(detach_down):
    """P3's one-number block in torch: frozen base weights as plain tensors, the adapter factors as leaves, the down
    projection's output computed under torch.no_grad() when ``detach_down``; returns autograd's ∂L/∂x for dL/dy = 1."""
    import torch

    c = {k: torch.tensor(v, dtype=torch.float64) for k, v in lesson10.P3_CASE.items()}
    x = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    a, b = c["a"].clone().requires_grad_(), c["b"].clone().requires_grad_()
    v = c["w_v"] * x + c["s"] * (x * a) * b
    h = x + c["w_o"] * v
    with torch.no_grad() if detach_down else torch.enable_grad():
        dn = c["w_d"] * (c["w_u"] * h)
    y = h + dn
    y.backward(c["dy"])
    return x.grad.item()


def test_p3_key_is_autograds_dx_with_the_down_projection_under_no_grad():
    """P3's key (2.5) is torch autograd's ∂L/∂x of the stated block with the down projection under no_grad; the named
    mistake "detach ignored" is autograd's ∂L/∂x of the same block without the cut."""
    assert _p3_block_dx(True) == pytest.approx(ITEMS["p3"].expected(), rel=1e-12) and RIGHT["p3"] == 2.5
    ignored = {m.label: m.value for m in lesson10._p3_mistakes()}["detach ignored"]
    assert _p3_block_dx(False) == pytest.approx(ignored, rel=1e-12) and ignored != RIGHT["p3"]


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden, capfd):
    fb = check(f"10.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()
    assert capfd.readouterr().err == ""


def test_taking_the_whole_blocks_backward_from_coursekit_fails_here_as_when_graded():
    """coursekit's block_backward is withheld while P5 is graded (the item asks for the o projection's step of it);
    the notebook's check runs the answer the same way, so an answer that reads ∇o off it scores nothing here too."""
    fb = check("10.p5", o_from_block, hidden=True)
    assert fb.points == 0 and "coursekit's block.block_backward is withheld" in fb.text()


def test_hidden_cases_are_deterministic():
    for item, fn, n in (("p1", dx_right, 3), ("p2", params_right, 4), ("p5", o_right, 3)):
        a = check(f"10.{item}", fn, hidden=True).text()
        assert a == check(f"10.{item}", fn, hidden=True).text() and a.count("hidden case") == n


def test_p1_reference_is_torch_autograds_dx():
    """P1's reference, fed the dh that the block's backward reaches at h = x + o, is torch autograd's ∇x of the same
    block (torch_block_forward, frozen base weights as plain tensors), for the Q/V configuration, no adapter and all seven."""
    import torch

    for targets in (("q", "v"), (), block.PROJECTIONS):
        rng = np.random.default_rng(7)
        T, d, H, f, s = 5, 8, 2, 12, 2.0
        weights, adapters = block.init_block(rng, d=d, n_heads=H, f=f, targets=targets, r=2)
        x0, dy = rng.standard_normal((T, d)), rng.standard_normal((T, d))
        _, cache = block.block_forward(x0, weights, adapters, s=s, n_heads=H)
        x = torch.tensor(x0, requires_grad=True)
        y = block.torch_block_forward(x, {k: torch.tensor(v) for k, v in weights.items()},
                                      {p: tuple(torch.tensor(m) for m in pair) for p, pair in adapters.items()}, s=s, n_heads=H)
        y.backward(torch.tensor(dy))
        dx = lesson10.block_input_grad(_dh(dy, cache), cache)
        np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-10, atol=1e-12)
        assert not np.allclose(dx, _dh(dy, cache))        # the attention branch adds something, frozen o_proj or not


def test_p1_withholds_the_block_kernels_but_not_attentions():
    assert set(ITEMS["p1"].withheld) == {"coursekit.block:block_backward", "coursekit.block:projection_backward",
                                         "coursekit.lora:lora_backward"}


# --------------------------------------------------------------------------- wrong answers


def _likely(fb):
    return " ".join(l.strip() for l in fb.lines if "Likely mistake:" in l)


@pytest.mark.parametrize(
    "item, fn, words",
    [
        ("p1", dx_residual_only, "the residual share alone"),
        ("p1", dx_frozen_passes_nothing, "the residual share alone"),
        ("p1", dx_no_residual, "the attention branch alone"),
        ("p1", dx_skipped_norm, "without passing it back through RMSNorm"),
        ("p1", dx_w_o_untransposed, "not dh W_o"),
        ("p2", params_square, "as if every projection were square"),
        ("p2", params_dense, "size of the dense weights"),
        ("p2", params_all_shapes, "count only the target modules"),
        ("p2", params_twice, "don't double it"),
        ("p5", o_residual_only, "the residual path alone"),
        ("p5", o_mlp_only, "only the MLP branch's gradient"),
        ("p5", o_missing_s, "is missing: dB_o = s"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_function_mistakes_are_named(item, fn, words, hidden, capfd):
    fb = check(f"10.{item}", fn, hidden=hidden)
    assert not fb.full, fb.text()
    assert words in _likely(fb), fb.text()
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    "fn, label",
    [
        (dx_residual_only, "no attention branch"),
        (dx_frozen_passes_nothing, "no attention branch"),   # equals dh wherever o has no adapter: 5 of the 6 cases
        (dx_no_residual, "no residual"),
        (dx_skipped_norm, "skipped RMSNorm"),
        (dx_w_o_untransposed, "W_o not transposed"),
    ],
)
def test_p1_wrong_code_is_labelled_with_the_mistake_it_makes(fn, label):
    """Each P1 label is what real wrong code produces, and only that one is recorded."""
    fb = check("10.p1", fn, hidden=True)
    assert fb.points == 0 and fb.mistakes == [label], (fb.mistakes, fb.text())


def test_swapped_outputs_get_a_shape_message():
    fb = check("10.p5", o_swapped)
    assert fb.points == 0 and "dA_o has shape" in fb.text()


def test_stubs_and_non_functions():
    def stub(dy, cache):
        raise NotImplementedError()

    assert check("10.p5", stub).points == 0 and "NotImplementedError" in check("10.p5", stub).text()
    fb = check("10.p1", "block_input_grad")
    assert fb.points == 0 and "should be a function" in fb.text()
    fb = check("10.p1", lambda dh, cache: dh.T)
    assert fb.points == 0 and "shape" in fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w2", 6, "the gate's share alone"),
        ("w2", -0.5, "the up projection's share alone"),
        ("w2", 1, "without passing each back through its projection"),
        ("w2", 0, "they stay in the graph"),
        ("p3", 4.375, "the block without the cut"),
        ("p3", 1, "the residual share alone"),
        ("p3", 0, "dx would still be dy"),
        ("p3", 2, "has two paths"),
        ("p3", 2.25, "the adapter's path is scaled"),
        ("p3", 2.6, "not right"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"10.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "its own projection's input"),
        ("w1", "b", "what q, k and v"),
        ("w1", "d", "has no projection weight"),
        ("w3", "b", "Freezing only stops W_o from being updated"),
        ("w3", "c", "bypasses attention entirely"),
        ("w3", "d", "same side of o_proj"),
        ("p4", "a", "output is a constant"),
        ("p4", "c", "layers below are still reached"),
        ("p4", "d", "it is absent"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"10.{item_id}", answer)
    assert fb.points == 0
    joined = " ".join(fb.lines)
    assert text in joined and "Reread" in joined


def test_multi_choice_partial_credit_and_hints():
    fb = check("10.p6", {"a", "b"})
    assert 0 < fb.points < 2 and "missing" in fb.text()
    fb = check("10.p6", {"a", "b", "c", "d"})
    assert 0 < fb.points < 2 and "o is the only road from the loss to their outputs" in fb.text()
    assert check("10.p6", {"d", "e"}).points == 0


def test_p6s_key_measured_with_the_first_norm_computed_under_no_grad():
    """P6's key ({a, b, c}) measured with autograd: the block of torch_block_forward with adapters on all seven
    projections, once as it is and once with u1 = RMSNorm(x; g1) computed under torch.no_grad(): every adapter's
    gradient is the same, ∇x differs, y is bit for bit the same."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(10)
    T, d, H, f, s = 5, 8, 2, 12, 2.0
    weights, adapters = block.init_block(rng, d=d, n_heads=H, f=f, targets=block.PROJECTIONS, r=2)
    x0, dy = rng.standard_normal((T, d)), rng.standard_normal((T, d))
    W = {k: torch.tensor(v) for k, v in weights.items()}

    def run(no_grad_u1):
        x = torch.tensor(x0, requires_grad=True)
        ad = {p: tuple(torch.tensor(m, requires_grad=True) for m in pair) for p, pair in adapters.items()}
        rms = lambda z, g: z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-5) * g
        P = lambda p, X: X @ W[f"W_{p}"] + s * (X @ ad[p][0]) @ ad[p][1]
        heads = lambda z: z.reshape(T, H, d // H).transpose(0, 1)
        with torch.no_grad() if no_grad_u1 else torch.enable_grad():
            u1 = rms(x, W["g1"])
        C = F.scaled_dot_product_attention(heads(P("q", u1)), heads(P("k", u1)), heads(P("v", u1)), is_causal=True)
        h = x + P("o", C.transpose(0, 1).reshape(T, d))
        u2 = rms(h, W["g2"])
        y = h + P("down", F.silu(P("gate", u2)) * P("up", u2))
        y.backward(torch.tensor(dy))
        return y.detach(), x.grad, {f"{m}_{p}": t.grad for p, pair in ad.items() for m, t in zip("AB", pair)}

    y_ref, dx_ref, g_ref = run(False)
    y_cut, dx_cut, g_cut = run(True)
    assert torch.equal(y_ref, y_cut)                                                     # e is false
    assert all(torch.allclose(g_ref[k], g_cut[k], rtol=1e-12, atol=1e-14) for k in g_ref)  # a and b are true, d false
    assert all(bool(torch.any(g_cut[k] != 0)) for k in g_cut)
    assert not torch.allclose(dx_ref, dx_cut)                                            # c is true
    keys = json.loads((ROOT / "autograder" / "keys" / "10.json").read_text())["keys"]
    assert set(keys["p6"]) == RIGHT["p6"] == {"a", "b", "c"}
