"""Lesson 11 ("Optimizers and preflight"): graded items score right answers fully, typical wrong answers less, with
the diagnostics a student needs; the notebook's test cells agree with the item registry."""

import json
from pathlib import Path

import nbformat
import numpy as np
import pytest

from coursekit.grading import check
from coursekit.grading.lessons.lesson11 import ITEMS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "11-optimizers-and-preflight" / "11-optimizers-and-preflight.ipynb"


# --------------------------------------------------------------------------- right answers, written as a student would


def factor_update(A, B, dA, dB, s):
    return s * ((A + dA) @ (B + dB) - A @ B)


def moved_by_step(opt):
    """Right for P2, written apart from the reference: snapshot, one real step, compare, then undo the step."""
    import copy

    import torch

    params = [p for g in opt.param_groups for p in g["params"]]
    values, state = [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict())
    opt.step()
    moved = [p for p, v in zip(params, values) if not torch.equal(p.detach(), v)]
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)
    opt.load_state_dict(state)
    return moved


def _moved_variant(rule):
    """A mistaken P2 answer, run: the rule over what the optimizer shows, before the step."""
    def fn(opt):
        import torch

        out = []
        for g in opt.param_groups:
            for p in g["params"]:
                m = opt.state.get(p, {}).get("exp_avg")
                f = dict(owned=True, requires_grad=p.requires_grad, grad=p.grad is not None,
                         grad_nonzero=p.grad is not None and bool(p.grad.any()), value_nonzero=bool(p.detach().any()),
                         decay=g["lr"] * g["weight_decay"] != 0, history=m is not None and bool(m.any()))
                if rule(f):
                    out.append(p)
        return out
    return fn


def rescaled_grads(X, W, A, B, s, D, c):
    Ac, Bc = c * A, B / c
    return X.T @ (s * D @ Bc.T), s * (X @ Ac).T @ D


