"""Lesson 19's graded items: the functions a student writes are checked on tiny models (and P12's on numbers of
tickets); right answers score full with hidden cases, the typical wrong versions lose points with the mistake named,
and a function that calls coursekit's own answer earns nothing. What the lesson's run prints is tested against the
capstone store in tests/test_capstone_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lesson19_answers as A
from coursekit.grading import check
from coursekit.grading.lessons.lesson19 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "19-capstone-a-real-qlora-run" / "19-capstone-a-real-qlora-run.ipynb"

FUNCTIONS = {"p1": A.load_for_lora, "p2": A.preflight, "p3": A.adapter_optimizer, "p4": A.train_steps,
             "p5": A.answer_logprobs, "p6": A.first_word, "p7": A.confusion_matrix, "p8": A.merge_onto_w16,
             "p12": A.smallest_significant_gain, "p9": A.probe_features, "p10": A.train_probe}
# The Function items' right answers, for tests/test_seed_sweep.py (hidden cases from other seeds).
RIGHT = {"p5": A.answer_logprobs, "p7": A.confusion_matrix, "p12": A.smallest_significant_gain, "p9": A.probe_features, "p10": A.train_probe}
CHOICES = {"w1": "a", "w2": "d", "w3": "b", "p11": ["a", "d"], "p13": "c",
           "p15": ["train", "save", "dequantize", "attach", "merge", "verify"]}


def test_every_item_is_covered_here():
    assert set(FUNCTIONS) | set(CHOICES) == set(ITEMS)


def test_notebook_solutions_are_the_answers_tested_here():
    """The notebook's solution cells define the functions this module imports as the right answers."""
    cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"])
             for c in json.loads(NOTEBOOK.read_text())["cells"]}
    for item, fn in FUNCTIONS.items():
        assert f"def {fn.__name__}(" in cells[f"{item}_answer"], item
        assert cells[f"{item}_test"].strip().endswith(f'grade("19.{item}", {fn.__name__})')


@pytest.mark.parametrize("item", sorted(FUNCTIONS))
def test_right_functions_score_full_with_hidden_cases(item):
    torch.manual_seed(11)
    before = torch.get_rng_state()
    fb = check(f"19.{item}", FUNCTIONS[item], hidden=True)
    assert fb.full, fb.text()
    assert "hidden case" in fb.text()
    assert torch.equal(torch.get_rng_state(), before), "grading must not move the student's random state"


@pytest.mark.parametrize("item", sorted(CHOICES))
def test_right_choices_score_full(item):
    assert check(f"19.{item}", CHOICES[item]).full


