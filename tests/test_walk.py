"""coursekit.walk: the rank-one walk's kernels against torch autograd and torch.optim, lesson 06's numbers,
the step-through widget, and clear errors for bad input."""

import html

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coursekit import lora, walk

SEEDS = range(6)


def _rng_logits(seed, n=3, m=5, scale=2.0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, m)) * scale, rng.integers(0, m, size=n)


# --------------------------------------------------------------------------- softmax and cross-entropy


@pytest.mark.parametrize("seed", SEEDS)
def test_softmax_and_log_softmax_match_torch(seed):
    Y, _ = _rng_logits(seed)
    np.testing.assert_allclose(walk.softmax(Y), torch.softmax(torch.tensor(Y), -1).numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(walk.log_softmax(Y), torch.log_softmax(torch.tensor(Y), -1).numpy(), rtol=1e-13, atol=1e-14)


def test_softmax_is_stable_for_large_logits():
    Y = np.array([[1000.0, 1001.0, 999.0]])
    p = walk.softmax(Y)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p, walk.softmax(Y - 1000.0), rtol=1e-14)
    assert np.all(np.isfinite(walk.log_softmax(Y)))


@pytest.mark.parametrize("seed", SEEDS)
def test_cross_entropy_forward_backward_match_autograd(seed):
    Y, t = _rng_logits(seed)
    loss, cache = walk.cross_entropy_forward(Y, t)
    Yt = torch.tensor(Y, requires_grad=True)
    ref = F.cross_entropy(Yt, torch.tensor(t))
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-13)
    np.testing.assert_allclose(walk.cross_entropy_backward(cache), Yt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_single_row_D_is_p_minus_onehot():
    Y = np.array([[0.3, -1.2, 2.0]])
    _, cache = walk.cross_entropy_forward(Y, 2)
    D = walk.cross_entropy_backward(cache)
    np.testing.assert_allclose(D, walk.softmax(Y) - np.array([[0.0, 0.0, 1.0]]), rtol=0, atol=1e-16)
    assert abs(D.sum()) < 1e-15  # probabilities sum to one, the one-hot too


@pytest.mark.parametrize("seed", SEEDS)
def test_softmax_backward_is_the_vjp_of_softmax(seed):
    Y, _ = _rng_logits(seed)
    g = np.random.default_rng(seed + 100).standard_normal(Y.shape)
    Yt = torch.tensor(Y, requires_grad=True)
    torch.softmax(Yt, -1).backward(torch.tensor(g))
    np.testing.assert_allclose(walk.softmax_backward(g, walk.softmax(Y)), Yt.grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
def test_log_softmax_backward_is_the_vjp_of_log_softmax(seed):
    Y, _ = _rng_logits(seed)
    g = np.random.default_rng(seed + 200).standard_normal(Y.shape)
    Yt = torch.tensor(Y, requires_grad=True)
    torch.log_softmax(Yt, -1).backward(torch.tensor(g))
    np.testing.assert_allclose(walk.log_softmax_backward(g, Y), Yt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_log_softmax_backward_public_example():
    dx = walk.log_softmax_backward(np.array([[1.0, 1.0]]), np.array([[0.1, 0.9]]))
    np.testing.assert_allclose(dx, [[0.3799, -0.3799]], atol=5e-5)
    # The softmax rule with a constant upstream gradient gives zero: the two rules are not interchangeable.
    np.testing.assert_allclose(walk.softmax_backward(np.array([[1.0, 1.0]]), walk.softmax(np.array([[0.1, 0.9]]))), 0, atol=1e-16)


def test_D_from_the_softmax_and_log_softmax_rules():
    """D = p − onehot is the softmax rule with g = −onehot / p, and the log-softmax rule with g = −onehot."""
    Y = np.array([[1.19, 1.35]])
    p = walk.softmax(Y)
    onehot = np.array([[0.0, 1.0]])
    np.testing.assert_allclose(walk.softmax_backward(-onehot / p, p), p - onehot, atol=1e-15)
    np.testing.assert_allclose(walk.log_softmax_backward(-onehot, Y), p - onehot, atol=1e-15)


# --------------------------------------------------------------------------- optimizers


@pytest.mark.parametrize("seed", SEEDS)
def test_adamw_step_matches_torch_adamw(seed):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    lr, wd = float(rng.uniform(1e-3, 0.1)), float(rng.choice([0.0, 0.01, 0.3]))
    betas, eps = (float(rng.uniform(0.5, 0.95)), float(rng.uniform(0.9, 0.9999))), float(rng.choice([1e-8, 1e-3, 0.1]))
    p0 = rng.standard_normal(shape)
    tp = torch.nn.Parameter(torch.tensor(p0))
    opt = torch.optim.AdamW([tp], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    param, state = p0.copy(), walk.AdamWState.zeros_like(p0)
    for _ in range(7):
        g = rng.standard_normal(shape) * rng.choice([1e-6, 1.0, 100.0])
        tp.grad = torch.tensor(g)
        opt.step()
        param, state = walk.adamw_step(param, g, state, lr, betas, eps, wd)
        np.testing.assert_allclose(param, tp.detach().numpy(), rtol=1e-12, atol=1e-14)
    st = opt.state[tp]
    np.testing.assert_allclose(state.m, st["exp_avg"].numpy(), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(state.v, st["exp_avg_sq"].numpy(), rtol=1e-12, atol=1e-300)
    assert state.t == int(st["step"]) == 7


def test_adamw_step_defaults_are_torchs_and_inputs_are_untouched():
    p0, g = np.array([[1.0, -2.0]]), np.array([[0.5, 0.25]])
    state = walk.AdamWState.zeros_like(p0)
    new, new_state = walk.adamw_step(p0, g, state)
    tp = torch.nn.Parameter(torch.tensor(p0))
    opt = torch.optim.AdamW([tp])
    tp.grad = torch.tensor(g)
    opt.step()
    np.testing.assert_allclose(new, tp.detach().numpy(), rtol=1e-13)
    assert state.t == 0 and not state.m.any() and not state.v.any()
    np.testing.assert_array_equal(p0, [[1.0, -2.0]])
    assert new_state.t == 1


def test_adamw_zero_gradient_moves_only_by_decay():
    p0 = np.array([[0.1], [-0.2]])
    new, _ = walk.adamw_step(p0, np.zeros_like(p0), walk.AdamWState.zeros_like(p0), lr=0.01, weight_decay=0.0)
    np.testing.assert_array_equal(new, p0)
    new, _ = walk.adamw_step(p0, np.zeros_like(p0), walk.AdamWState.zeros_like(p0), lr=0.01, weight_decay=0.5)
    np.testing.assert_allclose(new, p0 * (1 - 0.01 * 0.5), rtol=1e-15)


@pytest.mark.parametrize("wd", [0.0, 0.2])
def test_sgd_step_matches_torch_sgd(wd):
    rng = np.random.default_rng(7)
    p0 = rng.standard_normal((2, 3))
    tp = torch.nn.Parameter(torch.tensor(p0))
    opt = torch.optim.SGD([tp], lr=0.1, weight_decay=wd)
    param = p0.copy()
    for _ in range(5):
        g = rng.standard_normal((2, 3))
        tp.grad = torch.tensor(g)
        opt.step()
        param = walk.sgd_step(param, g, 0.1, wd)
        np.testing.assert_allclose(param, tp.detach().numpy(), rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- the walk


def _torch_walk(ex, steps, optimizer, lr):
    """Lesson 06's walk in plain PyTorch (autograd and torch.optim), returning per-step losses, grads and factors."""
    X = torch.tensor(ex["X"], requires_grad=True)
    W = torch.tensor(ex["W"])
    A = torch.nn.Parameter(torch.tensor(ex["A"]))
    B = torch.nn.Parameter(torch.tensor(ex["B"]))
    target = torch.tensor([ex["target"]])
    opt = (torch.optim.AdamW([A, B], lr=lr, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
           if optimizer == "adamw" else torch.optim.SGD([A, B], lr=lr))
    out = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        X.grad = None
        loss = F.cross_entropy(X @ W + ex["s"] * (X @ A) @ B, target)
        loss.backward()
        grads = [t.grad.detach().numpy().copy() for t in (A, B, X)]
        opt.step()
        with torch.no_grad():
            after = F.cross_entropy(X @ W + ex["s"] * (X @ A) @ B, target).item()
        out.append((loss.item(), *grads, A.detach().numpy().copy(), B.detach().numpy().copy(), after))
    assert torch.equal(W, torch.tensor(ex["W"]))
    return out


@pytest.mark.parametrize("optimizer, lr", [("adamw", 0.01), ("sgd", 0.1)])
def test_run_walk_matches_torch(optimizer, lr):
    ex = walk.worked_example()
    recs = walk.run_walk(**ex, steps=5, optimizer=optimizer)
    for rec, (loss, dA, dB, dX, A, B, after) in zip(recs, _torch_walk(ex, 5, optimizer, lr)):
        assert rec.loss == pytest.approx(loss, rel=1e-13) and rec.loss_after == pytest.approx(after, rel=1e-13)
        for got, want in ((rec.dA, dA), (rec.dB, dB), (rec.dX, dX), (rec.A_after, A), (rec.B_after, B)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_run_walk_reproduces_the_seed_printout():
    """The numbers lesson 06 prints for its walk (a CPU run of the PyTorch version), to six decimals."""
    r1, r2 = walk.run_walk(**walk.worked_example(), steps=2)
    close = lambda a, b: np.testing.assert_allclose(np.ravel(a), b, atol=5e-7)
    close(r1.Z, [-0.3]); close(r1.Y, [1.19, 1.35]); close(r1.p, [0.460085, 0.539915])
    close([r1.loss, r1.loss_after, r2.loss_after], [0.616344, 0.613588, 0.610433])
    assert r2.loss == r1.loss_after
    assert not r1.dA.any() and r1.dB.any()
    close(r1.dB, [-0.138026, 0.138026]); close(r1.dX, [0.506094, -0.289854])
    close(r1.A_after, [0.1, -0.2]); close(r1.B_after, [0.01, -0.01])
    close(r2.dA, [0.009172, 0.018344]); close(r2.dB, [-0.137579, 0.137579]); close(r2.dX, [0.505372, -0.290749])
    close(r2.A_after, [0.092559, -0.207441]); close(r2.B_after, [0.019999, -0.019999])


def test_run_walk_records_use_this_steps_factors_and_leave_inputs_alone():
    ex = walk.worked_example()
    frozen = {k: v.copy() for k, v in ex.items() if isinstance(v, np.ndarray)}
    recs = walk.run_walk(**ex, steps=3)
    for k, v in frozen.items():
        np.testing.assert_array_equal(ex[k], v)
    for prev, rec in zip(recs, recs[1:]):
        np.testing.assert_array_equal(rec.A, prev.A_after)
        np.testing.assert_array_equal(rec.B, prev.B_after)
    for rec in recs:  # the record's gradients are lora_backward's with this step's factors
        Y, cache = lora.lora_forward(ex["X"], ex["W"], rec.A, rec.B, ex["s"])
        dX, dA, dB = lora.lora_backward(rec.D, cache)
        np.testing.assert_array_equal(rec.dA, dA)
        np.testing.assert_array_equal(rec.dB, dB)
        np.testing.assert_allclose(rec.dZ, rec.D @ rec.B.T)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_both_zero_init_never_moves(optimizer):
    ex = walk.worked_example() | dict(A=np.zeros((2, 1)))
    recs = walk.run_walk(**ex, steps=10, optimizer=optimizer, weight_decay=0.1)
    for rec in recs:
        assert not rec.dA.any() and not rec.dB.any()
        assert not rec.A_after.any() and not rec.B_after.any()
        assert rec.loss_after == recs[0].loss
    assert recs[0].D.any()  # the loss still has a gradient for Y and X, just none for the factors
    assert recs[0].dX.any()


def test_weight_decay_moves_A_without_a_loss_gradient():
    rec = walk.run_walk(**walk.worked_example(), steps=1, weight_decay=0.5)[0]
    assert not rec.dA.any()
    np.testing.assert_allclose(rec.A_after, rec.A * (1 - 0.01 * 0.5), rtol=1e-15)


def test_several_rows_and_non_unit_scale_match_autograd():
    rng = np.random.default_rng(3)
    X, W, A, B = rng.standard_normal((4, 3)), rng.standard_normal((3, 5)), rng.standard_normal((3, 2)), rng.standard_normal((2, 5))
    target = np.array([0, 4, 2, 2])
    rec = walk.run_walk(X, W, A, B, 2.5, target, steps=1, optimizer="sgd", lr=0.05)[0]
    Xt, At, Bt = (torch.tensor(a, requires_grad=True) for a in (X, A, B))
    F.cross_entropy(Xt @ torch.tensor(W) + 2.5 * (Xt @ At) @ Bt, torch.tensor(target)).backward()
    for got, t in ((rec.dX, Xt), (rec.dA, At), (rec.dB, Bt)):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_format_record_and_pages():
    recs = walk.run_walk(**walk.worked_example(), steps=2)
    text = walk.format_record(recs[0])
    assert "0.616344" in text and "-0.138026" in text and "0.613588" in text
    pages = walk.walk_pages(recs)
    assert len(pages) == 16
    assert pages[0].title.startswith("training step 1") and "1/8" in pages[0].title
    assert "0.460085" in pages[1].text and "-0.138026" in pages[2].text
    assert "0.009172" in pages[8 + 4].text  # step 2's ∇A
    assert "(1 × 2)" in pages[2].text and "∇A = Xᵀ dZ (2 × 1)" in pages[4].text  # every tensor with its shape
    assert "cannot reach A yet" in pages[3].note and "cannot reach A" not in pages[8 + 3].note  # B = 0 only at first


def test_the_update_page_shows_before_and_after_and_what_changed():
    recs = walk.run_walk(**walk.worked_example(), steps=2)
    first, second = walk.walk_pages(recs)[6], walk.walk_pages(recs)[8 + 6]
    (a, a_after, a_before), (b, b_after, b_before) = first.tensors
    assert (a, b) == ("A", "B") and np.array_equal(a_before, recs[0].A) and np.array_equal(b_after, recs[0].B_after)
    html_first = walk.page_html(first)
    # Step 1: ∇A = 0, so AdamW leaves A alone and moves B (two entries); step 2 moves all four entries.
    assert html_first.count("background:#ffe58f") == 2
    assert walk.page_html(second).count("background:#ffe58f") == 4
    assert "→" in first.text and "W is frozen" in first.note


# --------------------------------------------------------------------------- the step-through widget


def test_step_through_buttons_move_and_clamp():
    recs = walk.run_walk(**walk.worked_example(), steps=2)
    w = walk.step_through(recs)
    import ipywidgets as widgets

    assert isinstance(w, widgets.VBox)
    assert w.index == 0 and w.prev.disabled and not w.next.disabled
    assert w.label.value.startswith("1/16") and "0.616344" in w.out.value
    w.prev.click()  # clamps at the start
    assert w.index == 0
    w.next.click()
    assert w.index == 1 and w.label.value.startswith("2/16") and "0.460085" in w.out.value
    w.next.click()
    assert "∇B" in w.label.value and "-0.138026" in w.out.value
    w.prev.click()
    assert w.index == 1 and not w.prev.disabled
    for _ in range(40):
        w.next.click()
    assert w.index == 15 and w.next.disabled and "0.610433" in w.out.value  # clamps at the end
    w.prev.click()
    assert w.index == 14 and not w.next.disabled


def test_step_through_shows_each_steps_matrices_at_one_height():
    """Each click shows the next page's own matrices (their values and shapes), the label names the page, the
    buttons disable at the ends, and the area keeps one height: a page taller than it scrolls inside instead of
    growing the cell (the browser test measures the rendered height)."""
    w = walk.step_through(walk.run_walk(**walk.worked_example(), steps=1))
    seen = []
    for i in range(len(w.pages)):
        assert w.index == i and w.label.value.startswith(f"{i + 1}/{len(w.pages)} · {w.pages[i].title}")
        assert w.out.value == walk.page_html(w.pages[i]) and w.out.value not in seen  # this page's content, new
        for name, values, _before in w.pages[i].tensors:
            assert html.escape(name) in w.out.value and " × ".join(map(str, np.shape(values))) in w.out.value, (i, name)
        assert (w.out.layout.height, w.out.layout.overflow) == (walk.STEP_THROUGH_HEIGHT, "auto")
        assert w.prev.disabled == (i == 0) and w.next.disabled == (i == len(w.pages) - 1)
        seen.append(w.out.value)
        w.next.click()
    assert w.index == len(w.pages) - 1  # Next at the last page stays there
    w.prev.click()
    assert w.out.value == seen[-2]


def test_step_through_escapes_html():
    page = walk.Page("t", (("<b>x</b>", np.zeros((1, 1)), None),), note="a < b & c")
    out = walk.page_html(page)
    assert "<b>x</b>" not in out and "&lt;b&gt;x&lt;/b&gt;" in out and "a &lt; b &amp; c" in out


# --------------------------------------------------------------------------- bad input


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="Y must be a floating NumPy array"):
        walk.softmax([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"Y must be 2-D, got shape \(2,\)"):
        walk.softmax(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"target indices must lie in \[0, 2\)"):
        walk.cross_entropy_forward(np.array([[1.0, 2.0]]), 2)
    with pytest.raises(ValueError, match=r"expected shape \(1,\), got \(2,\)"):
        walk.cross_entropy_forward(np.array([[1.0, 2.0]]), [0, 1])
    with pytest.raises(TypeError, match="target must hold integer"):
        walk.cross_entropy_forward(np.array([[1.0, 2.0]]), 1.0)
    with pytest.raises(ValueError, match=r"g must have the shape of p \(1, 2\)"):
        walk.softmax_backward(np.ones((1, 3)), np.ones((1, 2)) / 2)
    with pytest.raises(ValueError, match=r"g must have the shape of x"):
        walk.log_softmax_backward(np.ones((2, 2)), np.ones((1, 2)))
    p = np.zeros((2, 1))
    with pytest.raises(ValueError, match=r"grad must have the shape of param \(2, 1\), got \(1, 2\)"):
        walk.adamw_step(p, np.zeros((1, 2)), walk.AdamWState.zeros_like(p))
    with pytest.raises(ValueError, match="state.m and state.v"):
        walk.adamw_step(p, p, walk.AdamWState.zeros_like(np.zeros(3)))
    with pytest.raises(ValueError, match="betas must lie in"):
        walk.adamw_step(p, p, walk.AdamWState.zeros_like(p), betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="non-negative"):
        walk.sgd_step(p, p, lr=-0.1)
    with pytest.raises(TypeError, match="grad must be a floating"):
        walk.sgd_step(p, np.zeros((2, 1), dtype=int), lr=0.1)
    ex = walk.worked_example()
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'sgd'"):
        walk.run_walk(**ex, optimizer="adam")
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        walk.run_walk(**ex, steps=0)
    with pytest.raises(lora.LoRAShapeError, match="A must have 2 rows"):
        walk.run_walk(**(ex | dict(A=np.zeros((1, 2)))))
    with pytest.raises(ValueError, match="at least one StepRecord"):
        walk.walk_pages([])
