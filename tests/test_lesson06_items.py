"""Lesson 06 ("The rank-one walk"): graded items score right answers fully, typical wrong answers less, with
the diagnostics a student needs; the notebook's test cells agree with the item registry."""

from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from coursekit import walk
from coursekit.grading import check
from coursekit.grading.lessons import lesson06
from coursekit.grading.lessons.lesson06 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "06-the-rank-one-walk" / "06-the-rank-one-walk.ipynb"


# --------------------------------------------------------------------------- right answers, written as a student would


def ce_grad(Y, target):
    e = np.exp(Y - Y.max(axis=1, keepdims=True))
    D = e / e.sum(axis=1, keepdims=True)
    D[0, target] -= 1.0
    return D


def adamw_step(param, grad, m, v, t, lr, betas, eps, weight_decay):
    b1, b2 = betas
    param = param * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad**2
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def sgd_walk_step(X, W, A, B, s, target, lr):
    Z = X @ A
    D = ce_grad(X @ W + s * Z @ B, target)
    dB = s * Z.T @ D
    dA = X.T @ (s * D @ B.T)
    return A - lr * dA, B - lr * dB


def log_softmax_backward(g, x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return g - e / e.sum(axis=1, keepdims=True) * g.sum(axis=1, keepdims=True)


def largest_scale_for_a_tenth_step():
    """P4 worked out by a student: AdamW's first step moves an entry by lr·|g|/(|g| + ε), which is lr/10 at |g| = ε/9."""
    g = np.abs(walk.run_walk(**walk.worked_example(), steps=1)[0].dB).max()  # the notebook's r1.dB
    return 1e-8 / (9 * g)


def beta1_for_a_full_step(b2=0.999):
    """P5 by hand: A's moments are zero when its first gradient arrives at t = 2; the move lr·√(1 + β₂)/(1 + β₁) is lr
    at β₁ = √(1 + β₂) − 1."""
    return np.sqrt(1 + b2) - 1


RIGHT = {"w1": "c", "w2": 0.616344, "w3": "a", "p1": ce_grad, "p2": adamw_step, "p3": sgd_walk_step,
         "p4": largest_scale_for_a_tenth_step(), "p5": beta1_for_a_full_step(), "p6": "a", "p7": log_softmax_backward}


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"06.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_typed_six_decimals_are_accepted():
    assert check("06.p4", 8.05e-9).full and not check("06.p4", 8.0e-9).full
    assert check("06.p5", 0.414).full and check("06.p5", 0.41).points == 0
    assert check("06.w2", -np.log(0.539915)).full


# --------------------------------------------------------------------------- registry, keys, notebook


def _cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]


