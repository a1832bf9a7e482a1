"""coursekit.paired: McNemar's exact test, the paired cluster bootstrap, and the verdict, against values worked by
hand and against the cases where overlapping intervals give the wrong answer."""

from __future__ import annotations

import math

import pytest

from coursekit import evaluate, paired


def test_mcnemar_exact_counts_only_the_discordant_items():
    a = [True] * 50 + [True] * 7 + [False] * 1 + [False] * 10
    b = [True] * 50 + [False] * 7 + [True] * 1 + [False] * 10
    r = paired.mcnemar_exact(a, b)
    assert (r["n"], r["a_only"], r["b_only"]) == (68, 7, 1)
    # by hand: 2 * P(X <= 1), X ~ Binomial(8, 1/2) = 2 * (1 + 8) / 256
    assert math.isclose(r["p_value"], 18 / 256)
    assert paired.mcnemar_exact(b, a)["p_value"] == r["p_value"]  # two-sided


@pytest.mark.parametrize("a_only,b_only,p", [(0, 0, 1.0), (3, 3, 1.0), (5, 0, 2 / 32), (0, 6, 2 / 64), (10, 2, 2 * 79 / 4096)])
def test_mcnemar_exact_known_values(a_only, b_only, p):
    a = [True] * a_only + [False] * b_only + [True, False]
    b = [False] * a_only + [True] * b_only + [True, False]
    assert math.isclose(paired.mcnemar_exact(a, b)["p_value"], min(1.0, p))


def test_mcnemar_refuses_bad_input():
    with pytest.raises(ValueError):
        paired.mcnemar_exact([True], [True, False])
    with pytest.raises(ValueError):
        paired.mcnemar_exact([], [])
    with pytest.raises(ValueError, match="booleans"):
        paired.mcnemar_exact(["yes"], ["no"])
    with pytest.raises(TypeError):
        paired.mcnemar_exact(None, [True])


def test_overlapping_intervals_can_hide_a_difference_the_paired_test_finds():
    """The 'wrong both ways' of lesson 19, first way: 60 of 100 against 48 of 100, Wilson intervals overlapping, but
    every one of the 12 discordant items goes to A: p = 2 / 2^12."""
    a = [True] * 60 + [False] * 40
    b = [True] * 48 + [False] * 52
    la, ha = evaluate.wilson_interval(sum(a), 100)
    lb, hb = evaluate.wilson_interval(sum(b), 100)
    assert la < hb  # the intervals overlap
    c = paired.compare(_result(a), _result(b))
    assert c["a_only"] == 12 and c["b_only"] == 0 and c["p_value"] < 0.001 and c["winner"] == "a"
    assert "A is better" in paired.describe(c, "A", "B")


def test_intervals_that_miss_each_other_can_come_from_a_difference_resting_on_a_few_symptoms():
    """Second way: 65 of 95 against 45 of 95, Wilson intervals apart, but the 30 items right only for A come from
    three symptoms of ten: the interval resampling symptoms reaches zero, and no winner is named."""
    a, b, groups = [], [], []
    for g in range(10):
        a_right, b_right = g < 3 or 4 <= g < 8, 3 <= g < 8
        n = 5 if g == 7 else 10
        a += [a_right] * n
        b += [b_right] * n
        groups += [g] * n
    k_a, k_b = sum(a), sum(b)
    la, ha = evaluate.wilson_interval(k_a, len(a))
    lb, hb = evaluate.wilson_interval(k_b, len(b))
    assert hb < la  # the intervals miss each other
    ids = {f"t{i}": g for i, g in enumerate(groups)}
    c = paired.compare(_result(a), _result(b), ids)
    assert c["p_value"] < 0.05 and c["interval"][0] <= 0 and c["winner"] is None, (k_a, k_b, c)
    assert paired.describe(c, "A", "B").endswith("this test cannot tell them apart.")


def test_compare_refuses_duplicate_ids_bad_alpha_and_bad_n_boot():
    dup = {"predictions": [{"id": "t0", "label": "x", "pred": "x"}, {"id": "t0", "label": "x", "pred": "y"}]}
    with pytest.raises(ValueError, match="more than once"):
        paired.compare(dup, dup)
    with pytest.raises(ValueError, match="alpha"):
        paired.compare(_result([True]), _result([True]), alpha=0)
    with pytest.raises(ValueError, match="n_boot"):
        paired.paired_bootstrap_interval([True], [False], [0], n_boot=0)


def _result(correct, ids=None):
    ids = ids or [f"t{i}" for i in range(len(correct))]
    return {"predictions": [{"id": i, "label": "x", "pred": "x" if c else "y"} for i, c in zip(ids, correct)]}


def test_the_clustered_interval_is_wider_and_can_overrule_mcnemar():
    """Twelve groups of five items that move together: McNemar sees 15 discordant items, all for A (p < 0.05), but
    they come from three groups, and the interval that resamples groups reaches zero: no winner."""
    a, b, groups = [], [], []
    for g in range(12):
        both = g < 8
        a += [True] * 5 if both or g < 11 else [False] * 5
        b += [True] * 5 if both else [False] * 5
        groups += [g] * 5
    c_items = paired.compare(_result(a), _result(b))
    c_groups = paired.compare(_result(a), _result(b), {f"t{i}": g for i, g in enumerate(groups)})
    assert c_items["p_value"] == c_groups["p_value"] < 0.05
    assert c_items["winner"] == "a"
    lo_i, hi_i = c_items["interval"]
    lo_g, hi_g = c_groups["interval"]
    assert lo_g < lo_i and hi_g >= hi_i
    # 3 discordant groups of 12: some replicates draw none of them, so the clustered interval starts at 0
    assert lo_g <= 0 and c_groups["winner"] is None


