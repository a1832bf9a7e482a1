"""Lesson 03 ("What low rank restricts"): graded items score right answers fully, typical wrong answers less,
with the diagnostics a student needs; the notebook's test cells agree with the item registry."""

import math
from pathlib import Path

import nbformat
import numpy as np
import pytest

from coursekit import lowrank
from coursekit.grading import check, keys
from coursekit.grading.lessons.lesson03 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
LID = "03-what-low-rank-restricts"
NOTEBOOK = ROOT / "solutions" / LID / f"{LID}.ipynb"


def right_best_rank_k(M, k):
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, :k] * S[:k]) @ Vt[:k, :]


def right_residual_curve(sigma):
    s = np.sort(np.asarray(sigma, dtype=float))[::-1]
    return np.array([math.sqrt(np.sum(s[k:] ** 2)) for k in range(len(s) + 1)])


LAYER_1 = r"layers\.1\..*"
P5_RIGHT = {"rank_pattern": {LAYER_1: 4, "v_proj": 16, "up_proj": 32},
            "alpha_pattern": {LAYER_1: 16, "q_proj": 8, "v_proj": 32}}

RIGHT = {"w1": 16, "w2": "a", "w3": 8, "p1": right_best_rank_k, "p2": math.sqrt(3.1**2 - 1), "p3": "d", "p4": 0.0625,
         "p5": P5_RIGHT, "p6": right_residual_curve}


# --------------------------------------------------------------------------- registry, keys, notebook


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


def _nbgrader_cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]


def test_no_case_generator_or_key_in_notebook_cells():
    nb, _ = _nbgrader_cells()
    src = "\n".join(c.source for c in nb.cells)
    assert "_hidden" not in src and "keys.load" not in src and str(keys.load("03")["seed"]) not in src


# --------------------------------------------------------------------------- right answers


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"03.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_hidden_cases_are_added_and_deterministic():
    a = check("03.p1", right_best_rank_k, hidden=True).text()
    b = check("03.p1", right_best_rank_k, hidden=True).text()
    assert a == b and a.count("hidden case") == 6
    assert check("03.p6", right_residual_curve, hidden=True).text().count("hidden case") == 5


def test_a_hard_coded_answer_fails_hidden_cases():
    from coursekit.grading.lessons.lesson03 import _p1_public

    table = [(c.kwargs["M"], right_best_rank_k(c.kwargs["M"], c.kwargs["k"])) for c in _p1_public()]

    def hard_coded(M, k):
        for Mi, out in table:
            if Mi.shape == M.shape and np.allclose(Mi, M):
                return out
        return np.zeros_like(M)

    assert check("03.p1", hard_coded, hidden=False).full
    assert check("03.p1", hard_coded, hidden=True).points <= 3 * 3 / 9 + 1e-9


# --------------------------------------------------------------------------- P1 mistakes


def kept_smallest(M, k):
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, -k:] * S[-k:]) @ Vt[-k:, :]


def unsorted_eig(M, k):
    # eig does not sort its eigenvalues: the first k eigenvectors of MᵀM are not the top k.
    w, V = np.linalg.eig(M.T @ M)
    Vk = np.real(V[:, :k])
    return M @ Vk @ Vk.T


def factors(M, k):
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return U[:, :k], S[:k], Vt[:k, :]


def vt_cut(M, k):
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return U[:, :k] @ np.diag(S[:k]) @ Vt[:k, :k]


def one_too_many(M, k):
    return right_best_rank_k(M, k + 1) if k < min(M.shape) else M


def residual_instead(M, k):
    return M - right_best_rank_k(M, k)


def stub(M, k):
    raise NotImplementedError()


