"""coursekit.block: the pre-norm decoder block's backward against central differences and torch autograd,
the detach option, RMSNorm, the counting functions, and clear errors on bad input."""

import numpy as np
import pytest
import torch

from coursekit import block, lora
from coursekit.gradcheck import check_vjp


def _vjp_inputs(x, adapters):
    return {"x": x, **{f"A_{p}": adapters[p][0] for p in adapters}, **{f"B_{p}": adapters[p][1] for p in adapters}}


def _forward_of(weights, adapters, **kw):
    def fwd(x, **fac):
        return block.block_forward(x, weights, {p: (fac[f"A_{p}"], fac[f"B_{p}"]) for p in adapters}, **kw)[0]
    return fwd


TARGET_SETS = [("q", "v"), ("q", "k", "v", "o"), block.PROJECTIONS, ("o",), ("down", "gate")]


@pytest.mark.parametrize("targets", TARGET_SETS)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_factor_and_the_input_pass_check_vjp(targets, seed):
    rng = np.random.default_rng(seed)
    T, d, n_heads, f = int(rng.integers(2, 6)), 6, 3, 10
    w, ad = block.init_block(rng, d=d, n_heads=n_heads, f=f, targets=targets, r=int(rng.integers(1, 4)))
    x, dy, s = rng.standard_normal((T, d)), rng.standard_normal((T, d)), float(rng.choice([0.5, 2.0]))
    _, cache = block.block_forward(x, w, ad, s=s, n_heads=n_heads)
    g = block.block_backward(dy, cache)
    assert set(g) == {"x"} | {f"{k}_{p}" for p in targets for k in "AB"}
    inputs = _vjp_inputs(x, ad)
    report = check_vjp(_forward_of(w, ad, s=s, n_heads=n_heads), inputs, {k: g[k] for k in inputs}, dy, tol=1e-5)
    assert report.ok, str(report)


def test_base_grads_match_finite_differences():
    rng = np.random.default_rng(3)
    w, ad = block.init_block(rng, d=4, n_heads=2, f=6, targets=("q", "down"))
    x, dy = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    _, cache = block.block_forward(x, w, ad, s=2.0)
    g = block.block_backward(dy, cache, base_grads=True)
    report = check_vjp(lambda **ww: block.block_forward(x, ww, ad, s=2.0)[0], dict(w), {k: g[k] for k in w}, dy, tol=1e-5)
    assert report.ok, str(report)
    assert "W_q" not in block.block_backward(dy, cache)  # frozen: not formed unless asked


def _torch_grads(x, w, ad, dy, s, n_heads, detach=()):
    tt = lambda a: torch.tensor(a, requires_grad=True)  # noqa: E731
    xt, wt, adt = tt(x), {k: tt(v) for k, v in w.items()}, {p: (tt(A), tt(B)) for p, (A, B) in ad.items()}
    y = block.torch_block_forward(xt, wt, adt, s=s, n_heads=n_heads, detach=detach)
    y.backward(torch.tensor(dy))
    leaves = {"x": xt, **{f"A_{p}": adt[p][0] for p in ad}, **{f"B_{p}": adt[p][1] for p in ad}}
    # A leaf cut off by a detach gets no .grad at all (None): that is a zero gradient.
    return y.detach().numpy(), {k: (t.grad.numpy() if t.grad is not None else np.zeros(t.shape)) for k, t in leaves.items()}


@pytest.mark.parametrize("detach", [(), ("o",), ("down",), ("q", "v"), block.PROJECTIONS])
@pytest.mark.parametrize("targets", [("q", "v"), block.PROJECTIONS])
def test_torch_autograd_agrees_including_detach(targets, detach):
    rng = np.random.default_rng(7)
    w, ad = block.init_block(rng, d=8, n_heads=2, f=12, targets=targets)
    x, dy = rng.standard_normal((5, 8)), rng.standard_normal((5, 8))
    y, cache = block.block_forward(x, w, ad, s=1.5, n_heads=2, detach=detach)
    g = block.block_backward(dy, cache)
    y_t, g_t = _torch_grads(x, w, ad, dy, 1.5, 2, detach)
    np.testing.assert_allclose(y, y_t, rtol=1e-12, atol=1e-12)
    for k in g:
        np.testing.assert_allclose(g[k], g_t[k], rtol=1e-10, atol=1e-12, err_msg=k)


def test_detach_changes_backward_only():
    rng = np.random.default_rng(1)
    w, ad = block.init_block(rng, targets=("q", "v"))
    x, dy = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    y0, c0 = block.block_forward(x, w, ad)
    y1, c1 = block.block_forward(x, w, ad, detach=("o",))
    np.testing.assert_array_equal(y0, y1)
    frozen, cut = block.block_backward(dy, c0), block.block_backward(dy, c1)
    for k in ("A_q", "B_q", "A_v", "B_v"):
        assert np.abs(frozen[k]).max() > 1e-3
        assert not np.any(cut[k]), k  # exactly zero: the starved adapters
    assert np.abs(cut["x"]).max() > 0  # the residual still carries gradient to x
    # Detaching the frozen down projection leaves the attention adapters fed through the residual.
    _, c2 = block.block_forward(x, w, ad, detach=("down",))
    assert all(np.abs(block.block_backward(dy, c2)[k]).max() > 1e-3 for k in ("B_q", "B_v"))


