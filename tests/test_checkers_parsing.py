"""What a student may type for a choice, a "choose all that apply" and an ordering item, and what each earns.

Single choice: one letter, any case, the obvious punctuation around it ("c.", "(c)", "c)"); a one-element
list/tuple/set is graded as its letter with a note; several letters earn 0 (never partial credit by luck).
Multi choice: a collection or one string ("a, c", "a c", "ac"); repeats ignored; empty earns 0.
Ordering: a list, tuple, 1-D array of label strings or one separated string; a set (no order), a dict, a number
or a string that does not split into labels earns 0 with the expected form.
"""

from __future__ import annotations

import numpy as np
import pytest

from coursekit.grading import check_choice, check_multi, check_ordering

OPTIONS = list("abcd")


def _silent(capfd, fn, *args):
    fb = fn(*args)
    assert capfd.readouterr() == ("", "")
    assert 0 <= fb.points <= fb.max_points and fb.lines
    return fb


# --------------------------------------------------------------------------- single choice


@pytest.mark.parametrize("answer", ["c", "C", " c ", "c.", "(c)", "c)", "C) ", "[c]", "'c'", np.str_("c"), np.array("c")])
def test_choice_accepts_one_letter_with_punctuation(answer, capfd):
    fb = _silent(capfd, check_choice, answer, "c", 2, OPTIONS)
    assert fb.full and fb.lines == ["(c) is right."]


@pytest.mark.parametrize("answer", ["c.", "(c)", "c)"])
def test_choice_punctuation_is_read_as_the_letter_when_wrong_too(answer, capfd):
    fb = _silent(capfd, check_choice, answer, "b", 2, OPTIONS, {"c": "hint c"})
    assert fb.points == 0 and fb.lines[0] == "(c) is not right. hint c"


@pytest.mark.parametrize("answer, container", [(["c"], "list"), (("c",), "tuple"), ({"c"}, "set"),
                                               (frozenset("c"), "frozenset"), (np.array(["c"]), "NumPy array"),
                                               (["(C)"], "list")])
def test_choice_one_element_collection_is_graded_as_its_letter_with_a_note(answer, container, capfd):
    fb = _silent(capfd, check_choice, answer, "c", 2, OPTIONS)
    assert fb.full and fb.lines[0] == "(c) is right."
    assert fb.lines[1] == (f"Note: graded as \"c\"; a single-choice answer is one letter as a string, e.g. \"c\", "
                           f"not a {container} holding it.")
    fb = _silent(capfd, check_choice, answer, "b", 2, OPTIONS)
    assert fb.points == 0 and "(c) is not right" in fb.lines[0] and "one letter as a string" in fb.lines[1]


@pytest.mark.parametrize("answer", ["ac", "a, c", "a c", "(a) (c)", ["a", "c"], ("c", "a"), {"a", "c"}, ["ac"],
                                    "abcd", np.array(["a", "c"])])
def test_choice_several_letters_earn_nothing(answer, capfd):
    """The key is among them; picking several must never be rewarded."""
    for key in ("a", "c"):
        fb = _silent(capfd, check_choice, answer, key, 2, OPTIONS)
        assert fb.points == 0 and len(fb.lines) == 1
        assert fb.lines[0].startswith("Only one letter is allowed here"), fb.lines
        assert 'one letter out of a, b, c, d, as a string, e.g. "a"' in fb.lines[0]


def test_choice_a_repeated_letter_is_one_letter(capfd):
    assert _silent(capfd, check_choice, "c c", "c", 2, OPTIONS).full
    assert _silent(capfd, check_choice, ["c", "C"], "c", 2, OPTIONS).full


@pytest.mark.parametrize("answer", [None, ..., "", "   "])
def test_choice_no_answer_yet(answer, capfd):
    fb = _silent(capfd, check_choice, answer, "c", 2, OPTIONS)
    assert fb.points == 0 and fb.lines == ['No answer yet: set it to one letter out of a, b, c, d, as a string, e.g. "a".']


@pytest.mark.parametrize("answer, shown", [(3, "int 3"), ({"c": 1}, "dict {'c': 1}"), ("option c", "str 'option c'"),
                                           ([3], "list [3]"), ("1.5", "str '1.5'"), ("x" * 500, "str 'xxxx")])
def test_choice_malformed_says_what_to_type(answer, shown, capfd):
    fb = _silent(capfd, check_choice, answer, "c", 2, OPTIONS)
    assert fb.points == 0
    assert fb.lines[0].startswith('Expected one letter out of a, b, c, d, as a string, e.g. "a"; got ' + shown)
    assert len(fb.lines[0]) < 200  # a long answer is cut, not echoed whole


def test_choice_letter_outside_the_options(capfd):
    fb = _silent(capfd, check_choice, "E)", "c", 2, OPTIONS)
    assert fb.points == 0 and fb.lines == ["(e) is not an option here: choose one letter out of a, b, c, d."]


# --------------------------------------------------------------------------- multi choice


@pytest.mark.parametrize("answer", ["acd", "ACD", "a, c, d", "a c d", "a,c,d", "a;c;d", "a, c and d", "(a) (c) (d)",
                                    "(a)(c)(d)", ["a", "c", "d"], {"a", "c", "d"}, ("a", "c", "d"), ["A)", "c.", "d"],
                                    np.array(["a", "c", "d"]), "a, c, d, a", ["a", "c", "d", "c"], ["ac", "d"]])
def test_multi_accepts_the_forms_students_type(answer, capfd):
    fb = _silent(capfd, check_multi, answer, {"a", "c", "d"}, 3, OPTIONS)
    assert fb.full and fb.lines == ["All right."]


