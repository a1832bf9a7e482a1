"""coursekit.evaluate: the two scoring rules, the Wilson interval, the confusion matrix, and the prefix-cached
batched passes checked against the slow, obvious computation in float32 on a tiny model with SmolLM2's
tokenizer (a tiny random Llama with the real vocabulary: fast, and every code path of the real model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from coursekit import data, evaluate as E, model
from coursekit.data import prompts as P


@pytest.fixture(scope="module")
def tok():
    return model.load_tokenizer()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tok):
    folder = model.tiny_checkpoint(tmp_path_factory.mktemp("tiny"), vocab_size=len(tok), seed=3)
    return model.load_model("fp32", folder)


@pytest.mark.parametrize("text,word", [(" Thermal.", "thermal"), ("electrical\n", "electrical"), ("", ""), ("   ", ""),
                                       ("**network** issue", "network"), ("The fan", "the"), ("(hydraulic):", "hydraulic")])
def test_first_word(text, word):
    assert E.first_word(text) == word


def test_first_word_refuses_a_non_string():
    with pytest.raises(TypeError):
        E.first_word(None)


def test_answer_logprobs_is_minus_the_summed_training_loss():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g)
    labels = torch.full((3, 6), data.IGNORE_INDEX)
    labels[0, 4:] = torch.tensor([3, 7])
    labels[1, 5] = 2
    labels[2, 1:3] = torch.tensor([0, 10])
    got = E.answer_logprobs(logits, labels)
    for r in range(3):
        want = -data.token_loss_sum(logits[r:r + 1], labels[r:r + 1])
        assert torch.allclose(got[r], want, atol=1e-6)
    # by hand for row 1: the logit at position 4 predicts the token at position 5
    assert torch.isclose(got[1], torch.log_softmax(logits[1, 4], -1)[2], atol=1e-6)
    assert (got <= 0).all()


def test_answer_logprobs_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="logits must be"):
        E.answer_logprobs(torch.zeros(2, 5, 3), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("k,n,lo,hi", [(0, 10, 0.0, 0.27753), (10, 10, 0.72247, 1.0), (5, 10, 0.23659, 0.76341),
                                       (107, 144, 0.66602, 0.80746)])
def test_wilson_interval_known_values(k, n, lo, hi):
    a, b = E.wilson_interval(k, n)
    assert math.isclose(a, lo, abs_tol=5e-5) and math.isclose(b, hi, abs_tol=5e-5)


@pytest.mark.parametrize("k,n", [(-1, 5), (6, 5), (0, 0), (1.5, 4)])
def test_wilson_interval_refuses_impossible_counts(k, n):
    with pytest.raises(ValueError):
        E.wilson_interval(k, n)


def test_confusion_matrix_counts_rows_true_columns_predicted_and_an_other_column():
    m = E.confusion_matrix(["a", "a", "b", "c"], ["a", "b", "b", "the"], ["a", "b", "c"])
    assert m.tolist() == [[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]]
    with pytest.raises(ValueError):
        E.confusion_matrix(["a"], ["a", "b"], ["a", "b"])
    with pytest.raises(ValueError, match="true label"):
        E.confusion_matrix(["z"], ["a"], ["a", "b"])


def test_common_prefix_length_keeps_a_token_for_every_row():
    assert E.common_prefix_length([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 3]]) == 2
    assert E.common_prefix_length([[5, 6]]) == 0
    assert E.common_prefix_length([[1, 2], [3, 4]]) == 0


def _prompts(tok, style, n=9):
    shots = P.few_shot_examples(6)
    return E.encode_prompts(tok, [P.style_messages(style, ex["ticket"], shots) for ex in data.load_split("unseen_symptom")[:n]])


@pytest.mark.parametrize("style", P.PROMPT_STYLES)
def test_label_scoring_equals_the_slow_full_pass(tiny, tok, style):
    """Prefix cache, suffixes padded in the middle, L continuations on copies of the cache: the same numbers as
    scoring every (prompt, answer) pair in its own full forward pass, in float32."""
    prompts = _prompts(tok, style)
    fast = E.label_logprobs(tiny, tok, prompts, batch_size=4)
    end = data.end_of_turn_id(tok)
    slow = torch.zeros(len(prompts), len(data.LABELS))
    with torch.no_grad():
        for i, p in enumerate(prompts):
            for j, label in enumerate(data.LABELS):
                answer = tok.encode(label, add_special_tokens=False) + [end]
                ids = torch.tensor([p + answer])
                labels = torch.tensor([[data.IGNORE_INDEX] * len(p) + answer])
                slow[i, j] = E.answer_logprobs(tiny(input_ids=ids).logits, labels)[0]
    assert fast.shape == (len(prompts), len(data.LABELS))
    torch.testing.assert_close(fast, slow, atol=2e-4, rtol=1e-5)


@pytest.mark.parametrize("style", ["plain", "few_shot"])
def test_generation_with_a_cached_prefix_equals_plain_generate(tiny, tok, style):
    prompts = _prompts(tok, style, n=6)
    fast = E.generate_answers(tiny, tok, prompts, max_new_tokens=4, batch_size=3)
    end = data.end_of_turn_id(tok)
    slow = [tok.decode(tiny.generate(input_ids=torch.tensor([p]), max_new_tokens=4, do_sample=False,
                                     pad_token_id=end, eos_token_id=end)[0, len(p):], skip_special_tokens=True)
            for p in prompts]
    assert fast == slow


def test_evaluate_returns_counts_an_interval_and_every_prediction(tiny, tok):
    examples = data.load_split("unseen_phrasing")[:7]
    res = E.evaluate(tiny, tok, examples, "labels")
    assert res["n"] == 7 and 0 <= res["correct"] <= 7
    assert res["accuracy"] == res["correct"] / 7
    assert res["interval"] == list(E.wilson_interval(res["correct"], 7))
    assert np.array(res["confusion"]).sum() == 7 and np.array(res["confusion"]).shape == (6, 7)
    assert [p["id"] for p in res["predictions"]] == [ex["id"] for ex in examples]
    assert all(len(p["scores"]) == 6 and p["pred"] in data.LABELS for p in res["predictions"])
    gen = E.evaluate(tiny, tok, examples, "generate", max_new_tokens=2)
    assert all(p["pred"] == E.first_word(p["answer"]) for p in gen["predictions"])


def test_evaluate_refuses_bad_input(tiny, tok):
    with pytest.raises(ValueError, match="no examples"):
        E.evaluate(tiny, tok, [], "labels")
    with pytest.raises(ValueError, match="unknown scoring"):
        E.evaluate(tiny, tok, data.load_split("train")[:1], "vote")
    with pytest.raises(ValueError, match="unknown prompt style"):
        E.evaluate(tiny, tok, data.load_split("train")[:1], "labels", style="chatty")
    with pytest.raises(ValueError, match="empty"):
        E.label_logprobs(tiny, tok, [[1, 2], []])
    with pytest.raises(ValueError, match="no prompts"):
        E.generate_answers(tiny, tok, [])


def test_evaluation_restores_the_training_mode(tiny, tok):
    tiny.train()
    E.label_logprobs(tiny, tok, _prompts(tok, "plain", n=2))
    assert tiny.training and torch.is_grad_enabled()
    tiny.eval()


@pytest.mark.parametrize("style", ["plain", "definitions"])
def test_next_token_logits_equal_a_full_pass_per_prompt(tiny, tok, style):
    prompts = _prompts(tok, style, n=5)
    fast = E.next_token_logits(tiny, tok, prompts, batch_size=2)
    with torch.no_grad():
        slow = torch.stack([tiny(input_ids=torch.tensor([p])).logits[0, -1] for p in prompts])
    torch.testing.assert_close(fast, slow, atol=2e-4, rtol=1e-5)


def test_cluster_bootstrap_is_wider_when_groups_move_together():
    """Twelve groups of three identical outcomes carry twelve examples' worth of information, not 36."""
    correct = [g % 4 != 0 for g in range(12) for _ in range(3)]
    groups = [g for g in range(12) for _ in range(3)]
    lo, hi = E.cluster_bootstrap_interval(correct, groups)
    wl, wh = E.wilson_interval(sum(correct), len(correct))
    assert lo < wl and hi > wh
    assert E.cluster_bootstrap_interval(correct, groups) == (lo, hi)  # deterministic
    # one example per group: close to the binomial interval
    lo1, hi1 = E.cluster_bootstrap_interval(correct, list(range(36)))
    assert abs((hi1 - lo1) - (wh - wl)) < 0.06
    with pytest.raises(ValueError):
        E.cluster_bootstrap_interval([True], [1, 2])


