"""Lesson 09 ("Gated MLP backward"): graded items score right answers fully, the classic gated-MLP mistakes
(SiLU′ as σ or σ′, dG without U, dU with G, one branch of dX, a forgotten residual) lose points with a
diagnosis that names them, and the notebook's test cells agree with the item registry."""

import json
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from coursekit import mlp
from coursekit.grading import check
from coursekit.grading.lessons import lesson09
from coursekit.grading.lessons.lesson09 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
LID = "09-gated-mlp-backward"
NOTEBOOK = ROOT / "solutions" / LID / f"{LID}.ipynb"
F = torch.nn.functional


# --------------------------------------------------------------------------- students


def _sig(x):
    return 1 / (1 + np.exp(-np.clip(x, -700, 700)))


def silu_grad_right(x):
    s = _sig(x)
    return s * (1 + x * (1 - s))


def swish_right(x, beta):
    """Right for P1: the product rule and the chain rule on x·σ(βx)."""
    s = _sig(beta * x)
    return s + x * beta * s * (1 - s)


def swish_torch(x, beta):
    """Autograd instead of a formula: a tensor that required grad comes back."""
    t = torch.tensor(x, requires_grad=True)
    (t * torch.sigmoid(beta * t)).sum().backward()
    return t.grad


def swish_naive(x, beta):
    """exp(βx) / (1 + exp(βx)) overflows to NaN for large βx."""
    s = np.exp(beta * x) / (1 + np.exp(beta * x))
    return s * (1 + beta * x * (1 - s))


def swiglu_right(dH, G, U):
    return dH * U * silu_grad_right(G), dH * G * _sig(G)


def swiglu_no_U(dH, G, U):
    return dH * silu_grad_right(G), dH * G * _sig(G)


def swiglu_dU_with_G(dH, G, U):
    return dH * U * silu_grad_right(G), dH * G


def swiglu_sigma(dH, G, U):
    return dH * U * _sig(G), dH * G * _sig(G)


def swiglu_swapped(dH, G, U):
    return swiglu_right(dH, G, U)[::-1]


def _forward(X, W_gate, W_up):
    G, U = X @ W_gate, X @ W_up
    return G, U, G * _sig(G) * U


def mlp_right(dY, X, W_gate, W_up, W_down):
    G, U, H = _forward(X, W_gate, W_up)
    dG, dU = swiglu_right(dY @ W_down.T, G, U)
    return dG @ W_gate.T + dU @ W_up.T, X.T @ dG, X.T @ dU, H.T @ dY


def mlp_torch(dY, X, W_gate, W_up, W_down):
    t = [torch.tensor(v, requires_grad=True) for v in (X, W_gate, W_up, W_down)]
    Y = (F.silu(t[0] @ t[1]) * (t[0] @ t[2])) @ t[3]
    Y.backward(torch.tensor(dY))
    return tuple(v.grad for v in t)


def mlp_gate_only(dY, X, W_gate, W_up, W_down):
    dX, dWg, dWu, dWd = mlp_right(dY, X, W_gate, W_up, W_down)
    G, U, _ = _forward(X, W_gate, W_up)
    dG, _ = swiglu_right(dY @ W_down.T, G, U)
    return dG @ W_gate.T, dWg, dWu, dWd


def mlp_overwritten(dY, X, W_gate, W_up, W_down):
    """dX assigned per projection in a loop: the up branch overwrites the gate branch."""
    _, dWg, dWu, dWd = mlp_right(dY, X, W_gate, W_up, W_down)
    G, U, _ = _forward(X, W_gate, W_up)
    dG, dU = swiglu_right(dY @ W_down.T, G, U)
    for dP, W in ((dG, W_gate), (dU, W_up)):
        dX = dP @ W.T
    return dX, dWg, dWu, dWd


def mlp_dU_with_G(dY, X, W_gate, W_up, W_down):
    G, U, H = _forward(X, W_gate, W_up)
    dG, dU = swiglu_dU_with_G(dY @ W_down.T, G, U)
    return dG @ W_gate.T + dU @ W_up.T, X.T @ dG, X.T @ dU, H.T @ dY


def mlp_no_silu_in_H(dY, X, W_gate, W_up, W_down):
    dX, dWg, dWu, _ = mlp_right(dY, X, W_gate, W_up, W_down)
    return dX, dWg, dWu, ((X @ W_gate) * (X @ W_up)).T @ dY


