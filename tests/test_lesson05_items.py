"""Lesson 05 ("Backward through one adapted projection"): graded items score right answers fully, the
classic backward mistakes lose points with a diagnosis that names them, and the notebook's test cells
agree with the item registry."""

from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from coursekit import lora
from coursekit.grading import check
from coursekit.grading.lessons import lesson05
from coursekit.grading.lessons.lesson05 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
LID = "05-backward-through-one-projection"
NOTEBOOK = ROOT / "solutions" / LID / f"{LID}.ipynb"


# --------------------------------------------------------------------------- students


def bwd_right(D, X, W, A, B, s):
    Z = X @ A
    dZ = s * D @ B.T
    return D @ W.T + dZ @ A.T, X.T @ dZ, s * Z.T @ D


def bwd_torch(D, X, W, A, B, s):
    """Autograd instead of formulas: tensors that require grad come back (the checker must cope)."""
    Xt, At, Bt = (torch.tensor(v, requires_grad=True) for v in (X, A, B))
    Y = Xt @ torch.tensor(W) + s * (Xt @ At) @ Bt
    Y.backward(torch.tensor(D))
    return Xt.grad, At.grad, Bt.grad


def bwd_missing_s(D, X, W, A, B, s):
    dZ = D @ B.T
    return D @ W.T + dZ @ A.T, X.T @ dZ, (X @ A).T @ D


def bwd_s_twice(D, X, W, A, B, s):
    dX, _, dB = bwd_right(D, X, W, A, B, s)
    dZ = s * D @ B.T
    return D @ W.T + s * dZ @ A.T, s * X.T @ dZ, dB


def bwd_no_adapter_in_dX(D, X, W, A, B, s):
    _, dA, dB = bwd_right(D, X, W, A, B, s)
    return D @ W.T, dA, dB


def bwd_no_base_in_dX(D, X, W, A, B, s):
    """The frozen W treated as if it passed no gradient."""
    _, dA, dB = bwd_right(D, X, W, A, B, s)
    return s * D @ B.T @ A.T, dA, dB


def bwd_dA_transposed(D, X, W, A, B, s):
    dX, dA, dB = bwd_right(D, X, W, A, B, s)
    return dX, dA.T, dB


def bwd_dB_transposed(D, X, W, A, B, s):
    dX, dA, dB = bwd_right(D, X, W, A, B, s)
    return dX, dA, dB.T


def bwd_updated_B(D, X, W, A, B, s, lr=0.1):
    dX, _, dB = bwd_right(D, X, W, A, B, s)
    B = B - lr * dB  # the optimizer step taken before dA was formed
    return dX, s * X.T @ D @ B.T, dB


def bwd_W_not_transposed(D, X, W, A, B, s):
    dX, dA, dB = bwd_right(D, X, W, A, B, s)
    return D @ W + s * D @ B.T @ A.T, dA, dB


def bwd_B_not_transposed(D, X, W, A, B, s):
    dX, _, dB = bwd_right(D, X, W, A, B, s)
    return dX, s * X.T @ D @ B, dB


def bwd_hard_coded(D, X, W, A, B, s):
    """The worked example's answers, whatever the input."""
    return np.array([[0.45, -0.2, 0.65]]), np.array([[0.1], [-0.05], [0.15]]), np.array([[1.0, -0.5]])


RIGHT = {"w1": "d", "w2": "a", "w3": "c", "p1": bwd_right, "p2": "a", "p3": 8.0, "p4": {"b", "c", "d"},
         "p5": "b", "p6": np.array([[-0.56, 0.28]]), "p7": "a"}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def _nbgrader_cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]


def test_notebook_p3_case_is_the_graded_case():
    """The arrays printed in the notebook for P3 are the ones the grader computes ∇A from."""
    nb, _ = _nbgrader_cells()
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# The P3 case"))
    ns = {"np": np}
    exec(cell.source, ns)
    for k, v in lesson05.P3_CASE.items():
        np.testing.assert_array_equal(ns[f"{k}_p3"], v)


def test_worked_example_is_lesson02s_layer():
    from coursekit.grading.lessons.lesson02 import _worked_example

    ex02, ex05 = _worked_example(), lesson05.worked_example()
    for k in ("X", "W", "A", "B"):
        np.testing.assert_array_equal(ex02[k], ex05[k])
    assert lora.scaling(ex02["lora_alpha"], ex02["r"]) == ex05["s"]


