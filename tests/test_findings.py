"""coursekit.findings and the baseline search's helpers: the sentences lesson 19 prints take their direction from
the numbers they are given, and the search's choice is deterministic and made on training tickets only."""

from __future__ import annotations

import pytest

from coursekit import capstone, data, evaluate, findings
from coursekit.data import prompts


def _result(preds, labels=None, answers=None):
    labels = labels or ["thermal"] * len(preds)
    extra = [{"answer": a} for a in answers] if answers else None
    return evaluate.summarize(labels, preds, [f"t{i}" for i in range(len(preds))], extra)


def _search(acc):
    """A search result whose accuracies per (layout, rule) are given in tenths: 10 tickets, all 'thermal'."""
    return {layout: {rule: _result(["thermal"] * k + ["network"] * (10 - k)) for rule, k in by.items()}
            for layout, by in acc.items()}


def test_the_sentences_follow_the_numbers_in_both_directions():
    up = _search({"a": {"generate": 0, "with_end": 2, "label_only": 5, "label_mean": 4, "calibrated": 6},
                  "b": {"generate": 3, "with_end": 1, "label_only": 3, "label_mean": 3, "calibrated": 2}})
    lines = findings.search_findings(up, {"a": "A", "b": "B"}, capstone.RULES, ("a", "calibrated"))
    assert "dropping the end-of-turn token (label only against label + end) raised accuracy in every layout (by 25.0" in lines[2]
    assert "raised accuracy in 0 of 2 layouts and lowered it in 1 (-5.0 points on average)" in lines[3]
    assert "raised accuracy in 1 of 2 layouts and lowered it in 1 (+0.0 points" in lines[4]
    assert lines[-1] == "best on the 10 training tickets: A, calibrated, 60.0 % [31.3, 83.2]."
    down = _search({"a": {"generate": 0, "with_end": 5, "label_only": 2, "label_mean": 2, "calibrated": 2}})
    assert "lowered accuracy in every layout (by 30.0 points on average)" in findings.search_findings(
        down, {"a": "A"}, capstone.RULES, ("a", "with_end"))[2]


def test_generation_reports_how_many_first_words_are_labels():
    s = _search({"a": {"generate": 0, "with_end": 1, "label_only": 1, "label_mean": 1, "calibrated": 1}})
    s["a"]["generate"] = _result(["the"] * 9 + ["thermal"])
    assert findings.search_findings(s, {"a": "A"}, capstone.RULES, ("a", "with_end"))[0] == \
        "generation: A 10.0 % right, 10.0 % of first words a label."


def test_few_shot_bias_says_repeat_only_when_the_common_answer_is_the_last_shot():
    r = _result(["network"] * 8 + ["thermal"] * 2, answers=["network"] * 8 + ["thermal"] * 2)
    assert findings.few_shot_bias(r, "network").endswith("the model repeats the last answer it saw.")
    assert findings.few_shot_bias(r, "thermal").endswith("a 'thermal' ticket.")


def test_peak_difference_takes_its_direction_from_the_numbers():
    assert findings.peak_difference(900, 1000) == "QLoRA's peak is 100 MB lower than LoRA's on bf16 (10.0 % of it)"
    assert findings.peak_difference(1100, 1000).startswith("QLoRA's peak is 100 MB higher")
    assert findings.peak_difference(5, 5) == "QLoRA's peak equals LoRA's on bf16."


def test_search_examples_are_training_tickets_two_per_symptom():
    ex = capstone.search_examples()
    assert len(ex) == 120 and all(e["split"] == "train" for e in ex)
    by = {}
    for e in ex:
        by[e["symptom"]] = by.get(e["symptom"], 0) + 1
    assert len(by) == 60 and set(by.values()) == {2}
    assert len(capstone.search_examples(1)) == 60
    with pytest.raises(ValueError):
        capstone.search_examples(0)


def test_best_prompt_breaks_ties_by_the_search_order_and_can_be_limited_to_generation():
    s = _search({"a": {"generate": 3, "with_end": 5, "label_only": 5, "label_mean": 1, "calibrated": 5},
                 "b": {"generate": 4, "with_end": 5, "label_only": 1, "label_mean": 1, "calibrated": 1}})
    assert capstone.best_prompt(s) == ("a", "with_end")
    assert capstone.best_prompt(s, ("generate",)) == ("b", "generate")
    with pytest.raises(ValueError):
        capstone.best_prompt(s, ("vote",))


@pytest.mark.parametrize("style", prompts.LAYOUTS)
def test_every_layout_names_every_label_and_ends_with_the_ticket(style):
    msgs = prompts.style_messages(style, "The pump whines.", prompts.few_shot_examples(6))
    text = "\n".join(m["content"] for m in msgs)
    assert all(f"- {label}:" in text for label in data.LABELS)
    assert msgs[-1]["role"] == "user" and msgs[-1]["content"].endswith("\n\nTicket: The pump whines." if style == "definitions"
                                                                       else "Ticket: The pump whines.")
    assert (msgs[0]["role"] == "system") == style.startswith("system")
    assert sum(m["role"] == "assistant" for m in msgs) == (6 if "few_shot" in style else 0)


def test_a_few_shot_layout_needs_shots():
    with pytest.raises(ValueError, match="at least one shot"):
        prompts.system_few_shot_messages("x", [])