@pytest.mark.parametrize("item, fn, text", [
    ("p1", A.load_without_double_quant_or_prepare, "double quantization"),
    ("p1", A.load_with_r_and_alpha_swapped, "lora_alpha and r swapped"),
    ("p1", A.load_by_borrowing, "coursekit.train.load_for_lora instead of doing the work itself"),
    ("p1", A.load_by_borrowing_the_model_answer, "coursekit.recipe (the reference recipe)"),
    ("p4", A.train_by_borrowing_the_model_answer, "coursekit.recipe (the reference recipe)"),
    ("p2", A.preflight_demanding_lora_A_gradients, "every lora_A gradient is exactly zero"),
    ("p2", A.preflight_without_restore_or_base_check, "changed a base weight"),
    ("p2", A.preflight_without_restore_or_base_check, "copy them back"),
    ("p3", A.optimizer_over_all_parameters, "frozen base tensors"),
    ("p3", A.adam_not_adamw, "decoupled"),
    ("p4", A.train_mean_per_micro_batch, "each micro-batch's own mean loss"),
    ("p4", A.train_without_zero_grad, "never cleared between windows"),
    ("p5", A.logprobs_without_shift, "predicts the token at t + 1"),
    ("p5", A.logprobs_averaged, "sums them"),
    ("p6", A.first_word_not_lowercased, "Lower-case it"),
    ("p7", A.confusion_without_other_column, "its own last column"),
    ("p8", A.merge_into_nf4, "you merged into the NF4 weights"),
    ("p12", A.smallest_gain_one_sided, "one-sided tail"),
    ("p12", A.smallest_gain_chi2, "χ² approximation g² / d first exceeds"),
    ("p12", A.smallest_right_only_count, "subtracts the tuned prompt's right-only tickets"),
    ("p8", A.merge_a_fresh_adapter, "computes the bare base model"),
    ("p8", A.merge_without_unloading, "still has LoRA layers"),
    ("p9", A.probe_features_layer_off_by_one, "index 0 of hidden_states is the embedding output"),
    ("p9", A.probe_features_padding_pooled, "padding included"),
    ("p9", A.probe_features_last_column, "the last column's state"),
    ("p9", A.probe_features_summed, "without dividing by their number"),
    ("p10", A.train_probe_without_bias, "your b never moves"),
    ("p10", A.train_probe_with_sorted_labels, "alphabetical order"),
    ("p10", A.train_probe_summed, "N times too large"),
    ("p10", A.train_probe_ascending, "move up the gradient"),
    ("p10", A.train_probe_on_logits, "you used the logits Z"),
])
def test_typical_mistakes_lose_points_and_are_named(item, fn, text):
    fb = check(f"19.{item}", fn, hidden=False)
    assert not fb.full and text in fb.text(), fb.text()


@pytest.mark.parametrize("item, fn, labels", [
    ("p1", A.load_without_double_quant_or_prepare, ["no double quantization", "not prepared for k-bit"]),
    ("p1", A.load_with_r_and_alpha_swapped, ["r and lora_alpha swapped"]),
    ("p1", A.load_by_borrowing, []),  # not a mistake of the recipe: the feedback says what it ran instead
    ("p2", A.preflight_demanding_lora_A_gradients, ["refuses a healthy model"]),
    ("p2", A.preflight_without_restore_or_base_check, ["parameters not restored", "misses base moves"]),
    ("p3", A.optimizer_over_all_parameters, ["frozen tensors in the optimizer"]),
    ("p3", A.adam_not_adamw, ["not AdamW"]),
    ("p4", A.train_mean_per_micro_batch, ["mean of means"]),
    ("p4", A.train_without_zero_grad, ["no zero grad"]),
    ("p5", A.logprobs_without_shift, ["no shift"]),
    ("p5", A.logprobs_averaged, ["mean"]),
    ("p6", A.first_word_not_lowercased, ["not lower-cased"]),
    ("p6", A.first_word_as_written, ["punctuation kept", "not lower-cased"]),
    ("p7", A.confusion_without_other_column, ["no other column"]),
    ("p8", A.merge_into_nf4, ["merged into NF4"]),
    ("p12", A.smallest_gain_one_sided, ["one-sided"]),
    ("p12", A.smallest_gain_chi2, ["χ² approximation"]),
    ("p12", A.smallest_right_only_count, ["right-only count"]),
    ("p8", A.merge_a_fresh_adapter, ["adapter not loaded"]),
    ("p8", A.merge_without_unloading, ["not unloaded"]),
    ("p9", A.probe_features_layer_off_by_one, ["layer off by one"]),
    ("p9", A.probe_features_padding_pooled, ["padding pooled"]),
    ("p9", A.probe_features_last_column, ["last column"]),
    ("p9", A.probe_features_summed, ["sum"]),
    ("p10", A.train_probe_without_bias, ["no bias"]),
    ("p10", A.train_probe_with_sorted_labels, ["labels misaligned (sorted)"]),
    ("p10", A.train_probe_summed, ["sum, not mean"]),
    ("p10", A.train_probe_ascending, ["gradient ascent"]),
    ("p10", A.train_probe_on_logits, ["logits for probabilities"]),
])
def test_the_mistake_is_stored_by_name_for_the_class_report(item, fn, labels):
    """Feedback.mistakes, which the grading process stores and coursekit report counts, names each known mistake
    (every case's, when the cases fail in different ways), and nothing for a failure that is no mistake of the
    recipe."""
    fb = check(f"19.{item}", fn, hidden=False)
    assert fb.mistakes == labels, fb.text()


