"""Graded items of lesson 11, "Optimizers and preflight"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ... import lora, optim, walk
from ..checkers import PUBLIC_ONLY_NOTE, Case, Feedback, Mistake, _consistent, probe, quiet
from .. import Array, Choice, Function, Numeric

READ_STATE = "Reread 'What AdamW owns' in Know this."
READ_OWN = "Reread 'Ownership: only trainable tensors' in Know this."
READ_ZERO = "Reread 'Zero gradient, None gradient, not owned' in Know this."
READ_ALGEBRA = "Reread 'The factor-update algebra' in Know this."
READ_RESCALE = "Reread 'Same product, different training' in Know this."


# --------------------------------------------------------------------------- references


def factor_update(A, B, dA, dB, s):
    """Reference for p1: δ(ΔW) = s(δA·B + A·δB + δA·δB)."""
    return optim.factor_update(A, B, dA, dB, s)


def rescaled_grads(X, W, A, B, s, D, c):
    """Reference for p5: the loss gradients of the rescaled factors cA and B/c, for upstream gradient D."""
    Ac, Bc = optim.rescale_factors(A, B, c)
    _, cache = lora.lora_forward(X, W, Ac, Bc, s)
    _, dA, dB = lora.lora_backward(D, cache)
    return dA, dB


def _adamw_entry(p: float, grads: tuple[float, ...], lr: float, wd: float, bias_correction: bool = True) -> float:
    """One entry through AdamW (``walk.adamw_step``, torch's algorithm), one step per gradient in ``grads``;
    ``bias_correction=False`` gives the value of a student who leaves out m̂ and v̂ (a mistake's value)."""
    x = np.array([[p]])
    st = walk.AdamWState.zeros_like(x)
    if bias_correction:
        for g in grads:
            x, st = walk.adamw_step(x, np.full_like(x, g), st, lr=lr, weight_decay=wd)
        return float(x[0, 0])
    m = v = 0.0
    x = float(p)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for g in grads:
        x *= 1 - lr * wd
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        x -= lr * m / (np.sqrt(v) + eps)
    return float(x)


def _a_term_ratios(c: float = 10.0, lr: float = 0.01) -> np.ndarray:
    """‖s·δA'·B'‖ for factors (cA, B/c) divided by the same for c = 1, after one SGD step and one AdamW step."""
    rng = np.random.default_rng(11)
    X, W, A = rng.standard_normal((4, 6)), rng.standard_normal((6, 5)), rng.standard_normal((6, 2)) * 0.5
    B, D, s = rng.standard_normal((2, 5)) * 0.5, rng.standard_normal((4, 5)) * 0.1, 2.0
    out = []
    for kind in ("sgd", "adamw"):
        norms = []
        for cc in (1.0, c):
            Ac, Bc = optim.rescale_factors(A, B, cc)
            dA, _ = rescaled_grads(X, W, A, B, s, D, cc)
            if kind == "sgd":
                new = walk.sgd_step(Ac, dA, lr)
            else:
                new = walk.adamw_step(Ac, dA, walk.AdamWState.zeros_like(Ac), lr=lr, weight_decay=0.0)[0]
            norms.append(np.linalg.norm(s * (new - Ac) @ Bc))
        out.append(norms[1] / norms[0])
    return np.array(out)


# --------------------------------------------------------------------------- p1 cases and mistakes


def _fu_case(rng: np.random.Generator, step: float) -> dict:
    d, m, r = int(rng.integers(2, 6)), int(rng.integers(2, 6)), int(rng.integers(1, 4))
    return dict(A=rng.standard_normal((d, r)), B=rng.standard_normal((r, m)), dA=rng.standard_normal((d, r)) * step,
                dB=rng.standard_normal((r, m)) * step, s=float(rng.choice([0.5, 2.0, 4.0])))


def _fu_public() -> list[Case]:
    return [
        Case(dict(A=np.array([[1.0], [2.0]]), B=np.array([[3.0, -1.0]]), dA=np.array([[0.5], [0.0]]),
                  dB=np.array([[0.0, 1.0]]), s=1.0), "d = m = 2, r = 1, s = 1: the cross term δA·δB is [[0, 0.5], [0, 0]]"),
        Case(_fu_case(np.random.default_rng(111), 0.3), "random factors, s ≠ 1"),
        Case(dict(A=np.zeros((3, 2)), B=np.zeros((2, 4)), dA=np.random.default_rng(112).standard_normal((3, 2)),
                  dB=np.random.default_rng(113).standard_normal((2, 4)), s=2.0),
             "A = B = 0: only the cross term is left"),
    ]


def _fu_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_fu_case(rng, float(rng.choice([0.1, 1.0, 3.0])))) for _ in range(5)]