# --------------------------------------------------------------------------- choices and numbers


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", "a", "ignores which class is right"),
        ("w1", "b", "That is −D"),
        ("w1", "d", "the loss itself"),
        ("w3", "b", "W is frozen"),
        ("w3", "c", "X is an input"),
        ("w3", "d", "its gradient happens to be zero"),
        ("p6", "b", "That is what decoupled decay does"),
        ("p6", "c", "the gradient Adam sees is ∇A + λA"),
        ("p6", "d", "No optimizer here multiplies θ by 1 − λ"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"06.{item_id}", answer)
    assert fb.points == 0
    assert text in fb.text() and "Reread" in fb.text(), fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w2", 0.776343, "the target is class 1"),
        ("w2", -0.616344, "a loss of a probability below one is positive"),
        ("w2", 0.267677, "log base 10"),
        ("w2", -np.log(1.35), "the logit Y[1] itself"),   # −log of the target's logit, softmax skipped
        ("p5", 0.968, "without bias correction"),
        ("p5", 0.999, "square root off v's correction"),
        ("p5", 0.9, "not right (tolerance"),
        ("p4", 7.25e-9, "you divided by ε alone"),
        ("p4", 7.28e-5, "ε under the"),
        ("p4", 0.7245, "an SGD step"),
        ("p4", 1e-8, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"06.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def _torch_adamw_moves(grads, beta1=0.9, beta2=0.999):
    """How far torch.optim.AdamW (lr 0.01, ε 1e-8, no decay) moves a parameter at each step, given each step's gradient."""
    x = torch.nn.Parameter(torch.zeros(np.shape(grads[0]), dtype=torch.float64))
    opt = torch.optim.AdamW([x], lr=0.01, betas=(beta1, beta2), eps=1e-8, weight_decay=0.0)
    moves = []
    for g in grads:
        before = x.detach().clone()
        x.grad = torch.tensor(np.asarray(g, dtype=np.float64))
        opt.step()
        moves.append(float((x.detach() - before).abs().max()))
    return moves


def test_p4_key_is_where_torchs_first_step_falls_to_a_tenth_of_lr():
    """P4's key, measured: with the loss scaled by the key c, torch's AdamW moves B by lr/10 at the first step, by more
    for a slightly larger c; with the walk's own gradient (c = 1) by almost exactly lr, as the lesson prints."""
    dB = walk.run_walk(**walk.worked_example(), steps=1)[0].dB
    c = ITEMS["p4"].expected()
    assert c == pytest.approx(RIGHT["p4"], rel=1e-9)
    assert _torch_adamw_moves([c * dB])[0] == pytest.approx(0.001, rel=1e-9)
    assert _torch_adamw_moves([1.01 * c * dB])[0] > 0.001 > _torch_adamw_moves([0.99 * c * dB])[0]
    assert _torch_adamw_moves([dB])[0] == pytest.approx(0.01, rel=1e-6)


def test_p4_named_mistakes_are_the_mistaken_first_steps():
    """Each named c is where a mistaken first step (ε alone below g, ε under the root, an SGD step) moves B by lr/10."""
    g = np.abs(walk.run_walk(**walk.worked_example(), steps=1)[0].dB).max()
    named = {m.label: m.value for m in lesson06._p4_mistakes()}
    steps = {"|g| left out of the denominator": lambda x: 0.01 * x / 1e-8,
             "ε under the square root": lambda x: 0.01 * x / np.sqrt(x * x + 1e-8),
             "an SGD step": lambda x: 0.01 * x}
    assert set(named) == set(steps)
    for label, step in steps.items():
        assert step(named[label] * g) == pytest.approx(0.001, rel=1e-9), label
        assert abs(named[label] - RIGHT["p4"]) > 1e-3 * RIGHT["p4"], label


def test_p5_key_is_the_beta1_at_which_torchs_step_two_moves_a_by_lr():
    """P5's key, measured: torch's AdamW on the walk's A (a zero gradient at step 1, the walk's ∇A at step 2) moves A by
    lr at step 2 with β₁ = the key and β₂ = 0.999, by less for a larger β₁; with β₁ = 0.9 by the printed 0.007441."""
    dA = walk.run_walk(**walk.worked_example(), steps=2)[1].dA
    b1 = ITEMS["p5"].expected()
    assert b1 == pytest.approx(RIGHT["p5"], rel=1e-5)  # ε: |g| ≈ 0.009
    assert _torch_adamw_moves([0 * dA, dA], beta1=b1)[1] == pytest.approx(0.01, rel=1e-6)
    assert _torch_adamw_moves([0 * dA, dA], beta1=1.01 * b1)[1] < 0.01 < _torch_adamw_moves([0 * dA, dA], beta1=0.99 * b1)[1]
    assert _torch_adamw_moves([0 * dA, dA], beta1=0.9)[1] == pytest.approx(0.007441, abs=5e-7)


def test_p5_named_mistakes_are_the_mistaken_corrections():
    """Each named β₁ is where a mistaken move (no bias correction; v's correction without its square root) is lr."""
    b2 = 0.999
    named = {m.label: m.value for m in lesson06._p5_mistakes()}
    moves = {"no bias correction": lambda b1: 0.01 * (1 - b1) / np.sqrt(1 - b2),
             "v's correction not square-rooted": lambda b1: 0.01 * ((1 - b1) / (1 - b1**2)) * (1 - b2**2) / (1 - b2)}
    assert set(named) == set(moves)
    for label, move in moves.items():
        assert move(named[label]) == pytest.approx(0.01, rel=1e-9), label
        assert abs(named[label] - RIGHT["p5"]) > 1e-3 * RIGHT["p5"], label


def test_p6_key_is_what_torch_adam_does_with_coupled_decay():
    ex = walk.worked_example()
    for opt_cls, want in ((torch.optim.Adam, [[0.09], [-0.19]]), (torch.optim.AdamW, [[0.0995], [-0.199]])):
        A = torch.nn.Parameter(torch.tensor(ex["A"]))
        opt = opt_cls([A], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.5)
        A.grad = torch.zeros_like(A)  # B = 0: A's loss gradient is exactly zero at step 1
        opt.step()
        np.testing.assert_allclose(A.detach().numpy(), want, atol=1e-7)


# --------------------------------------------------------------------------- ce_grad


def _ce_wrong(kind):
    def fn(Y, target):
        if kind == "naive":
            e = np.exp(Y)
            D = e / e.sum(axis=1, keepdims=True)
            D[0, target] -= 1
            return D
        D = ce_grad(Y, target)
        onehot = np.eye(Y.shape[1])[[target]]
        p = D + onehot
        return {"sign": -D, "p": p, "class": p - np.eye(Y.shape[1])[[target - 1]]}[kind]
    return fn


@pytest.mark.parametrize("kind, text", [("sign", "the sign is flipped"), ("p", "you returned the probabilities p"),
                                        ("class", "not the target class"), ("naive", "every entry should be finite")])
def test_ce_grad_mistakes(kind, text):
    fb = check("06.p1", _ce_wrong(kind), hidden=True)
    assert fb.points < 3 and text in fb.text(), fb.text()


def test_ce_grad_hidden_cases_defeat_a_lookup_and_naive_exp():
    seen = {}

    def lookup(Y, target):
        return seen.setdefault("first", ce_grad(np.array([[1.19, 1.35]]), 1))

    assert check("06.p1", lookup, hidden=True).points < 1.5
    fb = check("06.p1", _ce_wrong("naive"), hidden=True)
    assert fb.text().count("✗") >= 2  # the public large-logit case and the hidden one


# --------------------------------------------------------------------------- adamw_step


def _adam_wrong(kind):
    def fn(param, grad, m, v, t, lr, betas, eps, weight_decay):
        b1, b2 = betas
        g = grad + weight_decay * param if kind == "coupled" else grad
        p = param if kind in ("coupled", "nodecay") else param * (1 - lr * weight_decay)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        mh, vh = (m, v) if kind == "nobias" else (m / (1 - b1**t), v / (1 - b2**t))
        den = np.sqrt(vh + eps) if kind == "epsin" else np.sqrt(vh) + eps
        return p - lr * mh / den, m, v
    return fn


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("kind, text", [
    ("nobias", "no bias correction"),
    ("coupled", "weight decay coupled into the gradient"),
    ("epsin", "eps inside the square root"),
    ("nodecay", "the weight decay is missing"),
])
def test_adamw_mistakes_lose_points_with_a_diagnosis(kind, text, hidden):
    fb = check("06.p2", _adam_wrong(kind), hidden=hidden)
    assert fb.points < 4 and text in fb.text(), fb.text()
    if hidden:
        assert fb.text().count("hidden case") >= 3
        # every hidden line explains itself in words: no option dict as the mistake's name, no bare name
        diagnoses, in_hidden = [], False
        for line in fb.lines:
            if line.startswith(("✗", "✓")):
                in_hidden = line.startswith("✗ hidden case")
            elif in_hidden and "Likely mistake" in line:
                diagnoses.append(line)
        assert diagnoses and all("{" not in l and text in l.lower() and "Reread" in l for l in diagnoses), diagnoses


def test_adamw_off_by_one_t_is_named():
    def t_minus_one(param, grad, m, v, t, lr, betas, eps, weight_decay):
        return adamw_step(param, grad, m, v, max(t - 1, 1) if t > 1 else t, lr, betas, eps, weight_decay)

    fb = check("06.p2", t_minus_one, hidden=True)
    assert fb.points < 4 and "t − 1" in fb.text()


def test_adamw_returns_three_values():
    fb = check("06.p2", lambda param, grad, m, v, t, lr, betas, eps, weight_decay: adamw_step(param, grad, m, v, t, lr, betas, eps, weight_decay)[0])
    assert fb.points == 0 and "should return 3 values" in fb.text()


def test_adamw_stub_scores_zero():
    def stub(param, grad, m, v, t, lr, betas, eps, weight_decay):
        raise NotImplementedError()

    fb = check("06.p2", stub)
    assert fb.points == 0 and "NotImplementedError" in fb.text()


# --------------------------------------------------------------------------- sgd_walk_step


def updated_B_first(X, W, A, B, s, target, lr):
    Z = X @ A
    D = ce_grad(X @ W + s * Z @ B, target)
    B_new = B - lr * s * Z.T @ D
    dA = X.T @ (s * D @ B_new.T)  # the mistake: the new B in the backward pass
    return A - lr * dA, B_new


def updated_A_first(X, W, A, B, s, target, lr):
    D = ce_grad(X @ W + s * (X @ A) @ B, target)
    A_new = A - lr * X.T @ (s * D @ B.T)
    return A_new, B - lr * s * (X @ A_new).T @ D


def missing_s(X, W, A, B, s, target, lr):
    Z = X @ A
    D = ce_grad(X @ W + s * Z @ B, target)
    return A - lr * X.T @ (D @ B.T), B - lr * Z.T @ D


def ascent(X, W, A, B, s, target, lr):
    A_new, B_new = sgd_walk_step(X, W, A, B, s, target, lr)
    return 2 * A - A_new, 2 * B - B_new


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("fn, text", [
    (updated_B_first, "you computed ∇A with B already updated"),
    (updated_A_first, "you computed ∇B with A already updated"),
    (missing_s, "missing the scale"),
    (ascent, "moved up the gradient"),
])
def test_walk_step_mistakes(fn, text, hidden):
    fb = check("06.p3", fn, hidden=hidden)
    assert fb.points < 3 and text in fb.text(), fb.text()


def test_updated_B_first_is_caught_on_the_seed_walk_itself():
    """With B = 0 the mistake still shows: the updated B is nonzero, so the wrong ∇A is too."""
    fb = check("06.p3", updated_B_first, hidden=False)
    assert "✗ public case 1" in fb.text()


# --------------------------------------------------------------------------- log_softmax_backward


def _softmax_rule_own_code(g, x):
    """The softmax rule written out, with g taken for ∂L/∂p: the chain rule through the log left out."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    return p * (g - (g * p).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("fn, label, text", [
    (lambda g, x: walk.softmax_backward(g, walk.softmax(x)), "softmax rule", "that is the softmax rule"),
    (_softmax_rule_own_code, "softmax rule", "that is the softmax rule"),
    (lambda g, x: g - walk.softmax(x), "no sum", "the row sum is missing"),
    (lambda g, x: walk.softmax(x) * g.sum(axis=1, keepdims=True) - g, "sign", "the sign is flipped"),
    (lambda g, x: g - walk.softmax(x) * g.sum(), "all sum", "sum each row separately"),
    (lambda g, x: g - (g * walk.softmax(x)).sum(axis=1, keepdims=True), "transposed Jacobian", "the Jacobian's other index"),
    (lambda g, x: g - walk.softmax(g) * g.sum(axis=1, keepdims=True), "softmax of g", "not a softmax of the upstream gradient"),
])
def test_log_softmax_backward_mistakes(fn, label, text, hidden):
    """Each named mistake is what its mistaken code returns: running the variant gives its label, and only its label."""
    fb = check("06.p7", fn, hidden=hidden)
    assert fb.points < 2 and text in fb.text(), fb.text()
    assert fb.mistakes == [label], fb.mistakes


def test_p7_rule_composed_through_p_fails_where_a_probability_underflows():
    """The derivation's second way in, coded without simplifying (softmax's upstream g / p, then the softmax rule),
    agrees with the rule where every p > 0 and gives NaN on the public case whose softmax(x)[1] underflows to 0."""
    def composed(g, x):
        p = walk.softmax(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return walk.softmax_backward(g / p, p)

    fb = check("06.p7", composed, hidden=True)
    assert 0 < fb.points < 2 and fb.mistakes == [], fb.text()
    assert "✗ public case 3 (logits hundreds apart" in fb.text() and "should be finite" in fb.text(), fb.text()
    assert fb.text().count("✗") == 1


def test_p7_rule_agrees_with_autograd_on_the_underflow_case():
    g, x = np.array([[0.5, -1.0, 2.0]]), np.array([[1000.0, 200.0, 1003.0]])
    assert walk.softmax(x)[0, 1] == 0.0
    xt = torch.tensor(x, requires_grad=True)
    torch.log_softmax(xt, -1).backward(torch.tensor(g))
    np.testing.assert_allclose(log_softmax_backward(g, x), xt.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_p7s_rule_is_not_written_before_p7():
    """P7 asks the student to derive log-softmax's backward: no cell of the lesson above P7 (solution or release),
    no earlier lesson and no glossary or notation entry states it, and none runs coursekit's log_softmax_backward,
    whose output the item grades. The Know this teaches the softmax rule, which the derivation starts from."""
    import re

    from coursekit import course

    rule = re.compile(r"g\s*[−-]\s*(softmax\(x\)|p)\s*[·*⋅]?\s*(Σ|rowsum|sum)|log_softmax_backward\(|log-softmax rule")
    release = ROOT / "lessons" / "06-the-rank-one-walk" / "06-the-rank-one-walk.ipynb"
    for path in (NOTEBOOK, release):
        cells = nbformat.read(path, as_version=4).cells
        p7 = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("**P7"))
        for c in cells[:p7]:
            assert not rule.search(c.source), f"{path.name}: a cell above P7 states its rule: {c.source[:300]}"
        know = next(c.source for c in cells if "### Softmax, cross-entropy and D" in c.source)
        assert "dx = p ⊙ (g − Σ_j g_j p_j)" in know                                # what the derivation starts from
    for lid in course.lesson_ids(ROOT):
        if lid < "06":
            for c in nbformat.read(ROOT / "lessons" / lid / f"{lid}.ipynb", as_version=4).cells:
                assert not rule.search(c.source), f"{lid} states P7's rule: {c.source[:300]}"
    for page in ("glossary.md", "notation.md"):
        assert not rule.search((ROOT / "lessons" / page).read_text()), page


def test_p7_stub_documents_log_softmax_backward_without_stating_its_rule():
    """The docstring the student reads in P7's answer cell (the release keeps it as the whole body) says what
    log_softmax_backward takes and returns, not the rule dx = g − softmax(x) · Σ_j g_j that the item grades."""
    release = ROOT / "lessons" / "06-the-rank-one-walk" / "06-the-rank-one-walk.ipynb"
    for path in (NOTEBOOK, release):
        nb = nbformat.read(path, as_version=4)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "p7_answer")
        doc = cell.source.split('"""')[1]
        assert "log_softmax(x)" in doc and "n x m" in doc, doc
        for rule in ("softmax(x) *", "softmax(x) ·", "row sum", "sum(", "g -", "g −", "Σ"):
            assert rule not in doc, f"{path.name}: P7's docstring states the answer ({rule!r}): {doc}"