def test_a_word_both_capitalised_and_punctuated_is_told_both_fixes():
    fb = check("19.p6", A.first_word_as_written, hidden=False)
    line = next(l for l in fb.lines if "'Thermal.'" in l and "✗" in l)
    assert "Strip the punctuation" in line and "lower-case it" in line, fb.text()


def test_the_whole_text_is_told_to_keep_one_word_and_lower_case_it_when_it_must():
    fb = check("19.p6", A.first_word_whole_text, hidden=False)
    capital = next(l for l in fb.lines if "'The fan is hot'" in l)
    newline = next(l for l in fb.lines if "'network\\nelectrical'" in l)
    assert "Keep only the first word" in capital and "lower-case it" in capital, fb.text()
    assert "Keep only the first word" in newline and "lower-case" not in newline, fb.text()


@pytest.mark.parametrize("item, fn, text", [
    ("p1", A.load_with_random_B_and_dropout, "lora_B is not zero at the start"),
    ("p1", A.load_with_random_B_and_dropout, "the adapters have dropout"),
    ("p2", A.preflight_leaving_gradients, "still hold a gradient"),
    ("p3", A.optimizer_that_unfreezes_the_norms, "changed which tensors train"),
    ("p4", A.train_without_optimizer_step, "did not move at all"),
    ("p4", A.train_returning_nothing, "returned NoneType"),
    ("p4", A.train_through_the_reference_in_disguise, "runs coursekit.train.train_steps, the grader's own code"),
    ("p8", A.merge_kept_in_float32, "float32 weights"),
])
def test_odd_answers_score_nothing_and_are_named(item, fn, text):
    fb = check(f"19.{item}", fn, hidden=True)
    assert fb.points == 0 and text in fb.text(), fb.text()


def _graded_in_the_runner(item: str, fn):
    """``fn`` scored the way the autograde run scores it: pickled by value as a notebook defines it, called in the
    grader's sandboxed runner, compared in this process."""
    import json

    from coursekit import sandbox
    from coursekit.grading import answer_record, score_record

    if sandbox.problem():
        pytest.skip(sandbox.problem())
    fn.__module__ = "__main__"
    return score_record(f"19.{item}", json.loads(json.dumps(answer_record(f"19.{item}", fn))))


def test_confusion_matrix_by_the_reference_earns_nothing_when_graded():
    """In the autograde run the function runs in the grader's sandboxed runner, where coursekit's
    confusion_matrix (the item's reference) is withheld."""
    fb = _graded_in_the_runner("p7", A.confusion_by_the_reference)
    assert fb.points == 0 and "confusion_matrix is withheld while this item is graded" in fb.text(), fb.text()


def test_a_model_item_is_measured_in_the_runner_and_scored_here():
    """A model item's measure runs next to the student's function in the runner and sends back data (here the
    optimizer's type, tensors, lr and weight decay); the right answer scores full with its hidden case, and
    coursekit's own adapter_optimizer is a stub there."""
    fb = _graded_in_the_runner("p3", A.adapter_optimizer)
    assert fb.full and "hidden case" in fb.text(), fb.text()
    fb = _graded_in_the_runner("p3", A.optimizer_by_borrowing)
    assert fb.points == 0 and "adapter_optimizer is withheld while this item is graded" in fb.text(), fb.text()


def test_a_forged_reply_from_inside_the_runner_earns_nothing():
    """The student's function finds the runner's reply stream and writes a score for every request to come.
    When lesson 19's model items were checked whole in the runner, such a line was read as the item's score;
    now a reply carries only measurements, and one that is not the measurement asked for counts for nothing."""
    fb = _graded_in_the_runner("p1", A.load_forging_replies)
    assert fb.points == 0 and "could not be read" in fb.text(), fb.text()


