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


def _v_students(dh, cache, o_base=True, o_adapter=True, through_o=True, head=2, x_input=False, scale=True):
    """A student's v_adapter_grads, written the way a student writes it (plain NumPy from the cache), with one slip."""
    po, pv = cache["proj"]["o"], cache["proj"]["v"]
    if through_o:
        dmh = dh @ po["W"].T if o_base else 0 * dh
        if "A" in po and o_adapter:
            dmh = dmh + (po["s"] * dh @ po["B"].T) @ po["A"].T
    else:
        dmh = dh
    D = attention.merge_heads(attention.attention_backward(attention.split_heads(dmh, cache["n_heads"]), cache["attn"])[head])
    X = cache["x"] if x_input else pv["X"]
    s = pv["s"] if scale else 1.0
    return X.T @ (s * D @ pv["B"].T), s * (X @ pv["A"]).T @ D


def v_right(dh, cache):
    return _v_students(dh, cache)


def v_frozen_o_passes_nothing(dh, cache):
    return _v_students(dh, cache, o_base=False)


def v_o_adapter_left_out(dh, cache):
    return _v_students(dh, cache, o_adapter=False)


def v_o_skipped(dh, cache):
    return _v_students(dh, cache, through_o=False)


def v_fed_dQ(dh, cache):
    return _v_students(dh, cache, head=0)


def v_fed_dK(dh, cache):
    return _v_students(dh, cache, head=1)


def v_input_x(dh, cache):
    return _v_students(dh, cache, x_input=True)


def v_missing_s(dh, cache):
    return _v_students(dh, cache, scale=False)


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


RIGHT = {"w1": "c", "w2": 240, "w3": "a", "p1": dx_right, "p2": v_right, "p3": 2.5,
         "p4": "d", "p5": o_right, "p6": {"a", "b"}}


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