def test_hidden_cases_are_deterministic():
    a = check("06.p2", adamw_step, hidden=True).text()
    b = check("06.p2", adamw_step, hidden=True).text()
    assert a == b and a.count("hidden case") == 5


def test_adamw_mistakes_are_named_in_words_and_explain_themselves_on_hidden_cases():
    # a hidden case whose mistake no public case showed has only the mistake's name and hint to go on
    from coursekit.grading.lessons.lesson06 import _adam_mistakes

    kw = dict(param=np.ones((2, 2)), grad=np.full((2, 2), 0.5), m=np.full((2, 2), 0.1), v=np.full((2, 2), 0.2), t=3,
              lr=0.01, betas=(0.9, 0.999), eps=0.01, weight_decay=0.1)
    found = [m for ms in _adam_mistakes(kw).values() for m in ms]
    assert {m.label for m in found} == {"no bias correction", "coupled weight decay", "eps inside the root",
                                        "no weight decay", "step t − 1"}
    assert all(m.hint and "Reread" in m.hint for m in found)


# --------------------------------------------------------------------------- p8 (graded by hand): what its model answer claims


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_p8_equal_constant_factors_train_but_stay_rank_one(optimizer):
    """P8's model answer, measured: with every entry of A and B equal to 0.01, both factors get nonzero gradients and the loss
    falls, but the columns of A (rows of B) stay copies of one another under SGD and AdamW (decoupled decay included), so sAB
    keeps rank 1; PEFT's initialisation (A random, B = 0) on the same task reaches the full rank r and a lower loss."""
    rng = np.random.default_rng(6)
    n, d, m, r = 16, 12, 10, 4
    X, W = rng.standard_normal((n, d)), rng.standard_normal((d, m)) / 4
    target = rng.integers(0, m, n)
    common = dict(X=X, W=W, s=2.0, target=target, steps=300, optimizer=optimizer, weight_decay=0.01)
    const = walk.run_walk(A=np.full((d, r), 0.01), B=np.full((r, m), 0.01), **common)
    assert const[0].dA.any() and const[0].dB.any()                        # both move from the first step
    assert const[-1].loss_after < 0.75 * const[0].loss                    # and the loss falls
    A, B = const[-1].A_after, const[-1].B_after
    assert np.abs(A - A[:, :1]).max() < 1e-12 and np.abs(B - B[:1]).max() < 1e-12   # r copies of one column / row
    sv = np.linalg.svd(A @ B, compute_uv=False)
    assert sv[1] < 1e-12 * sv[0]                                          # sAB = r·s·a bᵀ: rank 1
    usual = walk.run_walk(A=0.3 * rng.standard_normal((d, r)), B=np.zeros((r, m)), **common)
    sv_usual = np.linalg.svd(usual[-1].A_after @ usual[-1].B_after, compute_uv=False)
    assert sv_usual[r - 1] > 0.1 * sv_usual[0]                             # all r directions in use
    assert usual[-1].loss_after < 0.2 * const[-1].loss_after