def test_zero_B_init_gives_base_output_and_zero_dA():
    rng = np.random.default_rng(2)
    w, ad = block.init_block(rng, zero_B=True)
    x, dy = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    y, c = block.block_forward(x, w, ad)
    np.testing.assert_allclose(y, block.block_forward(x, w, {})[0], rtol=0, atol=0)
    g = block.block_backward(dy, c)
    assert all(not np.any(g[f"A_{p}"]) and np.any(g[f"B_{p}"]) for p in block.PROJECTIONS)


def test_rmsnorm_matches_torch_and_fd():
    rng = np.random.default_rng(4)
    x, gain, dy = rng.standard_normal((3, 5)), rng.standard_normal(5), rng.standard_normal((3, 5))
    y, c = block.rmsnorm_forward(x, gain, eps=1e-5)
    dx, dg = block.rmsnorm_backward(dy, c)
    ref = torch.nn.RMSNorm(5, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(gain))
    xt = torch.tensor(x, requires_grad=True)
    yt = ref(xt)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dg, ref.weight.grad.numpy(), rtol=1e-10, atol=1e-12)
    rep = check_vjp(lambda x, g: block.rmsnorm_forward(x, g)[0], dict(x=x, g=gain), dict(x=dx, g=dg), dy)
    assert rep.ok, str(rep)


SMOL = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64)


def test_counts_on_smollm2_shapes():
    shapes = block.projection_shapes(SMOL)
    assert shapes["k"] == (576, 192) and shapes["down"] == (1536, 576)
    assert block.adapter_count(("q", "v"), 30) == 60 and block.factor_count(("q", "v"), 30) == 120
    assert block.factor_count(block.PROJECTIONS, 30) == 420
    assert block.lora_param_count(shapes, ("q", "v"), 8, 30) == 30 * 8 * (1152 + 768)
    assert block.lora_param_count(shapes, block.PROJECTIONS, 8, 30) == 2_442_240
    assert block.lora_param_count(shapes, ("o",), 16) == lora.param_count(576, 576, 16)


def test_projection_shapes_without_head_dim_and_from_an_object():
    class Cfg:
        hidden_size, intermediate_size, num_attention_heads, num_key_value_heads = 64, 96, 4, 2

    assert block.projection_shapes(Cfg()) == {"q": (64, 64), "k": (64, 32), "v": (64, 32), "o": (64, 64),
                                              "gate": (64, 96), "up": (64, 96), "down": (96, 64)}
    with pytest.raises(KeyError, match="intermediate_size"):
        block.projection_shapes({"hidden_size": 4, "num_attention_heads": 2})


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: block.adapter_count("qv", 2), TypeError, "collection of projection names"),
        (lambda: block.adapter_count(["q", "q_proj"], 2), ValueError, "unknown projection names ['q_proj']"),
        (lambda: block.adapter_count(["q", "q"], 2), ValueError, "twice"),
        (lambda: block.adapter_count(["q"], 0), ValueError, "n_layers"),
        (lambda: block.lora_param_count({"q": (4, 4)}, ["q", "v"], 2), KeyError, "'v'"),
        (lambda: block.lora_param_count({"q": (4, 4)}, ["q"], 0), ValueError, "r must be"),
    ],
)
def test_counting_errors(call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert words in str(e.value)


def test_forward_errors_name_the_argument():
    rng = np.random.default_rng(0)
    w, ad = block.init_block(rng)
    x = rng.standard_normal((3, 8))
    with pytest.raises(ValueError, match=r"W_down must have shape \(12, 8\).*transposed"):
        block.block_forward(x, {**w, "W_down": w["W_down"].T.copy()}, ad)
    with pytest.raises(ValueError, match="n_heads"):
        block.block_forward(x, w, ad, n_heads=3)
    with pytest.raises(KeyError, match="W_down"):
        block.block_forward(x, {k: v for k, v in w.items() if k != "W_down"}, ad)
    with pytest.raises(TypeError, match="x must be a floating"):
        block.block_forward(x.astype(int), w, ad)
    with pytest.raises(ValueError, match="unknown projection names"):
        block.block_forward(x, w, ad, detach=("o_proj",))
    with pytest.raises(ValueError, match="g must have shape"):
        block.rmsnorm_forward(x, np.ones(3))
    y, c = block.block_forward(x, w, ad)
    with pytest.raises(ValueError, match="dy must have the shape of y"):
        block.block_backward(y[:2], c)
    with pytest.raises(lora.LoRAShapeError):
        block.block_forward(x, w, {"q": (np.ones((7, 2)), np.ones((2, 8)))})