def _tiny_llama(tied=True):
    """A Llama with SmolLM2-135M's layer count and tied embedding, shrunk in width (what PEFT selects depends on the
    module tree, not on the widths)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
                      num_hidden_layers=lesson10.SMOLLM2_LAYERS, tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # PEFT calls the renamed method
def test_w2_key_and_mistakes_are_what_peft_creates():
    """W2's key (240) is the number of lora_A / lora_B weights PEFT creates for q, k, v and o on a Llama with SmolLM2's 30
    layers; "adapters" is its number of adapted modules, "one layer" the factor matrices of layer 0 alone."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny_llama(), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    factors = [n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n]
    adapted = {n for n, _ in model.named_modules() if n.endswith(".lora_A")}
    assert len(factors) == ITEMS["w2"].expected() == RIGHT["w2"]
    mistakes = {m.label: m.value for m in lesson10._w2_mistakes()}
    assert len(adapted) == mistakes["adapters"]
    assert sum(1 for n in factors if ".layers.0." in n) == mistakes["one layer"]
    assert sum(1 for n in adapted if ".layers.0." in n) == mistakes["one layer's adapters"]


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # PEFT calls the renamed method
def test_w3_key_is_what_all_linear_selects():
    """W3's key: on a Llama with a tied embedding, all-linear adapts the seven projections of every layer and nothing
    else (not lm_head, not the embedding, not the RMSNorm gains)."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny_llama(), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    adapted = {n.removesuffix(".lora_A") for n, _ in model.named_modules() if n.endswith(".lora_A")}
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lora_" not in n
              and not any(n.startswith(a + ".") for a in adapted)}
    assert {n.split(".")[-1] for n in adapted} == {block.HF_NAMES[p] for p in block.PROJECTIONS}
    assert len(adapted) == len(block.PROJECTIONS) * lesson10.SMOLLM2_LAYERS
    assert linear - adapted == {"base_model.model.lm_head"}
    assert not any("embed" in n or "norm" in n for n in adapted)
    assert ITEMS["w3"].key == RIGHT["w3"] == "a"


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
    for item, fn, n in (("p1", dx_right, 3), ("p2", v_right, 3), ("p5", o_right, 3)):
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


def test_p2_reference_is_torch_autograds_v_adapter_gradients():
    """P2's reference, fed the dh that the block's backward reaches at h = x + o, is torch autograd's ∇A_v, ∇B_v of the
    same block (torch_block_forward, frozen base weights as plain tensors), with o frozen, o adapted and all seven adapted."""
    import torch

    for targets in (("q", "v"), ("v", "o"), block.PROJECTIONS):
        rng = np.random.default_rng(8)
        T, d, H, f, s = 5, 8, 2, 12, 2.0
        weights, adapters = block.init_block(rng, d=d, n_heads=H, f=f, targets=targets, r=2)
        x0, dy = rng.standard_normal((T, d)), rng.standard_normal((T, d))
        _, cache = block.block_forward(x0, weights, adapters, s=s, n_heads=H)
        ad = {p: tuple(torch.tensor(m, requires_grad=True) for m in pair) for p, pair in adapters.items()}
        y = block.torch_block_forward(torch.tensor(x0), {k: torch.tensor(v) for k, v in weights.items()}, ad, s=s, n_heads=H)
        y.backward(torch.tensor(dy))
        dA, dB = lesson10.v_adapter_grads(_dh(dy, cache), cache)
        np.testing.assert_allclose(dA, ad["v"][0].grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dB, ad["v"][1].grad.numpy(), rtol=1e-10, atol=1e-12)
        for wrong in (v_frozen_o_passes_nothing, v_o_skipped, v_fed_dQ, v_fed_dK, v_input_x, v_missing_s):
            assert not np.allclose(wrong(_dh(dy, cache), cache)[1], dB), wrong.__name__   # each slip changes the answer


def test_p1_and_p2_withhold_the_block_kernels_but_not_attentions():
    for item in ("p1", "p2"):
        assert set(ITEMS[item].withheld) == {"coursekit.block:block_backward", "coursekit.block:projection_backward",
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
        ("p2", v_frozen_o_passes_nothing, "as if the frozen W_o were detached"),
        ("p2", v_o_adapter_left_out, "a second road from dh to the heads"),
        ("p2", v_o_skipped, "you split dh into heads directly"),
        ("p2", v_fed_dQ, "the queries' gradient dQ"),
        ("p2", v_fed_dK, "the keys' gradient dK"),
        ("p2", v_input_x, "v_proj reads u1 = RMSNorm(x)"),
        ("p2", v_missing_s, "the scale s is missing: dB_v"),
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


@pytest.mark.parametrize(
    "fn, label",
    [
        (v_frozen_o_passes_nothing, "frozen o passes nothing"),
        (v_o_adapter_left_out, "o adapter path left out"),
        (v_o_skipped, "o_proj skipped"),
        (v_fed_dQ, "dQ for v"),
        (v_fed_dK, "dK for v"),
        (v_input_x, "input x"),
        (v_missing_s, "missing s"),
    ],
)
def test_p2_wrong_code_is_labelled_with_the_mistake_it_makes(fn, label):
    """Each P2 label is what real wrong code produces, and only that one is recorded."""
    fb = check("10.p2", fn, hidden=True)
    assert not fb.full and fb.mistakes == [label], (fb.mistakes, fb.text())


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
        ("w2", 120, "that is the number of adapters"),
        ("w2", 8, "that is one layer's count"),
        ("w2", 4, "the number of adapters in one layer"),
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
        ("w3", "b", "leaves the output layer out on purpose"),
        ("w3", "c", "all-linear selects nn.Linear layers only"),
        ("w3", "d", "That is the Q/V configuration"),
        ("p4", "a", "That is what a detached o_proj does"),
        ("p4", "c", "a detached K is still there with its value"),
        ("p4", "b", "the adapters of layers 0–2 included"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"10.{item_id}", answer)
    assert fb.points == 0
    joined = " ".join(fb.lines)
    assert text in joined and "Reread" in joined


def test_multi_choice_partial_credit_and_hints():
    fb = check("10.p6", {"a"})
    assert 0 < fb.points < 2 and "missing" in fb.text()
    fb = check("10.p6", {"a", "b", "c"})
    assert 0 < fb.points < 2 and "the MLP branch's share is gone" in fb.text()
    assert check("10.p6", {"d", "e"}).points == 0


def test_p6s_key_measured_with_a_detached_hidden_product():
    """P6's key ({a, b}) measured with autograd: the block of torch_block_forward with adapters on all seven
    projections, once as it is and once with H = SiLU(G) ⊙ U handed to down_proj detached. The gate and up adapters
    get no gradient (a), the down adapter the same one (b); the q, k, v and o adapters a different (c), nonzero (d)
    one; y is bit for bit the same (e). Each option is decided by what the run measured."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(10)
    T, d, H, f, s = 5, 8, 2, 12, 2.0
    weights, adapters = block.init_block(rng, d=d, n_heads=H, f=f, targets=block.PROJECTIONS, r=2)
    x0, dy = rng.standard_normal((T, d)), rng.standard_normal((T, d))
    W = {k: torch.tensor(v) for k, v in weights.items()}

    def run(detach_H):
        x = torch.tensor(x0, requires_grad=True)
        ad = {p: tuple(torch.tensor(m, requires_grad=True) for m in pair) for p, pair in adapters.items()}
        rms = lambda z, g: z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-5) * g
        P = lambda p, X: X @ W[f"W_{p}"] + s * (X @ ad[p][0]) @ ad[p][1]
        heads = lambda z: z.reshape(T, H, d // H).transpose(0, 1)
        u1 = rms(x, W["g1"])
        C = F.scaled_dot_product_attention(heads(P("q", u1)), heads(P("k", u1)), heads(P("v", u1)), is_causal=True)
        h = x + P("o", C.transpose(0, 1).reshape(T, d))
        u2 = rms(h, W["g2"])
        hidden = F.silu(P("gate", u2)) * P("up", u2)
        y = h + P("down", hidden.detach() if detach_H else hidden)
        y.backward(torch.tensor(dy))
        return y.detach(), {p: tuple(t.grad for t in pair) for p, pair in ad.items()}

    y_ref, g_ref = run(False)
    y_cut, g_cut = run(True)
    assert torch.equal(y_ref, block.torch_block_forward(torch.tensor(x0), W, {p: tuple(map(torch.tensor, pair))
                                                                               for p, pair in adapters.items()}, s=s, n_heads=H))
    assert all(t is not None and bool(torch.any(t != 0)) for pair in g_ref.values() for t in pair)
    same = lambda p: all(torch.allclose(a, b, rtol=1e-12, atol=1e-14) for a, b in zip(g_ref[p], g_cut[p]))
    measured = {
        "a": all(t is None for p in ("gate", "up") for t in g_cut[p]),
        "b": same("down"),
        "c": all(same(p) for p in ("q", "k", "v", "o")),
        "d": all(t is None or not bool(torch.any(t != 0)) for p in ("q", "k", "v", "o") for t in g_cut[p]),
        "e": not torch.equal(y_ref, y_cut),
    }
    assert not any(same(p) for p in ("q", "k", "v", "o"))      # each attention adapter's gradient changes
    keys = json.loads((ROOT / "autograder" / "keys" / "10.json").read_text())["keys"]
    assert {k for k, v in measured.items() if v} == set(keys["p6"]) == RIGHT["p6"] == {"a", "b"}, measured


def test_p4_key_measured_with_layer_3s_k_proj_under_no_grad():
    """P4's key (d) measured with autograd on a stack of three blocks with Q/V adapters (below, the cut one, above), once
    as it is and once with the middle block's frozen k_proj detached: the forward is the same, the cut block's and the
    upper block's adapters get the same gradients, the lower block's a different one, and none is zero."""
    import torch

    rng = np.random.default_rng(4)
    T, d, H, f, s = 5, 8, 2, 12, 2.0
    blocks = [block.init_block(rng, d=d, n_heads=H, f=f, targets=("q", "v"), r=2) for _ in range(3)]
    x0, dy = rng.standard_normal((T, d)), rng.standard_normal((T, d))

    def run(cut):
        z = torch.tensor(x0, requires_grad=True)
        leaves = []
        for i, (w, ad) in enumerate(blocks):
            ad_t = {p: tuple(torch.tensor(m, requires_grad=True) for m in pair) for p, pair in ad.items()}
            leaves.append(ad_t)
            z = block.torch_block_forward(z, {k: torch.tensor(v) for k, v in w.items()}, ad_t, s=s, n_heads=H,
                                          detach=("k",) if cut and i == 1 else ())
        z.backward(torch.tensor(dy))
        return z.detach(), [{f"{m}_{p}": t.grad for p, pair in ad_t.items() for m, t in zip("AB", pair)} for ad_t in leaves]

    y_ref, g_ref = run(False)
    y_cut, g_cut = run(True)
    assert torch.equal(y_ref, y_cut)
    assert all(g is not None and bool(torch.any(g != 0)) for layer in g_cut for g in layer.values())     # a and c's "no gradient"
    for i in (1, 2):                                                                                       # the cut block and above
        assert all(torch.allclose(g_ref[i][k], g_cut[i][k], rtol=1e-12, atol=1e-14) for k in g_ref[i])
    assert not any(torch.allclose(g_ref[0][k], g_cut[0][k]) for k in g_ref[0])                             # below: b is false
    keys = json.loads((ROOT / "autograder" / "keys" / "10.json").read_text())["keys"]
    assert keys["p4"] == RIGHT["p4"] == "d"


def test_p7_model_answer_measured_with_the_lower_blocks_under_no_grad():
    """P7's model answer measured with autograd on a stack of four blocks with Q/V adapters (PEFT's B = 0 in none of
    them, so that every factor could get a gradient): with blocks 0–1 run under torch.no_grad() the forward is the same,
    the factors of blocks 0–1 get no gradient at all (.grad None), and blocks 2–3 get the uncut stack's gradients; with
    block 1's o_proj detached instead, only block 1's q and v factors starve and block 0 learns from a changed gradient.
    The notebook measures the same cut on SmolLM2 (the real-world rep) and on a toy stack after the model answer."""
    import contextlib

    import torch

    rng = np.random.default_rng(7)
    T, d, H, f, s = 5, 8, 2, 12, 2.0
    blocks = [block.init_block(rng, d=d, n_heads=H, f=f, targets=("q", "v"), r=2) for _ in range(4)]
    x0, dy = rng.standard_normal((T, d)), rng.standard_normal((T, d))

    def run(no_grad_below=0, detach_o_in=None):
        z, leaves = torch.tensor(x0), []
        for i, (w, ad) in enumerate(blocks):
            leaves.append([torch.tensor(m, requires_grad=True) for pair in ad.values() for m in pair])
            ad_t = {p: tuple(leaves[-1][2 * j: 2 * j + 2]) for j, p in enumerate(ad)}
            with torch.no_grad() if i < no_grad_below else contextlib.nullcontext():
                z = block.torch_block_forward(z, {k: torch.tensor(v) for k, v in w.items()}, ad_t, s=s, n_heads=H,
                                              detach=("o",) if i == detach_o_in else ())
        z.backward(torch.tensor(dy))
        return z.detach(), [[t.grad for t in layer] for layer in leaves]

    y_ref, g_ref = run()
    y_low, g_low = run(no_grad_below=2)
    y_o, g_o = run(detach_o_in=1)
    assert torch.equal(y_ref, y_low) and torch.equal(y_ref, y_o)
    assert all(g is not None and bool(torch.any(g != 0)) for layer in g_ref for g in layer)
    assert all(g is None for layer in g_low[:2] for g in layer)                                   # below the cut: nothing
    assert all(torch.equal(a, b) for i in (2, 3) for a, b in zip(g_ref[i], g_low[i]))            # above it: the same, bit for bit
    assert all(g is None for g in g_o[1])                                                         # 'detach o': that block's q, v
    assert all(g is not None and bool(torch.any(g != 0)) for g in g_o[0])                         # ... while the block below learns
    assert not any(torch.allclose(a, b) for a, b in zip(g_ref[0], g_o[0]))                       # from a changed gradient
    assert all(torch.equal(a, b) for i in (2, 3) for a, b in zip(g_ref[i], g_o[i]))


def test_p7_is_not_answered_above_it():
    """P7 asks about the stack cut at a layer's output; the Know this explains the branch cuts (o, down) and shows which
    adapters a detached down_proj starves, but no cell above P7 runs or describes a cut of a whole layer."""
    nb = nbformat.read(ROOT / "lessons" / LID / f"{LID}.ipynb", as_version=4)
    p7 = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("**P7"))
    above = "\n".join(c.source for c in nb.cells[:p7])
    for words in ("layers_to_transform", "layers 0–3", "layers[3].register_forward_hook", "no_grad_below", "whole layer"):
        assert words not in above, words
    know = "\n".join(c.source for c in nb.cells[:p7] if c.cell_type == "markdown")
    assert "adapters\non gate_proj and up_proj, whose every road to the loss runs through down" in know
