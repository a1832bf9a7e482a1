"""Lesson 19's model answers: the six functions of the capstone's reference recipe that decide its results.

``coursekit capstone`` runs these (``coursekit.capstone.REFERENCE``), and so does a lesson-19 notebook for every
function its student has not written yet. The capstone's store keys each result by a fingerprint of the code that
computed it (``coursekit.capstone.code_fingerprint``: the compiled body, not the name, the docstring or the
comments), so the functions here are written exactly as the lesson's model answer is: a student whose code is
the model answer shares the reference's results, and any other code gets a run of its own.
``tests/test_recipe.py`` checks that each function here has the fingerprint of the model answer in
``solutions/19-capstone-a-real-qlora-run``; change both together.

The checked, documented versions the other lessons use live in ``coursekit.train`` and ``coursekit.evaluate``
(``load_for_lora``, ``adapter_optimizer``, ``train_steps``, ``answer_logprobs``, ``first_word``,
``merge_into_bf16``); these compute the same numbers without their argument checks.
"""

from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from . import data, train

__all__ = ["load_for_lora", "adapter_optimizer", "train_steps", "answer_logprobs", "first_word",
           "merge_onto_w16"]


def load_for_lora(path, r, lora_alpha, target_modules, quantize=True):
    """The checkpoint at ``path`` with LoRA adapters of rank ``r`` and scale s = lora_alpha / r on
    ``target_modules``; with ``quantize``, the QLoRA recipe (NF4 with double quantization, bf16 compute,
    ``prepare_model_for_kbit_training``; Dettmers et al. 2023, arXiv:2305.14314, and PEFT's quantization guide),
    else the bf16 base. Returns a ``PeftModel``, only the adapter trainable. Errors are transformers' and PEFT's."""
    if quantize:
        nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
        base = AutoModelForCausalLM.from_pretrained(path, quantization_config=nf4, dtype=torch.bfloat16, device_map="cpu")
        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    else:
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    config = LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules, lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    return get_peft_model(base, config)


def adapter_optimizer(model, lr, weight_decay):
    """``torch.optim.AdamW`` (Loshchilov and Hutter 2019, arXiv:1711.05101) over the tensors of ``model`` that
    require a gradient (the adapter), never the frozen base."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def train_steps(model, windows, optimizer, scheduler, progress=True):
    """One optimizer step per window (a list of micro-batch dicts with ``input_ids``, ``attention_mask`` and
    ``labels``, int64 [B, T]): each micro-batch adds (its summed token loss) / N to the gradient, N the window's
    supervised tokens, so every token weighs the same (lesson 04). Returns the window mean losses (floats, nats
    per token), one per window."""
    losses = []
    model.train()
    for window in tqdm(windows, desc="training", unit="step", disable=not progress):
        n = sum(data.count_supervised(b["labels"]) for b in window)
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
    """Per row, Σ log p(labels[t] | tokens before t) over the positions whose label is not -100: logits [R, T, V]
    (any float dtype, computed in float32), labels int64 [R, T] aligned with the inputs as in training. Returns
    float32 [R] (≤ 0). Minus the row's summed training loss (lesson 04)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = labels[:, 1:]
    keep = target != -100
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * keep).sum(dim=-1)


def first_word(text):
    """The first word of ``text`` (a str), lower-cased, without surrounding punctuation; "" for blank text."""
    words = text.strip().lower().split()
    return words[0].strip(".,:;!?\"'`*()[]") if words else ""


def merge_onto_w16(adapter_dir, path):
    """The bf16 base at ``path`` with the adapter saved in ``adapter_dir`` merged into its weights, W16 + s·A·B
    rounded once to bf16 (lesson 13): a plain transformers model."""
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