def adamw_by_torch(p, grads, lr=0.05, wd=0.2):
    """The entry after one torch.optim.AdamW step per gradient (float64): P3's key, measured."""
    import torch

    x = torch.nn.Parameter(torch.tensor([p], dtype=torch.float64))
    opt = torch.optim.AdamW([x], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    for g in grads:
        x.grad = torch.tensor([g], dtype=torch.float64)  # a tensor of zeros is a gradient, not None
        opt.step()
    return x.item()


def full_lr_steps(p=2.5, lr=0.05, wd=0.2, steps=3):
    """The entry of a student who moves it by a whole lr at every step, in AdamW's order (decay, then step)."""
    for _ in range(steps):
        p = p * (1 - lr * wd) - lr
    return p


def ratios(c=10.0, lr=0.01):
    rng = np.random.default_rng(0)
    X, W, A, B, D = (rng.standard_normal(sh) for sh in [(3, 4), (4, 5), (4, 2), (2, 5), (3, 5)])
    out = []
    for adam in (False, True):
        norms = []
        for cc in (1.0, c):
            g, _ = rescaled_grads(X, W, A, B, 1.0, D, cc)
            step = -lr * g / (np.abs(g) + 1e-8) if adam else -lr * g
            norms.append(np.linalg.norm(step @ (B / cc)))
        out.append(norms[1] / norms[0])
    return out


RIGHT = {"w1": "b", "w2": 135168, "w3": "c", "p1": factor_update, "p2": moved_by_step,
         "p3": adamw_by_torch(2.5, (4.0, 0.0, 0.0)), "p4": "d", "p5": rescaled_grads, "p6": ratios()}


def test_every_item_has_a_right_answer_here():
    assert set(RIGHT) == set(ITEMS)


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item_id", sorted(RIGHT))
def test_right_answers_score_full(item_id, hidden):
    fb = check(f"11.{item_id}", RIGHT[item_id], hidden=hidden)
    assert fb.full, fb.text()


def test_typed_decimals_are_accepted():
    assert check("11.p3", round(RIGHT["p3"], 6)).full
    assert check("11.p6", [0.01, 0.1]).full


# --------------------------------------------------------------------------- wrong answers and their diagnostics


@pytest.mark.parametrize("fn,text", [
    (lambda A, B, dA, dB, s: s * (dA @ B + A @ dB), "missed the cross term"),
    (lambda A, B, dA, dB, s: dA @ B + A @ dB + dA @ dB, "scale s = "),
    (lambda A, B, dA, dB, s: s * (A + dA) @ (B + dB), "subtract s·A·B"),
])
def test_factor_update_mistakes_are_named(fn, text):
    fb = check("11.p1", fn, hidden=True)
    assert not fb.full and text in fb.text(), fb.text()


def test_factor_update_without_s_still_passes_only_the_s_equal_one_case():
    fb = check("11.p1", lambda A, B, dA, dB, s: dA @ B + A @ dB + dA @ dB, hidden=False)
    assert 0 < fb.points < ITEMS["p1"].points


def test_p2_key_is_a_real_step_and_the_rule_matches_it():
    """Every case's key is what one real opt.step() changes; the lesson's rule (owned, .grad not None, and then the
    decay on a nonzero tensor, a nonzero gradient or an earlier moment) gives the same names, public and hidden."""
    from coursekit.grading.lessons import lesson11

    class Ctx:
        hidden = True

        def __init__(self, seed):
            self.seed = seed

        def rng(self):
            return np.random.default_rng(self.seed)

    for seed in range(10):
        for _, spec in lesson11.StepSelection("p2", 3).cases(Ctx(seed)):
            facts, moved = lesson11._step_facts(spec)
            assert sorted(moved) == sorted(n for n, f in facts.items() if lesson11._moves(f)), spec


def _variant(label):
    from coursekit.grading.lessons import lesson11

    rule = {lab: r for lab, r, _ in lesson11._MOVED_MISTAKES}[label]
    return _moved_variant(rule)


@pytest.mark.parametrize("label,text", [
    ("requires_grad", "step() does not read requires_grad"),
    ("any gradient", "a tensor of zeros stays zero"),
    ("nonzero gradient only", "still gets the decoupled decay"),
    ("no history", "you forgot the first moment"),
    ("zeros decay", "you let the decay move a tensor of zeros"),
])
def test_p2_mistakes_are_the_variants_run_and_named(label, text):
    """Each named mistake is its rule run as an answer over the optimizer; the feedback names it and only it."""
    for hidden in (False, True):
        fb = check("11.p2", _variant(label), hidden=hidden)
        assert not fb.full and fb.mistakes == [label] and text in fb.text(), (label, fb.mistakes, fb.text())


def test_p2_stub_non_function_and_copies():
    def stub(opt):
        raise NotImplementedError()
    assert check("11.p2", stub).points == 0 and "NotImplementedError" in check("11.p2", stub).text()
    assert "should be a function" in check("11.p2", [1, 2]).text()
    fb = check("11.p2", lambda opt: [p.detach() for p in moved_by_step(opt)])
    assert fb.points == 0 and "not parameters of the model" in fb.text(), fb.text()


def test_p2_an_answer_that_steps_and_keeps_the_step_scores_nothing():
    def steps(opt):
        params = [p for g in opt.param_groups for p in g["params"]]
        before = [p.detach().clone() for p in params]
        opt.step()
        return [p for p, b in zip(params, before) if not (p.detach() == b).all()]

    fb = check("11.p2", steps, hidden=True)
    assert fb.points == 0 and "must only read the optimizer" in fb.text(), fb.text()


def test_p2_hidden_cases_vary():
    fb = check("11.p2", RIGHT["p2"], hidden=True)
    assert fb.text().count("hidden case") == 4


@pytest.mark.parametrize("answer,text", [
    (adamw_by_torch(2.5, (4.0,)) * 0.99**2, "m̂ / (√v̂ + ε) is still about 0.67 and 0.52"),
    (adamw_by_torch(2.5, (4.0,)), "that is the entry after step 1"),
    (adamw_by_torch(2.5, (4.0, 0.0, 0.0), wd=0.0), "left out the decoupled decay"),
    (full_lr_steps(), "moved the entry by a full lr at every step"),
    (2.5 * 0.99**3 - 0.15, "not right"),  # all three decays first, then three steps: no order AdamW runs in
    (2.5 * 0.99**3, "not right"),
])
def test_p3_mistakes_are_named(answer, text):
    fb = check("11.p3", answer)
    assert fb.points == 0 and text in fb.text(), fb.text()


def test_p3_zero_gradients_after_a_real_one_move_the_entry_beyond_the_decay():
    """What P3 asks the student to predict, measured with torch: steps 2 and 3 (gradient zeros) move the entry by more
    than their decay alone, in step 1's direction; and the key is torch's number."""
    after_one = adamw_by_torch(2.5, (4.0,))
    decay_only = after_one * (1 - 0.05 * 0.2) ** 2
    assert RIGHT["p3"] < decay_only - 0.05
    assert ITEMS["p3"].expected() == pytest.approx(RIGHT["p3"], abs=1e-12)


@pytest.mark.parametrize("letter,text", [("a", "get_peft_model creates lora_A and lora_B afterwards"),
                                         ("c", "check 3 passes"), ("b", "AdamW skips them")])
def test_p4_wrong_letters_teach(letter, text):
    fb = check("11.p4", letter)
    assert fb.points == 0 and text in fb.text()


def test_p4s_key_an_optimizer_built_before_get_peft_model_moves_nothing_and_preflight_names_the_adapters():
    """P4's key (d) measured: the optimizer built before get_peft_model; after a few steps the adapters have nonzero
    gradients but have not moved, the base weights have not moved either, and preflight's ownership check fails."""
    import torch
    from peft import LoraConfig, get_peft_model

    from coursekit import train

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
    model = get_peft_model(net, LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"]))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(16, 8, generator=gen), "y": torch.randint(0, 4, (16,), generator=gen)}
    loss_fn = lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]), b["y"])
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model, batch).backward()
        opt.step()
    adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert adapters and all(p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in adapters.items() if "lora_B" in n)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())     # nothing moved, base included
    with pytest.raises(train.PreflightError, match="not in the optimizer"):
        train.preflight(model, batch, loss_fn=loss_fn, optimizer=opt)
    keys = json.loads((ROOT / "autograder" / "keys" / "11.json").read_text())["keys"]
    assert keys["p4"] == RIGHT["p4"] == "d"


