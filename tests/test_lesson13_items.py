"""Lesson 13 ("Merging"): graded items score right answers fully, typical wrong answers less, with the
diagnostics a student needs; the notebook's test cells agree with the item registry."""

from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from coursekit import merging
from coursekit.grading import check
from coursekit.grading.lessons import lesson13
from coursekit.grading.lessons.lesson13 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "13-merging" / "13-merging.ipynb"


def right_merge_unmerge(weight, lora_A, lora_B, lora_alpha, r):
    """P1 as the prompt describes PEFT: merge() adds the float32 ΔW in place (the sum stored in bf16), unmerge() casts
    ΔW to bf16 and subtracts it."""
    delta = (lora_alpha / r) * (lora_B @ lora_A)
    w = weight.clone()
    w += delta
    return w - delta.to(w.dtype)


def right_unmerge(weight_merged, lora_A, lora_B, lora_alpha, r, fan_in_fan_out):
    delta = (lora_alpha / r) * (lora_B @ lora_A)
    return weight_merged - (delta.T if fan_in_fan_out else delta)


RIGHT = {"w1": "b", "w2": "b", "w3": "d", "p1": right_merge_unmerge, "p2": right_unmerge,
         "p3": 2.0, "p4": 0.4444, "p5": "a", "p6": "c"}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def _nbgrader_cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]


def test_notebook_loads_the_real_model_once():
    nb, _ = _nbgrader_cells()
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert src.count("load_model(") == 1


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"13.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_right_unmerge_works_on_torch_tensors_too():
    def torch_unmerge(weight_merged, lora_A, lora_B, lora_alpha, r, fan_in_fan_out):
        w, a, b = (torch.tensor(t) for t in (weight_merged, lora_A, lora_B))
        delta = (lora_alpha / r) * b @ a
        return w - (delta.T if fan_in_fan_out else delta)

    assert check("13.p2", torch_unmerge, hidden=True).full


def test_hidden_cases_are_deterministic_and_defeat_hard_coding():
    a = check("13.p2", right_unmerge, hidden=True).text()
    assert a == check("13.p2", right_unmerge, hidden=True).text() and a.count("hidden case") == 5
    publics = [c.kwargs for c in ITEMS["p2"].public()]

    def lookup(weight_merged, lora_A, lora_B, lora_alpha, r, fan_in_fan_out):
        for kw in publics:
            if kw["weight_merged"].shape == weight_merged.shape and np.array_equal(kw["weight_merged"], weight_merged):
                return right_unmerge(**kw)
        return weight_merged + 1.0  # no idea

    assert len(publics) == 3 and [kw["fan_in_fan_out"] for kw in publics] == [False, True, True]
    assert check("13.p2", lookup, hidden=False).full
    fb = check("13.p2", lookup, hidden=True)
    assert fb.points == pytest.approx(2 * 3 / 8)
    p1_publics = [c.kwargs["weight"] for c in ITEMS["p1"].public()]
    assert check("13.p1", right_merge_unmerge, hidden=True).text() == check("13.p1", right_merge_unmerge, hidden=True).text()
    assert all(w.dtype == torch.bfloat16 for w in p1_publics)


# --------------------------------------------------------------------------- wrong answers


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "not the m × d update"),
        ("w1", "c", "part of the merge too"),
        ("w1", "d", "m × d already"),
        ("w2", "a", "the 4-bit rounding error of the base"),
        ("w2", "c", "only part of sAB survives"),
        ("w2", "d", "three different layers"),
        ("w3", "a", "rounds twice"),
        ("w3", "c", "PEFT keeps them"),
        ("w3", "b", "does not need a zero B"),
        ("p5", "b", "The residual is relative"),
        ("p5", "c", "by exactly the factor the update shrank"),
        ("p5", "d", "float32's exponent range"),
        ("p6", "a", "As a multiple of |ΔW| it cannot stay the same"),
        ("p6", "b", "cannot magnify it"),
        ("p6", "d", "does not remove Q(W) − W"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"13.{item_id}", answer)
    assert fb.points == 0 and text in fb.text()


