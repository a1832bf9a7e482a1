"""coursekit.train on the real NF4 base: the preflight catches a cut gradient path (and fails on the buggy
path), the guard keeps baseline-then-train correct, adapters reload exactly and refuse another base."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from coursekit import data, model, train

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
    train.generate_answers(base, tok, ["The motor overheats."], max_new_tokens=1)
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


@pytest.mark.parametrize("text,word", [(" Thermal.", "thermal"), ("electrical\n", "electrical"), ("", ""), ("**network** issue", "network")])
def test_answers_are_scored_by_their_first_word(text, word):
    assert train._first_word(text) == word


def test_train_refuses_too_few_examples(tok):
    with pytest.raises(ValueError, match="cannot fill a micro-batch"):
        train.train(torch.nn.Linear(1, 1), tok, data.load_split("train")[:2], CFG, progress=False)