def test_the_loop_check_sees_any_wrong_scale_of_the_loss():
    """The check hands the loop plain SGD, and the windows differ in N: dividing by N + 1 is not the reference."""
    fb = check("19.p4", A.train_dividing_by_n_plus_one, hidden=True)
    assert fb.points == 0 and "differs from the reference loop" in fb.text()


def test_a_loop_that_casts_the_adapter_is_told_so_not_a_grader_error():
    """Adapter tensors replaced by float64 copies after a right loop: comparing them with the float32 reference raised
    in the check before (scored 0 with no feedback)."""
    def train_steps(model, windows, optimizer, scheduler, progress=True):
        out = A.train_steps(model, windows, optimizer, scheduler, progress)
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.double()
        return out

    fb = check("19.p4", train_steps, hidden=False)
    assert fb.points == 0 and "changed the adapter's dtype" in fb.text(), fb.text()


def test_a_preflight_that_refuses_everything_refuses_nothing_in_particular():
    fb = check("19.p2", A.preflight_that_always_raises, hidden=True)
    assert fb.points == 0 and "also refuses the healthy model" in fb.text()
    fb = check("19.p2", lambda model: None, hidden=False)
    assert fb.points == 0 and "three arguments" in fb.text()
    # One that passes the healthy model but leaves it stepped is not told that it refuses it.
    fb = check("19.p2", A.preflight_without_restore_or_base_check, hidden=False)
    assert "did not pass the healthy model's case" in fb.text() and "refuses the healthy model" not in fb.text(), fb.text()


@pytest.mark.parametrize("item, fn", [("p1", A.load_without_double_quant_or_prepare), ("p3", A.optimizer_over_all_parameters),
                                      ("p4", A.train_mean_per_micro_batch), ("p8", A.merge_into_nf4)])
def test_hidden_cases_name_the_mistake_without_their_inputs(item, fn):
    fb = check(f"19.{item}", fn, hidden=True)
    hidden = [l for l in fb.lines if l.startswith("✗ hidden case")]
    assert hidden and not fb.full
    for line in hidden:
        own = line.split("the same mistake as public case")[0]  # a public case's description is public
        assert "r = " not in own and "lr = " not in own and "lora_alpha=" not in own, line


def test_a_stub_gets_the_stub_message():
    def stub(*args):
        raise NotImplementedError()

    for item in ("p1", "p2", "p4", "p6", "p8"):
        fb = check(f"19.{item}", stub, hidden=False)
        assert fb.points == 0 and "NotImplementedError" in fb.text()


def test_not_a_function_is_refused():
    for item in ("p1", "p2", "p3", "p4", "p6", "p8"):
        fb = check(f"19.{item}", 42, hidden=False)
        assert fb.points == 0 and "should be a function" in fb.text()


@pytest.mark.parametrize("item, wrong, text", [
    ("w2", "b", "proves only what it keeps out"),
    ("w3", "a", "never names the labels"),
    ("p11", ["a", "b", "d"], "inside the trained function's own 95 % interval"),
    ("p11", ["a", "c", "d"], "Same labels do not make same logits"),
    ("p11", ["d"], "(a) is missing from your set. True, by counting"),
    ("p13", "a", "each interval describes one adapter"),
    ("p13", "b", "how many discordant tickets that lead rests on"),
    ("p13", "d", "no count of one adapter's answers alone gives that"),
])
def test_wrong_choices_get_a_teaching_hint(item, wrong, text):
    fb = check(f"19.{item}", wrong)
    assert not fb.full and text in fb.text()