@pytest.mark.parametrize("blank", [None, ..., "", "z", 3])
def test_blank_or_malformed_choice_scores_zero(blank):
    fb = check("13.w1", blank)
    assert fb.points == 0 and fb.lines


def _mu_unchanged(weight, lora_A, lora_B, lora_alpha, r):
    return weight.clone()                                    # "unmerge undoes merge": exact arithmetic


def _mu_merged_only(weight, lora_A, lora_B, lora_alpha, r):
    return (weight.float() + (lora_alpha / r) * lora_B @ lora_A).bfloat16()


def _mu_added_twice(weight, lora_A, lora_B, lora_alpha, r):
    delta = (lora_alpha / r) * lora_B @ lora_A
    return (weight.float() + delta).bfloat16() + delta.bfloat16()


def _mu_float32(weight, lora_A, lora_B, lora_alpha, r):
    delta = (lora_alpha / r) * lora_B @ lora_A
    return weight.float() + delta - delta                    # the merged weight kept in float32


def _mu_no_scale(weight, lora_A, lora_B, lora_alpha, r):
    delta = lora_B @ lora_A
    return (weight.float() + delta).bfloat16() - delta.bfloat16()


@pytest.mark.parametrize(
    "fn, label, text",
    [
        (_mu_unchanged, "unchanged", "you returned the base weight"),
        (_mu_float32, "unchanged", "or a float32 weight"),
        (_mu_merged_only, "merged only", "that is the merged weight"),
        (_mu_added_twice, "added twice", "you added ΔW a second time"),
        (_mu_no_scale, "scale missing", "the scale is missing"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_merge_unmerge_mistakes_lose_every_case_with_a_diagnosis(fn, label, text, hidden):
    fb = check("13.p1", fn, hidden=hidden)
    assert fb.points == 0 and text in fb.text() and fb.mistakes == [label], (fb.mistakes, fb.text())


def _mu_scale_inverted(weight, lora_A, lora_B, lora_alpha, r):
    """A bf16 answer no named mistake explains: the scale taken as r / lora_alpha."""
    delta = (r / lora_alpha) * (lora_B @ lora_A)
    w = weight.clone()
    w += delta
    return w - delta.to(w.dtype)


@pytest.mark.parametrize("hidden", [False, True])
def test_a_wrong_bf16_round_trip_is_not_told_to_compute_in_float64(hidden):
    """P1's right answer is a bf16 weight (bf16 arithmetic, rounded twice), so a wrong answer that stays in bf16 is wrong
    arithmetic, not too few bits. The shared array checker used to add "Compute in float64, as the inputs are" to any
    bf16 answer within 100 bf16 spacings that matched no named mistake, which is wrong advice here (the inputs are bf16
    and float32, and a float64 answer is marked "unchanged"). The variant is run: it is bf16, wrong on every case,
    close enough that the old rule fired, and names no mistake."""
    from coursekit.grading.lessons.lesson13 import merge_unmerge

    rng = np.random.default_rng(0)
    cases = [c.kwargs for c in ITEMS["p1"].public()] + [c.kwargs for c in ITEMS["p1"].hidden(rng)]
    for kw in cases:
        got = _mu_scale_inverted(**kw)
        assert got.dtype == torch.bfloat16 and not torch.equal(got.double(), merge_unmerge(**kw))
        assert np.allclose(got.double().numpy(), merge_unmerge(**kw).numpy(), rtol=0.78, atol=0.78 * kw["weight"].abs().max().item())
    fb = check("13.p1", _mu_scale_inverted, hidden=hidden)
    assert fb.points == 0 and fb.mistakes == [], (fb.mistakes, fb.text())
    assert "float64" not in fb.text() and "machine epsilon" not in fb.text(), fb.text()


def test_p1_key_is_what_peft_leaves_after_merge_and_unmerge():
    """P1's key, run through PEFT itself on every public and hidden case: an nn.Linear whose weight is the case's bf16
    weight, a LoRA adapter (PEFT keeps it in float32) with the case's lora_A and lora_B, merge(), unmerge(): the weight
    it leaves equals the reference bit for bit, and differs from the base in every case (the prompt's prediction: the
    base does not come back). ΔW is a bf16 number in every case, so rounding it to bf16 before the merge's addition
    changes nothing (a student may read PEFT's merge either way)."""
    from peft import LoraConfig, get_peft_model

    from coursekit.grading.lessons.lesson13 import merge_unmerge

    class One(torch.nn.Module):
        def __init__(self, d, m):
            super().__init__()
            self.proj = torch.nn.Linear(d, m, bias=False)

        def forward(self, x):
            return self.proj(x)

    rng = np.random.default_rng(0)
    cases = [c.kwargs for c in ITEMS["p1"].public()] + [c.kwargs for c in ITEMS["p1"].hidden(rng)]
    for kw in cases:
        m, d = kw["weight"].shape
        model = One(d, m).to(torch.bfloat16)
        with torch.no_grad():
            model.proj.weight.copy_(kw["weight"])
        peft_model = get_peft_model(model, LoraConfig(r=kw["r"], lora_alpha=kw["lora_alpha"], target_modules=["proj"]))
        layer = peft_model.base_model.model.proj
        assert layer.lora_A["default"].weight.dtype == torch.float32 and layer.base_layer.weight.dtype == torch.bfloat16
        with torch.no_grad():
            layer.lora_A["default"].weight.copy_(kw["lora_A"])
            layer.lora_B["default"].weight.copy_(kw["lora_B"])
        layer.merge()
        layer.unmerge()
        back = layer.base_layer.weight.detach()
        assert torch.equal(back.double(), merge_unmerge(**kw)) and torch.equal(back, right_merge_unmerge(**kw))
        assert not torch.equal(back, kw["weight"])
        delta = (kw["lora_alpha"] / kw["r"]) * kw["lora_B"] @ kw["lora_A"]
        rounded_first = (kw["weight"] + delta.bfloat16()) - delta.bfloat16()
        assert torch.equal(rounded_first, back)


def _unmerge_with(f):
    def fn(weight_merged, lora_A, lora_B, lora_alpha, r, fan_in_fan_out):
        return f(weight_merged, lora_A, lora_B, lora_alpha / r, fan_in_fan_out)
    return fn


@pytest.mark.parametrize(
    "fn, label, text",
    [
        (_unmerge_with(lambda Wm, A, B, s, fan: Wm + s * ((B @ A).T if fan else B @ A)), "added", "added the update a second time"),
        (_unmerge_with(lambda Wm, A, B, s, fan: Wm - ((B @ A).T if fan else B @ A)), "scale missing", "the scale is missing"),
        (_unmerge_with(lambda Wm, A, B, s, fan: Wm), "unchanged", "unchanged"),
        (_unmerge_with(lambda Wm, A, B, s, fan: (Wm - s * ((B @ A).T if fan else B @ A)).T), "row-vector layout", "the transpose of the layer's"),
    ],
)
def test_unmerge_mistakes(fn, label, text):
    fb = check("13.p2", fn)
    assert fb.points == 0 and text in fb.text() and fb.mistakes == [label], (fb.mistakes, fb.text())


def test_unmerge_that_ignores_fan_in_fan_out_is_named():
    """The nn.Linear formula on a Conv1D layer: right on the nn.Linear case, a broadcast error where d ≠ m, and the named
    mistake on the square Conv1D case."""
    fb = check("13.p2", _unmerge_with(lambda Wm, A, B, s, fan: Wm - s * B @ A))
    assert fb.points == pytest.approx(2 / 3) and "update not transposed" in fb.mistakes and "PEFT transposes the update" in fb.text()


def test_p2_key_is_what_peft_merges_into_linear_and_conv1d():
    """P2's key, run: PEFT merges s · lora_B @ lora_A into an nn.Linear weight (m × d) and its transpose into a
    transformers Conv1D weight (d × m, fan_in_fan_out=True); the reference unmerge gives each base back."""
    from peft import LoraConfig, get_peft_model
    from transformers.pytorch_utils import Conv1D

    from coursekit.grading.lessons.lesson13 import unmerge

    class One(torch.nn.Module):
        def __init__(self, proj):
            super().__init__()
            self.proj = proj

        def forward(self, x):
            return self.proj(x)

    d, m, r, alpha = 5, 3, 2, 8
    torch.manual_seed(0)
    for fan, proj in ((False, torch.nn.Linear(d, m, bias=False)), (True, Conv1D(m, d))):
        base = proj.weight.detach().clone().double()
        assert tuple(base.shape) == ((d, m) if fan else (m, d))
        peft_model = get_peft_model(One(proj), LoraConfig(r=r, lora_alpha=alpha, target_modules=["proj"], fan_in_fan_out=fan))
        layer = peft_model.base_model.model.proj
        with torch.no_grad():
            layer.lora_B["default"].weight.copy_(torch.randn(m, r))
        A, B = (layer.lora_A["default"].weight.detach().double().numpy(), layer.lora_B["default"].weight.detach().double().numpy())
        layer.merge()
        merged = layer.base_layer.weight.detach().double().numpy()
        assert not np.allclose(merged, base.numpy())
        np.testing.assert_allclose(unmerge(merged, A, B, alpha, r, fan), base.numpy(), atol=1e-6)
        np.testing.assert_allclose(right_unmerge(merged, A, B, alpha, r, fan), base.numpy(), atol=1e-6)


def test_function_stub_and_non_function():
    def stub(weight, lora_A, lora_B, lora_alpha, r):
        raise NotImplementedError()

    assert check("13.p1", stub).points == 0
    fb = check("13.p1", "merge_unmerge")
    assert fb.points == 0 and "should be a function" in fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("p3", 1.28, "half of it reaches 0.005 at 1.28"),
        ("p3", 0.64, "w · 2⁻⁷ = 0.005 at 0.64"),
        ("p3", 1.0, "compared the update with the whole spacing"),
        ("p3", 1.9921875, "largest bfloat16 weight that still keeps"),
        ("p3", 1.99, "largest bfloat16 weight that still keeps"),
        ("p3", 16, "float16's answer"),
        ("p3", 4, "not right (tolerance"),
        ("p4", 0.0, "not right (tolerance"),
        ("p4", 0.1111, "one merge of the summed update"),
        ("p4", 1.0, "not every merge rounds back to 504"),
        ("p4", 0.6667, "from 512 = 2⁹ on the spacing is 4"),
        ("p4", 0.0625, "float16's grid"),
        ("p4", 8, "the update the entry carries"),
        ("p4", 6.4, "absolute error"),
        ("p4", 0.4, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"13.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p3_key_is_the_first_bfloat16_weight_that_loses_the_update():
    """P3's key, by brute force over every positive bfloat16 number: the merge (float32 sum stored in bf16) of 0.005 gives w
    back for w = 2.0 and for every larger w, and for no smaller one; the hand rule agrees (in [2ᵉ, 2ᵉ⁺¹) half the spacing is
    2ᵉ⁻⁸, at least 0.005 first for e = 1); the largest weight that keeps the update rounds up to 2.0 and is 0.4 % below it,
    outside the 3-significant-digit tolerance."""
    w = lesson13._positive_numbers(torch.bfloat16)
    lost = (w.float() + torch.tensor(0.005)).bfloat16() == w
    assert ITEMS["p3"].expected() == 2.0 == float(w[lost].min()) == RIGHT["p3"]
    assert bool(lost[w >= 2].all()) and not bool(lost[w < 2].any())
    assert min(e for e in range(-10, 10) if 2.0 ** (e - 8) >= 0.005) == 1
    assert merging.spacing(2.0, "bfloat16") / 2 >= 0.005 > merging.spacing(1.9921875, "bfloat16") / 2
    assert (torch.tensor(1.9921875) + torch.tensor(0.005)).bfloat16().item() == 2.0
    assert w.numel() == 0x7F7F and torch.isfinite(w.float()).all()


def test_p4_key_is_the_merges_run_one_after_the_other():
    """P4's key, run with PEFT's merge() itself: a 1 × 1 nn.Linear in bfloat16 at 504 gets twelve adapters in turn, each with
    ΔW = s · lora_B @ lora_A = 1.2, each merged (merge_and_unload, so the next one sits on the merged weight). The entry ends at
    512: the first four merges round up to the spacing 2, the others round back at 512, where the spacing is 4."""
    from peft import LoraConfig, get_peft_model

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(1, 1, bias=False)

        def forward(self, x):
            return self.proj(x)

    model = One().to(torch.bfloat16)
    with torch.no_grad():
        model.proj.weight.fill_(504.0)
    path = [504.0]
    for _ in range(12):
        peft_model = get_peft_model(model, LoraConfig(r=1, lora_alpha=1, target_modules=["proj"]))
        layer = peft_model.base_model.model.proj
        with torch.no_grad():
            layer.lora_A["default"].weight.fill_(1.0)
            layer.lora_B["default"].weight.fill_(1.2)
        model = peft_model.merge_and_unload()
        path.append(model.proj.weight.item())
    assert model.proj.weight.dtype == torch.bfloat16
    assert path == [504.0, 506.0, 508.0, 510.0, 512.0] + [512.0] * 8, path
    assert lesson13.merged_in_turn() == path[-1]
    np.testing.assert_allclose(ITEMS["p4"].expected(), abs((path[-1] - 504) - 12 * 1.2) / (12 * 1.2), rtol=1e-12)
    np.testing.assert_allclose(ITEMS["p4"].expected(), 4 / 9, rtol=1e-12)
    assert check("13.p4", 0.44).full and check("13.p4", 4 / 9).full and not check("13.p4", 0.45).full


def test_w2_key_is_the_merge_that_computes_the_trained_function():
    """W2's key (b), measured on a 192 × 576 layer quantized to NF4 by bitsandbytes (blocksize 64, as in the lesson) with an
    adapter whose update is smaller than the 4-bit rounding: against the trained function XQ(W) + s(XA)B, the weight
    Q(W) + sAB stored in bf16 is off by bf16 rounding only (b); W + sAB (a), the re-quantized merge (c) are each off by more
    than the whole update (d is false)."""
    import bitsandbytes.functional as bnbF

    g = torch.Generator().manual_seed(0)
    W = 0.05 * torch.randn(192, 576, generator=g)
    A, B, s = 0.02 * torch.randn(8, 576, generator=g), 0.02 * torch.randn(192, 8, generator=g), 2.0   # PEFT layout
    X = torch.randn(16, 576, generator=g)

    def nf4(w):
        q, state = bnbF.quantize_4bit(w, blocksize=64, quant_type="nf4")
        return bnbF.dequantize_4bit(q, state)

    QW, dW = nf4(W), s * B @ A
    trained = X @ QW.T + s * (X @ A.T) @ B.T
    update = (X @ dW.T).norm()
    off = {k: ((X @ w.bfloat16().float().T - trained).norm() / update).item()
           for k, w in {"a": W + dW, "b": QW + dW, "c": nf4(QW + dW)}.items()}
    assert off["b"] < 0.05 and off["a"] > 1 and off["c"] > 0.3, off
    assert min(off, key=off.get) == ITEMS["w2"].key == RIGHT["w2"] == "b"


def test_p4_tolerance_is_the_two_significant_digits_the_prompt_asks_for():
    """P4's prompt grades to 2 significant digits: 0.44 (and 0.444) pass with room to spare, not by a floating-point
    margin; the neighbouring 2-digit values 0.43 and 0.45 and a clearly wrong 0.5 fail."""
    key, rtol = ITEMS["p4"].expected(), ITEMS["p4"].rtol
    assert abs(0.44 - key) < 0.9 * rtol * key                  # 0.44 is inside by more than 10 % of the tolerance
    for right in (0.44, 0.444, 0.4444):
        assert check("13.p4", right).full, right
    for wrong in (0.43, 0.45, 0.5):
        fb = check("13.p4", wrong)
        assert fb.points == 0 and "not right (tolerance" in fb.text(), (wrong, fb.text())


def test_p4_a_string_answer():
    assert check("13.p4", "0.4444").points == 0  # a string is not a number


def test_p5_key_is_the_measured_residual_of_the_scaled_merge():
    """P5's key, measured: the lesson's 16 × 16 experiment (W ~ N(0, 1), ΔW ~ 1e-4 · N(0, 1), bfloat16) with W and ΔW both
    divided by 64 gives the same residual to the last digit (a); not 1/64 of it (b), not near 0 (c), not above 1 (d)."""
    import json

    from coursekit import merging

    g = np.random.default_rng(0)                     # the notebook's draw
    W, dW = g.standard_normal((16, 16)), 1e-4 * g.standard_normal((16, 16))
    before = merging.merge_residual(W, dW, "bfloat16")
    after = merging.merge_residual(W / 64, dW / 64, "bfloat16")
    assert before > 0.9
    measured = ("a" if after == before else "b" if abs(after - before / 64) < 0.5 * before / 64
                else "c" if after < 0.1 else "d" if after > 1 else None)
    keys = json.loads((ROOT / "autograder" / "keys" / "13.json").read_text())["keys"]
    assert measured == keys["p5"] == RIGHT["p5"]
    # the distractor c is what scaling W alone does: the same update on a finer grid survives
    assert merging.merge_residual(W / 64, dW, "bfloat16") < 0.5 * before


def test_p6_key_is_the_measured_distance_of_a_ten_times_larger_merge():
    """P6's key, measured on the lesson's real layer (layer 0's v_proj, the notebook's seeded adapter): with
    lora_B ten times larger, W + ΔW's distance from Q(W) + ΔW, relative to |ΔW|, is about ten times smaller (c), neither
    the same (a) nor larger (b), and still far above the bf16 rounding of Q(W) + ΔW (not d). The hints' numbers too."""
    import json

    import bitsandbytes.functional as bnbF

    from coursekit import model as cmodel, train

    base = cmodel.load_model("fp32")
    torch.manual_seed(0)                                 # the notebook's seed for PEFT's lora_A draw
    peft_model = train.attach_adapter(base, train.TrainConfig(
        r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))
    name = "base_model.model.model.layers.0.self_attn.v_proj"
    layer = dict(peft_model.named_modules())[name]
    W, A, s = layer.base_layer.weight.detach(), layer.lora_A["default"].weight.detach(), layer.scaling["default"]
    q, state = bnbF.quantize_4bit(W, blocksize=64, quant_type="nf4")
    QW = bnbF.dequantize_4bit(q, state)

    def distances(scale):
        gen = torch.Generator().manual_seed(13)          # the notebook's draw, in the same parameter order
        B = {n: scale * torch.randn(p.shape, generator=gen) for n, p in peft_model.named_parameters() if "lora_B" in n}
        dW = s * B[name + ".lora_B.default.weight"] @ A
        trained = QW + dW
        return {k: ((m.bfloat16().float() - trained).norm() / dW.norm()).item() for k, m in (("nf4", QW + dW), ("orig", W + dW))}

    before, after = distances(0.02), distances(0.2)
    ratio = before["orig"] / after["orig"]
    measured = ("a" if abs(ratio - 1) < 0.2 else "b" if ratio < 0.2 else "c" if abs(ratio - 10) < 1 else None)
    assert after["orig"] > 20 * after["nf4"]           # not d: W + ΔW is still off by the 4-bit rounding
    keys = json.loads((ROOT / "autograder" / "keys" / "13.json").read_text())
    assert measured == keys["keys"]["p6"] == RIGHT["p6"]
    assert (f"{before['orig']:.1f}", f"{after['orig']:.2f}", f"{after['nf4']:.3f}") == ("1.7", "0.17", "0.003")
    for hint in ("a", "b"):
        assert "from about 1.7 |ΔW| to about 0.17 |ΔW|" in keys["hints"]["p6"][hint]
    assert "about 0.17 |ΔW|" in keys["hints"]["p6"]["d"] and "about 0.003 |ΔW|" in keys["hints"]["p6"]["d"]