def test_multi_letters_run_together_are_read_one_by_one(capfd):
    fb = _silent(capfd, check_multi, "ab", {"a", "c"}, 2, OPTIONS, {"b": "hint b"})
    assert fb.points == 0  # one right, one wrong
    assert "(b) should not be chosen. hint b" in fb.lines and "One true statement is missing from your set." in fb.lines
    fb = _silent(capfd, check_multi, "ac", {"a", "c"}, 2, OPTIONS)
    assert fb.full


def test_multi_run_with_a_non_option_character_is_not_read_as_letters(capfd):
    fb = _silent(capfd, check_multi, "ace", {"a", "c"}, 2, OPTIONS)
    assert fb.points == 0 and fb.lines[0].startswith("Expected the letters you choose out of a, b, c, d")
    fb = _silent(capfd, check_multi, "a e", {"a", "c"}, 2, OPTIONS)
    assert fb.points == 0 and fb.lines == ["(e) is not an option; choose among a, b, c, d."]


@pytest.mark.parametrize("answer", ["", "  ", set(), [], (), frozenset(), ", ,"])
def test_multi_empty_answer_asks_for_at_least_one(answer, capfd):
    fb = _silent(capfd, check_multi, answer, {"a", "c"}, 2, OPTIONS)
    assert fb.points == 0 and fb.lines == ["Your answer is empty: choose at least one letter out of a, b, c, d."]


@pytest.mark.parametrize("answer", [None, ...])
def test_multi_no_answer_yet(answer, capfd):
    fb = _silent(capfd, check_multi, answer, {"a", "c"}, 2, OPTIONS)
    assert fb.points == 0 and fb.lines[0].startswith("No answer yet: set it to the letters you choose out of a, b, c, d")


@pytest.mark.parametrize("answer", [{"a": True, "c": True}, 3, ["a", None], [["a", "c"]], "a c x2"])
def test_multi_malformed_names_the_form(answer, capfd):
    fb = _silent(capfd, check_multi, answer, {"a", "c"}, 2, OPTIONS)
    assert fb.points == 0 and fb.lines[0].startswith("Expected the letters you choose out of a, b, c, d, e.g. {")


# --------------------------------------------------------------------------- ordering

KEY = ["train", "save", "attach"]


@pytest.mark.parametrize("answer", [KEY, tuple(KEY), np.array(KEY), np.array(KEY, dtype=object), "train, save, attach",
                                    "train save attach", "Train,Save,Attach", "train -> save -> attach",
                                    "train → save → attach", "train; save; attach", "['train', 'save', 'attach']",
                                    "  train,\nsave,\n attach  "])
def test_ordering_accepts_lists_arrays_and_separated_strings(answer, capfd):
    fb = _silent(capfd, check_ordering, answer, KEY, 2)
    assert fb.full and fb.lines == ["The order is right."]


def test_ordering_string_in_the_wrong_order_gets_pair_credit(capfd):
    fb = _silent(capfd, check_ordering, "save, train, attach", KEY, 3)
    assert 0 < fb.points < 3 and "2 of 3 pairs" in fb.lines[0] and "position 1: 'save'" in fb.lines[0]
    fb = _silent(capfd, check_ordering, np.array(["save", "train", "attach"]), KEY, 3)
    assert 0 < fb.points < 3 and "2 of 3 pairs" in fb.lines[0]


def test_ordering_string_with_a_typo_names_the_label(capfd):
    fb = _silent(capfd, check_ordering, "train, save, atach", KEY, 3)
    assert fb.points == 0 and fb.lines == ["Use each of the 3 labels exactly once (missing ['attach'], unknown or repeated ['atach'])."]


FORM = ('Expected a list of the 3 step labels (strings) in order, first step first, e.g. ["first label", '
        '"second label", ...], using the labels attach, save, train; got ')


@pytest.mark.parametrize(
    "answer, got",
    [
        ({"train", "save", "attach"}, "a set ("),
        (frozenset(KEY), "a frozenset ("),
        ({"train": 1, "save": 2, "attach": 3}, "dict {"),
        (3, "int 3"),
        (2.5, "float 2.5"),
        ("train", "a str ('train') that does not split into labels"),
        ("trainsaveattach", "a str ('trainsaveattach') that does not split into labels"),
        (np.array([1, 2, 3]), "numpy.ndarray of dtype int64 of shape (3,), not a 1-D array of label strings"),
        (np.array([KEY]), "numpy.ndarray of dtype <U6 of shape (1, 3), not a 1-D array of label strings"),
        (None, None),
    ],
)
def test_ordering_rejects_unordered_or_malformed_answers_with_the_expected_form(answer, got, capfd):
    fb = _silent(capfd, check_ordering, answer, KEY, 2)
    assert fb.points == 0 and len(fb.lines) == 1
    if got is None:
        assert fb.lines[0].startswith("No answer yet.")
    else:
        assert fb.lines[0].startswith(FORM + got), fb.lines
    if isinstance(answer, (set, frozenset)):
        assert "a set has no order" in fb.lines[0]


def test_ordering_set_is_rejected_even_when_it_happens_to_iterate_in_order(capfd):
    class Ordered(set):  # a set whose iteration order is the key: still no order to grade
        def __iter__(self):
            return iter(KEY)

    fb = _silent(capfd, check_ordering, Ordered(KEY), KEY, 2)
    assert fb.points == 0 and "a set has no order" in fb.lines[0]


def test_ordering_message_lists_labels_alphabetically_not_in_key_order(capfd):
    key = ["warmup", "know", "practice", "reps", "further"]
    fb = _silent(capfd, check_ordering, 5, key, 1)
    assert "using the labels further, know, practice, reps, warmup;" in fb.lines[0]
    assert ", ".join(key) not in fb.lines[0]