def test_p13s_intervals_are_the_wilson_intervals_of_its_counts():
    """P13's '74 % [67, 81] and 78 % [71, 84] on the same 144 tickets (95 % Wilson intervals): 107 and 113 right' are
    what evaluate.wilson_interval gives, and the two intervals overlap."""
    from coursekit import evaluate

    for k, shown in ((107, (74, 67, 81)), (113, (78, 71, 84))):
        lo, hi = evaluate.wilson_interval(k, 144)
        assert (round(100 * k / 144), round(100 * lo), round(100 * hi)) == shown
    assert evaluate.wilson_interval(113, 144)[0] < evaluate.wilson_interval(107, 144)[1]    # they overlap


def test_p13s_key_the_only_option_that_decides_the_exact_test():
    """P13's key (c), run: every pair of right/wrong lists with 107 and 113 right of the same 144 tickets is built (both
    right on n tickets, n from 76 to 107), each option's quantity is computed from the lists and McNemar's exact
    two-sided test (paired.mcnemar_exact) is run on them. Only the number of tickets both got right decides whether
    p < 0.05: the interval overlap, the lead and the wrong counts are the same in every pair while the verdict changes.
    The p-values and the range of n quoted in the hints are these."""
    from coursekit import evaluate, paired

    def lists(both):
        first_only, second_only = 107 - both, 113 - both
        neither = 144 - both - first_only - second_only
        first = [True] * both + [True] * first_only + [False] * second_only + [False] * neither
        second = [True] * both + [False] * first_only + [True] * second_only + [False] * neither
        return first, second

    feasible = [n for n in range(145) if min(107 - n, 113 - n, 144 - 220 + n) >= 0]
    assert (feasible[0], feasible[-1]) == (76, 107)
    quantity = {
        "a": lambda f, s: evaluate.wilson_interval(sum(f), len(f))[1] - evaluate.wilson_interval(sum(s), len(s))[0],
        "b": lambda f, s: sum(s) - sum(f),
        "c": lambda f, s: sum(x and y for x, y in zip(f, s)),
        "d": lambda f, s: (len(f) - sum(f), len(s) - sum(s)),
    }
    rows = []
    for n in feasible:
        f, s = lists(n)
        assert (sum(f), sum(s), len(f)) == (107, 113, 144)
        p = paired.mcnemar_exact(f, s)["p_value"]
        rows.append(({k: q(f, s) for k, q in quantity.items()}, p < 0.05, p))
    assert {sig for _, sig, _ in rows} == {True, False}          # the verdict changes across the pairs

    def decides(k):
        verdict = {}
        return all(verdict.setdefault(q[k], sig) == sig for q, sig, _ in rows)

    keys = json.loads((ROOT / "autograder" / "keys" / "19.json").read_text())
    assert [k for k in "abcd" if decides(k)] == [CHOICES["p13"]] == [keys["keys"]["p13"]] == ["c"]
    for k in "abd":                                               # each distractor is one value in every pair
        assert len({repr(q[k]) for q, _, _ in rows}) == 1, k
    assert rows[0][0]["a"] > 0                                    # the two intervals overlap
    p = {n: pv for n, (_, _, pv) in zip(feasible, rows)}
    quoted = {n: f"p = {p[n]:.2f}" for n in (107, 106, 76)}
    assert quoted == {107: "p = 0.03", 106: "p = 0.07", 76: "p = 0.54"}
    hints = keys["hints"]["p13"]
    assert all(v in hints["c"] for v in quoted.values()) and all(v in hints["b"] for v in quoted.values())
    assert "from 76 to 107" in hints["a"] and all(f"{p[n]:.2f}" in hints[k] for n in (76, 107) for k in "ad")


def _solution(name: str):
    """The notebook's own model answer ``name`` (its solution cell, run here), not the copy in lesson19_answers."""
    import nbformat

    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    (src,) = [s for s in cells if f"\ndef {name}(" in "\n" + s]
    ns: dict = {"torch": torch}
    exec(compile(src, f"{NOTEBOOK.name}:{name}", "exec"), ns)
    return ns[name]


