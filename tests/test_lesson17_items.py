"""Lesson 17 ("What QLoRA actually costs"): graded items score right answers fully, the classic ledger
mistakes (Adam's two moments, base gradients under LoRA, 4 bits as 4 bytes, GB vs GiB) less, with a
diagnosis; the notebook's test cells agree with the item registry."""

import math
from pathlib import Path

import nbformat
import pytest

from coursekit import memory
from coursekit.grading import check
from coursekit.grading.lessons.lesson17 import ITEMS, ledger_gb

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "17-what-qlora-actually-costs" / "17-what-qlora-actually-costs.ipynb"


def by_hand(n_params, n_adapter, method, double_quant=True):
    """ledger_gb written out in bytes per parameter, independent of coursekit.memory."""
    if method == "full":
        return 12 * n_params / 1e9
    total = (2 if method == "lora" else 0.5) * n_params + 12 * n_adapter
    if method == "qlora":
        blocks = math.ceil(n_params / 64)
        total += blocks + 4 * math.ceil(blocks / 256) if double_quant else 4 * blocks
    return total / 1e9


def measured_policy_gb(n_params, vocab, hidden, n_adapter, heads=2):
    """P1 written out: two vocab × hidden matrices in fp32, every other base parameter half a byte, 16 bytes per adapter
    parameter (fp32 weight, gradient and two AdamW moments); the policy test below measures each rate on a real load."""
    kept = heads * vocab * hidden
    return ((n_params - kept) * 0.5 + kept * 4 + n_adapter * 16) / 1e9


RIGHT = {"w1": "a", "w2": "c", "w3": "b", "p1": measured_policy_gb(6.74e9, 32_000, 4_096, 40e6),
         "p2": 1 / 2**16,
         "p3": "b", "p4": 4 * 512 * (49152 + 30 * 576) * 4 / 1e6, "p5": by_hand, "p6": "b"}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def test_notebook_loads_the_real_model_once():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert src.count("load_model(") == 1


def test_reference_matches_the_seed_and_coursekit():
    assert ledger_gb(7e9, 20e6, "full") == pytest.approx(84)
    assert ledger_gb(7e9, 20e6, "lora") == pytest.approx(14.24)
    assert ledger_gb(7e9, 20e6, "qlora", False) == pytest.approx(3.74 + 0.4375)
    assert ledger_gb(7e9, 20e6, "qlora", True) == pytest.approx(3.74 + memory.nf4_metadata_bytes(7e9) / 1e9)
    for n, a in ((1.3e9, 4e6), (123_456_789, 98_765)):
        for m in ("full", "lora", "qlora"):
            for dq in (False, True):
                assert ledger_gb(n, a, m, dq) == pytest.approx(by_hand(n, a, m, dq), rel=1e-12)


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"17.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_hidden_cases_are_deterministic_and_defeat_hard_coding():
    a = check("17.p5", by_hand, hidden=True).text()
    assert a == check("17.p5", by_hand, hidden=True).text() and a.count("hidden case") == 6
    public = {(c.kwargs["method"], c.kwargs["double_quant"]): by_hand(**c.kwargs) for c in ITEMS["p5"].public()}

    def lookup(n_params, n_adapter, method, double_quant=True):
        return public.get((method, double_quant), 0.0) if n_params == 7_000_000_000 else 0.0

    assert check("17.p5", lookup, hidden=False).full
    fb = check("17.p5", lookup, hidden=True)
    assert fb.points == pytest.approx(4 * 4 / 10)