def test_paired_bootstrap_is_deterministic_and_refuses_bad_input():
    a, b, g = [True, False, True, True], [False, False, True, False], [0, 0, 1, 1]
    assert paired.paired_bootstrap_interval(a, b, g, seed=3) == paired.paired_bootstrap_interval(a, b, g, seed=3)
    lo, hi = paired.paired_bootstrap_interval(a, b, g)
    assert -1 <= lo <= hi <= 1
    with pytest.raises(ValueError):
        paired.paired_bootstrap_interval(a, b, [0, 1])
    with pytest.raises(ValueError, match="level"):
        paired.paired_bootstrap_interval(a, b, g, level=1.5)


def test_compare_refuses_results_on_different_tickets():
    with pytest.raises(ValueError, match="not on the same tickets"):
        paired.compare(_result([True, False]), _result([True, False], ids=["t0", "z"]))


def test_describe_names_the_counts_and_says_which_is_better():
    c = paired.compare(_result([False] * 10), _result([True] * 10))
    text = paired.describe(c, "QLoRA", "the prompt")
    assert "right only for QLoRA on 0, only for the prompt on 10" in text and text.endswith("the prompt is better.")
    assert "-100.0 points" in text


def test_a_handful_of_groups_gives_numbers_and_no_verdict():
    """One symptom holding every ticket: the bootstrap redraws that one symptom every time and its interval has zero
    width, so it would 'exclude 0' for any difference. Below MIN_GROUPS groups no direction is stated."""
    a, b = [True] * 20, [False] * 20
    one = {f"t{i}": "s" for i in range(20)}
    c = paired.compare(_result(a), _result(b), one)
    assert c["interval"][0] == c["interval"][1] == 1.0 and c["p_value"] < 1e-5
    assert c["n_groups"] == 1 and c["winner"] is None
    text = paired.describe(c, "A", "B")
    assert "only 1 symptoms, too few to resample" in text and "better" not in text
    many = {f"t{i}": i % paired.MIN_GROUPS for i in range(20)}
    assert paired.compare(_result(a), _result(b), many)["winner"] == "a"


def test_describe_says_what_the_interval_resampled():
    c = paired.compare(_result([True] * 12), _result([False] * 12))
    assert "interval resampling tickets" in paired.describe(c, "A", "B") and not c["grouped"]
    g = paired.compare(_result([True] * 12), _result([False] * 12), {f"t{i}": i for i in range(12)})
    assert "interval resampling whole symptoms" in paired.describe(g, "A", "B") and g["grouped"]


def test_compare_refuses_other_labels_and_tickets_without_a_group():
    other = _result([True, False])
    other["predictions"][1]["label"] = "z"
    with pytest.raises(ValueError, match="different true labels, e.g. 't1'"):
        paired.compare(_result([True, False]), other)
    with pytest.raises(ValueError, match="1 tickets have no group, e.g. 't1'"):
        paired.compare(_result([True, False]), _result([True, True]), {"t0": "s"})


def test_paired_bootstrap_names_its_argument_errors():
    with pytest.raises(TypeError, match="groups"):
        paired.paired_bootstrap_interval([True], [False], None)
    import numpy as np

    assert paired.paired_bootstrap_interval([True, False], [False, False], [0, 1], n_boot=np.int64(50))
    with pytest.raises(ValueError, match="n_boot"):
        paired.paired_bootstrap_interval([True], [False], [0], n_boot=True)
    with pytest.raises(ValueError, match="n_boot"):
        paired.paired_bootstrap_interval([True], [False], [0], n_boot=2.5)


# --------------------------------------------------------------------------- the paired interval of a mean loss


def test_paired_loss_interval_is_a_token_weighted_difference_resampling_groups():
    tokens = [10, 30, 20, 40]
    a = [5.0, 9.0, 8.0, 12.0]
    b = [4.0, 6.0, 6.0, 8.0]                       # A costs 0.1 nats per token more on every item
    lo, hi = paired.paired_loss_interval(a, b, tokens, groups=[0, 1, 2, 3], n_boot=300)
    assert math.isclose(lo, 0.1) and math.isclose(hi, 0.1)   # the same per-token difference everywhere: no spread
    # the whole difference sits on one group of four: the interval reaches 0 (a replicate without that group)
    a2 = [4.0, 6.0, 6.0, 12.0]
    lo, hi = paired.paired_loss_interval(a2, b, tokens, groups=["g0", "g1", "g2", "g3"], n_boot=2000)
    assert lo == 0 and 0.04 < hi <= 4 / 40
    # swapping the models mirrors the interval; resampling pairs of items as groups changes it
    assert paired.paired_loss_interval(b, a2, tokens, ["g0", "g1", "g2", "g3"], n_boot=2000) == pytest.approx((-hi, -lo))
    assert paired.paired_loss_interval(a2, b, tokens, ["x", "x", "y", "y"], n_boot=2000) != (lo, hi)


def test_paired_loss_interval_refuses_bad_input():
    with pytest.raises(TypeError):
        paired.paired_loss_interval([1.0], [1.0], [3], None)
    with pytest.raises(ValueError, match="one loss per item"):
        paired.paired_loss_interval([1.0, 2.0], [1.0], [3, 3], [0, 1])
    with pytest.raises(ValueError, match="NaN or infinite"):
        paired.paired_loss_interval([float("nan")], [1.0], [3], [0])
    with pytest.raises(ValueError, match="token count"):
        paired.paired_loss_interval([1.0], [1.0], [0], [0])
    with pytest.raises(ValueError, match="level"):
        paired.paired_loss_interval([1.0], [1.0], [3], [0], level=1.5)
    with pytest.raises(ValueError, match="n_boot"):
        paired.paired_loss_interval([1.0], [1.0], [3], [0], n_boot=0)
