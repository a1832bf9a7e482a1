"""Lesson 16 ("Training through a quantized base"): graded items score right answers fully, typical wrong answers
less, with the diagnostics a student needs; the reference backward agrees with a real bitsandbytes Linear4bit."""

import logging
from pathlib import Path

import nbformat
import numpy as np
import pytest

from coursekit.grading import check
from coursekit.grading.lessons.lesson16 import ITEMS, dequantize, quantized_linear_backward

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "16-training-through-a-quantized-base" / "16-training-through-a-quantized-base.ipynb"


def right_backward(D, codes, absmax, code, blocksize):
    m, d = codes.shape
    return D @ (code[codes] * absmax[np.arange(m * d) // blocksize].reshape(m, d))


RIGHT = {"w1": "c", "w2": "a", "w3": "b", "p1": right_backward, "p2": {"b", "d"}, "p3": {"b", "f"},
         "p4": "b", "p5": "d", "p6": "c", "p7": "b", "p8": ["merge_nf4", "base_nf4", "merge_orig", "base_orig"]}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def test_notebook_loads_the_real_model_twice_at_most():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert src.count("load_model(") == 2
    assert "BEGIN SOLUTION" in src and "p9_explain" in {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}


# --------------------------------------------------------------------------- the reference against bitsandbytes


@pytest.mark.parametrize("shape", [(64, 128), (24, 40)])   # 40 % 64 != 0: blocks span rows
def test_reference_backward_equals_a_real_linear4bit(shape):
    import bitsandbytes as bnb
    import torch

    from coursekit import quant

    m, d = shape
    torch.manual_seed(0)
    w = torch.randn(m, d) * 0.05
    layer = bnb.nn.Linear4bit(d, m, bias=False, compute_dtype=torch.float32, quant_type="nf4", compress_statistics=True)
    layer.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=True, blocksize=64)
    layer = layer.to("cpu")
    qs = layer.weight.quant_state
    X = torch.randn(3, d, requires_grad=True)
    D = torch.randn(3, m)
    layer(X).backward(D)
    assert layer.weight.grad is None

    codes = quant.unpack_nibbles(layer.weight.data, m * d).reshape(m, d).numpy()
    absmax = (quant.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset).double().numpy()
    code = quant.nf4_code().double().numpy()
    W_hat = dequantize(codes, absmax, code, 64)
    # the dequantized weight: coursekit.quant's and ours agree to fp32 rounding
    np.testing.assert_allclose(W_hat, quant.dequantize_4bit(layer.weight.data, qs).double().numpy(), rtol=1e-6, atol=1e-7)
    ref = quantized_linear_backward(D.double().numpy(), codes, absmax, code, 64)
    np.testing.assert_allclose(ref, X.grad.double().numpy(), rtol=1e-4, atol=1e-6)


def test_reference_is_a_vector_jacobian_product():
    """Central differences on L = <D, X Ŵᵀ> give the same ∂L/∂X as the reference (float64)."""
    case = ITEMS["p1"].public()[0].kwargs
    W_hat = dequantize(case["codes"], case["absmax"], case["code"], case["blocksize"])
    D = case["D"]
    X = np.random.default_rng(0).standard_normal((D.shape[0], W_hat.shape[1]))
    num, eps = np.zeros_like(X), 1e-6
    for idx in np.ndindex(*X.shape):
        Xp, Xm = X.copy(), X.copy()
        Xp[idx] += eps
        Xm[idx] -= eps
        num[idx] = (np.sum(D * (Xp @ W_hat.T)) - np.sum(D * (Xm @ W_hat.T))) / (2 * eps)
    np.testing.assert_allclose(quantized_linear_backward(**case), num, rtol=1e-6, atol=1e-8)


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"16.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_right_backward_in_torch_scores_full():
    import torch

    def torch_backward(D, codes, absmax, code, blocksize):
        m, d = codes.shape
        idx = torch.arange(m * d) // blocksize
        W = torch.tensor(code)[torch.tensor(codes)] * torch.tensor(absmax)[idx].reshape(m, d)
        return torch.tensor(D) @ W

    assert check("16.p1", torch_backward, hidden=True).full


def test_right_backward_written_differently_scores_full():
    """float32 arithmetic (bitsandbytes' own), torch autograd, other parameter names, a list: all full marks."""
    import torch

    def f32(D, codes, absmax, code, blocksize):
        m, d = codes.shape
        W = np.float32(code)[codes] * np.repeat(np.float32(absmax), blocksize)[: m * d].reshape(m, d)
        return np.float32(D) @ W

    def autograd(grad_out, q, scales, table, bs):
        q = torch.as_tensor(q)
        m, d = q.shape
        W = torch.as_tensor(table)[q] * torch.as_tensor(scales).repeat_interleave(bs)[: m * d].reshape(m, d)
        X = torch.zeros(len(grad_out), d, dtype=W.dtype, requires_grad=True)
        (X @ W.T).backward(torch.as_tensor(grad_out))
        return X.grad

    def as_list(D, codes, absmax, code, blocksize):
        return right_backward(D, codes, absmax, code, blocksize).tolist()

    for fn in (f32, autograd, as_list):
        fb = check("16.p1", fn, hidden=True)
        assert fb.full, fb.text()
    half = lambda D, codes, absmax, code, blocksize: np.float16(f32(D, codes, absmax, code, blocksize))  # noqa: E731
    assert check("16.p1", half, hidden=True).points == 0


def test_hidden_cases_are_deterministic_and_defeat_hard_coding():
    a = check("16.p1", right_backward, hidden=True).text()
    assert a == check("16.p1", right_backward, hidden=True).text() and a.count("hidden case") == 5
    publics = [c.kwargs for c in ITEMS["p1"].public()]

    def lookup(D, codes, absmax, code, blocksize):
        for kw in publics:
            if kw["codes"].shape == codes.shape and np.array_equal(kw["codes"], codes) and np.array_equal(kw["D"], D):
                return right_backward(**kw)
        return np.zeros((D.shape[0], codes.shape[1]))

    assert check("16.p1", lookup, hidden=False).full
    assert check("16.p1", lookup, hidden=True).points == pytest.approx(3 * 3 / 8)


# --------------------------------------------------------------------------- wrong answers


def _with_W(f):
    def fn(D, codes, absmax, code, blocksize):
        m, d = codes.shape
        return f(D, codes, absmax, code, blocksize, m, d)
    return fn


@pytest.mark.parametrize(
    "fn, text",
    [
        (_with_W(lambda D, c, a, t, bs, m, d: D @ (t[c] * a[np.arange(m * d) // bs].reshape(m, d)).T), "you multiplied by Ŵᵀ"),
        (_with_W(lambda D, c, a, t, bs, m, d: D @ t[c]), "without the blocks' absmax"),
        (_with_W(lambda D, c, a, t, bs, m, d: D @ (c * a[np.arange(m * d) // bs].reshape(m, d))), "code indices 0…15"),
        (_with_W(lambda D, c, a, t, bs, m, d: D @ (t[c] * a[np.arange(m)[:, None] * (d // bs) + np.arange(d)[None, :] // bs])),
         "you indexed absmax per row"),
        (_with_W(lambda D, c, a, t, bs, m, d: D @ (t[c] / a[np.arange(m * d) // bs].reshape(m, d))), "you divided the levels by absmax"),
        (_with_W(lambda D, c, a, t, bs, m, d: D @ (t[c] * a[np.arange(m * d) // bs].reshape(d, m).T)), "blocks run down the columns"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_backward_mistakes_lose_points_with_a_diagnosis(fn, text, hidden):
    fb = check("16.p1", fn, hidden=hidden)
    assert fb.points < 3 and text in fb.text(), fb.text()


def test_per_row_blocks_pass_only_where_rows_hold_whole_blocks():
    fn = _with_W(lambda D, c, a, t, bs, m, d: D @ (t[c] * a[np.arange(m)[:, None] * (d // bs) + np.arange(d)[None, :] // bs]))
    fb = check("16.p1", fn, hidden=False)
    assert fb.points == pytest.approx(2.0)  # the square 4 × 4 / blocksize 4 and the 8 × 64 / 64 cases pass


def test_stub_and_non_function():
    def stub(D, codes, absmax, code, blocksize):
        raise NotImplementedError()

    assert check("16.p1", stub).points == 0
    fb = check("16.p1", "quantized_linear_backward")
    assert fb.points == 0 and "should be a function" in fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "not placed anywhere"),
        ("w1", "b", "The NF4 table is fixed"),
        ("w1", "d", "plain absmax INT4"),
        ("w2", "b", "added back exactly"),
        ("w2", "c", "dynamic map they index is signed"),
        ("w2", "d", "rounded up"),
        ("w3", "a", "only a description"),
        ("w3", "c", "finds the linear weights already in 4 bits"),
        ("w3", "d", "Nothing waits for the first forward pass"),
        ("p4", "a", "the loss get a grad_fn"),
        ("p4", "c", "stops at lm_head's input"),
        ("p4", "d", "checkpointed like the others"),
        ("p5", "a", "twelve whole blocks of 128, so every row starts a new block"),
        ("p5", "c", "gate_proj and up_proj are stored 1536 × 576"),
        ("p5", "b", "indexes absmax row by row"),
        ("p6", "a", "reaches the adapters above it through the forward pass"),
        ("p6", "b", "a base weight enters the backward only in the gradient it passes further down"),
        ("p6", "d", "Only layer₂'s adapter sees the change, through its input H"),
        ("p7", "a", "compute_dtype decides what the backward multiplies"),
        ("p7", "c", "does not depend on its compute dtype"),
        ("p7", "d", "on both sides of the comparison"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"16.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()
    assert "(Lesson 1" in fb.text()  # every hint says where to reread


def test_w3_key_is_measured_on_a_real_4bit_load(tmp_path):
    """W3's key: from_pretrained with a quantization_config leaves Params4bit codes at once (before any forward pass or
    prepare_model_for_kbit_training), the config holds no weights, and the preparation leaves the codes as they are."""
    import warnings

    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    bnb_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                    bnb_4bit_compute_dtype=torch.bfloat16)
    assert not any(isinstance(v, torch.Tensor) for v in vars(bnb_config).values())          # (a): no weights in it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=bnb_config, dtype=torch.bfloat16,
                                                     device_map="cpu")
    linears = [mod for name, mod in model.named_modules() if name.endswith(("q_proj", "down_proj"))]
    assert linears and all(type(m.weight).__name__ == "Params4bit" and m.weight.dtype == torch.uint8 for m in linears)
    assert all(m.weight.numel() * 2 == m.in_features * m.out_features for m in linears)    # (b): two codes per byte, no forward yet
    before = [m.weight.data.clone() for m in linears]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = prepare_model_for_kbit_training(model)                                   # (c): already 4-bit, left alone
    assert all(type(m.weight).__name__ == "Params4bit" and torch.equal(m.weight.data, b) for m, b in zip(linears, before))


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("p2", {"a", "d"}, "as soon as some adapter below it has contributed to it"),
        ("p2", {"b", "c", "d"}, "the trap costs the backward, not the forward"),
        ("p2", {"b"}, "(d) is missing from your set. True: a repacked layer passes no gradient to its input"),
        ("p2", {"d"}, "(b) is missing from your set. True: Linear4bit repacks in eval mode only when"),
        ("p2", {"b", "e"}, "A layer's own adapter does not go through the base's backward"),
        ("p3", {"a", "f"}, "every projection weight is a plain bf16 parameter"),
        ("p3", {"b", "c", "f"}, "one tensor shared by two modules"),
        ("p3", {"b", "d", "f"}, "installed only together with gradient checkpointing"),
        ("p3", {"b", "e", "f"}, "the loss is a constant with no grad_fn"),
        ("p3", {"f"}, "(b) is missing from your set. True: every parameter of the bf16 model"),
    ],
)
def test_multi_mistakes_cost_points_and_say_why(item_id, answer, text):
    fb = check(f"16.{item_id}", answer)
    assert 0 <= fb.points < ITEMS[item_id].points and text in fb.text(), fb.text()


def test_ordering_names_the_first_misplaced_step():
    fb = check("16.p8", ["merge_nf4", "merge_orig", "base_nf4", "base_orig"])     # the 'full-precision merge is closer' belief
    assert 0 < fb.points < 2 and "'merge_orig'" in fb.text() and "farther from what you trained" in fb.text(), fb.text()
    fb = check("16.p8", ["merge_orig", "merge_nf4", "base_nf4", "base_orig"])
    assert fb.points < 2 and "'merge_orig'" in fb.text()
    assert check("16.p8", ["merge_nf4", "base_nf4"]).points == 0


# --------------------------------------------------------------------------- keys, measured here


def _keys():
    import json

    return json.loads((ROOT / "autograder" / "keys" / "16.json").read_text())["keys"]


def test_p2_key_is_measured_on_the_real_model_with_the_repack_shortcut_left_on():
    """P2's key, run: the lesson's NF4 SmolLM2 with r = 16 adapters on every linear layer (attach_adapter), bitsandbytes'
    CPU shortcut switched back on (support_avx512bf16_for_cpu, as bitsandbytes ships it). An eval-mode loss with grad enabled
    repacks exactly layer 0's q_proj, k_proj and v_proj (b, not a), and agrees with the untrapped eval loss to within bf16
    rounding (c is false). The next training step still gives every lora_B, those three included, a nonzero gradient (d;
    e is false). Under torch.no_grad() all 210 layers repack (the contrast (a) draws)."""
    import torch
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbF

    from coursekit import data, train
    from coursekit import model as cmodel

    if not bnbF.has_avx512bf16():
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes never takes the repack shortcut here")
    tokenizer = cmodel.load_tokenizer()
    model = cmodel.load_model("nf4")
    if cmodel.matmul_dtype() == torch.float32:
        cmodel.compute_in_float32(model)
    cfg = train.TrainConfig(r=16, lora_alpha=32, steps=1, micro_batch=1, warmup_steps=0, lr=1e-3, seed=0)
    torch.manual_seed(0)
    peft_model = train.attach_adapter(model, cfg)
    batch = data.collate([data.encode_example(data.load_split("train")[0], tokenizer)], tokenizer.pad_token_id)
    layers = {n: m for n, m in peft_model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert len(layers) == 210

    def repacked():
        return sorted(n for n, m in layers.items() if getattr(m.weight.quant_state, "packing_format_for_cpu", False))

    def lora_B_grads():
        peft_model.train()
        peft_model.zero_grad(set_to_none=True)
        peft_model(**batch).loss.backward()
        grads = {n: p.grad for n, p in peft_model.named_parameters() if "lora_B" in n}
        peft_model.zero_grad(set_to_none=True)
        return grads

    peft_model.eval()
    loss_untrapped = peft_model(**batch).loss.item()             # the shortcut still off: the reference
    for m in layers.values():
        m.support_avx512bf16_for_cpu = True                      # as bitsandbytes ships it on this CPU
    assert repacked() == []
    peft_model.eval()
    loss_trapped = peft_model(**batch).loss.item()               # grad enabled: the colleague forgot torch.no_grad()
    three = [f"base_model.model.model.layers.0.self_attn.{p}.base_layer" for p in ("k_proj", "q_proj", "v_proj")]
    assert repacked() == three                                    # (b); (a) is false
    assert abs(loss_trapped - loss_untrapped) < 1e-2 * loss_untrapped  # (c) is false: the forward is the same
    grads = lora_B_grads()
    assert len(grads) == 210 and all(g is not None and g.abs().sum() > 0 for g in grads.values())   # (d)
    for p in ("q_proj", "k_proj", "v_proj"):                     # (e) is false
        g = grads[f"base_model.model.model.layers.0.self_attn.{p}.lora_B.default.weight"]
        assert g is not None and g.abs().sum() > 0
    with torch.no_grad():
        peft_model.eval()
        peft_model(**batch)
    assert len(repacked()) == 210                                # what (a) describes needs torch.no_grad()
    assert _keys()["p2"] == sorted(RIGHT["p2"]) == ["b", "d"]


def test_p5_key_is_which_projections_the_per_row_dequantize_gets_wrong_at_blocksize_128():
    """P5's key, run: each SmolLM2 projection shape (out × in) quantized by bitsandbytes at blocksize 128 and dequantized
    by bitsandbytes and by coursekit.quant (the lesson's self-test, probes._self_test_case). On a CPU where the AVX512
    kernel runs, exactly the shapes whose rows are not a whole number of blocks differ: all but down_proj (d). Elsewhere
    the per-row index of P1's mistake stands in for the kernel. Every weight is a whole number of blocks in total (b)."""
    from coursekit import probes

    avx512 = bool(probes.cpu_facts().get("bnb_has_avx512"))
    wrong = set()
    for name, (m, d) in probes.MODEL_SHAPES.items():
        assert (m * d) % 128 == 0                                            # b's premise holds, and b is still wrong
        case = probes._self_test_case(probes._row_scaled((m, d), 0), 128, "nf4", False, name)
        if avx512 and case["kernel"].startswith("cdequantize"):               # the native kernel ran: measure it
            differs = not case["agrees"]
        else:
            r, c = np.meshgrid(np.arange(m), np.arange(d), indexing="ij")
            differs = bool(((r * d + c) // 128 != r * (d // 128) + c // 128).any())
        if differs:
            wrong |= set(name.split(", "))
    assert 576 / 128 == 4.5 and 1536 / 128 == 12
    options = {"a": {"q_proj", "o_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"},
               "c": {"q_proj", "o_proj", "k_proj", "v_proj", "down_proj"}, "b": set()}
    options["d"] = options["a"] - {"down_proj"}
    measured = [k for k, v in options.items() if v == wrong]
    assert measured == [_keys()["p5"]] == [RIGHT["p5"]]


def _nf4_linear(w, compute_dtype):
    """A bitsandbytes Linear4bit holding the NF4 codes of ``w`` (m × d), built as the lesson's nf4_layer builds it."""
    import bitsandbytes as bnb

    m, d = w.shape
    layer = bnb.nn.Linear4bit(d, m, bias=False, compute_dtype=compute_dtype, quant_type="nf4", compress_statistics=True)
    layer.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=True, blocksize=64)
    return layer.to("cpu")


def _nf4_dequantized(layer):
    """Ŵ of a Linear4bit in float32, through coursekit.quant (bit for bit bitsandbytes' dequantize)."""
    from coursekit import quant

    return quant.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()


def _toy_layer_backward(compute_dtype):
    """The lesson's toy layer (nf4_layer: seed 0, 64 × 128, blocksize 64, double quantization) computing in
    ``compute_dtype``, one backward of the first check's X and D (seed 1): (w, Ŵ in float32, X with its .grad, D)."""
    import torch

    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    layer = _nf4_linear(w, compute_dtype)
    W_hat = _nf4_dequantized(layer)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(5, 128, generator=g, requires_grad=True)
    Y = layer(X)
    D = torch.randn(Y.shape, generator=g)
    Y.backward(D)
    return w, W_hat, X, D


def test_p6_key_is_which_adapters_move_when_the_lower_base_is_unquantized():
    """P6's key, run: two stacked adapted layers, H = layer₁(X) + s (X A₁) B₁ and Y = layer₂(H) + s (H A₂) B₂, with
    layer₁ the lesson's toy layer (nf4_layer, seed 0, float32 compute) and layer₂ another NF4 Linear4bit (64 → 64),
    nonzero B₁ and B₂, Y.backward(D). Swapping layer₁'s base for w_full (its float32 weight, a plain linear map) leaves
    ∇A₁ and ∇B₁ bit for bit the same and moves ∇A₂ and ∇B₂ by several percent (c): not neither (a), not layer₁'s only
    (b), not both (d). The same swap made on layer₂ instead moves no adapter gradient at all with a fixed D, which is why
    the prompt swaps the lower layer."""
    import torch

    w1, W_hat1, _, _ = _toy_layer_backward(torch.float32)
    layer1 = _nf4_linear(w1, torch.float32)
    torch.manual_seed(2)
    w2 = torch.randn(64, 64) * 0.05
    layer2 = _nf4_linear(w2, torch.float32)
    g = torch.Generator().manual_seed(3)
    s, r = 2.0, 4
    A1, B1 = 0.1 * torch.randn(128, r, generator=g), 0.1 * torch.randn(r, 64, generator=g)
    A2, B2 = 0.1 * torch.randn(64, r, generator=g), 0.1 * torch.randn(r, 64, generator=g)
    X, D = torch.randn(5, 128, generator=g), torch.randn(5, 64, generator=g)

    def grads(base1, base2):
        a1, b1, a2, b2 = (t.clone().requires_grad_() for t in (A1, B1, A2, B2))
        H = base1(X) + s * (X @ a1) @ b1
        Y = base2(H) + s * (H @ a2) @ b2
        Y.backward(D)
        return {"A1": a1.grad, "B1": b1.grad, "A2": a2.grad, "B2": b2.grad}

    quantized = grads(layer1, layer2)
    swapped = grads(lambda x: x @ w1.T, layer2)
    rel = {k: ((swapped[k] - quantized[k]).norm() / quantized[k].norm()).item() for k in quantized}
    changed = {k for k in quantized if not torch.equal(quantized[k], swapped[k])}
    assert all(rel[k] > 1e-2 for k in changed) and all(rel[k] == 0 for k in set(quantized) - changed)
    lower, upper = bool(changed & {"A1", "B1"}), bool(changed & {"A2", "B2"})
    measured = {(False, False): "a", (True, False): "b", (False, True): "c", (True, True): "d"}[(lower, upper)]
    assert measured == _keys()["p6"] == RIGHT["p6"]
    assert changed == {"A2", "B2"} and ((W_hat1 - w1).norm() / w1.norm()).item() > 0.05   # the swap is a real change
    # the hints' formulas: ∇B₂ = s (H A₂)ᵀ D and ∇A₂ = s Hᵀ (D B₂ᵀ), with H from the swapped layer₁
    H = X @ w1.T + s * (X @ A1) @ B1
    torch.testing.assert_close(swapped["B2"], s * (H @ A2).T @ D)
    torch.testing.assert_close(swapped["A2"], s * H.T @ (D @ B2.T))
    # the same swap on the upper layer moves nothing with a fixed D
    W_hat2 = _nf4_dequantized(layer2)
    upper_swapped = grads(layer1, lambda h: h @ w2.T)
    assert torch.equal(upper_swapped["A2"], quantized["A2"]) and torch.equal(upper_swapped["B2"], quantized["B2"])
    assert not torch.equal(upper_swapped["A1"], quantized["A1"]) and not torch.equal(W_hat2, w2)


def test_p7_key_is_the_measured_gap_of_a_bf16_compute_layer():
    """P7's key, run: the lesson's toy layer (nf4_layer, seed 0) rebuilt with compute_dtype=bf16, the same X and D (seed 1):
    X.grad is float32 and equals the bf16 product of D and Ŵ bit for bit, a few parts in 10³ from D Ŵ in float32 (b); not
    within 1e-6 (a), not missing (c), not NF4's ~10 % rounding (d), which the float32 layer shows against the original weight."""
    import torch

    w, W_hat, X, D = _toy_layer_backward(torch.bfloat16)
    ref = D @ W_hat
    assert X.grad is not None and X.grad.dtype == torch.float32
    assert torch.equal(X.grad, (D.bfloat16() @ W_hat.bfloat16()).float())
    gap = ((X.grad - ref).norm() / ref.norm()).item()
    nf4_rounding = ((D @ w - ref).norm() / ref.norm()).item()
    measured = "a" if (X.grad - ref).abs().max() <= 1e-6 else "b" if 1e-3 <= gap < 1e-2 else "d" if gap > 0.05 else None
    assert measured == _keys()["p7"] == RIGHT["p7"]
    assert 0.05 < nf4_rounding < 0.15                                   # d's "about 10 %" is NF4's rounding, not bf16's


def test_p8_key_is_the_measured_order_on_lesson_13s_layer():
    """P8's key, measured: lesson 13's synthetic adapter on layer 0's v_proj (the notebook's model, config and seed), the
    four versions stored in bf16, sorted by ‖M − (Q(W) + ΔW)‖. Both premises are asserted: the one the prompt leaves to
    lesson 13's measurement (the rounding larger than the update) and the one it states; without the second (ΔW at right
    angles to W − Q(W)) the last two places could swap."""
    import bitsandbytes.functional as bnbF
    import torch

    from coursekit import model as cmodel, train

    base = cmodel.load_model("fp32")
    cfg = train.TrainConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
    peft_model = train.attach_adapter(base, cfg)
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.02 * torch.randn(param.shape, generator=gen))
    v_proj = dict(peft_model.named_modules())["base_model.model.model.layers.0.self_attn.v_proj"]
    W, dW = v_proj.base_layer.weight.detach().clone(), v_proj.get_delta_weight("default").detach()
    q, state = bnbF.quantize_4bit(W, blocksize=64, quant_type="nf4")
    Q = bnbF.dequantize_4bit(q, state)
    trained = Q + dW
    versions = {"base_nf4": Q, "base_orig": W, "merge_nf4": Q + dW, "merge_orig": W + dW}
    dist = {k: ((m.bfloat16().float() - trained).norm() / dW.norm()).item() for k, m in versions.items()}
    order = sorted(dist, key=dist.get)
    assert order == _keys()["p8"] == RIGHT["p8"]
    assert all(b - a > 0.2 for a, b in zip(sorted(dist.values()), sorted(dist.values())[1:])), dist   # no near-tie
    assert ((Q - W).norm() / dW.norm()).item() > 1                      # lesson 13's measurement
    cos = (((W - Q) * dW).sum() / ((W - Q).norm() * dW.norm())).item()
    assert abs(cos) < 0.02, cos                                         # the second: ΔW uncorrelated with the rounding


def test_p3_key_is_what_the_call_without_checkpointing_leaves():
    """P3's key, run: a fresh bf16 SmolLM2 (no Params4bit) after prepare_model_for_kbit_training(use_gradient_checkpointing=False)."""
    import torch
    from peft import prepare_model_for_kbit_training

    from coursekit import data, model as cmodel

    m = cmodel.load_model("bf16")
    footprint_before = cmodel.footprint(m)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())                    # the premise the prompt states
    m = prepare_model_for_kbit_training(m, use_gradient_checkpointing=False)
    tokenizer = cmodel.load_tokenizer()
    emb = m.get_input_embeddings()
    batch = data.collate([data.encode_example(data.load_split("train")[0], tokenizer)], tokenizer.pad_token_id)
    projections = [x.weight for n, x in m.named_modules() if n.endswith("_proj")]
    assert len(projections) == 210
    ratio = cmodel.footprint(m) / footprint_before
    holds = {
        "a": all(w.dtype == torch.bfloat16 for w in projections),
        "b": 1.9 < ratio < 2.1,
        "c": m.lm_head.weight.dtype == torch.bfloat16 and emb.weight.dtype == torch.float32,
        "d": bool(emb._forward_hooks),
        "e": m(**batch).loss.grad_fn is not None,
        "f": all(not p.requires_grad for p in m.parameters()),
    }
    assert all(w.dtype == torch.float32 for w in projections) and m.lm_head.weight is emb.weight   # a's and c's hints
    assert sorted(k for k, v in holds.items() if v) == _keys()["p3"] == sorted(RIGHT["p3"])
