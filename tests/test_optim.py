"""coursekit.optim: ownership helpers against torch.optim.AdamW, the factor-update algebra against the expanded
product, rescaling against autograd, the Newton–Schulz experiment, and clear errors for bad input; plus the
opt-in preflight checks of coursekit.train on a tiny PEFT-shaped model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coursekit import optim, train, walk


def _rand(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("seed", range(5))
def test_factor_update_is_the_exact_change_of_sAB(seed):
    rng = np.random.default_rng(seed)
    d, m, r = (int(x) for x in rng.integers(1, 7, 3))
    A, B, dA, dB = _rand(rng, d, r), _rand(rng, r, m), _rand(rng, d, r), _rand(rng, r, m)
    s = float(rng.uniform(0.1, 4))
    want = s * (A + dA) @ (B + dB) - s * A @ B
    np.testing.assert_allclose(optim.factor_update(A, B, dA, dB, s), want, rtol=1e-10, atol=1e-12)
    cross = optim.factor_update(A, B, dA, dB, s) - optim.first_order_update(A, B, dA, dB, s)
    np.testing.assert_allclose(cross, s * dA @ dB, rtol=1e-10, atol=1e-12)
    # second order: halving both updates quarters the cross term
    half = optim.factor_update(A, B, dA / 2, dB / 2, s) - optim.first_order_update(A, B, dA / 2, dB / 2, s)
    np.testing.assert_allclose(half, cross / 4, rtol=1e-10, atol=1e-12)


def test_factor_update_accepts_tensors_and_rejects_bad_shapes():
    A, B = torch.ones(3, 2), torch.ones(2, 4)
    assert optim.factor_update(A, B, A, B, 1.0).shape == (3, 4)
    with pytest.raises(ValueError, match="share r"):
        optim.factor_update(np.ones((3, 2)), np.ones((3, 4)), np.ones((3, 2)), np.ones((3, 4)), 1.0)
    with pytest.raises(ValueError, match=r"dA must have A's shape \(3, 2\)"):
        optim.factor_update(np.ones((3, 2)), np.ones((2, 4)), np.ones((2, 3)), np.ones((2, 4)), 1.0)
    with pytest.raises(ValueError, match="dB must have B's shape"):
        optim.factor_update(np.ones((3, 2)), np.ones((2, 4)), np.ones((3, 2)), np.ones((4, 2)), 1.0)
    with pytest.raises(TypeError, match="A must be a 2-D float array"):
        optim.factor_update(np.ones(3), np.ones((2, 4)), np.ones(3), np.ones((2, 4)), 1.0)
    with pytest.raises(TypeError, match="float"):
        optim.factor_update(np.ones((3, 2), dtype=int), np.ones((2, 4)), np.ones((3, 2)), np.ones((2, 4)), 1.0)


def test_rescaling_keeps_the_product_and_scales_the_gradients_as_autograd_says():
    rng = np.random.default_rng(3)
    X, A, B, D, s, c = _rand(rng, 4, 5), _rand(rng, 5, 2), _rand(rng, 2, 3), _rand(rng, 4, 3), 1.5, 7.0
    Ac, Bc = optim.rescale_factors(A, B, c)
    np.testing.assert_allclose(Ac @ Bc, A @ B, rtol=1e-12)
    grads = []
    for a, b in ((A, B), (Ac, Bc)):
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        (s * (torch.tensor(X) @ ta) @ tb * torch.tensor(D)).sum().backward()
        grads.append((ta.grad.numpy(), tb.grad.numpy()))
    np.testing.assert_allclose(grads[1][0], grads[0][0] / c, rtol=1e-12)
    np.testing.assert_allclose(grads[1][1], grads[0][1] * c, rtol=1e-12)
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite nonzero"):
            optim.rescale_factors(A, B, bad)


@pytest.mark.parametrize("shape", [(16, 4), (4, 16), (8, 8), (32, 3)])
def test_newton_schulz_flattens_singular_values_and_keeps_vectors(shape):
    G = np.random.default_rng(sum(shape)).standard_normal(shape)
    O = optim.newton_schulz(G)
    assert O.shape == G.shape
    sv = np.linalg.svd(O, compute_uv=False)
    assert np.all((sv > 0.6) & (sv < 1.25)), sv
    U, _, Vt = np.linalg.svd(G, full_matrices=False)
    # same singular vectors: O is close to U Vᵀ up to the per-value error above
    np.testing.assert_allclose(U.T @ O @ Vt.T, np.diag(np.diag(U.T @ O @ Vt.T)), atol=1e-8)
    with pytest.raises(ValueError, match="steps"):
        optim.newton_schulz(G, steps=0)


def test_newton_schulz_of_zero_is_zero_and_muon_step_errors():
    assert not optim.newton_schulz(np.zeros((3, 2))).any()
    p, buf = optim.muon_factor_step(np.ones((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)), lr=0.1)
    np.testing.assert_array_equal(p, 1.0)
    with pytest.raises(ValueError, match="param's shape"):
        optim.muon_factor_step(np.ones((3, 2)), np.ones((2, 3)), np.zeros((3, 2)), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        optim.muon_factor_step(np.ones((3, 2)), np.ones((3, 2)), np.zeros((3, 2)), lr=-1)


# --------------------------------------------------------------------------- ownership and preflight on a toy


class _Adapted(torch.nn.Module):
    """A PEFT-shaped adapted linear layer (base_layer, lora_A.default, lora_B.default), row-vector math inside."""

    def __init__(self, d, m, r=2, s=2.0):
        super().__init__()
        self.base_layer = torch.nn.Linear(d, m)
        self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(d, r, bias=False)})
        self.lora_B = torch.nn.ModuleDict({"default": torch.nn.Linear(r, m, bias=False)})
        torch.nn.init.zeros_(self.lora_B["default"].weight)
        self.base_layer.requires_grad_(False)
        self.s = s

    def forward(self, x):
        return self.base_layer(x) + self.s * self.lora_B["default"](self.lora_A["default"](x))


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = _Adapted(6, 16), _Adapted(16, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _toy():
    torch.manual_seed(0)
    return _Toy()


def _loss(m, b):
    return F.cross_entropy(m(b["x"]), b["y"])


BATCH = {"x": torch.randn(12, 6, generator=torch.Generator().manual_seed(2)),
         "y": torch.randint(0, 3, (12,), generator=torch.Generator().manual_seed(3))}
IS_ADAPTER = lambda n: "lora_" in n  # noqa: E731


def test_trainable_params_and_state_bytes_match_adamw():
    m = _toy()
    params = optim.trainable_params(m)
    assert [n for n, *_ in optim.named_trainable(m)] == [n for n, p in m.named_parameters() if "lora_" in n]
    opt = torch.optim.AdamW(params, lr=1e-2)
    assert optim.optimizer_state_bytes(opt) == 0 and optim.owned_params(opt) == params
    _loss(m, BATCH).backward()
    opt.step()
    n = sum(p.numel() for p in params)
    assert optim.optimizer_state_bytes(opt) == 8 * n + 4 * len(params)
    with pytest.raises(TypeError, match="nn.Module"):
        optim.trainable_params([torch.zeros(1)])
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        optim.optimizer_state_bytes({"state": {}})


def test_adamw_decays_a_zero_gradient_but_skips_none_like_the_reference():
    pz, pn = torch.nn.Parameter(torch.full((2,), 3.0, dtype=torch.float64)), torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt = torch.optim.AdamW([pz, pn], lr=0.05, weight_decay=0.2)
    ref, st = np.full(2, 3.0), walk.AdamWState.zeros_like(np.full(2, 3.0))
    for _ in range(3):
        pz.grad, pn.grad = torch.zeros(2, dtype=torch.float64), None
        opt.step()
        ref, st = walk.adamw_step(ref, np.zeros(2), st, lr=0.05, weight_decay=0.2)
    np.testing.assert_allclose(pz.detach().numpy(), ref, rtol=1e-14)
    np.testing.assert_allclose(ref, 3.0 * 0.99**3, rtol=1e-14)
    assert torch.equal(pn, torch.ones(2, dtype=torch.float64)) and pn not in opt.state


def test_preflight_full_passes_and_restores_everything():
    m = _toy()
    opt = torch.optim.AdamW(optim.trainable_params(m), lr=5e-2, weight_decay=0.01)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    rep = train.preflight(m, BATCH, loss_fn=_loss, optimizer=opt, trainable=IS_ADAPTER, overfit_steps=40)
    assert rep["trainable"] == sum(p.numel() for p in optim.trainable_params(m)) and rep["tensors"] == 4
    assert rep["frozen_checked"] == 4 and rep["unexpected"] == []
    assert rep["losses"][-1] < rep["losses"][0] / 2 and len(rep["losses"]) == 42
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())
    assert len(opt.state) == 0 and all(p.grad is None for p in m.parameters())
    # the default call keeps the capstone's contract: these keys, no optimizer needed
    assert {"loss", "trainable", "total", "tensors"} <= set(train.preflight(m, BATCH, loss_fn=_loss))


def test_preflight_catches_a_frozen_adapter():
    m = _toy()
    for n, p in m.named_parameters():
        if "lora_A" in n:
            p.requires_grad_(False)
    with pytest.raises(train.PreflightError, match="not trainable"):
        train.preflight(m, BATCH, loss_fn=_loss, trainable=IS_ADAPTER)


def test_preflight_catches_a_frozen_weight_that_decays():
    m = _toy()
    for n, p in m.named_parameters():
        if not IS_ADAPTER(n):
            p.requires_grad_(True)
            p.register_hook(torch.zeros_like)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    with pytest.raises(train.PreflightError, match="frozen tensors changed.*base_layer"):
        train.preflight(m, BATCH, loss_fn=_loss, optimizer=opt, trainable=IS_ADAPTER)
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())  # restored even on failure
    # without weight decay the zero gradients move nothing: the check passes, and reports the surprise
    m2 = _toy()
    for n, p in m2.named_parameters():
        if not IS_ADAPTER(n):
            p.requires_grad_(True)
            p.register_hook(torch.zeros_like)
    rep = train.preflight(m2, BATCH, loss_fn=_loss, trainable=IS_ADAPTER,
                          optimizer=torch.optim.AdamW(m2.parameters(), lr=1e-2, weight_decay=0.0))
    assert len(rep["unexpected"]) == 4


def test_preflight_catches_nan_loss_missing_ownership_and_no_learning():
    m = _toy()
    bad = {"x": BATCH["x"].clone(), "y": BATCH["y"]}
    bad["x"][0, 0] = float("nan")
    with pytest.raises(train.PreflightError, match="loss is nan"):
        train.preflight(m, bad, loss_fn=_loss)
    only_A = [p for n, p in m.named_parameters() if "lora_A" in n]
    with pytest.raises(train.PreflightError, match="not in the optimizer"):
        train.preflight(m, BATCH, loss_fn=_loss, optimizer=torch.optim.AdamW(only_A, lr=1e-2))
    frozen_lr = torch.optim.AdamW(optim.trainable_params(m), lr=0.0)
    with pytest.raises(train.PreflightError, match="cannot memorise one batch"):
        train.preflight(m, BATCH, loss_fn=_loss, optimizer=frozen_lr, overfit_steps=5)


def test_preflight_argument_errors():
    m = _toy()
    with pytest.raises(ValueError, match="needs an optimizer"):
        train.preflight(m, BATCH, loss_fn=_loss, overfit_steps=3)
    with pytest.raises(ValueError, match="overfit_steps"):
        train.preflight(m, BATCH, loss_fn=_loss, overfit_steps=-1)
    with pytest.raises(ValueError, match="overfit_factor"):
        train.preflight(m, BATCH, loss_fn=_loss, optimizer=torch.optim.SGD(optim.trainable_params(m), lr=0.1), overfit_factor=1.0)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        train.preflight(m, BATCH, loss_fn=_loss, optimizer="adamw")
    with pytest.raises(TypeError, match="nn.Module"):
        train.preflight(lambda x: x, BATCH)