@pytest.mark.parametrize("style", ["system_definitions", "system_few_shot"])
def test_every_label_reading_equals_the_slow_computation(tiny, tok, style):
    """One pass, four readings: label + end (as label_logprobs), label tokens only, their mean per token, and the
    label-only score minus the same after the content-free ticket; each against full forward passes in float32."""
    prompts = _prompts(tok, style, n=5)
    shots = P.few_shot_examples(6)
    free = E.encode_prompts(tok, [P.style_messages(style, P.CONTENT_FREE, shots)])[0]
    got = E.label_rule_scores(tiny, tok, prompts, free, batch_size=2)
    assert list(got) == list(E.LABEL_RULES)
    end = data.end_of_turn_id(tok)

    def slow(p, with_end):
        out = torch.zeros(len(data.LABELS))
        for j, label in enumerate(data.LABELS):
            answer = tok.encode(label, add_special_tokens=False) + ([end] if with_end else [])
            ids = torch.tensor([p + answer])
            with torch.no_grad():
                out[j] = E.answer_logprobs(tiny(input_ids=ids).logits, torch.tensor([[data.IGNORE_INDEX] * len(p) + answer]))[0]
        return out

    n_tokens = torch.tensor([len(tok.encode(label, add_special_tokens=False)) for label in data.LABELS], dtype=torch.float32)
    bias = slow(free, False)
    for i, p in enumerate(prompts):
        torch.testing.assert_close(got["with_end"][i], slow(p, True), atol=2e-4, rtol=1e-5)
        torch.testing.assert_close(got["label_only"][i], slow(p, False), atol=2e-4, rtol=1e-5)
        torch.testing.assert_close(got["label_mean"][i], slow(p, False) / n_tokens, atol=2e-4, rtol=1e-5)
        torch.testing.assert_close(got["calibrated"][i], slow(p, False) - bias, atol=4e-4, rtol=1e-5)
    assert (got["label_only"] > got["with_end"]).all()  # the end-of-turn term only ever costs