def _fu_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    A, B, dA, dB = (np.asarray(kw[k], dtype=np.float64) for k in ("A", "B", "dA", "dB"))
    s = float(kw["s"])
    out = [
        Mistake("no cross", s * (dA @ B + A @ dB),
                "you missed the cross term s·δA·δB: (A + δA)(B + δB) − AB = δA·B + A·δB + δA·δB. It is second order "
                "(small for small steps) but not zero. " + READ_ALGEBRA),
        Mistake("no s", dA @ B + A @ dB + dA @ dB, f"the scale s = {s:g} is missing: ΔW = s·A·B, so its change carries s too. " + READ_ALGEBRA,
                hint="the scale s is missing: ΔW = s·A·B, so its change carries s too. " + READ_ALGEBRA),
        Mistake("no cross no s", dA @ B + A @ dB, f"both the cross term δA·δB and the scale s = {s:g} are missing. " + READ_ALGEBRA,
                hint="both the cross term δA·δB and the scale s are missing. " + READ_ALGEBRA),
        Mistake("new product", s * (A + dA) @ (B + dB), "you returned the new ΔW, s(A + δA)(B + δB); the question asks for its change "
                                                      "(subtract s·A·B). " + READ_ALGEBRA),
        Mistake("cross only", s * dA @ dB, "you kept only the cross term; δA·B and A·δB are the first-order terms. " + READ_ALGEBRA),
        Mistake("cross sign", s * (dA @ B + A @ dB - dA @ dB), "the cross term enters with a plus sign: s(δA·B + A·δB + δA·δB). " + READ_ALGEBRA),
    ]
    return {"result": out}


# --------------------------------------------------------------------------- p2: choosing what the optimizer owns


class _Lin(torch.nn.Module):
    """A PEFT-shaped adapted linear layer: base_layer, and lora_A / lora_B per adapter name."""

    def __init__(self, d: int, m: int, r: int, adapters: tuple[str, ...]):
        super().__init__()
        self.base_layer = torch.nn.Linear(d, m)
        self.lora_A = torch.nn.ModuleDict({a: torch.nn.Linear(d, r, bias=False) for a in adapters})
        self.lora_B = torch.nn.ModuleDict({a: torch.nn.Linear(r, m, bias=False) for a in adapters})


def _toy_model(layers: int, inactive: bool, head: bool, norm: bool, width: int = 6) -> torch.nn.Module:
    """Parameter structure of a PEFT model (forward is not needed): frozen base, a trainable "default" adapter,
    optionally a frozen second adapter "other" (PEFT freezes inactive adapters), a trainable head (like PEFT's
    ``modules_to_save``) and a trainable norm."""
    adapters = ("default", "other") if inactive else ("default",)
    m = torch.nn.Module()
    m.layers = torch.nn.ModuleList([_Lin(width, width, 2, adapters) for _ in range(layers)])
    if norm:
        m.norm = torch.nn.LayerNorm(width)
    m.score = torch.nn.Linear(width, 3)
    for n, p in m.named_parameters():
        p.requires_grad_(".default." in n or (head and n.startswith("score.")) or (norm and n.startswith("norm.")))
    return m


def trainable_params(model):
    """Reference for p2."""
    return optim.trainable_params(model)