def mlp_dW_transposed(dY, X, W_gate, W_up, W_down):
    dX, dWg, dWu, dWd = mlp_right(dY, X, W_gate, W_up, W_down)
    return dX, dWg.T, dWu, dWd


def mlp_hard_coded(dY, X, W_gate, W_up, W_down):
    return mlp_right(**lesson09._p3_public()[0].kwargs)


def _stack(mlp_dX=lambda dZ, Z, g, u, d: mlp_right(dZ, Z, g, u, d)[0], skip=True, reverse=True, upstream_dY=False,
           at_X=False):
    """A student's residual_stack_backward: right by default; each keyword is one classic slip."""
    def fn(dY, X, W_gate, W_up, W_down):
        inputs, Z = [], X
        for g, u, d in zip(W_gate, W_up, W_down):
            inputs.append(X if at_X else Z)
            Z = Z + _forward(Z, g, u)[2] @ d
        if upstream_dY:
            return dY + sum(mlp_dX(dY, inputs[l], W_gate[l], W_up[l], W_down[l]) for l in range(len(inputs)))
        dZ = dY
        for l in (reversed(range(len(inputs))) if reverse else range(len(inputs))):
            dZ = (dZ if skip else 0) + mlp_dX(dZ, inputs[l], W_gate[l], W_up[l], W_down[l])
        return dZ
    return fn


residual_right = _stack()
residual_forgot = _stack(skip=False)
residual_gate_only = _stack(mlp_dX=lambda dZ, Z, g, u, d: mlp_gate_only(dZ, Z, g, u, d)[0])


def residual_skip_only(dY, X, W_gate, W_up, W_down):
    return dY.copy()


def residual_torch(dY, X, W_gate, W_up, W_down):
    """Right, by autograd through the stack."""
    Xt = torch.tensor(X, requires_grad=True)
    Z = Xt
    for g, u, d in zip(W_gate, W_up, W_down):
        Z = Z + (F.silu(Z @ torch.tensor(g)) * (Z @ torch.tensor(u))) @ torch.tensor(d)
    Z.backward(torch.tensor(dY))
    return Xt.grad


RIGHT = {"w1": "c", "w2": 0.5, "w3": "d", "p1": swish_right, "p2": swiglu_right, "p3": mlp_right,
         "p4": residual_right, "p5": "c", "p6": -1.0436307777567597, "p7": 2_654_208}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def _nbgrader_cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]


def test_notebook_p6_case_is_the_graded_case():
    nb, _ = _nbgrader_cells()
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# The P6 case."))
    ns: dict = {}
    exec(cell.source, ns)
    for k, v in lesson09.P6_CASE.items():
        assert ns[f"{k}_p6"] == v, k


def test_p6_answer_leaks_nowhere_in_the_release():
    text = (ROOT / "lessons" / LID / f"{LID}.ipynb").read_text()
    assert "1.0436" not in text and "101376" not in text and "101_376" not in text


def test_p6_and_p7_expected_values_by_hand():
    # One number wide: G = 0.5, U = −1.5, dH = 2; dG = 2·(−1.5)·SiLU′(0.5), dU = 2·SiLU(0.5); dx = 1 + 0.5 dG − 1.5 dU.
    dG = 2 * -1.5 * mlp.silu_grad(0.5)
    dU = 2 * mlp.silu(0.5)
    assert ITEMS["p6"].expected() == pytest.approx(1 + 0.5 * dG - 1.5 * dU, rel=1e-12) == pytest.approx(RIGHT["p6"])
    assert ITEMS["p7"].expected() == 3 * 576 * 1536 == 2_654_208


def test_p6_mistakes_are_distinct_from_each_other_and_the_answer():
    values = [ITEMS["p6"].expected()] + [m.value for m in lesson09._p6_mistakes()]
    for i, a in enumerate(values):
        for b in values[i + 1:]:
            assert abs(a - b) > 1e-3, values


