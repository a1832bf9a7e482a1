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
    assert "raised accuracy in 0 of 2 layouts and lowered it in 1, leaving 1 unchanged (-5.0 points on average)" in lines[3]
    assert "raised accuracy in 1 of 2 layouts and lowered it in 1 (+0.0 points" in lines[4]
    assert lines[-1] == "best on the 10 training tickets: A, calibrated, 60.0 % [31.3, 83.2]."
    # 10 tickets: 5 of 5 discordant one way gives p = 0.0625, not below 0.05, so no layout is called significant
    assert lines[2].endswith("; McNemar's exact test on the same 10 tickets gives p < 0.05 in 0 of 2 layouts.")


def test_the_paired_count_follows_the_tickets():
    """On 20 tickets, 0 against 6 right: 6 discordant tickets all one way, p = 2/64 < 0.05; 0 against 5: p = 1/16."""
    def search(k_a, k_b):
        return {"a": {rule: _result(["thermal"] * k + ["network"] * (20 - k)) for rule, k in
                      {"generate": 0, "with_end": 0, "label_only": k_a, "label_mean": k_a, "calibrated": k_a}.items()},
                "b": {rule: _result(["thermal"] * k + ["network"] * (20 - k)) for rule, k in
                      {"generate": 0, "with_end": 0, "label_only": k_b, "label_mean": k_b, "calibrated": k_b}.items()}}
    line = findings.search_findings(search(6, 5), {"a": "A", "b": "B"}, capstone.RULES, ("a", "label_only"))[2]
    assert line.endswith("McNemar's exact test on the same 20 tickets gives p < 0.05 in 1 of 2 layouts."), line
    broken = search(6, 6)
    broken["a"]["with_end"] = _result(["thermal"] * 19)
    with pytest.raises(ValueError, match="different tickets"):
        findings.search_findings(broken, {"a": "A", "b": "B"}, capstone.RULES, ("a", "label_only"))
    same = _search({"a": {"generate": 0, "with_end": 5, "label_only": 5, "label_mean": 5, "calibrated": 5}})
    assert "left accuracy unchanged in every layout" in findings.search_findings(
        same, {"a": "A"}, capstone.RULES, ("a", "with_end"))[2]
    down = _search({"a": {"generate": 0, "with_end": 5, "label_only": 2, "label_mean": 2, "calibrated": 2}})
    assert "lowered accuracy in every layout (by 30.0 points on average)" in findings.search_findings(
        down, {"a": "A"}, capstone.RULES, ("a", "with_end"))[2]


def test_search_findings_refuse_an_empty_search():
    with pytest.raises(ValueError, match="no layouts"):
        findings.search_findings({}, {}, capstone.RULES, ("a", "with_end"))
    broken = _search({"a": {"generate": 0, "with_end": 5, "label_only": 5, "label_mean": 5, "calibrated": 5}})
    broken["a"]["label_only"]["predictions"] = []
    with pytest.raises(ValueError, match="a, label_only: a result with no predictions"):
        findings.search_findings(broken, {"a": "A"}, capstone.RULES, ("a", "with_end"))


def test_generation_reports_how_many_first_words_are_labels():
    s = _search({"a": {"generate": 0, "with_end": 1, "label_only": 1, "label_mean": 1, "calibrated": 1}})
    s["a"]["generate"] = _result(["the"] * 9 + ["thermal"])
    assert findings.search_findings(s, {"a": "A"}, capstone.RULES, ("a", "with_end"))[0] == \
        "generation: A 10.0 % right, 10.0 % of first words a label."


def test_few_shot_bias_names_the_coincidence_only_when_there_is_one():
    r = _result(["network"] * 8 + ["thermal"] * 2, answers=["network"] * 8 + ["thermal"] * 2)
    assert findings.few_shot_bias(r, "network") == ("8 of 10 few-shot answers are 'network'; the last solved ticket in "
                                                    "the prompt is a 'network' ticket, the same label.")
    assert findings.few_shot_bias(r, "thermal").endswith("a 'thermal' ticket.")


def test_peak_difference_takes_its_direction_from_the_numbers():
    assert findings.peak_difference(900, 1000) == "QLoRA's peak is 100 MB lower than LoRA's on bf16 (10.0 % of it)."
    assert findings.peak_difference(1100, 1000).startswith("QLoRA's peak is 100 MB higher")
    assert findings.peak_difference(5, 5) == "QLoRA's peak equals LoRA's on bf16."


def test_search_examples_are_training_tickets_two_per_symptom_and_never_a_solved_example():
    ex = capstone.search_examples()
    assert len(ex) == 120 and all(e["split"] == "train" for e in ex)
    assert not {e["id"] for e in ex} & {e["id"] for e in prompts.few_shot_examples(capstone.SHOTS)}
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


def test_cue_words_names_the_weakest_and_strongest_with_their_word_counts():
    named = {"a": (10, 10), "b": (0, 10), "c": (5, 10)}
    right = {"a": (11, 24), "b": (16, 24), "c": (24, 24)}
    lines = findings.cue_words(named, right)
    assert lines == ["weakest on unseen symptoms: a (11 of 24 right; its word in 10 of 10 training symptoms); strongest: "
                     "c (24 of 24 right; its word in 5 of 10 training symptoms).",
                     "named by every training symptom: a (11 of 24 right)."]
    with pytest.raises(ValueError):
        findings.cue_words(named, {"a": (1, 2)})


