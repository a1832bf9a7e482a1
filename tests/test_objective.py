"""coursekit.objective: oracle logits, the hand shift, token- vs example-weighted losses, bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit import objective
from coursekit.data import IGNORE_INDEX, EmptyBatchError, count_supervised, token_loss_sum


def _random_batch(seed: int, B: int, T: int, V: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (B, T), generator=g)
    for b in range(B):
        p = int(torch.randint(0, T - 1, (1,), generator=g))
        labels[b, :p] = IGNORE_INDEX
    return logits, labels


def _loop_losses(logits, labels):
    """Per-row (sum, count) by an explicit double loop over positions: the slow, obvious reference."""
    out = []
    for b in range(labels.shape[0]):
        s, n = 0.0, 0
        for t in range(1, labels.shape[1]):
            y = int(labels[b, t])
            if y != IGNORE_INDEX:
                s -= float(F.log_softmax(logits[b, t - 1], dim=-1)[y])
                n += 1
        out.append((s, n))
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 4), T=st.integers(2, 8), V=st.integers(2, 9))
def test_per_row_and_both_weightings_match_an_explicit_loop(seed, B, T, V):
    logits, labels = _random_batch(seed, B, T, V)
    ref = _loop_losses(logits, labels)
    sums, counts = objective.per_row_loss(logits, labels)
    assert counts.tolist() == [n for _, n in ref]
    torch.testing.assert_close(sums, torch.tensor([s for s, _ in ref], dtype=torch.float64))
    total_n = sum(n for _, n in ref)
    if total_n == 0:
        with pytest.raises(EmptyBatchError):
            objective.token_weighted_loss(logits, labels)
        return
    tw = objective.token_weighted_loss(logits, labels)
    assert math.isclose(float(tw), sum(s for s, _ in ref) / total_n, rel_tol=1e-9)
    assert math.isclose(float(tw), float(token_loss_sum(logits, labels)) / count_supervised(labels), rel_tol=1e-12)
    if all(n > 0 for _, n in ref):
        ew = objective.example_weighted_loss(logits, labels)
        assert math.isclose(float(ew), sum(s / n for s, n in ref) / B, rel_tol=1e-9)


def test_weightings_differ_with_unequal_counts_and_agree_with_equal_counts():
    logits, _ = _random_batch(7, 2, 8, 5)
    labels = torch.randint(0, 5, (2, 8), generator=torch.Generator().manual_seed(8))
    labels[0, :6] = IGNORE_INDEX  # row 0: 2 supervised, row 1: 7
    labels[1, :1] = IGNORE_INDEX
    assert objective.per_row_loss(logits, labels)[1].tolist() == [2, 7]
    assert abs(float(objective.token_weighted_loss(logits, labels) - objective.example_weighted_loss(logits, labels))) > 1e-3
    labels[1, :6] = IGNORE_INDEX  # now 2 and 2
    torch.testing.assert_close(objective.token_weighted_loss(logits, labels), objective.example_weighted_loss(logits, labels))


def test_oracle_logits_and_the_double_shift():
    ids = torch.tensor([[0, 3, 4, 5, 6, 2], [1, 1, 7, 3, 4, 2]])
    V, margin = 8, 6.0
    logits = objective.oracle_logits(ids, V, margin)
    assert logits.shape == (2, 6, V) and logits.dtype == torch.float64
    assert torch.equal(logits[:, :-1].argmax(-1), ids[:, 1:])
    assert torch.count_nonzero(logits[:, -1]) == 0
    per_position = math.log1p((V - 1) * math.exp(-margin))
    assert math.isclose(float(objective.token_weighted_loss(logits, ids)), per_position, rel_tol=1e-9)
    # Shifted twice: every scored target differs from the oracle's pick, so each position costs margin more.
    row0 = ids[:1]
    twice = objective.token_weighted_loss(objective.oracle_logits(row0, V, margin), objective.shift_left(row0))
    assert math.isclose(float(twice), margin + per_position, rel_tol=1e-9)
    # transformers' own loss shifts the same way
    from transformers.loss.loss_utils import ForCausalLMLoss

    hf = ForCausalLMLoss(objective.oracle_logits(row0, V, margin), objective.shift_left(row0), vocab_size=V)
    assert math.isclose(float(hf), float(twice), rel_tol=1e-5)


def test_shift_left_is_a_copy_with_minus_100_at_the_end():
    labels = torch.tensor([[5, 6, 7], [IGNORE_INDEX, 1, 2]])
    out = objective.shift_left(labels)
    assert out.tolist() == [[6, 7, IGNORE_INDEX], [1, 2, IGNORE_INDEX]]
    assert labels.tolist() == [[5, 6, 7], [IGNORE_INDEX, 1, 2]]  # input untouched


def test_empty_rows_and_batches_are_rejected():
    logits, labels = _random_batch(1, 2, 5, 4)
    labels[0] = IGNORE_INDEX
    with pytest.raises(EmptyBatchError, match=r"rows \[0\]"):
        objective.example_weighted_loss(logits, labels)
    objective.token_weighted_loss(logits, labels)  # row 1 still has tokens: fine
    labels[1, 1:] = IGNORE_INDEX  # only position 0 left: no logit predicts it
    with pytest.raises(EmptyBatchError, match="0/0"):
        objective.token_weighted_loss(logits, labels)


def test_bfloat16_logits_are_upcast():
    logits, labels = _random_batch(2, 2, 6, 5)
    sums16, _ = objective.per_row_loss(logits.bfloat16(), labels)
    assert sums16.dtype == torch.float32
    torch.testing.assert_close(sums16.double(), objective.per_row_loss(logits, labels)[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "call, exc, text",
    [
        (lambda: objective.oracle_logits([[1, 2]], 4), TypeError, "input_ids must be a torch.Tensor"),
        (lambda: objective.oracle_logits(torch.tensor([1, 2]), 4), ValueError, "input_ids must be 2-D"),
        (lambda: objective.oracle_logits(torch.tensor([[1.0, 2.0]]), 4), TypeError, "int64"),
        (lambda: objective.oracle_logits(torch.tensor([[1, 5]]), 4), ValueError, r"\[0, 4\)"),
        (lambda: objective.oracle_logits(torch.tensor([[1, 2]]), 1), ValueError, "vocab_size"),
        (lambda: objective.oracle_logits(torch.tensor([[1, 2]]), 4, margin=0.0), ValueError, "margin"),
        (lambda: objective.shift_left(torch.tensor([1, 2])), ValueError, "labels must be 2-D"),
        (lambda: objective.per_row_loss(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)), ValueError, "logits must be"),
        (lambda: objective.per_row_loss(torch.zeros(2, 3, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long)), TypeError, "floating-point"),
        (lambda: objective.token_weighted_loss(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long)), ValueError, r"\[B, T, V\]"),
    ],
)
def test_bad_input_names_the_argument(call, exc, text):
    with pytest.raises(exc, match=text):
        call()