def test_evaluate_label_rules_reads_each_rule_off_one_pass(tiny, tok):
    examples = data.load_split("unseen_phrasing")[:5]
    res = E.evaluate_label_rules(tiny, tok, examples, "definitions")
    assert set(res) == set(E.LABEL_RULES)
    one = E.evaluate(tiny, tok, examples, "labels", "definitions")
    assert [p["pred"] for p in res["with_end"]["predictions"]] == [p["pred"] for p in one["predictions"]]
    for rule, r in res.items():
        assert r["n"] == 5 and all(p["pred"] == data.LABELS[int(np.argmax(p["scores"]))] for p in r["predictions"]), rule
    with pytest.raises(ValueError, match="no examples"):
        E.evaluate_label_rules(tiny, tok, [], "definitions")
    with pytest.raises(ValueError, match="unknown prompt style"):
        E.evaluate_label_rules(tiny, tok, examples, "chatty")


def test_label_rules_refuse_a_scoring_function_that_gives_nan_or_the_wrong_shape(tiny, tok):
    """A student's answer_logprobs that returns NaN would rank the labels by whatever argmax makes of NaN; the pass
    names the function, the row and the value instead."""
    examples = data.load_split("unseen_phrasing")[:2]

    def nan_logprobs(logits, labels):
        out = E.answer_logprobs(logits, labels)
        out[1] = float("nan")
        return out

    with pytest.raises(ValueError, match=r"nan_logprobs\(logits, labels\) returned nan for row 1"):
        E.evaluate_label_rules(tiny, tok, examples, "definitions", logprob_fn=nan_logprobs)
    with pytest.raises(ValueError, match="one score per row"):
        E.evaluate_label_rules(tiny, tok, examples, "definitions", logprob_fn=lambda lg, lb: lg.sum(dim=-1))
    with pytest.raises(ValueError, match="batch_size"):
        E.evaluate_label_rules(tiny, tok, examples, "definitions", batch_size=0)


def test_an_unknown_true_label_is_named():
    with pytest.raises(ValueError, match="'plumbing' is not one of the labels"):
        E.summarize(["plumbing"], ["thermal"])
    with pytest.raises(ValueError, match="one prediction per true label"):
        E.summarize([], [])