def test_rescaled_grads_mistakes_are_named():
    fb = check("11.p5", lambda X, W, A, B, s, D, c: (X.T @ (s * D @ B.T), s * (X @ A).T @ D), hidden=True)
    assert fb.points == 0 and "∇(cA) = s Xᵀ D (B/c)ᵀ = ∇A / c" in fb.text()
    fb = check("11.p5", lambda X, W, A, B, s, D, c: (c * X.T @ (s * D @ B.T), s * (X @ A).T @ D / c), hidden=True)
    assert fb.points == 0 and "not c·∇A" in fb.text()


@pytest.mark.parametrize("answer,text", [([0.1, 0.1], "react differently to the gradient's scale"), ([0.01, 0.01], "the 1/c in the gradient"),
                                         ([1, 1], "the step is not"), ([0.1, 0.01], "in the wrong order")])
def test_p6_mistakes_are_named(answer, text):
    fb = check("11.p6", answer)
    assert not fb.full and text in fb.text(), fb.text()


def test_w1_key_and_near_misses_are_torchs_adamw_state():
    """W1 measured: after one step, a default torch.optim.AdamW holds exactly exp_avg and exp_avg_sq, shaped like the
    tensor, and a step count (b); not one mean per tensor (a), no learning rate (it is in param_groups, c); and the
    third buffer max_exp_avg_sq appears only with amsgrad=True, which is not the default (d)."""
    import torch

    def state(**kw):
        p = torch.nn.Parameter(torch.ones(3, 2))
        opt = torch.optim.AdamW([p], lr=1e-2, **kw)
        p.grad = torch.full((3, 2), 0.5)
        opt.step()
        return opt, {k: tuple(v.shape) for k, v in opt.state[p].items()}

    opt, default = state()
    assert opt.defaults["amsgrad"] is False and "lr" in opt.param_groups[0]
    assert default == {"step": (), "exp_avg": (3, 2), "exp_avg_sq": (3, 2)}
    assert state(amsgrad=True)[1] == {**default, "max_exp_avg_sq": (3, 2)}
    assert ITEMS["w1"].key == RIGHT["w1"] == "b"
    for letter, text in [("a", "per entry, not per tensor"), ("c", "not a rate"), ("d", "only with amsgrad=True")]:
        fb = check("11.w1", letter)
        assert not fb.full and text in fb.text(), fb.text()