def _measure_selection(fn, model: torch.nn.Module) -> dict:
    """Call ``trainable_params(model)`` and describe its result as data: each element's kind and, for a parameter of
    the model, its name (by identity: a copy is not the parameter); the names whose requires_grad it changed."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    got = fn(model)
    changed = [n for n, p in model.named_parameters() if p.requires_grad != flags[n]]
    try:
        got = list(got)
    except TypeError:
        return {"changed": changed, "not_a_list": type(got).__name__, "elements": []}
    elements = []
    for g in got:
        if isinstance(g, str):
            elements.append(["str", g])
        elif isinstance(g, tuple):
            elements.append(["tuple", ""])
        elif isinstance(g, torch.Tensor):
            elements.append(["param", by_id[id(g)]] if id(g) in by_id else ["copy", ""])
        else:
            elements.append(["other", type(g).__name__])
    return {"changed": changed, "not_a_list": "", "elements": elements}


@dataclass
class ParamSelection:
    """Implement ``trainable_params(model)``: the list of parameters an optimizer should own. Checked on PEFT-shaped
    toy models whose names trap a selection by name (a frozen inactive adapter, a trainable head)."""

    title: str
    points: float
    name: str = "trainable_params"
    #: stubbed in the grader's runner (and watched in the notebook): the lesson's own helper is the answer
    withheld = ("coursekit.optim:trainable_params",)

    def cases(self, ctx: Any) -> list[tuple[str, torch.nn.Module]]:
        torch.manual_seed(0)
        out = [
            ("public case 1 (two adapted layers, base frozen)", _toy_model(2, False, False, False)),
            ("public case 2 (a frozen inactive adapter 'other' and a trainable head 'score')", _toy_model(2, True, True, False)),
        ]
        if ctx.hidden:
            rng = ctx.rng()
            for i in range(4):  # each with a frozen inactive adapter: a function that flips requires_grad always shows
                out.append((f"hidden case {i + 3}", _toy_model(int(rng.integers(1, 4)), True,
                                                               bool(rng.integers(0, 2)), bool(rng.integers(0, 2)))))
        return out

    def check(self, answer: Any, ctx: Any) -> Feedback:
        if not callable(answer):
            return Feedback(0, self.points, [f"{self.name} should be a function; got {type(answer).__name__}. "
                                             f"Define it with def {self.name}(model):"])
        cases = self.cases(ctx)
        passed, lines, named = 0, [], []
        for tag, model in cases:
            bad = self._one(answer, model)
            if bad is None:
                return Feedback(0, self.points, [f"{self.name} still raises NotImplementedError: replace the stub with your code."])
            if bad:
                lines.append(f"✗ {tag}:")
                lines += ["    " + b for _, b in bad]
                if [label for label, _ in bad if label]:
                    named.append([label for label, _ in bad if label])
            else:
                passed += 1
                lines.append(f"✓ {tag}")
        if not ctx.hidden:
            lines.append(PUBLIC_ONLY_NOTE)
        return Feedback(self.points * passed / len(cases), self.points, lines, mistakes=_consistent(named))

    def _one(self, fn, model: torch.nn.Module) -> list[tuple[str, str]] | None:
        """What is wrong with the selection ``fn`` makes on ``model``: ``(label, sentence)`` pairs (label "" for a
        failure that is no known mistake); empty: right; None: ``fn`` is still the stub."""
        names = [n for n, _ in model.named_parameters()]
        want = [n for n, p in model.named_parameters() if p.requires_grad]  # before the student's code can change a flag
        try:
            with quiet([]):
                got = probe(fn, _measure_selection, model)
        except NotImplementedError:
            return None
        except Exception as e:
            return [("", f"{self.name}(model) raised {type(e).__name__}: {e}")]
        changed = got["changed"]
        if changed:
            return [("changes requires_grad", f"{self.name} changed requires_grad of {len(changed)} parameters (e.g. "
                     f"{changed[0]}): it must only read the model. Which tensors train is the PEFT setup's decision; select "
                     "by p.requires_grad. " + READ_OWN)]
        if got["not_a_list"]:
            return [("", f"{self.name} should return a list of parameters; got {got['not_a_list']}.")]
        kinds = [k for k, _ in got["elements"]]
        if "str" in kinds:
            return [("names", "you returned names (strings); the optimizer needs the Parameter objects themselves: "
                     "[p for p in model.parameters() if p.requires_grad]. " + READ_OWN)]
        if "tuple" in kinds:
            return [("pairs", "you returned (name, parameter) pairs; return the parameters only. " + READ_OWN)]
        others = sorted({v for k, v in got["elements"] if k == "other"})
        if others:
            return [("", f"{self.name} should return Parameter objects; got elements of type {', '.join(others)}. " + READ_OWN)]
        if "copy" in kinds:
            return [("copies", "some returned tensors are not parameters of the model (copies? .data or .detach() makes a new "
                     "tensor object, and the optimizer would update the copy, not the model). " + READ_OWN)]
        got_names = [v for _, v in got["elements"]]  # the returned parameters, by name, in the order returned
        out: list[tuple[str, str]] = []
        if len(got_names) != len(set(got_names)):
            out.append(("duplicates", "a parameter appears twice: the optimizer would refuse it (or step it twice). " + READ_OWN))
        extra = [n for n in dict.fromkeys(got_names) if n not in set(want)]
        missing = [n for n in want if n not in set(got_names)]
        if extra:
            out.append(("frozen included", f"{len(extra)} returned parameters are frozen (requires_grad=False), e.g. {extra[0]}."))
            if len(set(got_names)) == len(names):
                out.append(("every parameter", "You returned every parameter. AdamW skips a frozen one only while its .grad is "
                            "None; any gradient tensor (even zeros) gives it exp_avg / exp_avg_sq state and weight decay. " + READ_OWN))
            elif any("lora_" in n for n in extra):
                out.append(("selects by name", "You seem to select by name: a LoRA tensor of an inactive adapter is frozen. "
                            "Select by p.requires_grad, which is what PEFT sets. " + READ_OWN))
        if missing:
            out.append(("trainable missing", f"{len(missing)} trainable parameters are missing, e.g. {missing[0]}."))
            if any("lora_" not in n for n in missing):
                out.append(("selects by name", "Not every trainable tensor has 'lora' in its name (a head in modules_to_save, "
                            "a trainable norm): select by p.requires_grad, not by name. " + READ_OWN))
        return out


# --------------------------------------------------------------------------- p5 cases and mistakes


def _rg_case(rng: np.random.Generator) -> dict:
    n, d, m, r = int(rng.integers(1, 4)), int(rng.integers(2, 5)), int(rng.integers(2, 5)), int(rng.integers(1, 3))
    return dict(X=rng.standard_normal((n, d)), W=rng.standard_normal((d, m)), A=rng.standard_normal((d, r)),
                B=rng.standard_normal((r, m)), s=float(rng.choice([0.5, 2.0])), D=rng.standard_normal((n, m)),
                c=float(rng.choice([0.25, 3.0, 10.0, -2.0])))


def _rg_public() -> list[Case]:
    return [
        Case(dict(X=np.array([[1.0, 2.0]]), W=np.eye(2), A=np.array([[1.0], [0.5]]), B=np.array([[1.0, -1.0]]), s=1.0,
                  D=np.array([[0.5, -0.5]]), c=2.0), "a small case, c = 2"),
        Case(_rg_case(np.random.default_rng(115)) | dict(c=10.0), "random, c = 10"),
    ]


def _rg_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_rg_case(rng)) for _ in range(5)]


def _rg_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    X, W, A, B, D = (np.asarray(kw[k], dtype=np.float64) for k in ("X", "W", "A", "B", "D"))
    s, c = float(kw["s"]), float(kw["c"])
    _, cache = lora.lora_forward(X, W, A, B, s)
    _, dA, dB = lora.lora_backward(D, cache)
    same = "the product AB did not change, but the gradients did: "
    return {
        "dA": [Mistake("unscaled", dA, same + "∇(cA) = s Xᵀ D (B/c)ᵀ = ∇A / c. " + READ_RESCALE),
               Mistake("inverted", c * dA, "∇(cA) = ∇A / c, not c·∇A: the gradient of cA goes through B/c. " + READ_RESCALE)],
        "dB": [Mistake("unscaled", dB, same + "∇(B/c) = s (X·cA)ᵀ D = c·∇B. " + READ_RESCALE),
               Mistake("inverted", dB / c, "∇(B/c) = c·∇B, not ∇B / c: Z = X(cA) is c times larger. " + READ_RESCALE)],
    }


# --------------------------------------------------------------------------- items

#: P3: an entry whose gradient is 4 at step 1 and a tensor of zeros at steps 2 and 3 (kept, not None).
P3 = dict(p=2.5, grads=(4.0, 0.0, 0.0), lr=0.05, wd=0.2)

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 10

#: W2: a LoRA adapter (r = 8) on one 576 × 1536 projection, A d × r and B r × m, trained by torch.optim.AdamW in fp32.
W2 = dict(d=576, m=1536, r=8)


def _moment_bytes(shapes, dtype=torch.float32) -> int:
    """W2's reference, measured: bytes of exp_avg and exp_avg_sq together after one torch.optim.AdamW step on fresh
    parameters of these shapes (``dtype``), each with a gradient."""
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=dtype)) for shape in shapes]
    opt = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    return sum(opt.state[p][k].numel() * opt.state[p][k].element_size() for p in params for k in ("exp_avg", "exp_avg_sq"))


def _w2_shapes(d: int, m: int, r: int) -> list[tuple[int, int]]:
    return [(d, r), (r, m)]


def _w2_mistakes() -> list[Mistake]:
    d, m, r = W2["d"], W2["m"], W2["r"]
    right = _moment_bytes(_w2_shapes(d, m, r))
    return [
        Mistake("one moment", right // 2,
                "that is one moment; AdamW keeps two per entry, exp_avg (m) and exp_avg_sq (v), each shaped like the tensor. "
                + READ_STATE),
        Mistake("entries", 2 * r * (d + m),
                "that counts the numbers, not the bytes: each of the two moments is an fp32 tensor, 4 bytes per entry. "
                + READ_STATE),
        Mistake("dense weight", _moment_bytes([(d, m)]),
                "that is the state for the dense d × m weight; the optimizer owns only the adapter, A (d × r) and B (r × m), "
                "r(d + m) entries. " + READ_STATE),
        Mistake("base owned too", _moment_bytes(_w2_shapes(d, m, r) + [(d, m)]),
                "you gave the frozen base weight moments too; an optimizer built from the trainable tensors owns only A and B. "
                + READ_OWN),
        Mistake("one factor", _moment_bytes([(d, r)]),
                "that is A's state alone (d × r); B (r × m) has its own two moments. " + READ_STATE),
        Mistake("other factor", _moment_bytes([(r, m)]),
                "that is B's state alone (r × m); A (d × r) has its own two moments. " + READ_STATE),
        Mistake("weights and gradients too", 16 * r * (d + m),
                "that is 16 bytes per entry: the adapter's weights and gradients as well as the two moments; the question asks "
                "for the moments only, 8 bytes per entry. " + READ_STATE),
    ]


ITEMS = {
    "w1": Choice(
        "what torch.optim.AdamW stores per parameter tensor by default",
        0,
        key="b",
        explain={
            "a": "The moments are kept per entry, not per tensor: exp_avg and exp_avg_sq are shaped like the tensor, because AdamW divides each entry's step by that entry's own √v̂ + ε (lesson 06). One mean per tensor would give every entry the same scale. Reread 'What AdamW owns' in Know this.",
            "b": "torch.optim.AdamW keeps lesson 06's m, v and t for each parameter tensor in opt.state[p], named exp_avg and exp_avg_sq (both shaped like the tensor) and step, created lazily at the first step() in which the tensor has a gradient. The learning rate and the other hyperparameters live in opt.param_groups, shared by all tensors of a group. (Lesson 11, 'What AdamW owns'.)",
            "c": "AdamW's step is adaptive per entry because it divides by √v̂ + ε, but what it stores are the moments, not a rate: the learning rate lives in the param group, shared by all its tensors; per tensor AdamW keeps two moments shaped like it and a step count. Reread 'What AdamW owns' in Know this.",
            "d": "max_exp_avg_sq, the running maximum of v, belongs to the AMSGrad variant: torch creates it only with amsgrad=True, and AdamW's default is amsgrad=False, so the state holds exp_avg, exp_avg_sq and step. Reread 'What AdamW owns' in Know this.",
        },
    ),
    "w2": Numeric(
        f"bytes of AdamW's two moments for an r = {W2['r']} adapter on a {W2['d']} × {W2['m']} projection",
        0,
        name="bytes",
        expected=lambda: float(_moment_bytes(_w2_shapes(**W2))),
        rtol=1e-3,  # a `step` count (4 bytes per tensor) on top is within it: the question asks for the moments
        mistakes=_w2_mistakes,
    ),
    "w3": Choice(
        "AdamW(model.parameters(), weight_decay=0.1) on a PEFT model",
        0,
        key="c",
        explain={
            "a": "torch.optim.AdamW skips every parameter whose .grad is None before it applies the decay, and a frozen base weight's .grad stays None. Reread 'Zero gradient, None gradient, not owned' in Know this.",
            "b": "AdamW does not check requires_grad; it accepts frozen tensors without complaint and skips them because their .grad is None. Reread 'Zero gradient, None gradient, not owned' in Know this.",
            "c": "Backward never fills .grad for a tensor with requires_grad=False, so the base weights keep .grad = None, and torch.optim.AdamW skips every parameter whose .grad is None: no moments, no decoupled decay, and the weights come out bitwise unchanged. AdamW never looks at requires_grad itself, which is why a gradient tensor of zeros, unlike None, would bring both moments and the (1 − lr·λ) shrink. (Lesson 11, 'Ownership: only trainable tensors'.)",
            "d": "State is created lazily, at the first step where the parameter has a gradient: a None gradient means no state. Reread 'Zero gradient, None gradient, not owned' in Know this.",
        },
    ),
    "p1": Function(
        "implement factor_update",
        3,
        name="factor_update",
        reference=factor_update,
        public=_fu_public,
        hidden=_fu_hidden,
        outputs=("result",),
        mistakes=_fu_mistakes,
        rtol=1e-9,
        atol=1e-12,
    ),
    "p2": ParamSelection("implement trainable_params", 3),
    "p3": Numeric(
        "an entry after a real gradient and two zero gradients under AdamW",
        1,
        name="p",
        reread=READ_ZERO,
        expected=lambda: _adamw_entry(**P3),
        rtol=0,
        atol=1e-6,
        mistakes=lambda: [
            Mistake("zeros move nothing", _adamw_entry(P3["p"], P3["grads"][:1], P3["lr"], P3["wd"])
                    * (1 - P3["lr"] * P3["wd"]) ** 2,
                    "you let steps 2 and 3 only decay the entry, as for a tensor whose gradient was always zero; this one "
                    "had a gradient at step 1, so its m is not zero: m̂ / (√v̂ + ε) is still about 0.67 and 0.52 at steps "
                    "2 and 3, and the entry keeps moving in step 1's direction. " + READ_ZERO),
            Mistake("one step", _adamw_entry(P3["p"], P3["grads"][:1], P3["lr"], P3["wd"]),
                    "that is the entry after step 1; a zero gradient is a tensor, not None, so steps 2 and 3 run too: "
                    "the decay and the moments both act. " + READ_ZERO),
            Mistake("no decay", _adamw_entry(P3["p"], P3["grads"], P3["lr"], 0.0),
                    "you left out the decoupled decay: every step, whatever the gradient, first multiplies the entry by "
                    "(1 − lr·λ). " + READ_ZERO),
            Mistake("no bias correction", _adamw_entry(**P3, bias_correction=False),
                    "you left out the bias correction m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ) (lesson 06): without it "
                    "the first steps are far too small or too large. " + READ_ZERO),
            Mistake("three full steps", P3["p"] * (1 - P3["lr"] * P3["wd"]) ** 3 - 3 * P3["lr"],
                    "you moved the entry by a full lr at every step; after step 1 the gradient is zero, so m decays "
                    "by β₁ each step while √v̂ decays more slowly: m̂ / (√v̂ + ε) falls below 1. " + READ_ZERO),
        ],
    ),
    "p4": Choice(
        "an optimizer built before get_peft_model",
        1,
    ),
    "p5": Function(
        "implement rescaled_grads",
        2,
        name="rescaled_grads",
        reference=rescaled_grads,
        public=_rg_public,
        hidden=_rg_hidden,
        outputs=("dA", "dB"),
        mistakes=_rg_mistakes,
        rtol=1e-9,
        atol=1e-12,
    ),
    "p6": Array(
        "how rescaling by c = 10 changes the δA'·B' term: [SGD ratio, AdamW first-step ratio]",
        2,
        name="ratios",
        reread=READ_RESCALE,
        expected=_a_term_ratios,
        rtol=1e-4,
        atol=0,
        mistakes=lambda: [
            Mistake("same", [0.1, 0.1], "SGD and AdamW react differently to the gradient's scale: follow ∇A/c through each "
                                        "optimizer's step, then multiply by B/c. " + READ_RESCALE),
            Mistake("same2", [0.01, 0.01], "AdamW's first step is lr·g/(|g| + ε) ≈ lr·sign(g): the 1/c in the gradient "
                                           "cancels; what is left to shrink the term? " + READ_RESCALE),
            Mistake("one", [1.0, 1.0], "the product AB is the same, but the step is not: the gradients of cA and B/c are "
                                       "∇A/c and c·∇B. " + READ_RESCALE),
            Mistake("swapped", [0.1, 0.01], "the two ratios are in the wrong order: the answer is [SGD ratio, AdamW ratio]. " + READ_RESCALE),
            Mistake("inverse", [100.0, 10.0], "you took the c = 1 step over the rescaled one: the question asks rescaled / "
                                              "original. " + READ_RESCALE),
        ],
    ),
}
