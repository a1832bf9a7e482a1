"""coursekit.train on the real NF4 base: the preflight catches a cut gradient path (and fails on the buggy
path), the guard keeps baseline-then-train correct, adapters reload exactly and refuse another base, an
untrained adapter is never saved or loaded silently, and the loss that skips unsupervised logits is the loss."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from coursekit import data, evaluate, model, train
from coursekit.artifacts import UntrainedAdapterWarning

bnbF = pytest.importorskip("bitsandbytes.functional")
CFG = train.TrainConfig(r=4, lora_alpha=8, micro_batch=4, steps=2, warmup_steps=0)


@pytest.fixture(scope="module")
def tok():
    return model.load_tokenizer()


@pytest.fixture(scope="module")
def batch(tok):
    rows = [data.encode_example(ex, tok) for ex in data.load_split("train")[:4]]
    return data.collate(rows, tok.pad_token_id)


def _eval_pass(m, tok):
    """What a baseline evaluation does: eval mode, no grad, inputs that need no gradient."""
    m.eval()
    enc = tok(["Return the issue category for: motor overheats."], return_tensors="pt")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m(**enc)
    m.train()


@pytest.mark.skipif(not bnbF.has_avx512bf16(), reason="the inference repack happens only on AVX512-BF16 CPUs")
def test_preflight_catches_the_cut_gradient_path(tok, batch, monkeypatch):
    """The buggy path: an eval pass before training with the guard switched off. The preflight must refuse."""
    base = model.load_model("nf4")
    for mod in base.modules():  # undo the guard that load_model applied: the state of a plain transformers load
        if hasattr(mod, "support_avx512bf16_for_cpu"):
            mod.support_avx512bf16_for_cpu = True
    _eval_pass(base, tok)
    monkeypatch.setattr(model, "keep_4bit_layers_trainable", lambda m: 0)  # attach_adapter must not repair it here
    peft_model = train.attach_adapter(base, CFG)
    with pytest.raises(train.PreflightError, match="lora_B") as e:
        train.preflight(peft_model, batch)
    assert "keep_4bit_layers_trainable" in str(e.value)


def test_baseline_then_train_keeps_every_adapter_learning(tok, batch):
    """The capstone's order: baseline evaluation (eval, no grad), then attach and train. With the guard that
    load_model and generate_answers apply, every lora_B gets a gradient and one step moves every lora_A."""
    base = model.load_model("nf4")
    evaluate.generate_answers(base, tok, evaluate.encode_prompts(tok, [data.prompt_messages("The motor overheats.")]),
                              max_new_tokens=1)
    peft_model = train.attach_adapter(base, CFG)
    report = train.preflight(peft_model, batch)
    assert report["trainable"] == sum(p.numel() for p in peft_model.parameters() if p.requires_grad) > 0
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_A" in n}
    hist = train.train(peft_model, tok, data.load_split("train")[:8], CFG, progress=False)
    assert len(hist["loss"]) == CFG.steps and all(l == l for l in hist["loss"])
    # After step 1 B ≠ 0, so step 2 gives every A a gradient: all of them must have moved.
    stuck = [n for n, p in peft_model.named_parameters() if "lora_A" in n and torch.equal(p, before[n])]
    assert not stuck, f"{len(stuck)} lora_A tensors never changed, e.g. {stuck[:2]}"


def test_preflight_rejects_a_model_with_nothing_trainable(batch):
    m = model.load_model("bf16")
    for p in m.parameters():
        p.requires_grad_(False)
    with pytest.raises(train.PreflightError, match="no trainable parameters"):
        train.preflight(m, batch)


def test_adapter_reloads_exactly_and_refuses_another_base(tok, batch, tmp_path):
    peft_model = train.attach_adapter(model.load_model("nf4"), CFG)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)  # a nonzero adapter: a fresh one (B = 0) would match the base trivially
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntrainedAdapterWarning)  # a trained (nonzero B) adapter saves silently
        folder = train.save_adapter(peft_model, tmp_path / "adapter", CFG)
    ident = json.loads((folder / train.IDENTITY).read_text())
    assert ident["r"] == CFG.r and ident["lora_alpha"] == CFG.lora_alpha and ident["target_modules"]
    enc = {k: v for k, v in batch.items() if k != "labels"}
    peft_model.eval()
    with torch.no_grad():
        want = peft_model(**enc).logits
        got = train.load_nf4_with_adapter(folder).eval()(**enc).logits
    assert torch.equal(want, got)

    ident["base"]["checkpoint_files"] = {"model.safetensors": "0" * 64}
    (folder / train.IDENTITY).write_text(json.dumps(ident))
    with pytest.raises(ValueError, match="another base checkpoint"):
        train.load_nf4_with_adapter(folder)
    with pytest.raises(ValueError, match="holds no adapter"):
        train.load_adapter(None, tmp_path)


def test_train_refuses_too_few_examples(tok):
    with pytest.raises(ValueError, match="cannot fill a micro-batch"):
        train.train(torch.nn.Linear(1, 1), tok, data.load_split("train")[:2], CFG, progress=False)


def test_an_untrained_adapter_is_never_saved_or_loaded_silently(tmp_path):
    """B = 0 everywhere computes the base exactly: evaluation, reload and merge would all pass without a sign. Saving
    warns, and loading it (the fresh-adapter mistake's artifact) warns again, each with the likely cause."""
    fresh = train.attach_adapter(model.load_model("nf4"), CFG)
    with pytest.warns(UntrainedAdapterWarning, match="saved before any training step"):
        folder = train.save_adapter(fresh, tmp_path / "fresh", CFG)
    with pytest.warns(UntrainedAdapterWarning, match="computes exactly the base model"):
        train.load_nf4_with_adapter(folder)


def test_the_loss_without_unsupervised_logits_is_the_models_loss(tok, batch):
    """supervised_loss_sum runs the output layer only where a label is supervised: the same sum, the same gradient."""
    m = train.attach_adapter(model.load_model("bf16"), CFG)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    total, count = train.supervised_loss_sum(m, batch)
    assert count == data.count_supervised(batch["labels"])
    ref = m(**batch).loss * count
    assert torch.allclose(total, ref.float(), rtol=2e-3)
    total.backward()
    g1 = {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}
    m.zero_grad()
    ref.backward()
    # Two bf16 computations of the same gradient round differently entry by entry (and differently on CPUs with and
    # without native bf16), so compare each adapter tensor as a whole: relative error of the norm of the difference.
    errors = {n: float((g1[n] - p.grad).norm() / p.grad.norm()) for n, p in m.named_parameters() if p.requires_grad}
    assert max(errors.values()) < 2e-2, max(errors.items(), key=lambda kv: kv[1])
    empty = dict(batch, labels=torch.full_like(batch["labels"], data.IGNORE_INDEX))
    with pytest.raises(data.EmptyBatchError):
        train.supervised_loss_sum(m, empty)


def test_train_steps_weights_tokens_not_micro_batches(tok):
    """One window as one micro-batch of 4 rows, or as 4 micro-batches of 1 row (3, 2, 2 and 2 supervised tokens).
    The token-weighted loop makes the same step either way, up to the float rounding that padding changes;
    averaging per micro-batch does not. SGD, whose step is linear in the gradient: Adam's first step is about
    lr·sign(g), which would hide a wrong weighting."""
    rows = [data.encode_example(ex, tok) for ex in data.load_split("train")[:4]]
    pad = tok.pad_token_id

    def step(windows, per_micro_batch_mean=False):
        torch.manual_seed(0)
        m = train.attach_adapter(model.load_model("fp32"), CFG)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
        before = {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}
        sgd = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)
        if per_micro_batch_mean:  # the mistake: each micro-batch's own mean, averaged over the window
            for b in windows[0]:
                (m(**b).loss / len(windows[0])).backward()
            sgd.step()
            loss = None
        else:
            loss = train.train_steps(m, windows, sgd, progress=False)["loss"][0]
        update = torch.cat([(p.detach() - before[n]).flatten() for n, p in m.named_parameters() if n in before])
        return loss, update

    l1, u1 = step([[data.collate(rows, pad)]])
    l4, u4 = step([[data.collate([r], pad) for r in rows]])
    _, wrong = step([[data.collate([r], pad) for r in rows]], per_micro_batch_mean=True)
    assert l1 == pytest.approx(l4, rel=1e-4)
    assert (u1 - u4).norm() < 1e-3 * u1.norm()
    assert (wrong - u4).norm() > 1e-2 * u4.norm()  # the check above would catch the mistake