def test_reference_reproduces_the_seed_numbers():
    dX, dA, dB = lesson05.backward(**lesson05.worked_example())
    np.testing.assert_allclose(dB, [[1.0, -0.5]])
    np.testing.assert_allclose(dA, [[0.1], [-0.05], [0.15]])
    np.testing.assert_allclose(dX, [[0.45, -0.2, 0.65]])


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden, capfd):
    fb = check(f"05.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()
    assert capfd.readouterr().err == ""


def test_autograd_answer_scores_full():
    assert check("05.p1", bwd_torch, hidden=True).full


def test_hidden_cases_are_deterministic_and_add_six():
    a = check("05.p1", bwd_right, hidden=True).text()
    b = check("05.p1", bwd_right, hidden=True).text()
    assert a == b and a.count("hidden case") == 6


def test_hidden_cases_have_nonzero_B_and_distinct_scales():
    rng = np.random.default_rng(0)
    for case in lesson05._p1_hidden(rng) + lesson05._p1_public():
        kw = case.kwargs
        assert np.all(kw["B"] != 0)
        assert len({1.0, kw["s"], kw["s"] ** 2}) == 3


def test_hard_coded_answer_fails_hidden_cases():
    fb = check("05.p1", bwd_hard_coded, hidden=True)
    assert fb.points <= 4 * 1 / 9 + 1e-9 and "hidden case" in fb.text()


# --------------------------------------------------------------------------- wrong answers: the function


def _likely(fb):
    return [l.strip() for l in fb.lines if "Likely mistake:" in l]


@pytest.mark.parametrize(
    "fn, words",
    [
        (bwd_missing_s, "scale s is missing"),
        (bwd_s_twice, "applied twice"),
        (bwd_no_adapter_in_dX, "∇X is missing the adapter path"),
        (bwd_no_base_in_dX, "∇X is missing the base path"),
        (bwd_dA_transposed, "∇A has the shape of Aᵀ"),
        (bwd_dB_transposed, "∇B is transposed"),
        (bwd_updated_B, "B already updated (B − 0.1·∇B)"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_backward_mistakes_are_named(fn, words, hidden, capfd):
    fb = check("05.p1", fn, hidden=hidden)
    assert not fb.full, fb.text()
    assert any(words in l for l in _likely(fb)), fb.text()
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("fn, words", [(bwd_W_not_transposed, "not D W"), (bwd_B_not_transposed, "not B.")])
def test_square_hidden_cases_catch_a_missing_transpose(fn, words):
    """Public cases are rectangular, so the missing transpose raises; a hidden square case names it."""
    public = check("05.p1", fn, hidden=False)
    assert public.points == 0 and "inner sizes disagree" in public.text()
    fb = check("05.p1", fn, hidden=True)
    assert fb.points == 0
    assert any(words in l for l in _likely(fb)), fb.text()


def test_s_twice_on_one_token_is_not_mistaken_for_an_updated_B():
    """With n = 1 and r = 1 any multiple of dA fits 'B already updated' for some step size; the
    exact wrong scale must win."""
    fb = check("05.p1", bwd_s_twice)
    first = fb.text().split("public case 2")[0]
    assert "applied twice" in first and "already updated" not in first, first


def test_missing_s_names_every_output_and_the_worked_example_fails():
    fb = check("05.p1", bwd_missing_s)
    assert fb.points == 0
    lines = _likely(fb)
    for where in ("∇B = s Zᵀ D", "∇A = s Xᵀ D Bᵀ", "adapter path of ∇X"):
        assert any(where in l for l in lines), lines
    assert "dB[0, 0]: expected 1, got 2" in fb.text()


def test_stub_and_non_function():
    def stub(D, X, W, A, B, s):
        raise NotImplementedError()

    assert check("05.p1", stub).points == 0 and "NotImplementedError" in check("05.p1", stub).text()
    fb = check("05.p1", "lora_backward")
    assert fb.points == 0 and "should be a function" in fb.text()

    def two_outputs(D, X, W, A, B, s):
        return bwd_right(D, X, W, A, B, s)[1:]

    fb = check("05.p1", two_outputs)
    assert fb.points == 0 and "should return 3 values" in fb.text()


# --------------------------------------------------------------------------- wrong answers: the other items


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "Aᵀ's shape"),
        ("w1", "c", "shape of Z = XA"),
        ("w2", "b", "does not cut the graph"),
        ("w2", "d", "W.grad stays None"),
        ("w3", "a", "inner sizes m and r disagree"),
        ("w3", "d", "Z's shape n × r"),
        ("p2", "b", "Autograd does not average over the batch"),
        ("p2", "c", "Nothing is overwritten inside one backward"),
        ("p2", "d", "s enters once, in dZ = s D Bᵀ"),
        ("p5", "a", "Detaching W cuts only W's branch"),
        ("p5", "c", "shares W's numbers but not its place in the graph"),
        ("p5", "d", "stays None, not zeros"),
        ("p7", "b", "The base path D Wᵀ does not contain s"),
        ("p7", "c", "s enters once on each path"),
        ("p7", "d", "A constant factor in the forward pass stays a factor"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"05.{item_id}", answer)
    assert fb.points == 0
    joined = " ".join(fb.lines)
    assert text in joined and "Reread" in joined


def test_multi_choice_partial_credit_and_hints():
    fb = check("05.p4", {"b", "c"})
    assert 0 < fb.points < 2 and "missing" in fb.text()
    fb = check("05.p4", {"a", "b", "c", "d"})
    assert 0 < fb.points < 2 and "B is random now, so A is the factor that moves" in fb.text()
    fb = check("05.p4", {"a", "c", "d"})  # PEFT's initialisation carried over unchanged
    assert fb.points < 2 and "B is random now" in fb.text()
    fb = check("05.p4", {"a", "e"})
    assert fb.points == 0 and "as large as without LoRA" in fb.text()


def test_p4_key_is_what_the_kernels_give_for_the_swapped_initialisation():
    """P4's key, computed: with A = 0 and B random, the reference kernels give exactly zero ∇B, adapter output and
    adapter path of ∇X, and nonzero ∇A and base path (each option's letter is matched to its term)."""
    import json

    rng = np.random.default_rng(0)
    n, d, m, r, s = 4, 5, 3, 2, 2.0
    X, W, D = rng.standard_normal((n, d)), rng.standard_normal((d, m)), rng.standard_normal((n, m))
    A, B = np.zeros((d, r)), rng.standard_normal((r, m))
    Y, cache = lora.lora_forward(X, W, A, B, s)
    dX, dA, dB = lora.lora_backward(D, cache)
    dZ = s * D @ B.T
    terms = {"a": dA, "b": dB, "c": Y - X @ W, "d": dZ @ A.T, "e": D @ W.T}
    np.testing.assert_allclose(dX, terms["d"] + terms["e"])
    zero = {k for k, t in terms.items() if not np.any(t)}
    keys = json.loads((ROOT / "autograder" / "keys" / "05.json").read_text())["keys"]
    assert zero == set(keys["p4"]) == RIGHT["p4"] == {"b", "c", "d"}


def test_p5_key_is_what_autograd_does_with_a_detached_weight():
    """P5's key, computed: X @ W.detach() leaves W.grad None even with W.requires_grad=True, and X.grad still holds
    the base path D Wᵀ (plus the adapter path); (X @ W).detach() is the variant that loses it."""
    import json

    g = torch.Generator().manual_seed(0)
    X0, W, A, B, D = (torch.randn(*sh, generator=g, dtype=torch.float64)
                      for sh in ((4, 5), (5, 3), (5, 2), (2, 3), (4, 3)))
    s = 2.0
    out = {}
    for variant in ("weight", "product"):
        X, Wt, At, Bt = (t.clone().requires_grad_() for t in (X0, W, A, B))
        base = X @ Wt.detach() if variant == "weight" else (X @ Wt).detach()
        ((base + s * (X @ At) @ Bt) * D).sum().backward()
        out[variant] = (Wt.grad, X.grad)
    adapter_path = s * D @ B.T @ A.T
    assert out["weight"][0] is None and out["product"][0] is None
    torch.testing.assert_close(out["weight"][1], D @ W.T + adapter_path)
    torch.testing.assert_close(out["product"][1], adapter_path)
    keys = json.loads((ROOT / "autograder" / "keys" / "05.json").read_text())["keys"]
    assert keys["p5"] == RIGHT["p5"] == "b"


# P3's batches: two different (X, D) pairs whose Xᵀ D is the G printed in the notebook.
P3_BATCHES = {
    "two tokens": (np.array([[1.0, 2.0, 1.0], [0.0, -1.0, 1.0]]), np.array([[1.0, -1.0], [0.5, 2.0]])),
    "three tokens, X = I": (np.eye(3), lesson05.P3_CASE["G"]),
}


def _autograd_dA(X, D, A, B, s, W=None):
    """∇A measured by torch autograd on the layer Y = X W + s (X A) B with upstream gradient D."""
    W = np.ones((X.shape[1], D.shape[1])) if W is None else W
    At = torch.tensor(A, requires_grad=True)
    Y = torch.tensor(X) @ torch.tensor(W) + s * (torch.tensor(X) @ At) @ torch.tensor(B)
    Y.backward(torch.tensor(D))
    return At.grad.numpy()


@pytest.mark.parametrize("batch", sorted(P3_BATCHES))
def test_p3_key_is_measured_by_autograd_on_any_batch_with_that_G(batch):
    """P3's key measured: autograd's ∇A on a batch whose Xᵀ D is G, whatever X and D are (and whatever W is)."""
    X, D = P3_BATCHES[batch]
    A, B, s = (lesson05.P3_CASE[k] for k in ("A", "B", "s"))
    np.testing.assert_allclose(X.T @ D, lesson05.P3_CASE["G"], atol=1e-15)
    W = np.random.default_rng(0).standard_normal((X.shape[1], D.shape[1]))
    measured = _autograd_dA(X, D, A, B, s, W)[lesson05.P3_INDEX]
    assert ITEMS["p3"].expected() == pytest.approx(measured, abs=1e-12) == pytest.approx(RIGHT["p3"])
    assert check("05.p3", float(measured)).full


def test_p3_mistakes_are_the_mistaken_variants():
    """Each named wrong answer of P3 is what a mistaken backward (or a mistaken reading of G) gives on the batch."""
    X, D = P3_BATCHES["two tokens"]
    A, B, s, G = (lesson05.P3_CASE[k] for k in ("A", "B", "s", "G"))
    i, j = lesson05.P3_INDEX
    variants = [
        (bwd_missing_s(D, X, np.ones((3, 2)), A, B, s)[1][i, j], "the scale is missing"),
        (bwd_s_twice(D, X, np.ones((3, 2)), A, B, s)[1][i, j], "applied twice"),
        (_autograd_dA(X, D, A, B.T, s)[i, j], "Bᵀ belongs"),                   # B where Bᵀ belongs (B is square)
        (G[i, j], "an entry of G"),
        (bwd_right(D, X, np.ones((3, 2)), A, B, s)[2][i, j], "the entry of ∇B"),
        (3.0, "not right (tolerance"),
    ]
    for answer, text in variants:
        fb = check("05.p3", float(answer))
        assert fb.points == 0 and text in fb.text(), (answer, fb.text())


def measured_p6_change(lr=lesson05.P6_LR):
    """05.p6 measured with torch autograd: the worked example with W trainable, one backward of sum(y · D), one SGD step
    on W alone, and the change of y for the same x."""
    ex = lesson05.worked_example()
    t = {k: torch.tensor(v) for k, v in ex.items() if k != "s"}
    s = ex["s"]
    W = t["W"].clone().requires_grad_()

    def y_of(W_):
        return t["X"] @ W_ + s * (t["X"] @ t["A"]) @ t["B"]

    (y_of(W) * t["D"]).sum().backward()
    with torch.no_grad():
        return (y_of(W - lr * W.grad) - y_of(W)).numpy()


def test_p6_key_is_what_autograd_and_one_sgd_step_give():
    """The key is measured: autograd's ∇W, one step of η = 0.1 on W, the new y minus the old. It is −η ‖x‖² D (‖x‖² = 14),
    as the solution's comment says."""
    ex = lesson05.worked_example()
    measured = measured_p6_change()
    np.testing.assert_allclose(measured, ITEMS["p6"].expected(), rtol=1e-12)
    np.testing.assert_allclose(measured, RIGHT["p6"], rtol=1e-12)
    assert (ex["X"] @ ex["X"].T).item() == 14
    np.testing.assert_allclose(measured, -0.1 * 14 * ex["D"], rtol=1e-12)


@pytest.mark.parametrize(
    "answer, points, text",
    [
        (np.array([[0.8, -0.4], [-0.4, 0.2], [1.2, -0.6]]), 0, "that is ∇W = xᵀ D itself"),
        (np.array([[-0.28, 0.14]]), 0.25, "the base path has no scale"),
        (-RIGHT["p6"], 0.25, "a descent step subtracts"),
        (RIGHT["p6"] / 0.1, 0.25, "the change for η = 1"),
        (np.array([[4.94, -3.97]]), 0.25, "the new output y"),
        (RIGHT["p6"] + 0.1, 0, "is not right"),  # no credit, and the key stays hidden
        ("x ΔW", 0, "array of numbers"),
    ],
)
def test_p6_dY_mistakes(answer, points, text):
    fb = check("05.p6", answer)
    assert fb.points == pytest.approx(points) and text in fb.text(), fb.text()


def test_p6_named_values_are_what_the_mistakes_compute():
    """'scaled' is the change with an s put into ∇W (s = 0.5 times the key); 'no learning rate' is the step of η = 1,
    measured; 'new output' is y after the step."""
    named = {m.label: m.value for m in lesson05._dY_mistakes()}
    np.testing.assert_allclose(named["scaled"], 0.5 * measured_p6_change(), rtol=1e-12)
    np.testing.assert_allclose(named["no learning rate"], measured_p6_change(lr=1.0), rtol=1e-12)
    ex = lesson05.worked_example()
    y = lora.lora_forward(ex["X"], ex["W"], ex["A"], ex["B"], ex["s"])[0]
    np.testing.assert_allclose(named["new output"], y + RIGHT["p6"], rtol=1e-12)


# --------------------------------------------------------------------------- a named mistake is the one made


def bwd_sign_flipped(D, X, W, A, B, s):
    return bwd_right(-D, X, W, A, B, s)


def bwd_float32(D, X, W, A, B, s):
    f = np.float32
    return tuple(np.asarray(v, dtype=f) for v in bwd_right(D.astype(f), X.astype(f), W.astype(f), A.astype(f), B.astype(f), f(s)))


_NAMES = {  # each simulated mistake → the words that name it; no other mistake's words may appear
    bwd_missing_s: "scale s is missing", bwd_s_twice: "applied twice", bwd_no_adapter_in_dX: "missing the adapter path",
    bwd_no_base_in_dX: "missing the base path", bwd_dA_transposed: "shape of Aᵀ", bwd_dB_transposed: "∇B is transposed",
    bwd_updated_B: "already updated", bwd_W_not_transposed: "not D W", bwd_sign_flipped: "wrong sign",
}


@pytest.mark.parametrize("fn", list(_NAMES) + [bwd_float32], ids=lambda f: f.__name__)
def test_the_named_mistake_is_the_one_made_and_no_other(fn):
    fb = check("05.p1", fn, hidden=True)
    # (a line that says two mistakes fit one case equally names both on purpose: the other cases decide)
    named = " ".join(l for l in fb.lines if "Likely mistake" in l and "two mistakes give exactly" not in l)
    others = [w for f, w in _NAMES.items() if f is not fn and w in named]
    assert not others, f"{fn.__name__}: the feedback also names {others}: {named}"
    if fn is bwd_float32:
        assert "float32" in fb.text() and not named, fb.text()
    else:
        assert _NAMES[fn] in named, fb.text()


def test_p7_key_and_p9_identity_hold_for_the_reference_backward():
    """P7's key: doubling s doubles ∇A, ∇B and the adapter path of ∇X, not the base path. P9's model answer:
    ∇A = s G Bᵀ and ∇B = s Aᵀ G with G = Xᵀ D."""
    from coursekit import lora

    rng = np.random.default_rng(5)
    X, W, A, B, D = (rng.standard_normal(sh) for sh in ((4, 6), (6, 5), (6, 2), (2, 5), (4, 5)))
    dX1, dA1, dB1 = lora.lora_backward(D, lora.lora_forward(X, W, A, B, 1.5)[1])
    dX2, dA2, dB2 = lora.lora_backward(D, lora.lora_forward(X, W, A, B, 3.0)[1])
    np.testing.assert_allclose(dA2, 2 * dA1, rtol=1e-12)
    np.testing.assert_allclose(dB2, 2 * dB1, rtol=1e-12)
    np.testing.assert_allclose(dX2 - D @ W.T, 2 * (dX1 - D @ W.T), rtol=1e-10, atol=1e-12)
    G = X.T @ D
    np.testing.assert_allclose(dA1, 1.5 * G @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB1, 1.5 * A.T @ G, rtol=1e-12)


def test_p9_a_nonzero_G_outside_both_factors_gives_the_adapter_no_gradient():
    """P9's model answer, measured with autograd: for r < d and r < m, G = u vᵀ with Aᵀ u = 0 and B v = 0 is a nonzero
    ∇W (what a trainable W gets), while ∇A and ∇B are zero, so an SGD step leaves A and B unchanged; the adapter's
    gradients are s G Bᵀ (d × r) and s Aᵀ G (r × m), r·(d + m) numbers against G's d·m."""
    rng = np.random.default_rng(9)
    d, m, r, s = 6, 5, 2, 1.5
    A, B = rng.standard_normal((d, r)), rng.standard_normal((r, m))
    u = np.linalg.svd(A.T)[2][-1]              # a unit vector with Aᵀ u = 0 (A has rank r < d)
    v = np.linalg.svd(B)[2][-1]                # a unit vector with B v = 0 (B has rank r < m)
    G = np.outer(u, v)
    X, D = np.eye(d), G                        # a batch of d tokens whose Xᵀ D is G
    Xt, Wt, At, Bt = (torch.tensor(a, requires_grad=True) for a in (X, rng.standard_normal((d, m)), A, B))
    ((Xt @ Wt + s * (Xt @ At) @ Bt) * torch.tensor(D)).sum().backward()
    np.testing.assert_allclose(Wt.grad.numpy(), G, atol=1e-12)
    assert np.abs(G).max() > 0.1
    np.testing.assert_allclose(At.grad.numpy(), 0, atol=1e-12)
    np.testing.assert_allclose(Bt.grad.numpy(), 0, atol=1e-12)
    lr = 0.1
    np.testing.assert_allclose(A - lr * At.grad.numpy(), A, atol=1e-12)
    np.testing.assert_allclose(B - lr * Bt.grad.numpy(), B, atol=1e-12)
    assert At.grad.numel() + Bt.grad.numel() == r * (d + m) < d * m == Wt.grad.numel()
    # and a generic G does reach both factors
    Xt.grad = Wt.grad = At.grad = Bt.grad = None
    ((Xt @ Wt + s * (Xt @ At) @ Bt) * torch.tensor(rng.standard_normal((d, m)))).sum().backward()
    assert np.abs(At.grad.numpy()).max() > 1e-3 and np.abs(Bt.grad.numpy()).max() > 1e-3


def test_p9_the_two_gradients_fix_r_d_plus_m_minus_r_squared_numbers_of_G():
    """P9's model answer on the overlap: ∇A and ∇B hold r·(d + m) numbers, but Aᵀ ∇A = ∇B Bᵀ (both s Aᵀ G Bᵀ), so the
    linear map G ↦ (∇A, ∇B) has rank r·(d + m) − r², and the G it sends to zero form a (d − r)(m − r)-dimensional set."""
    rng = np.random.default_rng(9)
    d, m, r, s = 6, 5, 2, 1.5
    A, B = rng.standard_normal((d, r)), rng.standard_normal((r, m))
    G = rng.standard_normal((d, m))
    dA, dB = s * G @ B.T, s * A.T @ G
    np.testing.assert_allclose(A.T @ dA, dB @ B.T, rtol=1e-12)
    columns = []
    for k in range(d * m):                       # the map applied to each basis matrix of G
        E = np.zeros(d * m)
        E[k] = 1.0
        E = E.reshape(d, m)
        columns.append(np.concatenate([(s * E @ B.T).ravel(), (s * A.T @ E).ravel()]))
    rank = np.linalg.matrix_rank(np.array(columns).T)
    assert rank == r * (d + m) - r * r == d * m - (d - r) * (m - r) < r * (d + m)


def test_p2_key_is_what_autograd_gives_peft_layout_for_a_batch():
    """P2's key, computed: PEFT's layout (lora_A, lora_B as nn.Linear, scaling after lora_B) on a b × n × d batch with a
    mean loss. lora_A.weight.grad is r × d and equals dZᵀ X with the b · n tokens flattened (dZ = ∂L/∂Z measured), and
    each wrong option, all r × d too, is computed and differs from it: the mean over the b sequences (b), the last
    sequence alone (c), s applied once more (d)."""
    import json

    torch.manual_seed(0)
    b, n, d, m, r, s = 3, 4, 5, 6, 2, 2.0
    lora_A = torch.nn.Linear(d, r, bias=False, dtype=torch.float64)
    lora_B = torch.nn.Linear(r, m, bias=False, dtype=torch.float64)
    X = torch.randn(b, n, d, dtype=torch.float64)
    W = torch.randn(d, m, dtype=torch.float64)     # the frozen base
    T = torch.randn(b, n, m, dtype=torch.float64)  # targets of a mean squared error, a mean over all tokens
    Z = lora_A(X)
    Z.retain_grad()
    Y = X @ W + s * lora_B(Z)
    ((Y - T) ** 2).mean().backward()
    grad, dZ = lora_A.weight.grad, Z.grad
    options = {
        "a": dZ.reshape(-1, r).T @ X.reshape(-1, d),
        "b": torch.stack([dZ[i].T @ X[i] for i in range(b)]).mean(0),
        "c": dZ[-1].T @ X[-1],
        "d": s * dZ.reshape(-1, r).T @ X.reshape(-1, d),
    }
    assert all(tuple(v.shape) == tuple(grad.shape) == (r, d) for v in options.values())
    right = {k for k, v in options.items() if torch.allclose(v, grad, rtol=1e-12, atol=1e-15)}
    for k, v in options.items():
        assert k in right or (v - grad).abs().max() > 1e-3 * grad.abs().max(), k
    # the same sum, one backward per sequence: .grad adds them up
    lora_A.weight.grad = None
    for i in range(b):
        Yi = X[i] @ W + s * lora_B(lora_A(X[i]))
        (((Yi - T[i]) ** 2).sum() / (b * n * m)).backward()
    torch.testing.assert_close(lora_A.weight.grad, grad)
    keys = json.loads((ROOT / "autograder" / "keys" / "05.json").read_text())["keys"]
    assert right == {keys["p2"]} == {RIGHT["p2"]} == {"a"}


def test_p8_model_answer_is_what_autograd_gives_the_toy_with_a_skip():
    """P8's model answer, computed: the two-layer toy of 'Frozen is not detached' with a skip around layer 2,
    Y₂ = H + H W₂ + s (H A₂) B₂, fresh adapters. Frozen: ∇H = D + D W₂ᵀ; with (H @ W2).detach(): ∇H = D. B₁ gets a
    nonzero gradient in both, s Z₁ᵀ ∇H, and the two differ by s Z₁ᵀ D W₂ᵀ; ∇A₁ is zero in both (B₁ = 0)."""
    g = torch.Generator().manual_seed(0)
    f64 = dict(dtype=torch.float64)
    n, d, h, r, s = 6, 5, 4, 2, 2.0
    X, W1, W2 = (torch.randn(*shape, generator=g, **f64) for shape in ((n, d), (d, h), (h, h)))
    A1_0, A2_0 = torch.randn(d, r, generator=g, **f64), torch.randn(h, r, generator=g, **f64)
    D = torch.randn(n, h, generator=g, **f64)

    def run(detach):
        A1, A2 = A1_0.clone().requires_grad_(), A2_0.clone().requires_grad_()
        B1, B2 = torch.zeros(r, h, **f64).requires_grad_(), torch.zeros(r, h, **f64).requires_grad_()
        H = X @ W1 + s * (X @ A1) @ B1
        H.retain_grad()
        base = (H @ W2).detach() if detach else H @ W2
        ((H + base + s * (H @ A2) @ B2) * D).sum().backward()
        return H.grad, B1.grad, A1.grad

    Z1 = X @ A1_0
    (dH_frozen, dB1_frozen, dA1_frozen), (dH_cut, dB1_cut, dA1_cut) = run(False), run(True)
    torch.testing.assert_close(dH_frozen, D + D @ W2.T)
    torch.testing.assert_close(dH_cut, D)
    torch.testing.assert_close(dB1_cut, s * Z1.T @ D)
    torch.testing.assert_close(dB1_frozen - dB1_cut, s * Z1.T @ D @ W2.T)
    assert dB1_cut.abs().max() > 0.1 and (dB1_frozen - dB1_cut).abs().max() > 0.1
    assert dA1_frozen.abs().max() == 0 and dA1_cut.abs().max() == 0
