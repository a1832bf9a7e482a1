"""Lesson 19's eight functions as a student writes them (the notebook's solutions), and the typical wrong
versions the checks must name. Defined here, outside coursekit: the checks treat them as a student's code."""

import copy

import numpy as np
import torch
from tqdm.auto import tqdm

from coursekit import train
from coursekit.data import IGNORE_INDEX


def load_for_lora(path, r, lora_alpha, target_modules, quantize=True):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    if quantize:
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=bnb, dtype=torch.bfloat16, device_map="cpu")
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    config = LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules, lora_dropout=0.0, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def preflight(model, batch, optimizer):
    params = dict(model.named_parameters())
    trainable = [n for n, p in params.items() if p.requires_grad]
    assert trainable, "nothing is trainable"
    saved = {n: p.detach().clone() for n, p in params.items()}
    saved_opt = copy.deepcopy(optimizer.state_dict())
    model.train()
    optimizer.zero_grad(set_to_none=True)
    try:
        loss = model(**batch).loss
        assert torch.isfinite(loss), f"the loss is {loss.item()}"
        loss.backward()
        for n in trainable:
            g = params[n].grad
            assert g is not None, f"{n} gets no gradient at all (its .grad is None)"
            assert torch.isfinite(g).all(), f"{n} has a gradient that is not finite"
            if "lora_B" in n:
                assert g.abs().sum() > 0, f"{n} gets no gradient: the path to it is cut"
        optimizer.step()
        moved = [n for n, p in params.items() if "lora_" not in n and not torch.equal(p.detach(), saved[n])]
        assert not moved, f"a base weight moved: {moved[0]}"
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])
        optimizer.load_state_dict(saved_opt)
        optimizer.zero_grad(set_to_none=True)


def adapter_optimizer(model, lr, weight_decay):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def train_steps(model, windows, optimizer, scheduler, progress=True):
    losses = []
    model.train()
    for window in tqdm(windows, disable=not progress):
        n = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in window)
        total = 0.0
        for b in window:
            loss_sum, _ = train.supervised_loss_sum(model, b)
            (loss_sum / n).backward()
            total += loss_sum.item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total / n)
    return losses


def answer_logprobs(logits, labels):
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = labels[:, 1:]
    keep = target != IGNORE_INDEX
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * keep).sum(dim=-1)


def first_word(text):
    words = text.strip().lower().split()
    return words[0].strip(".,:;!?\"'`*()[]") if words else ""


def confusion_matrix(true, pred, labels):
    m = np.zeros((len(labels), len(labels) + 1), dtype=int)
    for t, p in zip(true, pred):
        m[labels.index(t), labels.index(p) if p in labels else len(labels)] += 1
    return m


def merge_onto_w16(adapter_dir, path):
    from transformers import AutoModelForCausalLM
    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()


# --------------------------------------------------------------------------- typical wrong versions


def load_without_double_quant_or_prepare(path, r, lora_alpha, target_modules, quantize=True):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=bnb if quantize else None,
                                                 dtype=torch.bfloat16, device_map="cpu")
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules))


def load_with_r_and_alpha_swapped(path, r, lora_alpha, target_modules, quantize=True):
    return load_for_lora(path, lora_alpha, r, target_modules, quantize)


def load_by_borrowing(path, r, lora_alpha, target_modules, quantize=True):
    return train.load_for_lora(path, r, lora_alpha, target_modules, quantize)


def load_by_borrowing_the_model_answer(path, r, lora_alpha, target_modules, quantize=True):
    from coursekit import recipe

    return recipe.load_for_lora(path, r, lora_alpha, target_modules, quantize)


def train_by_borrowing_the_model_answer(model, windows, optimizer, scheduler, progress=True):
    from coursekit import recipe

    return recipe.train_steps(model, windows, optimizer, scheduler, progress)


def load_forging_replies(path, r, lora_alpha, target_modules, quantize=True):
    """Writes a full score for requests 1 to 99 into every other text stream open for writing (the runner's
    replies among them), then returns nothing."""
    import gc
    import io
    import json

    for o in gc.get_objects():
        if isinstance(o, io.TextIOWrapper) and getattr(o, "mode", "") == "w" and isinstance(o.name, int) and o.name > 2:
            for i in range(1, 100):
                o.write(json.dumps({"id": i, "points": 3.0, "lines": ["✓ all cases"], "result": None}) + "\n")
            o.flush()
    return None


def optimizer_by_borrowing(model, lr, weight_decay):
    return train.adapter_optimizer(model, lr, weight_decay)