def test_make_windows_is_deterministic_and_refuses_too_few_examples(tok):
    cfg = train.TrainConfig(micro_batch=4, accumulation=2, steps=3)
    a = train.make_windows(data.load_split("train")[:20], tok, cfg)
    b = train.make_windows(data.load_split("train")[:20], tok, cfg)
    assert len(a) == 3 and all(len(w) == 2 for w in a)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for wa, wb in zip(a, b) for x, y in zip(wa, wb))
    with pytest.raises(ValueError, match="cannot fill a micro-batch"):
        train.make_windows(data.load_split("train")[:3], tok, cfg)


def test_load_for_lora_is_the_four_call_recipe(tmp_path):
    import bitsandbytes as bnb

    path = model.tiny_checkpoint(tmp_path / "tiny")
    q = train.load_for_lora(path, 4, 8, ["q_proj", "v_proj"], quantize=True)
    layer = q.get_base_model().model.layers[0].self_attn.q_proj
    assert isinstance(layer.base_layer, bnb.nn.Linear4bit) and layer.base_layer.weight.quant_state.nested
    assert q.get_base_model().model.norm.weight.dtype == torch.float32  # prepare_model_for_kbit_training ran
    assert {n.split(".")[-4] for n, p in q.named_parameters() if p.requires_grad} == {"q_proj", "v_proj"}
    b = train.load_for_lora(path, 4, 8, "all-linear", quantize=False)
    assert b.get_base_model().model.norm.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        train.load_for_lora(path, 0, 8)