# --------------------------------------------------------------------------- wrong answers


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "b", "the new weights alone"),
        ("w1", "c", "not part of the quantized base"),
        ("w1", "d", "the two fp32 moments only"),
        ("w2", "a", "sums every token's contribution"),
        ("w2", "b", "a fixed cost of the adapter"),
        ("w2", "d", "keeps only the packed codes"),
        ("w3", "a", "not their precision"),
        ("w3", "c", "optimizer state is untouched"),
        ("w3", "d", "weights stay where they are"),
        ("p3", "a", "takes log_softmax over every row of the logits first"),
        ("p3", "c", "still need their log-probabilities"),
        ("p3", "d", "the label tensor itself"),
        ("p6", "a", "a weight kept in fp32 ends at 2.00005"),
        ("p6", "c", "does not lose a share of the steps"),
        ("p6", "d", "256 is where a running sum of ones stops"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"17.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p4_names_each_slip_in_the_checkpointed_activations():
    right = 4 * 512 * (49152 + 30 * 576) * 4
    assert check("17.p4", right / 1e6).points == 2
    assert check("17.p4", round(right / 1e6, 0)).points == 2                # 3 significant digits: 544 MB
    for answer, text in [(4 * 512 * 49152 * 4 / 1e6, "only the loss's log-softmax"),
                         (4 * 512 * 30 * 576 * 4 / 1e6, "only the layer inputs"),
                         (right / 2 / 1e6, "2 bytes per number"),
                         (right / 4 / 1e6, "one sequence of 512 tokens"),
                         (right / 2**20, "MiB"),
                         (right, "in bytes")]:
        fb = check("17.p4", answer)
        assert fb.points == 0 and text in fb.text(), (answer, fb.text())


def test_p4_sizes_are_smollm2s_and_the_loss_saves_a_tokens_by_vocabulary_fp32_tensor():
    """P4's prompt quotes the model's vocabulary, hidden size and layer count: they are the converted checkpoint's; and
    cross_entropy keeps one fp32 tensor of tokens × vocabulary for backward (what the lesson's count found)."""
    import json

    import torch

    from coursekit import model as cmodel
    from coursekit.grading.lessons.lesson17 import P4

    cfg = json.loads((cmodel.default_checkpoint_dir() / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (P4["vocab"], P4["hidden"], P4["layers"])
    saved = []
    logits = torch.randn(8, P4["vocab"], requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        torch.nn.functional.cross_entropy(logits, torch.randint(0, P4["vocab"], (8,)))
    big = {t.untyped_storage().data_ptr(): t for t in saved if t.numel() >= 8 * P4["vocab"]}   # distinct storages
    assert [(tuple(t.shape), t.dtype) for t in big.values()] == [((8, P4["vocab"]), torch.float32)]
    assert all(t.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr() for t in big.values())


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("p2", 2.0, "not right (tolerance"),
        ("p1", 0.5 * 6.74 + 12 * 0.04, "the ledger's policy"),
        ("p1", RIGHT["p1"] - 2 * 32_000 * 4_096 * 2 / 1e9, "kept the embedding and the output head in bf16"),
        ("p1", 0.5 * 6.74 + 16 * 0.04, "you quantized the embedding and the output head too"),
        ("p1", measured_policy_gb(6.74e9, 32_000, 4_096, 40e6, heads=1), "is not tied to its embedding"),
        ("p1", RIGHT["p1"] - 4 * 0.04, "12 bytes per adapter parameter"),
        ("p1", RIGHT["p1"] - 12 * 0.04, "only the adapter's fp32 weights"),
        ("p1", RIGHT["p1"] + 3.5 * (6.74 - 2 * 0.131072), "each 4-bit code as 4 bytes"),
        ("p1", RIGHT["p1"] * 1e9 / 2**30, "in GiB"),
        ("p1", RIGHT["p1"] * 1e9, "in bytes"),
        ("p1", 20.0, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"17.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def _variant(**kw):
    """by_hand with one classic mistake switched on."""
    def fn(n_params, n_adapter, method, double_quant=True):
        moments = kw.get("moments", 8)
        if method == "full":
            return (4 + moments) * n_params / kw.get("unit", 1e9)
        base = {"lora": 2, "qlora": kw.get("code_bytes", 0.5)}[method] * n_params
        total = base + (4 + moments) * n_adapter + kw.get("base_grads", 0) * n_params
        if method == "qlora":
            blocks = math.ceil(n_params / 64)
            total += blocks + 4 * math.ceil(blocks / 256) if double_quant else 4 * blocks
        return total / kw.get("unit", 1e9)
    return fn


@pytest.mark.parametrize(
    "fn, text, lost_everywhere",
    [
        (_variant(moments=4), "you forgot Adam's second moment", True),
        (_variant(base_grads=2), "you counted gradients for the frozen base", False),
        (_variant(code_bytes=4), "you counted each 4-bit code as 4 bytes", False),
        (_variant(unit=2**30), "in GiB (2**30 bytes)", True),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_ledger_mistakes_lose_points_with_a_diagnosis(fn, text, lost_everywhere, hidden):
    fb = check("17.p5", fn, hidden=hidden)
    assert fb.points < 4 and text in fb.text(), fb.text()
    assert (fb.points == 0) == lost_everywhere


def test_metadata_mistakes_in_the_function():
    def no_meta(n_params, n_adapter, method, double_quant=True):
        return by_hand(n_params, n_adapter, method if method != "qlora" else "qlora", double_quant) - (
            memory.nf4_metadata_bytes(n_params, double_quant=double_quant) / 1e9 if method == "qlora" else 0)

    fb = check("17.p5", no_meta)
    assert fb.points == 2 and "left out the NF4 block scales" in fb.text()

    def swapped(n_params, n_adapter, method, double_quant=True):
        return by_hand(n_params, n_adapter, method, not double_quant)

    fb = check("17.p5", swapped)
    assert fb.points == 2 and "this case has double_quant=" in fb.text()


def test_function_stub_and_non_function():
    def stub(n_params, n_adapter, method, double_quant=True):
        raise NotImplementedError()

    assert check("17.p5", stub).points == 0
    fb = check("17.p5", 3.74)
    assert fb.points == 0 and "should be a function" in fb.text()


@pytest.mark.parametrize("answer, points", [(4.928, 2), (4.9275, 2), (4.927504, 2), (4.924, 0), (4.93, 0), (4.9, 0), (5, 0)])
def test_p1_accepts_three_decimals_and_names_coarser_rounding(answer, points):
    import numpy as np

    fb = check("17.p1", answer)
    assert fb.points == points, fb.text()
    if not points and answer != 4.924:
        assert "looks rounded" in fb.text() and "4.9275" not in fb.text()
    assert check("17.p1", np.float32(answer)).points == points


def test_p1_policy_is_what_a_4bit_load_of_an_untied_model_keeps(tmp_path):
    """P1's key, measured: a tiny Llama with an output head *not* tied to its embedding, loaded as the lesson loads
    SmolLM2 (coursekit.model.load_model("nf4"), then coursekit.train.attach_adapter: prepare_model_for_kbit_training and
    PEFT's LoRA on every linear layer), one backward and one AdamW step. Its persistent bytes, norms and step counters
    aside, are exactly P1's policy: half a byte per quantized weight, the embedding and the head (not quantized) in
    fp32, 16 bytes per adapter parameter. So the key is the policy applied to the prompt's sizes."""
    import bitsandbytes as bnb
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from coursekit import model as cmodel, train
    from coursekit.grading.lessons import lesson17 as L

    vocab, hidden = 128, 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    base = cmodel.load_model("nf4", tmp_path)
    assert not isinstance(base.lm_head, bnb.nn.Linear4bit) and base.lm_head.weight is not base.get_input_embeddings().weight
    model = train.attach_adapter(base, train.TrainConfig(r=4, lora_alpha=8))
    adapter = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(adapter, lr=1e-3)
    ids = torch.randint(2, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()

    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    codes = [p for p in frozen if type(p).__name__ == "Params4bit"]
    kept = [base.get_input_embeddings().weight, base.lm_head.weight]
    norms = [p for p in frozen if p.ndim == 1]
    assert len(frozen) == len(codes) + len(kept) + len(norms)
    assert all(p.dtype == torch.float32 for p in kept + norms + adapter)
    n_quantized = sum(p.quant_state.shape.numel() for p in codes)
    n_adapter = sum(p.numel() for p in adapter)
    moments = [t for p in adapter for k, t in opt.state[p].items() if k != "step"]
    measured = nbytes(codes) + nbytes(kept) + nbytes(adapter) + nbytes(p.grad for p in adapter) + nbytes(moments)
    assert measured == L.policy_bytes(n_quantized + 2 * vocab * hidden, vocab, hidden, n_adapter)
    assert ITEMS["p1"].expected() == pytest.approx(RIGHT["p1"], rel=1e-12) == L.policy_bytes(**L.P1) / 1e9


def test_function_that_misreads_the_method_or_rounds_is_told_so():
    def capital(n_params, n_adapter, method, double_quant=True):   # tests method == "QLoRA": qlora falls into LoRA
        kind = "full" if method == "full" else "qlora" if method == "QLoRA" else "lora"
        return by_hand(n_params, n_adapter, kind, double_quant)

    fb = check("17.p5", capital)
    assert fb.points == 2 and "that is the 'lora' column, but this case has method='qlora'" in fb.text(), fb.text()

    def rounded(n_params, n_adapter, method, double_quant=True):
        return round(by_hand(n_params, n_adapter, method, double_quant), 2)

    fb = check("17.p5", rounded)
    assert 0 < fb.points < 4 and "looks rounded to 2 decimals" in fb.text(), fb.text()


@pytest.mark.parametrize("junk", [None, "3.74", float("nan"), [1, 2]])
def test_junk_answers_score_zero_without_raising(junk):
    for item in ("p1", "p2", "p5"):
        assert check(f"17.{item}", junk).points == 0
    assert check("17.p5", lambda n_params, n_adapter, method, double_quant=True: junk).points == 0


def test_p3_key_is_what_the_models_own_loss_saves_with_masked_labels():
    """P3's key, run: transformers' causal-LM loss (the function SmolLM2's forward calls) on the lesson's 2 × 64 batch
    shape saves the same bytes for backward whether every label counts or 48 of each row's 64 are −100: one fp32
    128 × 49,152 log-softmax, 25 MB (b); not a quarter of it (a), not nothing (c), not twice it (d)."""
    import json

    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    from coursekit.grading.lessons.lesson17 import P4

    vocab, MB = P4["vocab"], 1e6
    logits = torch.randn(2, 64, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (2, 64))
    masked = labels.clone()
    masked[:, :48] = -100
    saved = {}
    for name, lab in (("every token", labels), ("48 of 64 masked", masked)):
        with memory.SavedTensors(exclude=[logits]) as s:
            ForCausalLMLoss(logits, lab, vocab_size=vocab)
        saved[name] = s
    full, part = saved["every token"], saved["48 of 64 masked"]
    assert full.largest(1)[0] == part.largest(1)[0] == (128 * vocab * 4, (128, vocab), "float32")
    ratio = part.nbytes / full.nbytes
    measured = "b" if abs(ratio - 1) < 0.01 else "a" if abs(ratio - 0.25) < 0.05 else "c" if ratio < 0.1 else "d" if ratio > 1.9 else None
    keys = json.loads((ROOT / "autograder" / "keys" / "17.json").read_text())["keys"]
    assert measured == keys["p3"] == RIGHT["p3"]
    assert round(128 * vocab * 4 / MB) == 25                                  # the 25 MB the prompt quotes


def test_p6_key_is_what_a_bf16_weight_does_with_a_thousand_small_steps():
    """P6's key, run: 1.0 plus 1,000 steps of +0.001, rounded to bf16 after each step, stays 1.0 (b); in fp32 it ends at
    2.00005 (a's hint); bf16's spacing between 1 and 2 is 2⁻⁷ ≈ 0.0078 (the next number above 1 is 1.0078), and a running
    sum of ones kept in bf16 stops at 256 (d), as the lesson measured."""
    import json

    import torch

    def walk(dtype, start=1.0, step=1e-3, n=1000):
        w = torch.tensor(start, dtype=dtype)
        for _ in range(n):
            w = w + torch.tensor(step, dtype=dtype)
        return w.item()

    bf16, fp32 = walk(torch.bfloat16), walk(torch.float32)
    measured = "b" if bf16 == 1.0 else "a" if abs(bf16 - 2) < 0.01 else "c" if 1.8 < bf16 < 1.99 else None
    keys = json.loads((Path(__file__).resolve().parents[1] / "autograder" / "keys" / "17.json").read_text())["keys"]
    assert measured == keys["p6"] == RIGHT["p6"]
    assert round(fp32, 5) == 2.00005
    eps = torch.finfo(torch.bfloat16).eps
    assert eps == 2**-7 and round(eps, 4) == 0.0078 and round(1 + eps, 4) == 1.0078 and 1e-3 < eps / 2
    assert torch.nextafter(torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor(2.0, dtype=torch.bfloat16)).item() == 1 + eps
    assert walk(torch.bfloat16, start=0.0, step=1.0, n=300) == 256.0        # d: the running sum of ones


def _scaler_step(order: str, true_grad=(0.3, 0.4), max_norm=1.0):
    """One step of a loop with torch.amp.GradScaler at its default starting scale on a two-entry parameter whose true
    gradient (of the unscaled loss) is ``true_grad`` (norm 0.5), clipping to ``max_norm``. ``order``: "unscale first"
    (unscale_, clip, step: the lesson's order), "clip first" (clip, then step, which unscales: P2's loop). Returns the
    scale, the norm clip_grad_norm_ measured, the norm it left, and the norm of the gradients the optimizer stepped
    with (scaler.step unscales them in place; SGD with lr 0 leaves the parameter alone)."""
    import torch

    p = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale((p * torch.tensor(true_grad)).sum()).backward()
    if order == "unscale first":
        scaler.unscale_(opt)
    seen = torch.nn.utils.clip_grad_norm_([p], max_norm).item()
    left = p.grad.norm().item()
    scaler.step(opt)
    scaler.update()
    return {"scale": scaler._init_scale, "seen": seen, "left": left, "stepped": p.grad.norm().item()}


def test_p2_key_is_the_measured_norm_when_clipping_runs_before_unscale():
    """P2's key, run: torch's GradScaler (default starting scale 2¹⁶) and clip_grad_norm_ in the colleague's order (clip,
    then scaler.step, which unscales): the optimizer steps with norm 1/S. Each named mistake is a number the same loop
    produces read the wrong way: the lesson's order (unscale_ first) steps with the true 0.5; the clipped gradients before
    scaler.step have norm 1.0; clip_grad_norm_ measured 0.5 · S."""
    from coursekit.grading.lessons.lesson17 import P2

    wrong, right = _scaler_step("clip first"), _scaler_step("unscale first")
    assert wrong["scale"] == P2["scale"] == 2.0**16 and math.isclose(math.hypot(0.3, 0.4), P2["true_norm"])
    assert check("17.p2", wrong["stepped"]).full and math.isclose(wrong["stepped"], RIGHT["p2"], rel_tol=1e-3)
    assert math.isclose(ITEMS["p2"].expected(), wrong["stepped"], rel_tol=1e-5)
    for value, text in ((right["stepped"], "0.5 is what the right order gives"),
                        (wrong["left"], "1.0 is the norm clip_grad_norm_ leaves"),
                        (wrong["seen"], "32,768 is the norm clip_grad_norm_ measures")):
        fb = check("17.p2", value)
        assert fb.points == 0 and text in fb.text(), (value, fb.text())
    assert math.isclose(right["stepped"], 0.5, rel_tol=1e-6) and math.isclose(wrong["left"], 1.0, rel_tol=1e-5)
    assert wrong["seen"] == 0.5 * 2**16 == 32_768 and right["seen"] == pytest.approx(0.5)