@pytest.mark.parametrize(
    "fn, text",
    [
        (kept_smallest, "smallest singular values"),
        (factors, "you returned the factors (U, S, Vt)"),
        (vt_cut, "cut Vt[:k] to k columns"),
        (one_too_many, "check the slice bounds"),
        (residual_instead, "you returned the residual M − M_k"),
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_best_rank_k_mistakes_are_named(fn, text, hidden):
    fb = check("03.p1", fn, hidden=hidden)
    assert not fb.full, fb.text()
    assert text in fb.text()
    assert "Reread 'The best rank-k approximation'" in fb.text()


def test_unsorted_directions_are_named_on_some_case():
    fb = check("03.p1", unsorted_eig, hidden=True)
    assert not fb.full
    assert "not the largest ones" in fb.text() and "Sort in decreasing order" in fb.text()


def test_best_rank_k_stub_and_non_function():
    assert check("03.p1", stub).points == 0 and "NotImplementedError" in check("03.p1", stub).text()
    fb = check("03.p1", "svd")
    assert fb.points == 0 and "should be a function" in fb.text()


def test_square_transpose_is_named():
    from coursekit.grading.lessons.lesson03 import best_rank_k_mistakes

    M = lowrank.with_singular_values([3.0, 2.0, 1.0], 3, 3, 0)
    labels = [m.label for m in best_rank_k_mistakes({"M": M, "k": 1})["M_k"]]
    assert "transposed" in labels and "smallest" in labels


# --------------------------------------------------------------------------- P6 mistakes


def curve_unsorted(sigma):
    s = np.asarray(sigma, dtype=float)
    return np.array([math.sqrt(np.sum(s[k:] ** 2)) for k in range(len(s) + 1)])


def curve_ascending(sigma):
    return curve_unsorted(np.sort(np.asarray(sigma, dtype=float)))


def curve_squared(sigma):
    return right_residual_curve(sigma) ** 2


def curve_from_one(sigma):
    return right_residual_curve(sigma)[1:]


def curve_plain_sum(sigma):
    s = np.sort(np.asarray(sigma, dtype=float))[::-1]
    return np.array([np.sum(s[k:]) for k in range(len(s) + 1)])


@pytest.mark.parametrize(
    "fn, text",
    [
        (curve_unsorted, "in the order it was given"),
        (curve_ascending, "sorted in increasing order"),
        (curve_squared, "squared residuals"),
        (curve_from_one, "starts at k = 1"),
        (curve_plain_sum, "summed the discarded singular values"),
    ],
)
def test_residual_curve_mistakes_are_named(fn, text):
    fb = check("03.p6", fn, hidden=True)
    assert not fb.full, fb.text()
    assert text in fb.text()


# --------------------------------------------------------------------------- numeric, array and choice items


@pytest.mark.parametrize(
    "item, answer, text",
    [
        ("w1", 4096, "rank(A B) <= r"),
        ("w1", 32, "do not add their ranks"),
        ("w1", 131072, "parameter count"),
        ("w3", 4, "have their own directions"),
        ("w3", 16, "do not multiply"),
        ("w3", 576, "full 576 × 576 matrix"),
        ("w3", 9216, "parameter count"),
        ("p2", 0.781, "in the order they are written"),
        ("p2", 1.449, "bounded the squared residual"),
        ("p2", 2.1, "added the discarded"),
        ("p4", 0.25, "that is the plot's configuration"),
        ("p4", 1, "with the scale held fixed"),
        ("p4", 0.015625, "names the variance"),
        ("p4", 16, "not a larger one"),
        ("p4", 0.5, "not right (tolerance"),
    ],
)
def test_numeric_mistakes_are_recognised(item, answer, text):
    fb = check(f"03.{item}", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_w3s_key_and_mistakes_are_measured():
    """W3's key is measured: two rank-4 adapters with random factors on one 576 × 576 weight, their updates added with
    coursekit's own merge (W + sAB, from W = 0), and the rank of the sum taken with NumPy; it equals the rank of the one
    product [A1 A2][B1; B2]. Every named mistake is the mistaken variant run: one adapter's rank alone, the two ranks
    multiplied, the rank of a dense random 576 × 576 matrix, and the two adapters' parameter count."""
    from coursekit import lora
    from coursekit.grading.lessons.lesson03 import W3

    assert W3 == dict(adapters=2, r=4, d=576, m=576)
    g = np.random.default_rng(30)
    d, m, r = W3["d"], W3["m"], W3["r"]
    factors = [(g.standard_normal((d, r)), g.standard_normal((r, m))) for _ in range(W3["adapters"])]
    merged = np.zeros((d, m))
    for A, B in factors:
        merged = lora.merge(merged, A, B, 1.0)
    key = np.linalg.matrix_rank(merged)
    A_cat, B_cat = np.hstack([A for A, _ in factors]), np.vstack([B for _, B in factors])
    np.testing.assert_allclose(A_cat @ B_cat, merged, rtol=1e-10, atol=1e-10)
    one = [np.linalg.matrix_rank(A @ B) for A, B in factors]
    measured = {
        "one adapter": one[0],
        "ranks multiplied": one[0] * one[1],
        "dense": np.linalg.matrix_rank(g.standard_normal((d, m))),
        "params": sum(A.size + B.size for A, B in factors),
    }
    named = {mk.label: mk.value for mk in ITEMS["w3"].mistakes()}
    assert set(named) == set(measured)
    assert key == np.linalg.matrix_rank(A_cat @ B_cat) == RIGHT["w3"]
    assert check("03.w3", int(key)).full
    for label, value in measured.items():
        assert named[label] == value, label
        fb = check("03.w3", int(value))
        assert not fb.full and fb.mistakes == [label], (label, fb.text())


def _measured_update_rms(r, scale, b_std=lambda r: 1 / math.sqrt(r), draws=3000, d=96, m=96, seed=0):
    """The root-mean-square of ||scale(16, r) · xAB|| over random draws, factors as in P4 (x ~ N(0, 1), A ~ N(0, 1/d),
    B's entries of standard deviation b_std(r): 1/sqrt(r), variance 1/r), measured with coursekit's own forward pass."""
    from coursekit import lora

    g = np.random.default_rng(seed)
    sq = []
    for _ in range(draws):
        x, A, B = g.standard_normal((1, d)), g.standard_normal((d, r)) / math.sqrt(d), g.standard_normal((r, m)) * b_std(r)
        y = lora.lora_forward(x, np.zeros((d, m)), A, B, scale(16, r))[0]
        sq.append(float(np.sum(y ** 2)))
    return math.sqrt(np.mean(sq))


def _largest_x_measured(residual, bound=3.1, x_max=10.0):
    """The largest x in [0, x_max] with residual(x) <= bound, measured: a scan on a grid of 10,001 points, then
    bisection between the last x within the bound and the next grid point; every x past it on the grid is over."""
    grid = np.linspace(0.0, x_max, 10_001)
    within = np.array([residual(x) <= bound for x in grid])
    last = int(np.flatnonzero(within)[-1])
    assert within[: last + 1].all() and not within[last + 1:].any()  # one interval [0, x*]
    lo, hi = grid[last], grid[last + 1]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if residual(mid) <= bound else (lo, mid)
    return lo


def test_p2_key_and_mistakes_are_measured():
    """P2's key is measured: M = diag(1, -4, 0, 3, x), its best rank-2 approximation from NumPy's SVD, the Frobenius
    residual measured for x on a grid and by bisection, and the largest x within 3.1 kept. Past x = 3 the residual stays
    at sqrt(10) > 3.1 (M_2 keeps x instead of 3). Every named mistake is the same search with the mistaken residual run:
    M_2 as the first two diagonal entries, the squared residual, the plain sum of the discarded singular values."""
    from coursekit.grading.lessons.lesson03 import P2_BOUND, P2_DIAG, p2_expected, p2_mistakes

    assert (P2_DIAG, P2_BOUND) == ((1.0, -4.0, 0.0, 3.0), 3.1)
    M = lambda x: np.diag([1.0, -4.0, 0.0, 3.0, x])  # noqa: E731

    def kept_in_order(x):
        kept = np.zeros((5, 5))
        kept[:2, :2] = M(x)[:2, :2]
        return kept

    residual = lambda x: np.linalg.norm(M(x) - right_best_rank_k(M(x), 2))  # noqa: E731
    key = _largest_x_measured(residual)
    for x in (3.0, 3.5, 7.0):
        assert residual(x) == pytest.approx(math.sqrt(10), rel=1e-12) and math.sqrt(10) > 3.1
    measured = {
        "in order": _largest_x_measured(lambda x: np.linalg.norm(M(x) - kept_in_order(x))),
        "no sqrt": _largest_x_measured(lambda x: residual(x) ** 2),
        "plain sum": _largest_x_measured(lambda x: np.linalg.svd(M(x), compute_uv=False)[2:].sum()),
    }
    named = {mk.label: mk.value for mk in p2_mistakes()}
    assert set(named) == set(measured)
    assert p2_expected() == pytest.approx(key, rel=1e-9) == pytest.approx(RIGHT["p2"], rel=1e-9)
    assert check("03.p2", key).full and check("03.p2", round(key, 3)).full  # 4 significant digits are enough
    for label, value in measured.items():
        assert named[label] == pytest.approx(value, rel=1e-9), label
        fb = check("03.p2", round(value, 3))
        assert fb.points == 0 and fb.mistakes == [label], (label, fb.text())


def test_p4_key_and_mistakes_are_measured():
    """P4's key is the measured ratio of root-mean-square updates from r = 4 to r = 64 under s = lora_alpha / r with
    B's entries of variance 1/r, and every named mistake is the same measurement with the mistaken variant: B drawn as
    in the lesson's plot (variance 1), s held at lora_alpha, 1/r taken as B's standard deviation, or s upside down."""
    from coursekit import lora
    from coursekit.grading.lessons.lesson03 import GROWTH, growth_expected, growth_mistakes

    assert (GROWTH["r_from"], GROWTH["r_to"], GROWTH["lora_alpha"]) == (4, 64, 16)

    def ratio(scale, b_std=lambda r: 1 / math.sqrt(r)):
        return _measured_update_rms(64, scale, b_std) / _measured_update_rms(4, scale, b_std)

    default = lambda a, r: lora.scaling(a, r)  # noqa: E731
    measured = {
        "key": ratio(default),
        "sqrt(r) growth kept": ratio(default, b_std=lambda r: 1.0),
        "fixed s": ratio(lambda a, r: a),
        "std for variance": ratio(default, b_std=lambda r: 1 / r),
        "s upside down": ratio(lambda a, r: r / a),
    }
    named = {mk.label: mk.value for mk in growth_mistakes()}
    assert set(named) == set(measured) - {"key"}
    assert growth_expected() == pytest.approx(measured["key"], rel=0.03) == pytest.approx(0.0625, rel=0.03)
    for label, value in named.items():
        assert value == pytest.approx(measured[label], rel=0.03), label
    # the measured key is right under the item's tolerance; each measured mistake is named, not accepted
    assert check("03.p4", measured["key"]).full
    for label in named:
        fb = check("03.p4", measured[label])
        assert fb.points == 0 and fb.mistakes == [label], (label, fb.text())


# --------------------------------------------------------------------------- P5: the patterns, built with PEFT

#: Every mistake P5's feedback names, as the answer that makes it: (label, answer, points, a phrase of its message).
#: Each is a whole answer, right but for that one mistake, and is built with PEFT by the check.
P5_VARIANTS = [
    # ranks set, alpha_pattern forgotten: q_proj keeps 16 / 8 = 2, v_proj drops to 16 / 16 = 1 (two rows)
    ("no alpha", {"rank_pattern": P5_RIGHT["rank_pattern"], "alpha_pattern": {}}, 1.0, "keeps the default lora_alpha 16"),
    # v_proj's r raised to 16 and its lora_alpha left at 16: scaling 1 (one row)
    ("no alpha", {"rank_pattern": P5_RIGHT["rank_pattern"], "alpha_pattern": {LAYER_1: 16, "q_proj": 8}}, 1.5,
     "rank_pattern sets r alone"),
    # the wanted scalings written as lora_alpha: 1 / 8, 2 / 16 and 4 / 4 (up_proj's row keeps the default, right)
    ("alpha as scaling", {"rank_pattern": P5_RIGHT["rank_pattern"], "alpha_pattern": {LAYER_1: 4, "q_proj": 1, "v_proj": 2}},
     0.5, "lora_alpha must be the scaling times r"),
    # layer 1's keys after the projections' keys, in both dicts: layer 1 takes the projections' r and lora_alpha
    ("general key first", {"rank_pattern": {"v_proj": 16, "up_proj": 32, LAYER_1: 4},
                           "alpha_pattern": {"q_proj": 8, "v_proj": 32, LAYER_1: 16}}, 1.5, "in the dict's order"),
    # layer 1's key after the projections' keys in alpha_pattern only
    ("general key first", {"rank_pattern": P5_RIGHT["rank_pattern"], "alpha_pattern": {"q_proj": 8, "v_proj": 32, LAYER_1: 16}},
     1.5, "must come before the key for its whole projection"),
    # no alpha_pattern key for layer 1: its q_proj and v_proj take 8 and 32 from the projections' keys
    ("alpha not given back", {"rank_pattern": P5_RIGHT["rank_pattern"], "alpha_pattern": {"q_proj": 8, "v_proj": 32}}, 1.5,
     "give layer 1 an alpha_pattern key of its own"),
    # a prefix as the key for layer 1: it matches no module (PEFT warns), layer 1 falls back to the other keys
    ("key matches nothing", {"rank_pattern": {"layers.1": 4, "v_proj": 16, "up_proj": 32},
                             "alpha_pattern": {"layers.1": 16, "q_proj": 8, "v_proj": 32}}, 1.5, "matches no module"),
    # a '^' anchor: the full names start with 'model.', so it matches nothing either
    ("key matches nothing", {"rank_pattern": {r"^layers\.1\..*": 4, "v_proj": 16, "up_proj": 32},
                             "alpha_pattern": {r"^layers\.1\..*": 16, "q_proj": 8, "v_proj": 32}}, 1.5,
     "did not match any targeted module"),
    # unescaped dots: 'layers.1.*' also matches layers 10 to 19, which get layer 1's r 4 and scaling 4 (three rows)
    ("too wide", {"rank_pattern": {"layers.1.*": 4, "v_proj": 16, "up_proj": 32},
                  "alpha_pattern": {"layers.1.*": 16, "q_proj": 8, "v_proj": 32}}, 0.5, "also matches layers 10–19"),
    ("too wide", {"rank_pattern": {"layers.1..*": 4, "v_proj": 16, "up_proj": 32},
                  "alpha_pattern": {"layers.1..*": 16, "q_proj": 8, "v_proj": 32}}, 0.5, "also matches layers 10–19"),
]

#: Other right answers: the check compares what PEFT builds, not the keys.
P5_ALSO_RIGHT = [
    {"rank_pattern": {"layers.1.self_attn.q_proj": 4, "layers.1.self_attn.v_proj": 4, "layers.1.mlp.up_proj": 4,
                      "v_proj": 16, "up_proj": 32},
     "alpha_pattern": {"layers.1.self_attn.q_proj": 16, "1.self_attn.v_proj": 16, "q_proj": 8, "v_proj": 32}},
    {"rank_pattern": {r"model\.layers\.1\.\w+\.\w+": 4, "self_attn.v_proj": 16, r".*\.up_proj": 32},
     "alpha_pattern": {r"layers\.1\.self_attn\.(q|v)_proj": 16, "q_proj": 8, "v_proj": 32, "up_proj": 16}},
]


def _peft_table(answer, model):
    """Build answer's LoraConfig with PEFT on ``model`` and read every adapter: {name: (r, lora_alpha, scaling)}."""
    import warnings

    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"],
                                                      rank_pattern=dict(answer["rank_pattern"]),
                                                      alpha_pattern=dict(answer["alpha_pattern"])))
    return {n: (int(m.r["default"]), float(m.lora_alpha["default"]), float(m.scaling["default"]))
            for n, m in peft_model.base_model.model.named_modules()
            if isinstance(getattr(m, "scaling", None), dict) and "default" in m.scaling}


def _smollm2_on_meta():
    """SmolLM2-135M itself, LlamaForCausalLM with the prepared checkpoint's config, on the meta device (no weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from coursekit import model as M

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig.from_pretrained(M.prepare_model(progress=False)))


def test_p5_skeleton_is_smollm2_as_peft_sees_it():
    """The check builds on a skeleton with SmolLM2-135M's module names; PEFT gives the real architecture (its config,
    on the meta device) the same r, lora_alpha and scaling, adapter by adapter, for the right answer and for every
    mistaken variant."""
    from coursekit.grading.lessons.lesson03 import P5, _p5_skeleton, p5_build

    real = _smollm2_on_meta()
    targets = [n for n, m in real.named_modules() if n.rsplit(".", 1)[-1] in P5["targets"]]
    assert [n for n, m in _p5_skeleton().named_modules() if n.rsplit(".", 1)[-1] in P5["targets"]] == targets
    assert len(targets) == 90 == 3 * P5["layers"] == 3 * real.config.num_hidden_layers
    for answer in [P5_RIGHT] + [v[1] for v in P5_VARIANTS[::3]]:
        assert p5_build(answer["rank_pattern"], answer["alpha_pattern"])[0] == _peft_table(answer, _smollm2_on_meta())


def test_p5_key_is_measured():
    """The right answer, built with PEFT, gives each row of the table its r and scaling, and scaling = lora_alpha / r
    on every adapter; PEFT's own reading agrees with coursekit's copy of its rule (lowrank.module_lora_settings)."""
    from coursekit.grading.lessons.lesson03 import P5, P5_ROWS, _p5_row, _p5_skeleton

    table = _peft_table(P5_RIGHT, _p5_skeleton())
    assert len(table) == 90
    for name, (r, alpha, s) in table.items():
        _, _, _, r_want, s_want = P5_ROWS[_p5_row(name)]
        assert (r, s) == (r_want, s_want) and s == alpha / r, name
        ours = lowrank.module_lora_settings(name, P5["r"], P5["lora_alpha"], **P5_RIGHT)
        assert (ours["r"], ours["lora_alpha"], ours["scaling"]) == (r, alpha, s), name
    assert {_p5_row(n) for n in table} == set(range(len(P5_ROWS)))
    for answer in [P5_RIGHT, *P5_ALSO_RIGHT]:
        fb = check("03.p5", answer)
        assert fb.full and fb.mistakes == [], fb.text()


@pytest.mark.parametrize("label, answer, points, text", P5_VARIANTS, ids=[f"{v[0]}-{i}" for i, v in enumerate(P5_VARIANTS)])
def test_p5_mistakes_are_measured_and_named(label, answer, points, text):
    """Each mistaken variant, built with PEFT by the check, loses exactly the rows it breaks (PEFT's table says which)
    and is named by its label alone."""
    from coursekit.grading.lessons.lesson03 import P5_ROWS, _p5_row, _p5_skeleton

    table = _peft_table(answer, _p5_skeleton())
    wrong_rows = {_p5_row(n) for n, (r, alpha, s) in table.items() if (r, s) != P5_ROWS[_p5_row(n)][3:]}
    assert wrong_rows and points == 2 * (len(P5_ROWS) - len(wrong_rows)) / len(P5_ROWS)
    fb = check("03.p5", answer)
    assert fb.points == points and fb.mistakes == [label], fb.text()
    assert text in fb.text() and "Reread" in fb.text(), fb.text()


def test_p5_two_mistakes_are_both_named():
    answer = {"rank_pattern": {"layers.1.*": 4, "v_proj": 16, "up_proj": 32}, "alpha_pattern": {"layers.1.*": 16, "q_proj": 8}}
    fb = check("03.p5", answer)
    assert fb.mistakes == ["too wide", "no alpha"] and fb.points == 0.5, fb.text()


@pytest.mark.parametrize(
    "answer, text",
    [
        (None, "should be a dict with two entries"),
        ([2, 1, 0.5], "got list"),
        ({"rank_pattern": {"v_proj": 16}}, "has no alpha_pattern"),
        ({"rank_pattern": {}, "alpha_pattern": {}, "r": 8}, "fixed by the question"),
        ({"rank_pattern": [("v_proj", 16)], "alpha_pattern": {}}, "rank_pattern should be a dict"),
        ({"rank_pattern": {"v_proj": 16.0}, "alpha_pattern": {}}, "a rank is a whole number"),
        ({"rank_pattern": {"v_proj": True}, "alpha_pattern": {}}, "should be a number"),
        ({"rank_pattern": {"v_proj": 0}, "alpha_pattern": {}}, "from 1 to 1024"),
        ({"rank_pattern": {"v_proj": 10**9}, "alpha_pattern": {}}, "from 1 to 1024"),
        ({"rank_pattern": {}, "alpha_pattern": {"v_proj": "32"}}, "should be a number"),
        ({"rank_pattern": {}, "alpha_pattern": {"v_proj": float("nan")}}, "finite"),
        ({"rank_pattern": {3: 4}, "alpha_pattern": {}}, "is not a string"),
        ({"rank_pattern": {"layers.(1": 4}, "alpha_pattern": {}}, "not a regular expression"),
        ({"rank_pattern": {"(?i)v_proj": 4}, "alpha_pattern": {}}, "not a regular expression"),
        ({"rank_pattern": {f"k{i}": 4 for i in range(13)}, "alpha_pattern": {}}, "has 13 keys"),
        ({"rank_pattern": {"(.|.)*Z": 4}, "alpha_pattern": {}}, "repeats a group"),
        ({"rank_pattern": {r"(x)\1": 4}, "alpha_pattern": {}}, "refers back to a group"),
        ({"rank_pattern": {".*.*.*v_proj": 4}, "alpha_pattern": {}}, "repeats 3 times"),
        ({"rank_pattern": {"(ab|cd)(ef|gh)(ij|kl)(mn|op)(qr|st)": 4}, "alpha_pattern": {}}, "32 ways to split"),
        ({"rank_pattern": {"x" * 201: 4}, "alpha_pattern": {}}, "longer than 200"),
    ],
)
def test_p5_malformed_answers_are_told_what_is_wrong(answer, text):
    fb = check("03.p5", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p5_worst_keys_allowed_are_checked_quickly():
    """A key may repeat single characters at most twice and split a name at most 16 ways, so that no key a student
    writes can hold the grading process: the slowest keys allowed, 12 in each dict (none matches), take seconds in all."""
    import time

    from coursekit.grading.lessons.lesson03 import _regex_problem

    slow = [r".?.?.?.?.*.*[^a-z_.0-9]", r"(.|.)(.|.)(.|.)(.|.).*.*Z", r"(.|..)(.|..).?.?.*\w*Z", r"\w?\w?\w?\w?\w*.*#"]
    keys = [slow[i % len(slow)] + f"(?#{i})" for i in range(12)]  # (?#…): a comment, to make 12 different keys
    assert all(_regex_problem(k) is None for k in keys)
    answer = {"rank_pattern": {k: 4 for k in keys}, "alpha_pattern": {k: 4.0 for k in keys}}
    t0 = time.perf_counter()
    fb = check("03.p5", answer)
    assert time.perf_counter() - t0 < 60 and fb.points == 0 and len(answer["rank_pattern"]) == 12, fb.text()


def test_p5_check_keeps_the_notebook_state():
    """The check runs PEFT in the student's kernel too: it leaves torch's random state as it was and writes nothing to
    stderr (a test cell with stderr scores 0)."""
    import contextlib
    import io

    import torch

    torch.manual_seed(3)
    before = torch.get_rng_state()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        check("03.p5", {"rank_pattern": {"layers.1": 4}, "alpha_pattern": {}})
    assert torch.equal(torch.get_rng_state(), before) and err.getvalue() == ""


@pytest.mark.parametrize(
    "item, answer, text",
    [
        ("w2", "b", "rank 2"),
        ("w2", "d", "full rank"),
        ("p3", "a", "independent"),
        ("p3", "c", "not a number of blocks"),
        ("p3", "b", "heads"),
    ],
)
def test_wrong_choice_gets_a_teaching_hint(item, answer, text):
    fb = check(f"03.{item}", answer)
    assert fb.points == 0 and text in fb.text() and "Reread" in fb.text()


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("power, text", [(2, "squared singular values"), (0, "you left out the singular values")])
def test_the_singular_values_power_is_named(power, text, hidden):
    def wrong(M, k):
        U, S, Vt = np.linalg.svd(np.asarray(M, dtype=np.float64), full_matrices=False)
        return (U[:, :k] * S[:k] ** power) @ Vt[:k]

    fb = check("03.p1", wrong, hidden=hidden)
    assert not fb.full and text in fb.text(), fb.text()


def test_p5s_refusals_state_the_limits_the_check_applies():
    """P5's prompt says what a key may be (a name or a regular expression, matched by the rule of Know this) and leaves
    the check's limits out of the subject; a refused key gets them in its message, with the check's own numbers (12
    ways allowed; one more optional group, 24, refused)."""
    from coursekit.grading.lessons.lesson03 import P5_MAX_CHOICES, P5_MAX_REPEATS, _regex_problem

    nb = nbformat.read(ROOT / "solutions" / "03-what-low-rank-restricts" / "03-what-low-rank-restricts.ipynb", as_version=4)
    prompt = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("**P5."))
    assert "Each key may be a module name or a regular\nexpression; PEFT matches it by the rule in 'Per-module ranks in PEFT'." in prompt
    assert not any(w in prompt for w in ("refused", "repeats", "ways through", "back-reference"))
    example = r"(encoder|decoder)\.(fc1|fc2|out)(\.base)?"
    assert _regex_problem(example) is None
    assert "has 24 ways" in _regex_problem(example + r"(\.x)?") and f"at most {P5_MAX_CHOICES}" in _regex_problem(example + r"(\.x)?")
    assert f"at most {P5_MAX_REPEATS}" in _regex_problem(".*.*.*v_proj")
    assert "refers back" in _regex_problem(r"(x)\1")
    assert "repeats a group" in _regex_problem(r"model\.layers\.1(\.\w+)+")
    fb = check("03.p5", {"rank_pattern": {".*.*.*v_proj": 4}, "alpha_pattern": {}})
    assert fb.points == 0 and f"needs at most {P5_MAX_REPEATS}" in fb.text(), fb.text()