@pytest.mark.parametrize("fault, says", [("cut", "gets no gradient at all"), ("", None)])
def test_the_model_preflight_names_a_missing_gradient_as_missing(fault, says):
    """A cut path leaves the adapters below it with no gradient (``.grad`` None): the notebook's preflight says so,
    instead of calling it a gradient that is not finite; the healthy model passes."""
    from coursekit.grading.lessons.lesson19 import PreflightCase, preflight_setup

    model, batch, opt = preflight_setup(PreflightCase("", 0, fault))
    if says is None:
        _solution("preflight")(model, batch, opt)
        return
    with pytest.raises(RuntimeError, match=says) as e:
        _solution("preflight")(model, batch, opt)
    assert "finite" not in str(e.value)


def test_the_probe_features_by_the_reference_earn_nothing_when_graded():
    """coursekit.cheap.probe_features is the item's reference: withheld in the grader's runner."""
    fb = _graded_in_the_runner("p9", A.probe_features_by_the_reference)
    assert fb.points == 0 and "withheld while this item is graded" in fb.text(), fb.text()


def test_each_probe_mistake_is_named_only_where_it_was_made():
    """A right answer is told no mistake, and each wrong one only its own (none of the other five)."""
    assert check("19.p9", A.probe_features, hidden=True).mistakes == []
    names = {"layer off by one", "padding pooled", "last column", "last real token", "first token", "sum"}
    for fn, label in ((A.probe_features_layer_off_by_one, "layer off by one"),
                      (A.probe_features_padding_pooled, "padding pooled"),
                      (A.probe_features_last_column, "last column"), (A.probe_features_summed, "sum")):
        assert set(check("19.p9", fn, hidden=True).mistakes) & names == {label}, fn.__name__


