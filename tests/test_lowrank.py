"""coursekit.lowrank: SVD truncation against brute force and torch, Eckart–Young residuals, PEFT's
per-module rank/alpha matching against PEFT itself, and clear errors for bad input."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from coursekit import lora, lowrank

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)

SEED = (4.0, 2.0, 1.0, 0.5)


# --------------------------------------------------------------------------- SVD and truncation


@pytest.mark.parametrize("d, m", [(4, 4), (7, 3), (3, 6), (1, 5)])
def test_with_singular_values_has_that_spectrum(d, m):
    rng = np.random.default_rng(d * 10 + m)
    sigma = np.sort(rng.uniform(0.1, 3, size=min(d, m)))[::-1]
    M = lowrank.with_singular_values(sigma, d, m, rng)
    assert M.shape == (d, m) and M.dtype == np.float64
    np.testing.assert_allclose(lowrank.singular_values(M), sigma, rtol=1e-12)


def test_with_singular_values_is_reproducible_and_accepts_fewer_values():
    a = lowrank.with_singular_values(SEED, 6, 5, 3)
    b = lowrank.with_singular_values(SEED, 6, 5, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert np.linalg.matrix_rank(a) == 4


@pytest.mark.parametrize("seed", range(6))
def test_best_rank_k_has_rank_k_and_the_eckart_young_residual(seed):
    rng = np.random.default_rng(seed)
    d, m = int(rng.integers(2, 9)), int(rng.integers(2, 9))
    M = rng.standard_normal((d, m))
    S = np.linalg.svd(M, compute_uv=False)
    for k in range(min(d, m) + 1):
        Mk = lowrank.best_rank_k(M, k)
        assert Mk.shape == (d, m)
        assert np.linalg.matrix_rank(Mk) == k
        np.testing.assert_allclose(np.linalg.norm(M - Mk), math.sqrt(np.sum(S[k:] ** 2)), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lowrank.rank_k_residual(S, k), np.linalg.norm(M - Mk), rtol=1e-10, atol=1e-12)
        if k < min(d, m):
            np.testing.assert_allclose(np.linalg.norm(M - Mk, 2), S[k], rtol=1e-10)
            assert lowrank.rank_k_residual(S, k, norm="2") == pytest.approx(S[k])
    np.testing.assert_allclose(lowrank.best_rank_k(M, min(d, m)), M, atol=1e-12)


def test_best_rank_k_beats_random_rank_k_matrices():
    # Eckart–Young, checked by brute force: no random rank-2 matrix (even with its best scale) is closer.
    rng = np.random.default_rng(11)
    M = rng.standard_normal((5, 4))
    best = np.linalg.norm(M - lowrank.best_rank_k(M, 2))
    for _ in range(300):
        X = rng.standard_normal((5, 2)) @ rng.standard_normal((2, 4))
        c = np.sum(M * X) / np.sum(X * X)
        assert np.linalg.norm(M - c * X) >= best - 1e-12


def test_best_rank_k_matches_torch_svd_and_accepts_tensors_and_lists():
    rng = np.random.default_rng(5)
    M = rng.standard_normal((6, 4))
    U, S, Vh = torch.linalg.svd(torch.tensor(M), full_matrices=False)
    ref = (U[:, :2] * S[:2]) @ Vh[:2]
    np.testing.assert_allclose(lowrank.best_rank_k(torch.tensor(M), 2), ref.numpy(), atol=1e-12)
    np.testing.assert_allclose(lowrank.best_rank_k(M.tolist(), 2), ref.numpy(), atol=1e-12)
    assert lowrank.best_rank_k(M, 0).shape == (6, 4) and not lowrank.best_rank_k(M, 0).any()


def test_seed_spectrum_numbers():
    assert lowrank.rank_k_residual(SEED, 1) == pytest.approx(math.sqrt(5.25))
    assert round(lowrank.rank_k_residual(SEED, 1), 3) == 2.291
    np.testing.assert_allclose(lowrank.residual_curve(SEED), [math.sqrt(21.25), math.sqrt(5.25), math.sqrt(1.25), 0.5, 0.0])
    # order of the input does not matter
    np.testing.assert_allclose(lowrank.residual_curve([1, 0.5, 4, 2]), lowrank.residual_curve(SEED))
    assert lowrank.rank_k_residual([0.5, 4, 1, 2], 1) == pytest.approx(math.sqrt(5.25))


def test_residual_curve_is_non_increasing_and_matches_rank_k_residual():
    rng = np.random.default_rng(2)
    s = rng.uniform(0, 3, size=7)
    curve = lowrank.residual_curve(s)
    assert curve.shape == (8,) and curve[-1] == 0 and np.all(np.diff(curve) <= 0)
    np.testing.assert_allclose(curve, [lowrank.rank_k_residual(s, k) for k in range(8)])


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, exc, text",
    [
        (lambda: lowrank.best_rank_k(np.ones(4), 1), ValueError, "2-D"),
        (lambda: lowrank.best_rank_k(np.ones((3, 4)), 4), ValueError, "min(d, m) = 3"),
        (lambda: lowrank.best_rank_k(np.ones((3, 4)), -1), ValueError, "between 0"),
        (lambda: lowrank.best_rank_k(np.ones((3, 4)), 1.0), TypeError, "k must be an integer"),
        (lambda: lowrank.best_rank_k(np.ones((3, 4)), True), TypeError, "k must be an integer"),
        (lambda: lowrank.best_rank_k(np.array([[1.0, np.nan]]), 1), ValueError, "non-finite"),
        (lambda: lowrank.best_rank_k(np.array([["a", "b"]]), 1), TypeError, "numeric"),
        (lambda: lowrank.best_rank_k([[1.0, 2.0], [3.0]], 1), TypeError, "2-D array of numbers"),
        (lambda: lowrank.rank_k_residual([4, -1], 1), ValueError, ">= 0"),
        (lambda: lowrank.rank_k_residual([], 0), ValueError, "non-empty"),
        (lambda: lowrank.rank_k_residual([[1, 2]], 0), ValueError, "1-D"),
        (lambda: lowrank.rank_k_residual([4, 2], 3), ValueError, "between 0"),
        (lambda: lowrank.rank_k_residual([4, 2], 1, norm="nuc"), ValueError, "norm must be"),
        (lambda: lowrank.with_singular_values([1, 2, 3], 2, 5), ValueError, "at most min(d, m) = 2"),
        (lambda: lowrank.with_singular_values([1], 0, 5), ValueError, "d must be a positive integer"),
        (lambda: lowrank.pattern_key([3], "a.b"), TypeError, "pattern keys must be strings"),
        (lambda: lowrank.pattern_key(["b"], 3), TypeError, "module_name must be a str"),
        (lambda: lowrank.module_lora_settings("x.v_proj", 8, 16, {"v_proj": 0}), ValueError, "positive integer"),
    ],
)
def test_bad_input_raises_a_clear_error(call, exc, text):
    with pytest.raises(exc, match=None) as info:
        call()
    assert text in str(info.value)


# --------------------------------------------------------------------------- PEFT's rank_pattern / alpha_pattern

NAMES = ["layers.0.attn.q_proj", "layers.0.attn.v_proj", "layers.1.attn.v_proj", "layers.11.mlp.up_proj", "v_proj"]


@pytest.mark.parametrize(
    "keys",
    [["v_proj"], ["proj"], ["attn.v_proj"], ["layers.1.attn.v_proj"], ["1.attn.v_proj"], [r"layers\.1\d*\..*"],
     ["q_proj", "v_proj"], ["layers.0.attn.v_proj", "v_proj"], ["v_proj", "layers.0.attn.v_proj"], []],
)
def test_pattern_key_agrees_with_peft(keys):
    from peft.utils.other import get_pattern_key

    for name in NAMES:
        theirs = get_pattern_key(keys, name)
        assert lowrank.pattern_key(keys, name) == (None if theirs == name and name not in keys else theirs), (keys, name)


def test_suffix_rule_examples():
    assert lowrank.pattern_key(["v_proj"], "layers.1.attn.v_proj") == "v_proj"
    assert lowrank.pattern_key(["proj"], "layers.1.attn.v_proj") is None          # no dot before "proj"
    assert lowrank.pattern_key(["layers.0.attn.v_proj"], "layers.1.attn.v_proj") is None
    assert lowrank.pattern_key(["1.attn.v_proj"], "layers.11.attn.v_proj") is None


def test_module_settings_override_r_and_alpha_independently():
    rp, ap = {"v_proj": 32}, {"layers.0.attn.v_proj": 32}
    q = lowrank.module_lora_settings("layers.0.attn.q_proj", 8, 16, rp, ap)
    v0 = lowrank.module_lora_settings("layers.0.attn.v_proj", 8, 16, rp, ap)
    v1 = lowrank.module_lora_settings("layers.1.attn.v_proj", 8, 16, rp, ap)
    assert (q["r"], q["lora_alpha"], q["scaling"], q["rank_key"]) == (8, 16.0, 2.0, None)
    assert (v0["r"], v0["lora_alpha"], v0["scaling"]) == (32, 32.0, 1.0)
    assert (v1["r"], v1["lora_alpha"], v1["scaling"], v1["alpha_key"]) == (32, 16.0, 0.5, None)
    rs = lowrank.module_lora_settings("layers.1.attn.v_proj", 8, 16, rp, ap, use_rslora=True)
    assert rs["scaling"] == pytest.approx(16 / math.sqrt(32))


def test_module_settings_match_a_real_peft_model():
    from peft import LoraConfig, get_peft_model
    from torch import nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.v_proj = nn.Linear(8, 8, bias=False), nn.Linear(8, 4, bias=False)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attn()

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block() for _ in range(3)])

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                     rank_pattern={"layers.2.attn.q_proj": 6, "v_proj": 2}, alpha_pattern={"layers.1.attn.v_proj": 1, "q_proj": 3})
    model = get_peft_model(Tiny(), cfg)
    seen = 0
    for name, mod in model.base_model.model.named_modules():
        if isinstance(getattr(mod, "r", None), dict) and "default" in mod.r:
            ours = lowrank.module_lora_settings(name, cfg.r, cfg.lora_alpha, cfg.rank_pattern, cfg.alpha_pattern)
            assert ours["r"] == mod.r["default"] == mod.lora_A["default"].weight.shape[0], name
            assert ours["lora_alpha"] == mod.lora_alpha["default"], name
            assert ours["scaling"] == pytest.approx(mod.scaling["default"]), name
            assert ours["scaling"] == pytest.approx(lora.scaling(ours["lora_alpha"], ours["r"]))
            seen += 1
    assert seen == 6
