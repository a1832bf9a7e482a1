"""Lesson 02 ("LoRA inside one matmul"): the numeric items and P6's prediction, each key measured here from first
principles or with PEFT itself (not from coursekit.lora), and each named mistake caught only when it was made."""

import numpy as np
import pytest
import torch

from coursekit.grading import check, keys

def _peft_layer(d, m, r, lora_alpha, use_rslora, A, B):
    """A one-projection model adapted by PEFT, with our A (d × r) and B (r × m) copied into its transposed storage."""
    from peft import LoraConfig, get_peft_model

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(d, m, bias=False)

        def forward(self, x):
            return self.proj(x)

    torch.manual_seed(0)
    model = get_peft_model(One(), LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=["proj"], use_rslora=use_rslora))
    layer = model.base_model.model.proj
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(torch.as_tensor(A.T))
        layer.lora_B["default"].weight.copy_(torch.as_tensor(B.T))
    return model, layer


def test_p3_key_is_the_measured_change_of_a_peft_adapters_contribution():
    """P3's key, measured: the same A and B in a PEFT layer with r = 16, lora_alpha = 32, loaded once with PEFT's
    default scale and once with use_rslora=True; the adapter's contribution (output minus the base's) grows by the
    ratio asked for. The named mistakes are that ratio upside down, the two scales PEFT reports, and r."""
    d, m, r, alpha = 24, 20, 16, 32
    g = np.random.default_rng(0)
    A, B = g.standard_normal((d, r)).astype(np.float32), g.standard_normal((r, m)).astype(np.float32)
    X = torch.as_tensor(g.standard_normal((5, d)).astype(np.float32))
    contribution, scaling = {}, {}
    for rs in (False, True):
        model, layer = _peft_layer(d, m, r, alpha, rs, A, B)
        with torch.no_grad():
            contribution[rs] = (model(X) - layer.base_layer(X)).double()
        scaling[rs] = layer.scaling["default"]
    ratio = contribution[True] / contribution[False]
    assert torch.allclose(ratio, ratio.mean(), rtol=1e-4)        # one factor for every entry
    measured = ratio.mean().item()
    assert measured == pytest.approx(4.0, rel=1e-4)
    assert check("02.p3", measured).full and check("02.p3", 4).full
    for value, label, text in [(1 / measured, "upside down", "old over new"), (scaling[True], "new s", "new scale"),
                               (scaling[False], "old s", "trained with"), (r, "r", "not by r")]:
        fb = check("02.p3", value)
        assert fb.points == 0 and fb.mistakes == [label] and text in fb.text(), (label, fb.text())
    assert "Likely mistake" not in check("02.p3", 3).text()


P4_A_ROWS = ((0, 1, 2), (2, 3))   # the question's pattern: nonzero rows of A's columns, nonzero columns of B's rows
P4_B_COLS = ((0, 1), (1, 2, 3))


def _pattern_factors(seed):
    g = np.random.default_rng(seed)
    A, B = np.zeros((6, 2)), np.zeros((2, 5))
    for k in range(2):
        A[list(P4_A_ROWS[k]), k] = g.uniform(0.5, 2, len(P4_A_ROWS[k])) * g.choice([-1, 1], len(P4_A_ROWS[k]))
        B[k, list(P4_B_COLS[k])] = g.uniform(0.5, 2, len(P4_B_COLS[k])) * g.choice([-1, 1], len(P4_B_COLS[k]))
    return A, B


def _changed(W, merged):
    return int(np.count_nonzero(merged != W))


