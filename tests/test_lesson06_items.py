"""Lesson 06 ("The rank-one walk"): graded items score right answers fully, typical wrong answers less, with
the diagnostics a student needs; the notebook's test cells agree with the item registry."""

from pathlib import Path

import nbformat
import numpy as np
import pytest

from coursekit import walk
from coursekit.grading import check
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


def a_after_three():
    ex = walk.worked_example()
    sa, sb = (dict(m=np.zeros_like(ex[k]), v=np.zeros_like(ex[k])) for k in "AB")
    A, B = ex["A"], ex["B"]
    for t in (1, 2, 3):
        D = ce_grad(ex["X"] @ ex["W"] + (ex["X"] @ A) @ B, 1)
        dA, dB = ex["X"].T @ (D @ B.T), (ex["X"] @ A).T @ D
        A, sa["m"], sa["v"] = adamw_step(A, dA, sa["m"], sa["v"], t, 0.01, (0.9, 0.999), 1e-8, 0.0)
        B, sb["m"], sb["v"] = adamw_step(B, dB, sb["m"], sb["v"], t, 0.01, (0.9, 0.999), 1e-8, 0.0)
    return A


def sgd_loss_after_one():
    ex = walk.worked_example()
    A, B = sgd_walk_step(ex["X"], ex["W"], ex["A"], ex["B"], 1.0, 1, 0.1)
    Y = ex["X"] @ ex["W"] + (ex["X"] @ A) @ B
    return float(-np.log(np.exp(Y[0, 1]) / np.exp(Y).sum()))


RIGHT = {"w1": "c", "w2": 0.616344, "w3": "a", "p1": ce_grad, "p2": adamw_step, "p3": sgd_walk_step,
         "p4": sgd_loss_after_one(), "p5": a_after_three(), "p6": "d", "p7": log_softmax_backward}


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"06.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_typed_six_decimals_are_accepted():
    assert check("06.p4", 0.612542).full
    assert check("06.p5", [[0.084269], [-0.215731]]).full
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
        ("p6", "a", "runs through B, not through W"),
        ("p6", "b", "D is not zero"),
        ("p6", "c", "computed before the optimizer runs"),
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
        ("p4", 0.616344, "the loss before the step"),
        ("p4", 0.613588, "AdamW's loss after step 1"),
        ("p4", 0.608616, "after two SGD steps"),
        ("p4", 0.62, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"06.{item_id}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p2_lr_mistake_is_computed_not_typed():
    lr01 = walk.run_walk(**walk.worked_example(), steps=1, optimizer="sgd", lr=0.01)[0].loss_after
    assert "lr 0.01" in check("06.p4", lr01).text()


def test_p6_mistakes():
    restarted = walk.worked_example()
    for _ in range(3):  # a new optimizer each step: moments and t start over
        rec = walk.run_walk(**restarted, steps=1)[0]
        restarted |= dict(A=rec.A_after, B=rec.B_after)
    fb = check("06.p5", restarted["A"])
    assert 0 < fb.points < 2 and "restarted AdamW" in fb.text()
    fb = check("06.p5", walk.run_walk(**walk.worked_example(), steps=2)[-1].A_after)
    assert "after two steps" in fb.text()
    fb = check("06.p5", walk.run_walk(**walk.worked_example(), steps=3, optimizer="sgd")[-1].A_after)
    assert "SGD variant" in fb.text()
    fb = check("06.p5", a_after_three().T)
    assert fb.points == 0 and "transpose" in fb.text()


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


@pytest.mark.parametrize("fn, text", [
    (lambda g, x: walk.softmax_backward(g, walk.softmax(x)), "that is the softmax rule"),
    (lambda g, x: g - walk.softmax(x), "the row sum is missing"),
    (lambda g, x: walk.softmax(x) * g.sum(axis=1, keepdims=True) - g, "the sign is flipped"),
    (lambda g, x: g - walk.softmax(x) * g.sum(), "sum each row separately"),
])
def test_log_softmax_backward_mistakes(fn, text):
    fb = check("06.p7", fn, hidden=True)
    assert fb.points < 2 and text in fb.text(), fb.text()


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


def test_torchs_default_weight_decay_in_p5_is_named():
    from coursekit import walk

    got = walk.run_walk(**walk.worked_example(), steps=3, weight_decay=0.01)[-1].A_after
    fb = check("06.p5", got)
    assert not fb.full and "default weight_decay = 0.01" in fb.text(), fb.text()