def test_hidden_cases_have_f_wider_than_d_and_vary():
    rng = np.random.default_rng(0)
    cases = lesson09._p3_hidden(rng)
    assert len(cases) == 5
    for c in cases:
        d, f = c.kwargs["W_gate"].shape
        assert f > d and c.kwargs["W_down"].shape == (f, d)
    big = lesson09._p1_hidden(np.random.default_rng(1))[-1].kwargs["x"]
    assert np.sum(np.abs(big) >= 30) >= 6  # the overflow check
    assert np.any(np.abs(big) < 5)  # and moderate x, where σ(x) (a wrong slope) differs from SiLU′


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden, capfd):
    fb = check(f"09.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()
    assert capfd.readouterr().err == ""


def test_autograd_answers_score_full():
    assert check("09.p1", swish_torch, hidden=True).full


def test_p1_is_silus_slope_at_beta_one_and_differs_elsewhere():
    """The key is measured: autograd through x·σ(βx) (above), SiLU′ at β = 1, and a different slope at the other β."""
    cases = lesson09._p1_public() + list(lesson09._p1_hidden(np.random.default_rng(0)))
    assert cases[0].kwargs["beta"] == 1.0
    np.testing.assert_allclose(lesson09.swish_grad_ref(**cases[0].kwargs), mlp.silu_grad(cases[0].kwargs["x"]), rtol=1e-15)
    others = [c for c in cases if c.kwargs["beta"] != 1.0]
    assert len(others) >= 4
    for c in others:
        assert not np.allclose(lesson09.swish_grad_ref(**c.kwargs), mlp.silu_grad(c.kwargs["x"]))
    t = torch.linspace(-3, 3, 7, dtype=torch.float64, requires_grad=True)
    (t * torch.sigmoid(lesson09.GELU_BETA * t)).sum().backward()
    np.testing.assert_allclose(lesson09.swish_grad_ref(t.detach().numpy(), lesson09.GELU_BETA), t.grad.numpy(), rtol=1e-12)
    assert check("09.p3", mlp_torch, hidden=True).full
    assert check("09.p4", residual_torch, hidden=True).full


def test_p4_cases_stack_several_blocks():
    cases = lesson09._p4_public() + list(lesson09._p4_hidden(np.random.default_rng(0)))
    depths = [c.kwargs["W_gate"].shape[0] for c in cases]
    assert 1 in depths and sum(L >= 2 for L in depths) >= 4 and max(depths) >= 3


def test_p4_copying_the_one_block_rule_fails_on_stacks():
    """Know this's dX = dY + (MLP's dX), with the stack's first block only, is right for L = 1 alone."""
    fb = check("09.p4", lambda dY, X, W_gate, W_up, W_down: dY + mlp_right(dY, X, W_gate[0], W_up[0], W_down[0])[0])
    assert 0 < fb.points < 1 and "public case 1" in fb.text() and "✗ public case 2" in fb.text(), fb.text()


def test_hidden_cases_are_deterministic():
    a = check("09.p3", mlp_right, hidden=True).text()
    b = check("09.p3", mlp_right, hidden=True).text()
    assert a == b and a.count("hidden case") == 5


def test_hard_coded_answer_fails_hidden_cases():
    fb = check("09.p3", mlp_hard_coded, hidden=True)
    assert fb.points <= 4 * 1 / 8 + 1e-9 and "hidden case" in fb.text()


# --------------------------------------------------------------------------- wrong answers: functions


def _likely(fb):
    return " ".join(l.strip() for l in fb.lines if "Likely mistake:" in l)


@pytest.mark.parametrize(
    "item_id, fn, words",
    [
        ("p1", lambda x, beta: _sig(beta * x), "the slope taken as σ(βx)"),
        ("p1", lambda x, beta: _sig(beta * x) * (1 - _sig(beta * x)), "the sigmoid's own slope"),
        ("p1", lambda x, beta: x * _sig(beta * x), "swish_β(x) = x·σ(βx) itself"),
        ("p1", lambda x, beta: silu_grad_right(x), "that is SiLU′(x)"),
        ("p1", lambda x, beta: _sig(beta * x) * (1 + x * (1 - _sig(beta * x))), "the chain rule's β is missing"),
        ("p1", lambda x, beta: beta * silu_grad_right(beta * x), "you multiplied SiLU′(βx) by β"),
        ("p2", swiglu_no_U, "dG is missing the factor U"),
        ("p2", swiglu_dU_with_G, "dU uses G where SiLU(G) belongs"),
        ("p2", swiglu_sigma, "in dG = dH ⊙ U ⊙ SiLU′(G): SiLU′ taken as σ(x)"),
        ("p2", swiglu_swapped, "did you swap the two outputs?"),
        ("p3", mlp_gate_only, "dX has the gate branch dG W_gateᵀ only"),
        ("p3", mlp_overwritten, "overwritten"),
        ("p3", mlp_dU_with_G, "in the up branch of dX: dU uses G where SiLU(G) belongs"),
        ("p3", mlp_no_silu_in_H, "you used G ⊙ U"),
        ("p4", residual_forgot, "forgot the residuals"),
        ("p4", residual_skip_only, "you returned dY only"),
        ("p4", residual_gate_only, "the same slip in every block's MLP (P3's mlp_backward): dX has the gate branch"),
        ("p4", _stack(upstream_dY=True), "you handed dY to every block"),
        ("p4", _stack(reverse=False), "in the forward order"),
        ("p4", _stack(at_X=True), "at the stack's input X"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_function_mistakes_are_named(item_id, fn, words, hidden, capfd):
    fb = check(f"09.{item_id}", fn, hidden=hidden)
    assert not fb.full, fb.text()
    assert words in _likely(fb), fb.text()
    assert capfd.readouterr().err == ""


def test_dW_transposed_is_named():
    fb = check("09.p3", mlp_dW_transposed)
    assert fb.points == 0 and "transpose of the right one" in fb.text()


def test_naive_sigmoid_fails_only_the_large_inputs(capfd):
    fb = check("09.p1", swish_naive)
    text = fb.text()
    assert 0 < fb.points < 2 and "public case 3" in text and "should be finite" in text
    assert "overflow" in text  # the warning is shown on stdout, not graded
    assert capfd.readouterr().err == ""


def test_stub_and_non_function():
    def stub(x, beta):
        raise NotImplementedError()

    assert check("09.p1", stub).points == 0 and "NotImplementedError" in check("09.p1", stub).text()
    fb = check("09.p2", "swiglu_backward")
    assert fb.points == 0 and "should be a function" in fb.text()
    fb = check("09.p3", lambda dY, X, W_gate, W_up, W_down: mlp_right(dY, X, W_gate, W_up, W_down)[:3])
    assert fb.points == 0 and "should return 4 values" in fb.text()


def test_p7s_key_is_the_backward_matmul_count_through_frozen_weights():
    """P7's key measured: torch's FlopCounterMode over the backward of SmolLM2's MLP shapes with frozen weights and an
    input that needs its gradient (the layers below carry adapters): 2 FLOPs per multiply-add, matmuls only."""
    from torch.utils.flop_counter import FlopCounterMode

    d, f = 576, 1536
    gen = torch.Generator().manual_seed(7)
    Wg, Wu, Wd = (0.02 * torch.randn(a, b, generator=gen) for a, b in ((d, f), (d, f), (f, d)))  # frozen: no grad
    x = torch.randn(1, d, generator=gen, requires_grad=True)
    y = (torch.nn.functional.silu(x @ Wg) * (x @ Wu)) @ Wd
    with FlopCounterMode(display=False) as counter:
        y.backward(torch.randn(1, d, generator=gen))
    assert counter.get_total_flops() == 2 * ITEMS["p7"].expected() == 2 * RIGHT["p7"]


def test_p5s_key_a_token_with_a_closed_gate_trains_none_of_the_three_adapters():
    """P5's key (c) measured with autograd: a gated MLP with trained adapters on gate, up and down, one ordinary token
    and one whose row of G (adapter included) is −20 everywhere: the closed token's share of every factor's gradient is
    below a ten-thousandth of the ordinary token's (its U and dY being the ordinary token's)."""
    gen = torch.Generator().manual_seed(9)
    d, f, r, s = 12, 4, 2, 2.0
    rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    W = {n: rnd(*shape) / 2 for n, shape in (("gate", (d, f)), ("up", (d, f)), ("down", (f, d)))}
    ad = {n: (rnd(W[n].shape[0], r), rnd(r, W[n].shape[1])) for n in W}
    eff = {n: W[n] + s * ad[n][0] @ ad[n][1] for n in W}
    x0 = rnd(d)
    # the closed token: G = −20 in every column, and the same U as the ordinary token
    target = torch.cat([torch.full((f,), -20.0, dtype=torch.float64), x0 @ eff["up"]])
    x_closed = torch.linalg.lstsq(torch.cat([eff["gate"], eff["up"]], 1).T, target).solution
    X = torch.stack([x0, x_closed])
    dY = rnd(2, d)

    def grads(t):
        ps = {n: tuple(p.clone().requires_grad_() for p in ad[n]) for n in ad}
        proj = lambda n, x: x @ W[n] + s * (x @ ps[n][0]) @ ps[n][1]
        G = proj("gate", X[t:t + 1])
        assert t == 0 or torch.allclose(G, torch.full_like(G, -20.0))
        U = proj("up", X[t:t + 1])
        assert torch.allclose(U, proj("up", X[:1]))  # an ordinary U
        Y = proj("down", torch.nn.functional.silu(G) * U)
        Y.backward(dY[t:t + 1])
        return {n: max(float(p.grad.abs().max()) for p in ps[n]) for n in ps}

    ordinary, closed = grads(0), grads(1)
    assert all(closed[n] < 1e-4 * ordinary[n] for n in ad), (closed, ordinary)
    keys = json.loads((ROOT / "autograder" / "keys" / "09.json").read_text())["keys"]
    assert keys["p5"] == RIGHT["p5"] == "c"



def test_p8s_model_answer_zero_up_projection_measured_with_autograd():
    """P8's model answer (explain, W_up = 0 at the start) measured with autograd on a gated MLP: in the first backward
    pass dW_gate, dW_down and the MLP's dX are exactly zero and dW_up is not; after one SGD step all three weights get
    a nonzero gradient."""
    gen = torch.Generator().manual_seed(98)
    n, d, f = 4, 3, 5
    rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    X, dY = rnd(n, d).requires_grad_(), rnd(n, d)
    Wg, Wu, Wd = rnd(d, f).requires_grad_(), torch.zeros(d, f, dtype=torch.float64, requires_grad=True), rnd(f, d).requires_grad_()
    (F.silu(X @ Wg) * (X @ Wu) @ Wd).backward(dY)
    assert torch.equal(Wg.grad, torch.zeros_like(Wg)) and torch.equal(Wd.grad, torch.zeros_like(Wd))
    assert torch.equal(X.grad, torch.zeros_like(X))
    assert Wu.grad.abs().min() > 0
    with torch.no_grad():
        for w in (Wg, Wu, Wd):
            w -= 0.1 * w.grad
            w.grad = None
    (F.silu(X @ Wg) * (X @ Wu) @ Wd).backward(dY)
    assert all(w.grad.abs().max() > 1e-3 for w in (Wg, Wu, Wd))


def test_p9s_model_answer_a_dropped_adapter_path_passes_a_check_at_b_zero_only():
    """P9's model answer (explain) measured with the course's functions: dH from the adapted down projection is
    dY W_downᵀ + s dY B_downᵀ A_downᵀ; with B_down = 0 the colleague's dH = dY W_downᵀ is exact, so every adapter gradient
    matches autograd, and after one SGD step (B_down ≠ 0) the gate and up adapters' gradients and dX no longer do."""
    from coursekit import lora

    rng = np.random.default_rng(99)
    n, d, f, r, s = 4, 3, 5, 2, 2.0
    X, dY = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    W = {"gate": rng.standard_normal((d, f)), "up": rng.standard_normal((d, f)), "down": rng.standard_normal((f, d))}
    A = {p: rng.standard_normal((W[p].shape[0], r)) for p in W}
    B = {p: np.zeros((r, W[p].shape[1])) for p in W}

    def by_hand(B, colleague):
        G, c_gate = lora.lora_forward(X, W["gate"], A["gate"], B["gate"], s)
        U, c_up = lora.lora_forward(X, W["up"], A["up"], B["up"], s)
        H, c_sw = mlp.swiglu_forward(G, U)
        _, c_down = lora.lora_forward(H, W["down"], A["down"], B["down"], s)
        dH, dA_down, dB_down = lora.lora_backward(dY, c_down)
        np.testing.assert_allclose(dH, dY @ W["down"].T + s * dY @ B["down"].T @ A["down"].T, rtol=1e-12, atol=1e-12)
        if colleague:
            dH = dY @ W["down"].T
        dG, dU = mlp.swiglu_backward(dH, c_sw)
        dX_g, dA_gate, dB_gate = lora.lora_backward(dG, c_gate)
        dX_u, dA_up, dB_up = lora.lora_backward(dU, c_up)
        return dict(X=dX_g + dX_u, A_gate=dA_gate, B_gate=dB_gate, A_up=dA_up, B_up=dB_up, A_down=dA_down, B_down=dB_down)

    def autograd(B):
        t = {k: torch.tensor(v, requires_grad=True) for k, v in
             dict(X=X, **{f"A_{p}": A[p] for p in W}, **{f"B_{p}": B[p] for p in W}).items()}
        proj = lambda p, x: x @ torch.tensor(W[p]) + s * (x @ t[f"A_{p}"]) @ t[f"B_{p}"]
        proj("down", F.silu(proj("gate", t["X"])) * proj("up", t["X"])).backward(torch.tensor(dY))
        return {k: v.grad.numpy() for k, v in t.items()}

    start = autograd(B)
    colleague = by_hand(B, colleague=True)
    for k in start:                                                       # at B = 0 the check passes
        np.testing.assert_allclose(colleague[k], start[k], rtol=1e-12, atol=1e-12, err_msg=k)
    assert np.abs(start["B_down"]).max() > 1e-3                          # so one step moves B_down
    B1 = {p: B[p] - 0.1 * start[f"B_{p}"] for p in W}
    later, colleague, right = autograd(B1), by_hand(B1, colleague=True), by_hand(B1, colleague=False)
    for k in later:
        np.testing.assert_allclose(right[k], later[k], rtol=1e-10, atol=1e-12, err_msg=k)
    rel = lambda k: np.abs(colleague[k] - later[k]).max() / np.abs(later[k]).max()
    assert all(rel(k) > 1e-2 for k in ("X", "A_gate", "B_gate", "A_up", "B_up")), {k: rel(k) for k in later}
    assert rel("A_down") < 1e-12 and rel("B_down") < 1e-12               # the down adapter's own D is dY either way

# --------------------------------------------------------------------------- wrong answers: other items


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "shape of X and of the MLP's output"),
        ("w1", "d", "W_gate's (and W_up's) shape"),
        ("w3", "a", "drops the up branch"),
        ("w3", "c", "Averaging halves"),
        ("p5", "a", "This token is not like the others"),
        ("p5", "b", "A closed gate silences what down_proj reads"),
        ("p5", "d", "Their input X is ordinary, but their D is not"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"09.{item_id}", answer)
    assert fb.points == 0
    joined = " ".join(fb.lines)
    assert text in joined and "Reread" in joined


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w2", 0.25, "σ′(0)"),
        ("w2", 0.0, "the value, not the slope"),
        ("w2", 1.0, "ReLU's slope"),
        ("p6", RIGHT["p6"] - 1, "forgot the residual"),
        ("p6", lesson09._p6_mistakes()[3].value, "gate branch"),
        ("p6", 1.0, "skip path"),
        ("p7", 6 * 576 * 1536, "A frozen weight needs no ∇W"),
        ("p7", 2 * 576 * 1536, "X feeds both gate and up"),
        ("p7", 576 * 1536, "that is one product"),
        ("p7", 9 * 576 * 1536, "the forward plus a full backward"),
        ("p7", 0, "a frozen weight is not a detached one"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"09.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p2_formulas_come_after_its_check_in_the_release():
    """P2 asks the student to derive dG and dU: neither formula, nor the diagram that labels its arrows with them, is in
    the release above P2's check; both follow it ('The gate, derived')."""
    nb = nbformat.read(ROOT / "lessons" / LID / f"{LID}.ipynb", as_version=4)
    check_at = next(i for i, c in enumerate(nb.cells) if 'grade("09.p2"' in c.source)
    formulas = ("dH ⊙ U ⊙ SiLU′(G)", "dH ⊙ SiLU(G)", "mlp_backward_graph")
    above = "\n".join(c.source for c in nb.cells[:check_at])
    below = "\n".join(c.source for c in nb.cells[check_at + 1:check_at + 3])
    assert not [f for f in formulas if f in above]
    assert all(f in below for f in formulas) and "**The gate, derived.**" in below


def test_p6_two_slips_at_once_never_land_on_a_named_mistake():
    """A student who drops a branch (or makes one branch's slip) and also forgets the residual must not be told another
    mistake's story: with w_up = −1 both branch terms equalled −dy, and 'up only, no residual' was named "no silu'"."""
    kw = lesson09.p6_arrays()
    named = {m.label: float(np.ravel(m.value)[0]) for m in lesson09.residual_mistakes(kw)["dX"]}
    for label, value, _ in lesson09._dX_wrongs(lesson09._mlp_parts(kw)):  # the MLP's wrong dX, the residual forgotten
        v = float(np.ravel(value)[0])
        hits = [n for n, nv in named.items() if abs(nv - v) <= 1e-3 * max(1.0, abs(v))]
        assert not hits, f"{label} without the residual ({v:.6f}) is named {hits}"
        assert check("09.p6", v).points == 0