def test_cue_words_print_each_interval_and_no_verdict_on_their_overlap():
    named = {"a": (10, 10), "b": (0, 10), "c": (5, 10)}
    right = {"a": (11, 24), "b": (16, 24), "c": (24, 24)}
    wide = {"a": (0.2, 0.8), "b": (0.4, 0.9), "c": (0.7, 1.0)}
    lines = findings.cue_words(named, right, wide)
    assert lines == ["weakest on unseen symptoms: a (11 of 24 right, [20.0, 80.0] %; its word in 10 of 10 training "
                     "symptoms); strongest: c (24 of 24 right, [70.0, 100.0] %; its word in 5 of 10 training symptoms).",
                     "named by every training symptom: a (11 of 24 right)."]
    assert findings.cue_words(named, right, dict(wide, a=(0.3, 0.6)))[1:] == lines[1:]  # apart or not: no verdict
    with pytest.raises(ValueError, match="does not hold its accuracy"):
        findings.cue_words(named, right, dict(wide, c=(0.5, 0.9)))
    with pytest.raises(ValueError, match="same labels"):
        findings.cue_words(named, right, {"a": (0, 1)})


def _merge(w16_agree, dq_agree, w16_diff, dq_diff):
    m = lambda agree, diff: {"agreement": agree, "mean_abs_diff": diff, "no_label": 0.0, "same_token_as_base": 0.0}  # noqa: E731
    return {"nf4_codes_changed": 1.2e-5, "merges": {
        "onto W16 (bf16 base)": m(w16_agree, w16_diff), "onto dequant(W4), in bf16": m(dq_agree, dq_diff),
        "into NF4 (re-quantized)": {"agreement": 0.0, "mean_abs_diff": 17.0, "no_label": 1.0, "same_token_as_base": 0.76}}}


def test_merge_findings_take_the_closer_merge_from_the_numbers():
    lines = findings.merge_findings(_merge(0.833, 0.993, 2.88, 0.121))
    assert lines[0] == ("into NF4: 0.0012 % of the 4-bit codes changed; the merged model gives no label on 100.0 % of the "
                        "tickets and the untrained base's first token on 76.0 %, and agrees with the trained function on 0.0 %.")
    assert lines[-1] == "closer to the trained function: onto dequant(W4), in bf16 (its logits move 23.8 times less, and more labels agree)."
    flipped = findings.merge_findings(_merge(0.99, 0.80, 0.1, 3.0))
    assert flipped[-1].startswith("closer to the trained function: onto W16 (bf16 base)")
    mixed = findings.merge_findings(_merge(0.99, 0.80, 3.0, 0.1))
    assert mixed[-1] == "the two measures disagree: onto W16 (bf16 base) keeps more labels, onto dequant(W4), in bf16 moves the logits less."


def _paired_merge(w16, dq):
    """A merge_comparison result whose rows carry only what merge_paired_findings reads: (a_only, b_only, p, winner,
    agreement) per merge."""
    def row(a_only, b_only, p, winner, agreement):
        return {"n": 144, "accuracy": 0.7, "interval": [0.62, 0.77], "agreement": agreement,
                "paired": {"a_only": a_only, "b_only": b_only, "p_value": p, "interval": [-0.05, 0.02], "winner": winner}}
    return {"reference": {"n": 144, "accuracy": 0.72, "interval": [0.64, 0.79]},
            "merges": {"onto W16 (bf16 base)": row(*w16), "onto dequant(W4), in bf16": row(*dq),
                       "into NF4 (re-quantized)": row(0, 100, 1e-30, "b", 0.0)}}


def test_merge_paired_findings_state_a_direction_only_where_the_paired_test_found_one():
    lines = findings.merge_paired_findings(_paired_merge((9, 12, 0.66, None, 0.833), (0, 0, 1.0, None, 1.0)))
    assert lines[0] == "the trained function: 72.0 % [64.0, 79.0] on 144 tickets (95 % Wilson interval)."
    assert lines[1] == ("onto W16 (bf16 base): 70.0 % [62.0, 77.0] on 144; it loses 12 tickets the trained function got "
                        "right and gains 9 (McNemar exact p = 0.66; interval resampling whole symptoms [-5.0, +2.0] "
                        "points): this test cannot tell it from the trained function, though it answers 16.7 % of the "
                        "tickets with another label.")
    assert lines[2].endswith("right on exactly the tickets the trained function gets right.")
    assert lines[3].endswith("worse than the trained function; the test and the interval agree.")
    worse = findings.merge_paired_findings(_paired_merge((1, 20, 1e-5, "b", 0.85), (0, 1, 1.0, None, 0.99)))
    assert "loses 20 tickets" in worse[1] and worse[1].endswith("worse than the trained function; the test and the interval agree.")
    assert "loses 1 ticket the" in worse[2] and worse[2].endswith("though it answers 1.0 % of the tickets with another label.")
