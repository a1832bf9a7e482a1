"""Lesson 02 ("LoRA inside one matmul"): the counting items and P6's prediction, each key recomputed here from first
principles (not from coursekit.lora), and each named mistake caught only when it was made."""

import numpy as np
import pytest
import torch

from coursekit.grading import check, keys

R = 8
Q = (2048, 2048)   # q_proj, d × m
V = (2048, 512)    # v_proj of a grouped-query layer


def _count(d, m, r=R):
    return d * r + r * m   # A is d × r, B is r × m


def test_p3_counts_both_adapters_and_names_the_square_v_proj():
    assert check("02.p3", _count(*Q) + _count(*V)).points == 1
    fb = check("02.p3", 2 * _count(*Q))
    assert fb.points == 0 and "2048 × 2048" in fb.text() and "512" in fb.text()
    fb = check("02.p3", _count(*Q))
    assert fb.points == 0 and "q_proj's adapter alone" in fb.text()
    assert "Likely mistake" not in check("02.p3", 12345).text()


def test_p4_pools_the_two_layers_and_names_the_mean_of_percentages():
    pooled = 100 * (_count(*Q) + _count(*V)) / (Q[0] * Q[1] + V[0] * V[1])
    assert pooled == pytest.approx(1.015625)
    assert check("02.p4", pooled).points == 1
    mean = 50 * (_count(*Q) / (Q[0] * Q[1]) + _count(*V) / (V[0] * V[1]))
    assert mean != pytest.approx(pooled, rel=1e-3)
    fb = check("02.p4", mean)
    assert fb.points == 0 and "averages the two layers' percentages" in fb.text()
    assert "percent" in check("02.p4", pooled / 100).text()


def test_p7_is_the_largest_rank_below_break_even_of_a_non_square_matrix():
    d, m = 576, 192
    key = max(r for r in range(1, m + 1) if r * (d + m) < d * m)
    assert key == 143 and 144 * (d + m) == d * m           # break-even d·m/(d + m) = 144 exactly: not smaller
    assert check("02.p7", key).points == 1
    assert "not smaller" in check("02.p7", 144).text()
    assert "576 × 576" in check("02.p7", 287).text()


def test_p6_scaling_x_by_a_power_of_two_scales_the_rounding_difference_exactly():
    """The key, measured: ×1024 multiplies the largest |unmerged − merged| by exactly 1024 in NumPy and torch; ×1000
    does not (the ratio wanders), which is what option c would describe."""
    ratios_1000 = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((16, 64)).astype(np.float32)
        W = rng.standard_normal((64, 32)).astype(np.float32)
        A = (0.1 * rng.standard_normal((64, 4))).astype(np.float32)
        B = (0.1 * rng.standard_normal((4, 32))).astype(np.float32)
        s = np.float32(16 / 4)

        def gap(X):
            return np.abs((X @ W + s * ((X @ A) @ B)) - X @ (W + s * (A @ B))).max()

        def gap_t(X):
            Xt, Wt, At, Bt = map(torch.from_numpy, (X, W, A, B))
            return ((Xt @ Wt + 4.0 * ((Xt @ At) @ Bt)) - Xt @ (Wt + 4.0 * (At @ Bt))).abs().max().item()

        assert gap(X) > 0 and gap_t(X) > 0                                   # not bit-identical (option a's premise)
        assert gap(X * np.float32(1024)) == 1024 * gap(X)
        assert gap_t(X * np.float32(1024)) == 1024 * gap_t(X)
        ratios_1000.append(gap(X * np.float32(1000)) / gap(X))
    assert any(r != pytest.approx(1000, rel=1e-6) for r in ratios_1000)
    assert keys.load("02")["keys"]["p6"] == "b"
    assert check("02.p6", "b").points == 1
    assert all(check("02.p6", wrong).points == 0 for wrong in "acd")