def test_p4_key_is_the_number_of_entries_a_peft_merge_changes():
    """P4's key, measured: PEFT merges a rank-2 adapter with the question's pattern of nonzeros (random values, ten
    draws) into a 6 × 5 weight, and the merged weight differs from the base in the same number of entries every time.
    Each named mistake is a count made the mistaken way, on the same factors."""
    counts = set()
    for seed in range(10):
        A, B = _pattern_factors(seed)
        model, layer = _peft_layer(6, 5, 2, 1.0, False, A.astype(np.float32), B.astype(np.float32))
        W = layer.base_layer.weight.detach().numpy().T.copy()
        merged = model.merge_and_unload().proj.weight.detach().numpy().T
        counts.add(_changed(W, merged))
        assert _changed(W, W + 0.5 * A @ B) == _changed(W, merged)      # NumPy's merge agrees
    assert counts == {11}
    assert check("02.p4", 11).full

    A, B = _pattern_factors(0)
    W = np.random.default_rng(1).standard_normal((6, 5))
    pieces = [_changed(W, W + np.outer(A[:, k], B[k])) for k in range(2)]
    made = {
        "pieces added": sum(pieces),                                                   # the shared entry counted twice
        "rows × columns": int(A.any(axis=1).sum() * B.any(axis=0).sum()),              # every touched row × column
        "one piece only": pieces[0],                                     # either piece: both change 6
        "one per rank": A.shape[1],
        "every entry": W.size,
    }
    assert made == {"pieces added": 12, "rows × columns": 16, "one piece only": 6, "one per rank": 2, "every entry": 30}
    assert pieces[0] == pieces[1], "the 'one piece only' message says the two pieces change as many entries"
    for label, value in made.items():
        fb = check("02.p4", value)
        assert fb.points == 0 and fb.mistakes == [label], (label, fb.text())
    assert "Likely mistake" not in check("02.p4", 9).text()


def _peft_trainable(layers, shapes, r, targets):
    """Trainable parameters PEFT gives a stack of ``layers`` blocks holding bias-free nn.Linear projections of
    ``shapes`` (name -> (d, m)), adapted with LoraConfig(r, target_modules=targets)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            for name, (d, m) in shapes.items():
                setattr(self, name, nn.Linear(d, m, bias=False))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block() for _ in range(layers)])

    with torch.device("meta"):
        base = Stack()
    dense = sum(p.numel() for n, p in base.named_parameters() if n.split(".")[-2] in targets)
    model = get_peft_model(base, LoraConfig(r=r, lora_alpha=16, target_modules=list(targets)))
    return sum(p.numel() for p in model.parameters() if p.requires_grad), dense


def test_p7_key_and_mistakes_are_counted_by_peft():
    """P7's key is the trainable-parameter count PEFT reports for rank-8 adapters on q_proj (576 × 576) and v_proj
    (576 × 192) in 30 blocks; each named mistake is that count for the mistaken configuration (one block, a square
    v_proj, q_proj alone) or the frozen dense weights' count."""
    from coursekit.grading.lessons.lesson02 import ITEMS, P7_CONFIG

    shapes = {"q_proj": (576, 576), "v_proj": (576, 192)}
    assert P7_CONFIG == dict(layers=30, shapes=shapes, r=8)
    key, dense = _peft_trainable(30, shapes, 8, ("q_proj", "v_proj"))
    measured = {
        "one layer": _peft_trainable(1, shapes, 8, ("q_proj", "v_proj"))[0],
        "square v_proj": _peft_trainable(30, {"q_proj": (576, 576), "v_proj": (576, 576)}, 8, ("q_proj", "v_proj"))[0],
        "q_proj only": _peft_trainable(30, shapes, 8, ("q_proj",))[0],
        "dense": dense,
    }
    assert ITEMS["p7"].expected() == key == 460_800
    assert {mk.label: mk.value for mk in ITEMS["p7"].mistakes()} == measured
    assert check("02.p7", key).points == 1
    for label, value in measured.items():
        fb = check("02.p7", value)
        assert fb.points == 0 and fb.mistakes == [label], (label, fb.text())


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