def preflight_demanding_lora_A_gradients(model, batch, optimizer):
    loss = model(**batch).loss
    loss.backward()
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{n} got a zero gradient"
    model.zero_grad(set_to_none=True)


def preflight_without_restore_or_base_check(model, batch, optimizer):
    loss = model(**batch).loss
    assert torch.isfinite(loss), "loss is not finite"
    loss.backward()
    for n, p in model.named_parameters():
        if "lora_B" in n:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
    optimizer.step()
    optimizer.zero_grad()


def optimizer_over_all_parameters(model, lr, weight_decay):
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def adam_not_adamw(model, lr, weight_decay):
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def train_mean_per_micro_batch(model, windows, optimizer, scheduler, progress=True):
    """model(**batch).loss is the micro-batch's own mean: divided by the number of micro-batches, a mean of means."""
    out = []
    model.train()
    for window in windows:
        total = 0.0
        for b in window:
            loss = model(**b).loss / len(window)
            loss.backward()
            total += loss.item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        out.append(total)
    return out


def train_without_zero_grad(model, windows, optimizer, scheduler, progress=True):
    out = []
    for window in windows:
        n = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in window)
        total = 0.0
        for b in window:
            s, _ = train.supervised_loss_sum(model, b)
            (s / n).backward()
            total += s.item()
        optimizer.step()
        scheduler.step()
        out.append(total / n)
    return out


def logprobs_without_shift(logits, labels):
    logp = torch.log_softmax(logits.float(), -1)
    keep = labels != IGNORE_INDEX
    return (logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep).sum(-1)


def logprobs_averaged(logits, labels):
    return answer_logprobs(logits, labels) / (labels[:, 1:] != IGNORE_INDEX).sum(-1)


def first_word_not_lowercased(text):
    words = text.strip().split()
    return words[0].strip(".,:;!?\"'`*()[]") if words else ""


def first_word_whole_text(text):
    return text.strip()


def first_word_as_written(text):
    words = text.strip().split()
    return words[0] if words else ""


def confusion_without_other_column(true, pred, labels):
    m = np.zeros((len(labels), len(labels)), dtype=int)
    for t, p in zip(true, pred):
        if p in labels:
            m[labels.index(t), labels.index(p)] += 1
    return m


def merge_into_nf4(adapter_dir, path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    base = AutoModelForCausalLM.from_pretrained(path, quantization_config=nf4, device_map="cpu")
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()


def merge_a_fresh_adapter(adapter_dir, path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return get_peft_model(base, LoraConfig(r=4, target_modules="all-linear")).merge_and_unload()


def merge_without_unloading(adapter_dir, path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16), adapter_dir)


def preflight_that_always_raises(model, batch, optimizer):
    raise RuntimeError("refused")


def preflight_leaving_gradients(model, batch, optimizer):
    preflight(model, batch, optimizer)
    model(**batch).loss.backward()  # restores everything, then leaves one backward's gradients behind


def optimizer_that_unfreezes_the_norms(model, lr, weight_decay):
    for n, p in model.named_parameters():
        if "norm" in n:
            p.requires_grad_(True)
    return adapter_optimizer(model, lr, weight_decay)


def train_dividing_by_n_plus_one(model, windows, optimizer, scheduler, progress=True):
    losses = []
    for window in windows:
        n = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in window)
        total = 0.0
        for b in window:
            s, _ = train.supervised_loss_sum(model, b)
            (s / (n + 1)).backward()
            total += s.item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total / n)
    return losses


def train_without_optimizer_step(model, windows, optimizer, scheduler, progress=True):
    for window in windows:
        for b in window:
            train.supervised_loss_sum(model, b)[0].backward()
        scheduler.step()
        optimizer.zero_grad()
    return [0.0] * len(windows)


def train_returning_nothing(model, windows, optimizer, scheduler, progress=True):
    train_steps(model, windows, optimizer, scheduler, progress)


def train_through_the_reference_in_disguise(model, windows, optimizer, scheduler, progress=True):
    from coursekit.grading.lessons.lesson19 import _quiet_call

    return _quiet_call(train.train_steps, model, windows, optimizer, scheduler, False)


def _as_notebook_code(src: str, name: str):
    """A function compiled as a notebook cell would be: the checkers trust code from tests/ (it hands them the
    references on purpose), and treat a cell's code as a student's."""
    scope: dict = {}
    exec(compile(src, "<notebook cell>", "exec"), scope)
    return scope[name]


confusion_by_the_reference = _as_notebook_code(
    "from coursekit import evaluate\n"
    "def confusion_matrix(true, pred, labels):\n"
    "    return evaluate.confusion_matrix(true, pred, labels)\n", "confusion_matrix")


