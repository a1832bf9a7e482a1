"""Lesson 14 ("Blockwise quantization"): graded items score right answers fully, typical wrong answers less,
with the diagnostics a student needs; the notebook's test cells agree with the item registry."""

from pathlib import Path

import nbformat
import numpy as np
import pytest

from coursekit import quant, walk
from coursekit.grading import check
from coursekit.grading.lessons import lesson14
from coursekit.grading.lessons.lesson14 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "14-blockwise-quantization" / "14-blockwise-quantization.ipynb"


def right_block(x, bits):
    q = 2 ** (bits - 1) - 1
    absmax = np.abs(x).max()
    if absmax == 0:
        return np.zeros_like(x), 0.0
    return np.round(x / absmax * q), absmax


def right_blocks(x, bits, blocksize):
    parts = [right_block(x[i:i + blocksize], bits) for i in range(0, len(x), blocksize)]
    return np.concatenate([c for c, _ in parts]), np.array([a for _, a in parts])


def _softmax(Y):
    e = np.exp(Y - Y.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def right_walk_D(X, W, A, B, s, target, step):
    W_hat = np.round(W / step) * step
    D = _softmax(X @ W_hat + s * (X @ A) @ B)
    D[0, target] -= 1.0
    return D, D @ W_hat.T + s * D @ B.T @ A.T


RIGHT = {"w1": 85, "w2": "d", "w3": [[3, -2], [1, 5]], "p1": right_block, "p2": right_blocks, "p3": right_walk_D,
         "p4": [[-0.06324549, 0.06324549]], "p5": 0.7333, "p6": [[0.559131, -0.399131], [0.138263, 1.051737]], "p7": "a",
         "p8": -0.588}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def test_notebook_test_cells_match_the_registry():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    tests = {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
             if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"}
    assert {gid.removesuffix("_test") for gid in tests} == set(ITEMS)
    for gid, cell in tests.items():
        item = gid.removesuffix("_test")
        assert cell.metadata["nbgrader"]["points"] == ITEMS[item].points, gid
        assert f'grade("14.{item}"' in cell.source


def test_notebook_loads_no_real_model():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "load_model(" not in src


def test_seed_numbers_carry_over():
    codes, W_hat = quant.toy_int4(walk.worked_example()["W"])
    np.testing.assert_array_equal(codes, [[3, -2], [1, 5]])
    np.testing.assert_allclose(W_hat, [[0.6, -0.4], [0.2, 1.0]])
    plain = walk.run_walk(**walk.worked_example(), steps=1)[0]
    toy = walk.run_walk(**(walk.worked_example() | dict(W=W_hat)), steps=1)[0]
    assert toy.loss < plain.loss  # the seed: the quantized toy starts lower on this target
    np.testing.assert_allclose(plain.dB, [[-0.138026, 0.138026]], atol=1e-6)


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"14.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_right_functions_work_on_torch_tensors_too():
    import torch

    def torch_block(x, bits):
        t = torch.tensor(x)
        am = t.abs().max()
        if am == 0:
            return torch.zeros_like(t), am
        return torch.round(t / am * (2 ** (bits - 1) - 1)), am

    assert check("14.p1", torch_block, hidden=True).full


def test_hidden_cases_are_deterministic_and_defeat_hard_coding():
    a = check("14.p3", right_walk_D, hidden=True).text()
    assert a == check("14.p3", right_walk_D, hidden=True).text() and a.count("hidden case") == 4
    publics = [c.kwargs for c in ITEMS["p1"].public()]

    def lookup(x, bits):
        for kw in publics:
            if kw["bits"] == bits and kw["x"].shape == x.shape and np.array_equal(kw["x"], x):
                return right_block(x, bits)
        return np.zeros_like(x), 1.0

    assert check("14.p1", lookup, hidden=False).full
    assert check("14.p1", lookup, hidden=True).points == pytest.approx(3 * 4 / 9)


# --------------------------------------------------------------------------- wrong answers


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w2", "a", "for accuracy, not speed"),
        ("w2", "c", "address levels"),
        ("w2", "b", "codes are frozen"),
        ("p7", "d", "only W_leaf's gradient takes that path"),
        ("p7", "b", "A and B never pass through the rounding"),
        ("p7", "c", "whatever Ŵ was computed from"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item_id, answer, text):
    fb = check(f"14.{item_id}", answer)
    assert fb.points == 0 and text in fb.text() and "(Lesson 14, '" in fb.text(), fb.text()


@pytest.mark.parametrize("blank", [None, ..., "", "z", 3])
def test_blank_or_malformed_choice_scores_zero(blank):
    assert check("14.w2", blank).points == 0


def _block_with(codes_fn):
    def fn(x, bits):
        q = 2 ** (bits - 1) - 1
        am = np.abs(x).max()
        if am == 0:
            return np.zeros_like(x), 0.0
        return codes_fn(x, am, q), am
    return fn


@pytest.mark.parametrize(
    "fn, text",
    [
        (_block_with(lambda x, am, q: np.round(x / am)), "forgot to multiply by Q"),
        (_block_with(lambda x, am, q: np.floor(x / am * q)), "floor where round belongs"),
        (_block_with(lambda x, am, q: (x / am * q).astype(int)), "truncated toward zero"),
        (_block_with(lambda x, am, q: x / am * q), "not integers"),
        (_block_with(lambda x, am, q: np.round(x / am * 127)), "scale of int8"),
        (_block_with(lambda x, am, q: np.clip(np.round(x / am * (q + 1)), -(q + 1), q)), "instead of Q = 2^(bits−1) − 1"),
        (_block_with(lambda x, am, q: np.round(x / am * (q + 1))), "instead of Q = 2^(bits−1) − 1"),
        (_block_with(lambda x, am, q: np.round(x / am * q) / q * am), "reconstructed values"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_block_mistakes_lose_points_with_a_diagnosis(fn, text, hidden):
    fb = check("14.p1", fn, hidden=hidden)
    assert fb.points < 3 and text in fb.text(), fb.text()


def test_block_zero_division_is_reported_not_raised():
    def naive(x, bits):
        return np.round(x / np.abs(x).max() * (2 ** (bits - 1) - 1)), np.abs(x).max()

    fb = check("14.p1", naive)
    assert 0 < fb.points < 3 and "every entry should be finite" in fb.text(), fb.text()


def test_max_instead_of_abs_max():
    def fn(x, bits):
        am = x.max()
        return np.round(x / abs(am) * (2 ** (bits - 1) - 1)) if am else np.zeros_like(x), am

    fb = check("14.p1", fn)
    assert fb.points < 3 and "not the largest x" in fb.text(), fb.text()


def test_per_tensor_absmax_is_named():
    def per_tensor(x, bits, blocksize):
        c, a = right_block(x, bits)
        return c, np.array([a])

    fb = check("14.p2", per_tensor, hidden=True)
    assert fb.points < 2 and "one absmax for the whole tensor" in fb.text(), fb.text()

    def per_tensor_repeated(x, bits, blocksize):
        c, a = right_block(x, bits)
        return c, np.full(-(-len(x) // blocksize), a)

    fb = check("14.p2", per_tensor_repeated)
    assert fb.points < 2 and "one absmax for the whole tensor" in fb.text(), fb.text()


def test_dropped_last_block_and_forgot_q_in_blocks():
    def dropped(x, bits, blocksize):
        n = len(x) - len(x) % blocksize
        c, a = right_blocks(x[:n], bits, blocksize)
        return np.concatenate([c, np.zeros(len(x) - n)]), a

    assert "dropped the last, shorter block" in check("14.p2", dropped).text()

    def forgot_q(x, bits, blocksize):
        c, a = right_blocks(x, bits, blocksize)
        return np.round(c / (2 ** (bits - 1) - 1)), a

    fb = check("14.p2", forgot_q)
    assert fb.points == 0 and "forgot to multiply by Q" in fb.text(), fb.text()


def _walk_with(W_in_dX=False, W_in_D=False, rounding=np.round, adapter=True, s_fwd=True, s_dX=True, sign=1.0, onehot=True):
    def fn(X, W, A, B, s, target, step):
        W_hat = rounding(W / step) * step
        D = _softmax(X @ (W if W_in_D else W_hat) + (s if s_fwd else 1.0) * (X @ A) @ B)
        D[0, target] -= 1.0 if onehot else 0.0
        D = sign * D
        dX = D @ (W if W_in_dX else W_hat).T + ((s if s_dX else 1.0) * D @ B.T @ A.T if adapter else 0)
        return D, dX
    return fn


@pytest.mark.parametrize(
    "fn, text",
    [
        (_walk_with(W_in_dX=True), "you used W instead of Ŵ in D·Ŵᵀ"),
        (_walk_with(W_in_dX=True, W_in_D=True), "unquantized walk's"),
        (_walk_with(rounding=np.floor), "floor instead of round"),
        (_walk_with(rounding=np.trunc), "truncation toward zero"),
        (_walk_with(adapter=False), "missing the adapter's path"),
        (_walk_with(s_dX=False), "you left out the scale s"),
        (_walk_with(s_fwd=False, s_dX=False), "your forward left out the scale s"),
        (_walk_with(sign=-1.0), "wrong sign"),
        (_walk_with(onehot=False), "softmax(Y) alone"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_walk_mistakes_lose_points_with_a_diagnosis(fn, text, hidden):
    fb = check("14.p3", fn, hidden=hidden)
    assert fb.points < 3 and text in fb.text(), fb.text()


@pytest.mark.parametrize(
    "item_id, answer, text",
    [
        ("w1", 84, "floor"),
        ("w1", 1, "forgot to multiply by Q"),
        ("w1", 5, "int4 code"),
        ("w1", 0.6 / 0.9 * 127, "a code is an integer"),
        ("w1", 84.67, "a code is an integer"),
        ("w1", 127, "not max x"),
        ("w1", 80, "not right"),
        ("w3", [[3, -2], [1, 4]], "truncated toward zero"),
        ("w3", [[3, -3], [1, 4]], "floor"),
        ("w3", [[0.6, -0.4], [0.2, 1.0]], "the reconstruction"),
        ("p4", [[-0.138026, 0.138026]], "unquantized walk's value"),
        ("p5", 3.786, "plain gradient descent"),
        ("p5", 0.22, "one for one"),
        ("p5", 1.4667, "moved only one entry"),
        ("p5", 0.7433, "after its own first step"),
        ("p6", [[0.63, -0.47], [0.28, 0.91]], "derivative of round is 0"),
        ("p6", [[0.537983, -0.377983], [0.095966, 1.094034]], "forward pass on W"),
        ("p6", [[0.529131, -0.329131], [0.058263, 1.141737]], "applied the step to Ŵ"),
        ("p6", [[0.6, -0.4], [0.2, 1.0]], "W itself after the step"),
        ("p6", [[0.354344, -0.354344], [0.708687, -0.708687]], "the STE's gradient"),
        ("p6", [[0.700869, -0.540869], [0.421737, 0.768263]], "uphill"),
        ("p6", [[0.275656, -0.115656], [-0.428687, 1.618687]], "learning rate"),
        ("p6", [[0.559131, -0.611737], [0.350869, 1.051737]], "transposed"),
        ("p6", [[0.559131, -0.599131], [0.138263, 0.651737]], "softmax(XŴ) alone"),
        ("p8", -0.294, "half of it"),
        ("p8", 0.588, "wrong sign"),
        ("p8", 3.33, "rounds to 5, not 4"),
        ("p8", -3.33, "floor"),
        ("p8", -0.778, "target's logit Y₁ unchanged"),
        ("p8", -0.375, "other class's logit Y₀ unchanged"),
        ("p8", 1.25, "margin Y₁ − Y₀ on Ŵ itself zero"),
        ("p8", 2.5, "transpose"),
        ("p8", -1.7, "first entry of X"),
        ("w3", [[3, 1], [-2, 5]], "transposed"),
        ("p4", [[0.06324549, -0.06324549]], "wrong sign"),
        ("p4", [[0.21081829, -0.21081829]], "that is D"),
        ("p4", [[-0.06294653, 0.06294653]], "second step"),
        ("p4", [[-0.10630311, 0.10630311]], "toy base"),
        ("p4", [[-0.14026371, 0.14026371]], "one absmax of their own"),
        ("p4", [[-0.0694434, 0.0694434]], "whole of V one absmax"),
        ("p4", [[-0.142506, 0.142506]], "wrong row"),
        ("p4", [[-0.153937, 0.153937]], "instead of Q = 2^(bits−1) − 1 = 7"),
        ("p4", [[-0.1479, 0.1479]], "unsigned range"),
        ("p4", [[-0.13345, 0.13345]], "int8's Q = 127"),
        ("p4", [[-0.233708, 0.233708]], "forgot to multiply by Q = 7"),
        ("p4", [[-0.141011, 0.141011]], "truncate toward zero"),
        ("p4", [[-0.14775, 0.14775]], "floor"),
        ("p4", [[-0.299899, 0.299899]], "integer codes"),
    ],
)
def test_numeric_and_array_mistakes_are_recognised(item_id, answer, text):
    fb = check(f"14.{item_id}", answer)
    assert not fb.full and text in fb.text(), fb.text()


def test_p4_key_is_the_walk_on_the_blockwise_quantized_corner_measured_by_autograd():
    """The key is ∇B of a forward pass on the corner of V (2 × 64, W in columns 0–1, the outlier 4.2 at V[1, 40]) quantized by
    coursekit.quant in int4 absmax blocks of 64, measured with torch autograd (not the walk's hand formulas). Each row of V
    is one block: row 0 keeps W's own absmax 0.63, row 1 takes the outlier's, and 0.28 is coded 0. The other entries of V
    never matter (two fillings give the same key), and the hand computation of the solution (one absmax per row of W)
    agrees."""
    import torch

    ex = walk.worked_example()
    V = lesson14.outlier_weight()
    codes, absmax = quant.absmax_quantize(V, bits=4, blocksize=64)
    np.testing.assert_allclose(absmax, [0.63, 4.2])
    np.testing.assert_array_equal(codes.reshape(2, 64)[:, :2], [[7, -5], [0, 2]])
    W_hat = quant.absmax_dequantize(codes, absmax, V.shape, bits=4, blocksize=64)[:, :2]
    np.testing.assert_allclose(W_hat, [[0.63, -0.45], [0.0, 1.2]], atol=1e-12)
    np.testing.assert_allclose(lesson14.outlier_corner(seed=3), W_hat, rtol=0, atol=0)
    absmax_rows = np.array([[0.63], [4.2]])
    np.testing.assert_allclose(np.round(ex["W"] / absmax_rows * 7) / 7 * absmax_rows, W_hat, atol=1e-15)
    B = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    X, A = torch.tensor(ex["X"]), torch.tensor(ex["A"])
    Y = X @ torch.tensor(W_hat) + ex["s"] * (X @ A) @ B
    torch.nn.functional.cross_entropy(Y, torch.tensor([ex["target"]])).backward()
    np.testing.assert_allclose(ITEMS["p4"].expected(), B.grad.numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(B.grad.numpy(), RIGHT["p4"], atol=1e-8)
    assert check("14.p4", B.grad.numpy()).full
    # the old per-tensor answer, W's own absmax 0.91, is a named mistake, not the key
    own = quant.absmax_quantize(ex["W"], bits=4, blocksize=4)
    own_hat = quant.absmax_dequantize(*own, (2, 2), bits=4, blocksize=4)
    fb = check("14.p4", walk.run_walk(**(ex | dict(W=own_hat)), steps=1)[0].dB)
    assert not fb.full and "one absmax of their own" in fb.text(), fb.text()


@pytest.mark.parametrize("answer", [[-0.06324549, 0.06324549], (-0.0632455, 0.0632455), np.array([-0.06324549, 0.06324549])])
def test_p4_accepts_the_row_written_flat(answer):
    fb = check("14.p4", answer)
    assert fb.points == ITEMS["p4"].points and "read as the 1 × 2 row" in fb.text(), fb.text()


@pytest.mark.parametrize("item_id, answer, key_text", [("w1", 84, "85"), ("w1", 0.6 / 0.9 * 127, "85"),
                                                       ("w3", [[3, -2], [1, 4]], "to 5"), ("w3", [[3, -3], [1, 4]], "to −2")])
def test_mistake_feedback_does_not_state_the_key(item_id, answer, key_text):
    fb = check(f"14.{item_id}", answer)
    assert not fb.full and "Likely mistake" in fb.text() and key_text not in fb.text(), fb.text()
    assert "of the points" not in fb.text(), "a warm-up is worth no points: no partial-credit note"


def test_p2_public_cases_have_no_rounding_ties():
    """A tie (x / absmax · Q exactly k + 0.5) would grade the tie-breaking rule, which the lesson does not teach."""
    for case in ITEMS["p2"].public():
        x, bits, bs = case.kwargs["x"], case.kwargs["bits"], case.kwargs["blocksize"]
        q = 2 ** (bits - 1) - 1
        for i in range(0, len(x), bs):
            b = x[i:i + bs]
            if np.abs(b).max() > 0:
                frac = np.abs(b / np.abs(b).max() * q) % 1
                assert not np.any(np.isclose(frac, 0.5)), (case.label, b)


@pytest.mark.parametrize("hidden", [False, True])
def test_the_unsigned_range_as_q_is_named(hidden):
    def unsigned_q(x, bits, blocksize):
        x = np.asarray(x, dtype=np.float64)
        codes, absmax = [], []
        for i in range(0, x.size, blocksize):
            block = x[i:i + blocksize]
            am = np.abs(block).max()
            absmax.append(am)
            codes.append(np.round(block / am * (2 ** bits - 1)) if am else np.zeros_like(block))
        return np.concatenate(codes), np.array(absmax)

    fb = check("14.p2", unsigned_q, hidden=hidden)
    assert not fb.full and "2^bits − 1" in fb.text(), fb.text()


def test_p5_key_is_the_hand_prediction():
    """P5's key is found by bisection on run_walk (AdamW at learning rate lr, target class 0, on the toy base): the first
    update's loss equals the loss the walk on W starts from, the number the lesson prints. The hand prediction gives the
    same: the first AdamW step moves B by lr against the sign of its gradient ([+, −], so B = [−lr, lr]), the margin
    Y₁ − Y₀ falls by 2·s·|XA|·lr = 0.6·lr, and rounding raised it by 0.44, so lr = 0.44 / 0.6. At that lr run_walk's loss
    after the step is W's starting loss to float precision (ε = 1e-8 next to |∇B| ≈ 0.19 moves it by less than 1e-7)."""
    ex = walk.worked_example() | dict(target=0)
    W_hat = quant.toy_int4(ex["W"])[1]
    Z = float((ex["X"] @ ex["A"])[0, 0])
    gain = float((ex["X"] @ (W_hat - ex["W"]) @ np.array([-1.0, 1.0]))[0])
    np.testing.assert_allclose([Z, gain], [-0.3, 0.44], atol=1e-12)
    hand = gain / (2 * ex["s"] * abs(Z))
    np.testing.assert_allclose(ITEMS["p5"].expected(), hand, rtol=1e-6)
    rec = walk.run_walk(**(ex | dict(W=W_hat)), steps=1, lr=hand)[0]
    np.testing.assert_allclose(np.sign(rec.dB), [[1.0, -1.0]])
    np.testing.assert_allclose(rec.B_after, [[-hand, hand]], rtol=1e-6)
    np.testing.assert_array_equal(rec.A_after, ex["A"])                      # A does not move: its gradient is 0
    start_W = walk.run_walk(**ex, steps=1)[0].loss
    np.testing.assert_allclose(rec.loss_after, start_W, rtol=1e-6)
    np.testing.assert_allclose(start_W, 0.776344, atol=1e-6)                 # the loss the lesson prints for W, target 0
    assert check("14.p5", 0.7333).full and check("14.p5", 0.73333).full and not check("14.p5", 0.74).full
    values = {m.label: m.value for m in ITEMS["p5"].mistakes()}
    np.testing.assert_allclose([values["no XA"], values["one entry"]], [gain / 2, gain / 0.3], rtol=1e-6)


def test_p6_key_is_the_ste_step_measured_by_autograd():
    """P6's key, measured: the straight-through step written as a torch.autograd.Function (forward q, backward the
    identity), one SGD step at lr 0.2, equals the item's key; so does W − lr·XᵀD with D from run_walk on Ŵ (the course's
    walk). With round inside the graph autograd's gradient is exactly 0 (the "plain round" mistake); the step moves no code
    across a rounding boundary, so q(W) after it is the toy base's Ŵ (the "q(W)" mistake) while W itself moved."""
    import torch

    class STE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return (w / 0.2).round() * 0.2

        @staticmethod
        def backward(ctx, g):
            return g

    ex = walk.worked_example()
    w = torch.tensor(ex["W"], requires_grad=True)
    torch.nn.functional.cross_entropy(torch.tensor(ex["X"]) @ STE.apply(w), torch.tensor([ex["target"]])).backward()
    stepped = ex["W"] - 0.2 * w.grad.numpy()
    np.testing.assert_allclose(ITEMS["p6"].expected(), stepped, rtol=1e-12)
    W_hat = quant.toy_int4(ex["W"])[1]
    D = walk.run_walk(**(ex | dict(W=W_hat)), steps=1)[0].D
    np.testing.assert_allclose(stepped, ex["W"] - 0.2 * ex["X"].T @ D, rtol=1e-12)
    assert check("14.p6", stepped).full and check("14.p6", np.round(stepped, 4)).full
    np.testing.assert_array_equal(quant.toy_int4(stepped)[0], quant.toy_int4(ex["W"])[0])
    values = {m.label: m.value for m in ITEMS["p6"].mistakes()}
    np.testing.assert_array_equal(values["plain round"], ex["W"])
    np.testing.assert_allclose(values["q(W)"], quant.toy_int4(stepped)[1])
    plain = walk.run_walk(**ex, steps=1)[0].D
    np.testing.assert_allclose(values["W in forward"], ex["W"] - 0.2 * ex["X"].T @ plain, rtol=1e-12)


def test_p7_key_is_measured_with_the_rounding_inside_the_graph():
    """P7's key, run: the lesson's autograd check (B = [0.3, −0.2]) once with the constant Ŵ and once with
    Ŵ = 0.2 · round(W_leaf / 0.2) built in the graph from a leaf that requires grad. ∇X, ∇A and ∇B come out bit for bit
    the same (a), none of them is zero (b, d), ∇X is DŴᵀ + sDBᵀAᵀ and not DWᵀ + sDBᵀAᵀ (c), and W_leaf's gradient is all
    zeros."""
    import json

    import torch

    ex = walk.worked_example()
    s, target = ex["s"], torch.tensor([ex["target"]])

    def grads(inside):
        X = torch.tensor(ex["X"], requires_grad=True)
        A = torch.tensor(ex["A"], requires_grad=True)
        B = torch.tensor([[0.3, -0.2]], dtype=torch.float64, requires_grad=True)
        W_leaf = torch.tensor(ex["W"], requires_grad=inside)
        W_hat = (W_leaf / 0.2).round() * 0.2
        Y = X @ (W_hat if inside else W_hat.detach()) + s * (X @ A) @ B
        torch.nn.functional.cross_entropy(Y, target).backward()
        return X.grad, A.grad, B.grad, W_leaf.grad, Y.detach()

    const, inside = grads(False), grads(True)
    for a, b in zip(const[:3], inside[:3]):
        assert torch.equal(a, b)                                           # (a): nothing changes
        assert a.abs().sum() > 0                                           # (b), (d): nothing becomes 0
    assert const[3] is None and inside[3] is not None and torch.all(inside[3] == 0)
    D = torch.softmax(inside[4], dim=1) - torch.nn.functional.one_hot(target, 2)
    B, A = torch.tensor([[0.3, -0.2]], dtype=torch.float64), torch.tensor(ex["A"])
    W_hat, W = torch.tensor(quant.toy_int4(ex["W"], 0.2)[1]), torch.tensor(ex["W"])
    torch.testing.assert_close(inside[0], D @ W_hat.T + s * D @ B.T @ A.T)
    assert (inside[0] - (D @ W.T + s * D @ B.T @ A.T)).abs().max() > 0.01  # (c) is a different number
    key = json.loads((ROOT / "autograder" / "keys" / "14.json").read_text())["keys"]["p7"]
    assert key == RIGHT["p7"] == "a"


def test_p8_key_is_the_input_where_rounding_leaves_the_margin_unchanged():
    """P8's key, measured on run_walk's forward: on X = [1, x₂] with x₂ = −10/17 the margin Y₁ − Y₀ on Ŵ equals that on W
    (to rounding); it is the hand prediction −(row 0's gain) / (row 1's gain) with gains (Ŵ − W)[:, 1] − (Ŵ − W)[:, 0] =
    [0.10, 0.17]; the lesson's X = [1, 2] still gives the lesson's +0.44; and the change is linear in x₂, so it has one root,
    with the margin falling below it and rising above it."""
    ex = walk.worked_example()
    W_hat = quant.toy_int4(ex["W"])[1]

    def measured(x2):
        X = np.array([[1.0, x2]])
        recs = [walk.run_walk(**(ex | dict(X=X, W=w)), steps=1)[0] for w in (ex["W"], W_hat)]
        return (recs[1].Y[0, 1] - recs[1].Y[0, 0]) - (recs[0].Y[0, 1] - recs[0].Y[0, 0])

    key = ITEMS["p8"].expected()
    np.testing.assert_allclose(key, -10 / 17, rtol=1e-12)
    assert abs(measured(key)) < 1e-12
    assert measured(key - 0.1) < 0 < measured(key + 0.1)
    dW = W_hat - ex["W"]
    gain = dW[:, 1] - dW[:, 0]
    np.testing.assert_allclose(gain, [0.10, 0.17], atol=1e-12)
    np.testing.assert_allclose(key, -gain[0] / gain[1], rtol=1e-12)
    np.testing.assert_allclose(measured(2.0), 0.44, atol=1e-12)
    np.testing.assert_allclose(lesson14.margin_change(ex["X"]), 0.44, atol=1e-12)
    assert check("14.p8", -0.588).full and check("14.p8", -10 / 17).full and not check("14.p8", -0.6).full
    values = [m.value for m in ITEMS["p8"].mistakes()]
    assert len(set(np.round(values, 6))) == len(values) and all(abs(v - key) > 0.05 for v in values)


@pytest.mark.parametrize("item_id", ["p1", "p3"])
def test_the_prompt_names_every_function_withheld_while_it_is_graded(item_id):
    """A student who reuses a withheld coursekit helper is told so by the prompt, not only by the check's error."""
    from coursekit.grading.remote import withheld_of

    nb = nbformat.read(NOTEBOOK, as_version=4)
    head = f"**{item_id.upper()} ("
    prompt = next(c.source[c.source.index(head):] for c in nb.cells if c.cell_type == "markdown" and head in c.source)
    withheld = withheld_of(ITEMS[item_id])
    assert withheld
    for target in withheld:
        module, name = target.split(":")
        whole_module = f"`{module}`" in prompt                   # P1: "not `coursekit.quant`"
        assert whole_module or (name in prompt and module.split(".")[-1] in prompt), (item_id, target)