@pytest.mark.parametrize("answer,text", [(67584, "that is one moment"), (33792, "not the bytes"), (7077888, "dense d × m weight"),
                                         (7213056, "frozen base weight moments too"), (36864, "A's state alone"),
                                         (98304, "B's state alone"), (270336, "weights and gradients as well")])
def test_w2_mistakes_are_named(answer, text):
    fb = check("11.w2", answer)
    assert not fb.full and text in fb.text(), fb.text()


def test_w2_key_is_torchs_adamw_state():
    """W2's key measured: a torch.optim.AdamW that owns an r = 8 adapter on a 576 × 1536 projection (a PEFT LoraConfig on an
    nn.Linear, fp32) holds 135,168 bytes in exp_avg and exp_avg_sq after one step, and the lesson's own counter
    (optim.optimizer_state_bytes, which adds 4 bytes of step count per tensor) agrees; each named mistake is what the
    mistaken count measures: one moment, numbers instead of bytes, the dense weight, the base owned as well, one factor."""
    import torch
    from peft import LoraConfig, get_peft_model

    from coursekit import optim
    from coursekit.grading.lessons import lesson11

    torch.manual_seed(0)
    net = torch.nn.Sequential()
    net.add_module("proj", torch.nn.Linear(576, 1536, bias=False))
    model = get_peft_model(net, LoraConfig(r=8, lora_alpha=16, target_modules=["proj"]))
    params = optim.trainable_params(model)
    assert sorted(tuple(p.shape) for p in params) == [(8, 576), (1536, 8)]
    opt = torch.optim.AdamW(params, lr=1e-3)
    model(torch.randn(3, 576)).pow(2).sum().backward()
    opt.step()
    moments = sum(t.numel() * t.element_size() for p in params for k, t in opt.state[p].items() if k != "step")
    assert moments == ITEMS["w2"].expected() == 135168
    assert optim.optimizer_state_bytes(opt) == moments + 4 * len(params)
    assert check("11.w2", moments).full and check("11.w2", optim.optimizer_state_bytes(opt)).full
    values = {m.label: m.value for m in ITEMS["w2"].mistakes()}
    assert values["one moment"] == moments // 2 and values["entries"] == sum(p.numel() for p in params) * 2
    dense = torch.nn.Parameter(torch.zeros(1536, 576))
    assert values["dense weight"] == lesson11._moment_bytes([tuple(dense.shape)]) == 2 * 4 * dense.numel()
    assert values["base owned too"] == moments + values["dense weight"]
    assert values["one factor"] + values["other factor"] == moments
    assert values["weights and gradients too"] == moments + sum(p.numel() * p.element_size() for p in params) * 2


# --------------------------------------------------------------------------- registry, keys, notebook


def _cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return nb, [c for c in nb.cells if "nbgrader" in c.metadata]




def test_p5_answer_is_stated_only_after_its_question():
    """The student's notebook derives nothing of P5 above it: the gradients of the rescaled factors, ∇A/c and c·∇B, and
    their measured ratios appear only after P5's check (the cell above it prints how far they are from ∇A and ∇B)."""
    nb = nbformat.read(ROOT / "lessons" / "11-optimizers-and-preflight" / "11-optimizers-and-preflight.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if c.source.startswith("**P5 (implement).**"))
    before = "\n".join(c.source for c in nb.cells[:at])
    after = "\n".join(c.source for c in nb.cells[at:])
    for answer in ("∇A/c", "c·∇B", "∇(cA) / ∇A", "∇(B/c) / ∇B"):
        assert answer not in before and answer in after, answer
    assert "largest |∇(cA) − ∇A|" in before