def test_p9s_model_answer_a_rank_one_adapter_cannot_add_the_identity():
    """P9's model answer, measured: rank-one PEFT adapters with random factors on a 2 × 2 weight. The update a merge
    adds (s A B) has nonzero off-diagonal entries whenever its diagonal ones are nonzero, with the product of the
    off-diagonal pair equal to the diagonal pair's (1 when the diagonal changes are 1 and 1), and even the best rank-one
    change (the SVD's) leaves a residual from the identity. A rank-2 PEFT adapter with A = I, B = I / s adds exactly the
    identity, and a rank-one adapter with one nonzero in A and one in B changes exactly one entry."""
    g = np.random.default_rng(9)
    s = 0.5
    for _ in range(20):
        A, B = g.standard_normal((2, 1)).astype(np.float32), g.standard_normal((1, 2)).astype(np.float32)
        _, layer = _peft_layer(2, 2, 1, s, False, A, B)
        change = layer.get_delta_weight("default").detach().double().numpy().T      # what a merge adds: s A B
        assert np.all(np.diag(change) != 0) and change[0, 1] != 0 and change[1, 0] != 0
        assert change[0, 1] * change[1, 0] == pytest.approx(change[0, 0] * change[1, 1], rel=1e-4)
    U, S, Vt = np.linalg.svd(np.eye(2))
    assert np.linalg.norm(np.eye(2) - S[0] * np.outer(U[:, 0], Vt[0])) == pytest.approx(1.0)    # no rank one gives I

    model, layer = _peft_layer(2, 2, 2, 2 * s, False, np.eye(2, dtype=np.float32), (np.eye(2) / s).astype(np.float32))
    assert layer.scaling["default"] == s
    W = layer.base_layer.weight.detach().double().numpy().T.copy()
    np.testing.assert_allclose(model.merge_and_unload().proj.weight.detach().double().numpy().T - W, np.eye(2), atol=1e-6)

    one = (np.array([[1.0], [0.0]], dtype=np.float32), np.array([[1.0, 0.0]], dtype=np.float32))
    model, layer = _peft_layer(2, 2, 1, s, False, *one)
    W = layer.base_layer.weight.detach().numpy().T.copy()
    assert np.count_nonzero(model.merge_and_unload().proj.weight.detach().numpy().T != W) == 1


def test_p8s_model_answer_the_papers_letters_against_peft_and_the_course():
    """P8's model answer, measured on a PEFT adapter of nn.Linear(k = 5 inputs, d = 3 outputs) at r = 2: the base weight
    is the paper's W₀ (d × k), lora_A.weight has the paper's A shape r × k and is random at initialisation, lora_B.weight
    has the paper's B shape d × r and starts at zero; with B made nonzero, the paper's column form W₀x + s B A x and the
    course's row form x W + s x A B (W = W₀ᵀ, A = lora_A.weightᵀ, B = lora_B.weightᵀ) both give PEFT's output."""
    from peft import LoraConfig, get_peft_model

    k, d, r = 5, 3, 2
    torch.manual_seed(0)
    model = get_peft_model(torch.nn.Sequential(torch.nn.Linear(k, d, bias=False)), LoraConfig(r=r, lora_alpha=4, target_modules=["0"]))
    layer = model.base_model.model[0]
    W0 = layer.base_layer.weight.detach().double()
    A_paper, B_paper = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert tuple(W0.shape) == (d, k) and tuple(A_paper.shape) == (r, k) and tuple(B_paper.shape) == (d, r)
    assert torch.count_nonzero(B_paper) == 0 and torch.count_nonzero(A_paper) == A_paper.numel()   # B = 0, A random
    with torch.no_grad():
        B_paper.normal_()
    s = layer.scaling["default"]
    x = torch.randn(k, dtype=torch.float64)
    with torch.no_grad():
        h_peft = model(x.float()[None]).double()[0]
    A_p, B_p = A_paper.detach().double(), B_paper.detach().double()
    h_paper = W0 @ x + s * B_p @ (A_p @ x)                                  # column vectors: h = W₀x + s B A x
    h_course = x @ W0.T + s * (x @ A_p.T) @ B_p.T                           # rows: x W + s (x A) B, A = A_paperᵀ, B = B_paperᵀ
    torch.testing.assert_close(h_paper, h_peft, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h_course, h_peft, rtol=1e-5, atol=1e-6)