def load_with_random_B_and_dropout(path, r, lora_alpha, target_modules, quantize=True):
    """init_lora_weights=False leaves B random (not zero), and lora_dropout=0.1 is on."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return get_peft_model(base, LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules, lora_dropout=0.1,
                                           init_lora_weights=False))


def merge_kept_in_float32(adapter_dir, path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), adapter_dir).merge_and_unload()


# --------------------------------------------------------------------------- P9: the probe's features


def probe_features(hidden_states, attention_mask, layer):
    m = attention_mask.to(hidden_states[layer].dtype).unsqueeze(-1)
    return (hidden_states[layer] * m).sum(1) / m.sum(1)


def probe_features_layer_off_by_one(hidden_states, attention_mask, layer):
    return probe_features(hidden_states, attention_mask, layer - 1)


def probe_features_padding_pooled(hidden_states, attention_mask, layer):
    return hidden_states[layer].mean(1)


def probe_features_last_column(hidden_states, attention_mask, layer):
    return hidden_states[layer][:, -1]


def probe_features_summed(hidden_states, attention_mask, layer):
    return (hidden_states[layer] * attention_mask.unsqueeze(-1)).sum(1)


def probe_features_by_the_reference(hidden_states, attention_mask, layer):
    from coursekit import cheap

    return cheap.probe_features(hidden_states, attention_mask, layer)


# --------------------------------------------------------------------------- P10: the probe's gradient descent


def train_probe(features, labels, classes, steps, lr):
    X = torch.as_tensor(features, dtype=torch.float32)
    Y = torch.nn.functional.one_hot(torch.tensor([list(classes).index(lab) for lab in labels]), len(classes)).float()
    W, b = torch.zeros(X.shape[1], len(classes)), torch.zeros(len(classes))
    for _ in range(steps):
        dZ = (torch.softmax(X @ W + b, dim=1) - Y) / len(X)
        W, b = W - lr * X.T @ dZ, b - lr * dZ.sum(0)
    return W, b


def _probe_by_hand(features, labels, classes, steps, lr, bias=True, scale=1.0, order=None, probs=True):
    import numpy as np

    cols = list(classes) if order is None else order(labels)
    X = np.asarray(features, dtype=np.float64)
    Y = np.eye(len(cols))[[cols.index(lab) for lab in labels]]
    W, b = np.zeros((X.shape[1], len(cols))), np.zeros(len(cols))
    for _ in range(steps):
        Z = X @ W + b
        P = np.exp(Z - Z.max(1, keepdims=True))
        P = P / P.sum(1, keepdims=True) if probs else Z
        dZ = scale * (P - Y) / len(X)
        W = W - lr * X.T @ dZ
        if bias:
            b = b - lr * dZ.sum(0)
    return W, b


def train_probe_without_bias(features, labels, classes, steps, lr):
    return _probe_by_hand(features, labels, classes, steps, lr, bias=False)


def train_probe_with_sorted_labels(features, labels, classes, steps, lr):
    return _probe_by_hand(features, labels, classes, steps, lr, order=lambda ls: sorted(set(ls)))


def train_probe_summed(features, labels, classes, steps, lr):
    return _probe_by_hand(features, labels, classes, steps, lr, scale=len(labels))


def train_probe_ascending(features, labels, classes, steps, lr):
    return _probe_by_hand(features, labels, classes, steps, lr, scale=-1.0)


def train_probe_on_logits(features, labels, classes, steps, lr):
    return _probe_by_hand(features, labels, classes, steps, lr, probs=False)


def train_probe_by_the_reference(features, labels, classes, steps, lr):
    from coursekit import cheap

    return cheap.train_probe(features, labels, classes, steps, lr)


def smallest_significant_gain(d):
    from coursekit import paired

    for a in range(d // 2 + 1, d + 1):
        if paired.mcnemar_exact([True] * a + [False] * (d - a), [False] * a + [True] * (d - a))["p_value"] < 0.05:
            return 2 * a - d


def smallest_gain_one_sided(d):
    from math import comb

    for a in range(d // 2 + 1, d + 1):
        if sum(comb(d, i) for i in range(a, d + 1)) / 2 ** d < 0.05:
            return 2 * a - d


def smallest_right_only_count(d):
    from coursekit import paired

    for a in range(d // 2 + 1, d + 1):
        if paired.mcnemar_exact([True] * a + [False] * (d - a), [False] * a + [True] * (d - a))["p_value"] < 0.05:
            return a


def smallest_gain_chi2(d):
    g = d % 2
    while g * g / d <= 3.841458820694124:  # McNemar's statistic without continuity correction against χ²(1)'s 95 % point
        g += 2
    return g