def test_the_last_hidden_state_comes_after_the_final_norm():
    """P9's prompt: with output_hidden_states=True, index 0 is the embedding output and index l < L decoder layer l's
    output, but index L is handed back after the model's final RMSNorm (transformers puts last_hidden_state there), so
    the searches' layer 30 is the normed state the head reads. Measured on the tiny checkpoint the checks use."""
    from coursekit import model as cmodel
    from coursekit.grading.lessons.lesson19 import tiny_path

    m = cmodel.load_model("fp32", tiny_path(0, 2))
    outs = []
    hooks = [layer.register_forward_hook(lambda mod, args, out: outs.append(out[0] if isinstance(out, tuple) else out))
             for layer in m.model.layers]
    ids = torch.randint(2, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            hs = m(input_ids=ids, output_hidden_states=True).hidden_states
            normed = m.model.norm(outs[-1])
            embedded = m.model.embed_tokens(ids)
    finally:
        for h in hooks:
            h.remove()
    n = m.config.num_hidden_layers
    assert len(hs) == n + 1 and len(outs) == n
    assert torch.equal(hs[0], embedded)
    assert all(torch.equal(hs[l], outs[l - 1]) for l in range(1, n))
    assert torch.equal(hs[n], normed) and not torch.allclose(hs[n], outs[-1])


def test_the_probe_trained_by_the_reference_earns_nothing_when_graded():
    """coursekit.cheap.train_probe is withheld in the grader's runner."""
    fb = _graded_in_the_runner("p10", A.train_probe_by_the_reference)
    assert fb.points == 0 and "withheld while this item is graded" in fb.text(), fb.text()


def test_each_probe_training_mistake_is_named_only_where_it_was_made_and_every_case_catches_it():
    """A right answer (float64 numpy or torch) is told no mistake; each wrong one only its own, on hidden cases too,
    and no public case lets one pass (the classes are unbalanced, so the bias has a gradient from the first step)."""
    assert check("19.p10", A.train_probe, hidden=True).full
    assert check("19.p10", A.train_probe, hidden=True).mistakes == []
    for fn, label in ((A.train_probe_without_bias, "no bias"), (A.train_probe_with_sorted_labels, "labels misaligned (sorted)"),
                      (A.train_probe_summed, "sum, not mean"), (A.train_probe_ascending, "gradient ascent"),
                      (A.train_probe_on_logits, "logits for probabilities")):
        fb = check("19.p10", fn, hidden=True)
        assert fb.points == 0 and fb.mistakes == [label], (fn.__name__, fb.text())


def test_p15_accepts_every_valid_deployment_order():
    """Loading and dequantizing the NF4 base needs no adapter: it may come anywhere before the adapter is attached to
    it. Saving must sit between training and attaching, and the merge and its check come last."""
    for order in (["train", "save", "dequantize", "attach", "merge", "verify"],
                  ["train", "dequantize", "save", "attach", "merge", "verify"],
                  ["dequantize", "train", "save", "attach", "merge", "verify"]):
        assert check("19.p15", order).full, order
    fb = check("19.p15", ["train", "save", "attach", "dequantize", "merge", "verify"])  # attached to nothing yet
    assert not fb.full
    fb = check("19.p15", ["train", "dequantize", "attach", "save", "merge", "verify"])  # attaches what is not saved
    assert not fb.full


def test_every_section_the_feedback_sends_a_student_to_is_where_it_says():
    """The model items' feedback ends with "Reread '<section>' in <part>.": the section is a heading of the lesson, and
    the nearest top-level (##) heading above it is the part named (the Steps sit in Practice, part 1, not in Know this)."""
    import re

    import nbformat

    from coursekit.grading.lessons import lesson19 as L

    heads = [(len(m.group(1)), m.group(2).strip()) for c in nbformat.read(NOTEBOOK, as_version=4).cells
             if c.cell_type == "markdown" for m in re.finditer(r"^(#+) (.+)$", c.source, re.M)]
    for read in (L.READ_RECIPE, L.READ_PREFLIGHT, L.READ_LOOP, L.READ_SCORING, L.READ_MERGE, L.READ_PROBE, L.READ_PAIRED):
        section, part = re.fullmatch(r"Reread '(.+)' in (.+)\.", read).groups()
        at = next(i for i, (_, text) in enumerate(heads) if text.startswith(section))
        above = next(text for level, text in reversed(heads[:at]) if level == 2)
        assert above.startswith(part), (read, above)


def test_p12s_reference_is_the_smallest_gain_scipys_exact_test_calls_significant():
    """19.p12's reference against scipy's binomtest (not coursekit's test) for every d from 6 to 300: p < 0.05 at the
    gain it returns, not two tickets below (the next gain d's parity allows); at d ≤ 5 no split reaches it."""
    from scipy.stats import binomtest

    from coursekit.grading.lessons import lesson19

    for d in range(6, 301):
        g = lesson19.smallest_significant_gain(d)
        assert g % 2 == d % 2 and binomtest((d + g) // 2, d, 0.5).pvalue < 0.05, d
        assert g - 2 < 0 or binomtest((d + g - 2) // 2, d, 0.5).pvalue >= 0.05, d
        assert A.smallest_significant_gain(d) == g, d
    for d in range(1, 6):
        with pytest.raises(ValueError):
            lesson19.smallest_significant_gain(d)


@pytest.mark.parametrize("fn, label", [(A.smallest_gain_one_sided, "one-sided"), (A.smallest_gain_chi2, "χ² approximation"),
                                       (A.smallest_right_only_count, "right-only count")])
@pytest.mark.parametrize("seed", ["1", "7", "12345"])
def test_p12s_mistake_keeps_one_label_with_hidden_cases(fn, label, seed, monkeypatch):
    """Graded with hidden cases (other d, where the one-sided and χ² thresholds may coincide or equal the key), each
    wrong threshold is stored under its own label only, so that the class report counts each student once."""
    monkeypatch.setenv("COURSEKIT_SEED", seed)
    fb = check("19.p12", fn, hidden=True)
    assert not fb.full and fb.mistakes == [label], fb.text()
