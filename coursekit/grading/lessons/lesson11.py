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


def _full_lr_steps(p: float, lr: float, wd: float, steps: int) -> float:
    """The entry after ``steps`` AdamW steps that each move it by a whole lr against the gradient's sign (positive),
    in AdamW's order: decay p by (1 − lr·λ), then step. 11.p3's "three full steps" mistake."""
    for _ in range(steps):
        p = p * (1 - lr * wd) - lr
    return p


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


# --------------------------------------------------------------------------- p2: what one AdamW step moves


class _Lin(torch.nn.Module):
    """A PEFT-shaped adapted linear layer: base_layer, and lora_A / lora_B per adapter name."""

    def __init__(self, d: int, m: int, r: int, adapters: tuple[str, ...]):
        super().__init__()
        self.base_layer = torch.nn.Linear(d, m)
        self.lora_A = torch.nn.ModuleDict({a: torch.nn.Linear(d, r, bias=False) for a in adapters})
        self.lora_B = torch.nn.ModuleDict({a: torch.nn.Linear(r, m, bias=False) for a in adapters})


def _step_case(spec: dict):
    """Build 11.p2's case from plain data, the same on the grader's side and in the student's runner: a PEFT-shaped
    model (frozen base, a trainable "default" adapter whose B starts at zero, a frozen inactive adapter "other", a
    trainable head "score" and norm "norm"), an AdamW over it and the gradients of the step about to be taken.
    Returns (model, optimizer). Uses torch only (it runs in the runner)."""
    with torch.random.fork_rng(devices=[]):                        # the caller's random state is left as it was
        torch.manual_seed(spec["seed"])
        return _step_case_seeded(spec)


def _step_case_seeded(spec: dict):
    width, lr = 6, 1e-2
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([_Lin(width, width, 2, ("default", "other")) for _ in range(spec["layers"])])
    model.norm = torch.nn.LayerNorm(width)
    model.score = torch.nn.Linear(width, 3)
    for n, p in model.named_parameters():
        trainable = ".default." in n or n.startswith(("score.", "norm."))
        p.requires_grad_(trainable or (spec["zero_freeze"] and "base_layer" in n))
        if "lora_B" in n:
            torch.nn.init.zeros_(p)                                 # PEFT starts B at zero
    adapter = [p for n, p in model.named_parameters() if ".default." in n]
    norm, head = list(model.norm.parameters()), list(model.score.parameters())
    if spec["owner"] == "all":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=spec["wd_adapter"])
    else:
        opt = torch.optim.AdamW([{"params": adapter + ([] if spec["norm_unowned"] else norm),
                                  "weight_decay": spec["wd_adapter"]},
                                 {"params": head, "weight_decay": spec["wd_head"]}], lr=lr)
    if spec["history"]:                                             # one earlier step, every trainable tensor with a gradient
        for n, p in model.named_parameters():
            p.grad = torch.randn_like(p) if p.requires_grad and "base_layer" not in n else None
        opt.step()
    for n, p in model.named_parameters():                           # the gradients of the step about to be taken
        if "base_layer" in n:
            p.grad = torch.zeros_like(p) if spec["zero_freeze"] else None
        elif ".other." in n:
            p.grad = None
        elif "lora_A" in n and int(n.split(".")[1]) in spec.get("a_none_layers", []):
            p.grad = None                                           # set_to_none, and the loss did not reach it
        elif "lora_B" in n and int(n.split(".")[1]) in spec["b_zero_layers"]:
            p.grad = torch.zeros_like(p)                            # the loss does not reach this B on this batch
        elif n.startswith("score.") and spec["head_zero_grad"]:
            p.grad = torch.zeros_like(p)
        else:
            p.grad = torch.randn_like(p)
    return model, opt


def _measure_moved(fn, spec: dict) -> dict:
    """In the runner: build the case, call ``moved_by_step(opt)`` and describe its result as data: each element's
    kind and, for a parameter of the model, its name (by identity); the names whose value or gradient it changed."""
    model, opt = _step_case(spec)
    by_id = {id(p): n for n, p in model.named_parameters()}
    before = {n: (p.detach().clone(), None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}
    got = fn(opt)
    changed = [n for n, p in model.named_parameters()
               if not torch.equal(p.detach(), before[n][0])
               or (p.grad is None) != (before[n][1] is None)
               or (p.grad is not None and not torch.equal(p.grad, before[n][1]))]
    try:
        got = list(got)
    except TypeError:
        return {"changed": changed, "not_a_list": type(got).__name__, "elements": []}
    elements = []
    for g in got:
        if isinstance(g, str):
            elements.append(["str", g])
        elif isinstance(g, torch.Tensor):
            elements.append(["param", by_id[id(g)]] if id(g) in by_id else ["copy", ""])
        else:
            elements.append(["other", type(g).__name__])
    return {"changed": changed, "not_a_list": "", "elements": elements}


def _step_facts(spec: dict) -> tuple[dict, list[str]]:
    """What the rules of 'Zero gradient, None gradient, not owned' read, per parameter of the case, and the names
    one real ``opt.step()`` changes (the key, measured)."""
    model, opt = _step_case(spec)
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    facts = {}
    for n, p in model.named_parameters():
        g = group_of.get(id(p))
        m = opt.state.get(p, {}).get("exp_avg") if g is not None else None
        facts[n] = dict(
            owned=g is not None, requires_grad=p.requires_grad, grad=p.grad is not None,
            grad_nonzero=p.grad is not None and bool(p.grad.any()), value_nonzero=bool(p.detach().any()),
            decay=(g if g is not None else opt.param_groups[0])["weight_decay"] * (g or opt.param_groups[0])["lr"] != 0,
            history=m is not None and bool(m.any()))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    return facts, moved


def _moves(f: dict) -> bool:
    """The rule: owned, a gradient tensor (None is skipped), and then the decay changes a nonzero tensor, or the
    Adam part m̂ / (√v̂ + ε) is nonzero because this gradient or an earlier one (m) is."""
    return f["owned"] and f["grad"] and ((f["decay"] and f["value_nonzero"]) or f["grad_nonzero"] or f["history"])


#: Each named mistake as the rule it runs, and what it misses. A label is named only when the answer equals the rule's
#: selection on every case it fails, and the selection is not right there.
_MOVED_MISTAKES = (
    ("requires_grad", lambda f: f["owned"] and f["requires_grad"],
     "you selected the owned tensors that require a gradient; step() does not read requires_grad: it skips a tensor "
     "whose .grad is None (set_to_none, or the loss did not reach it), and a zero gradient moves a tensor only through "
     "the decay or an earlier gradient's moment. " + READ_ZERO),
    ("any gradient", lambda f: f["owned"] and f["grad"],
     "you counted every owned tensor with a gradient; a zero gradient moves a tensor only through the decay (lr·λ ≠ 0, "
     "and a tensor of zeros stays zero when multiplied) or through m, kept from an earlier nonzero gradient. " + READ_ZERO),
    ("nonzero gradient only", lambda f: f["owned"] and f["grad_nonzero"],
     "you counted only tensors whose gradient is nonzero; a zero gradient tensor (not None) still gets the decoupled "
     "decay θ(1 − lr·λ), and m̂ from an earlier step keeps pushing it (P3's entry). " + READ_ZERO),
    ("no history", lambda f: f["owned"] and f["grad"] and ((f["decay"] and f["value_nonzero"]) or f["grad_nonzero"]),
     "you forgot the first moment: after an earlier nonzero gradient, exp_avg is not zero, so a zero gradient still "
     "moves the tensor by lr·m̂ / (√v̂ + ε), even in a group without weight decay (read opt.state[p]). " + READ_ZERO),
    ("zeros decay", lambda f: f["owned"] and f["grad"] and (f["decay"] or f["grad_nonzero"] or f["history"]),
     "you let the decay move a tensor of zeros; θ(1 − lr·λ) is still zero, so a lora_B that is zero (PEFT's start) "
     "with a zero gradient and no history does not move. " + READ_ZERO),
)


def moved_by_step(opt):
    """Reference for p2: the parameters one ``opt.step()`` of this ``torch.optim.AdamW`` changes."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            m = opt.state.get(p, {}).get("exp_avg")
            decays = group["lr"] * group["weight_decay"] != 0 and bool(p.detach().any())
            if decays or bool(p.grad.any()) or (m is not None and bool(m.any())):
                out.append(p)
    return out


_PUBLIC_SPECS = [
    ("public case 1 (two groups: adapter, weight_decay 0.1, and head, weight_decay 0; no earlier step; the norm "
     "trainable but not owned; layer 0's B and the head with zero gradients; layer 1's A with .grad None)",
     dict(seed=0, layers=2, owner="groups", wd_adapter=0.1, wd_head=0.0, history=False, zero_freeze=False,
          norm_unowned=True, b_zero_layers=[0], head_zero_grad=True, a_none_layers=[1])),
    ("public case 2 (AdamW over model.parameters(), weight_decay 0.1; the base 'frozen' by zero gradients; no earlier "
     "step; layer 0's B with a zero gradient)",
     dict(seed=1, layers=2, owner="all", wd_adapter=0.1, wd_head=0.1, history=False, zero_freeze=True,
          norm_unowned=False, b_zero_layers=[0], head_zero_grad=False)),
    ("public case 3 (two groups: adapter, weight_decay 0.1, and head, weight_decay 0; one earlier step; the norm "
     "trainable but not owned; layer 0's B and the head with zero gradients; layer 1's A with .grad None)",
     dict(seed=2, layers=2, owner="groups", wd_adapter=0.1, wd_head=0.0, history=True, zero_freeze=False,
          norm_unowned=True, b_zero_layers=[0], head_zero_grad=True, a_none_layers=[1])),
]


@dataclass
class StepSelection:
    """Implement ``moved_by_step(opt)``: the parameters one AdamW ``step()`` will change, read from the optimizer
    before the step. Checked on PEFT-shaped cases built from data (:func:`_step_case`), each against a real step."""

    title: str
    points: float
    name: str = "moved_by_step"

    def cases(self, ctx: Any) -> list[tuple[str, dict]]:
        out = list(_PUBLIC_SPECS)
        if ctx.hidden:
            rng = ctx.rng()
            for i in range(4):
                layers = int(rng.integers(1, 4))
                out.append((f"hidden case {i + 1 + len(_PUBLIC_SPECS)}", dict(
                    seed=int(rng.integers(0, 2**31)), layers=layers, owner=str(rng.choice(["all", "groups"])),
                    wd_adapter=float(rng.choice([0.0, 0.1])), wd_head=float(rng.choice([0.0, 0.1])),
                    history=bool(rng.integers(0, 2)), zero_freeze=bool(rng.integers(0, 2)),
                    norm_unowned=bool(rng.integers(0, 2)),
                    b_zero_layers=[k for k in range(layers) if rng.integers(0, 2)], head_zero_grad=bool(rng.integers(0, 2)),
                    a_none_layers=[k for k in range(layers) if rng.integers(0, 4) == 0])))
        return out

    def check(self, answer: Any, ctx: Any) -> Feedback:
        if not callable(answer):
            return Feedback(0, self.points, [f"{self.name} should be a function; got {type(answer).__name__}. "
                                             f"Define it with def {self.name}(opt):"])
        cases = self.cases(ctx)
        passed, lines, per_case = 0, [], []
        for tag, spec in cases:
            bad = self._one(answer, spec)
            if bad is None:
                return Feedback(0, self.points, [f"{self.name} still raises NotImplementedError: replace the stub with your code."])
            if bad:
                lines.append(f"✗ {tag}:")
                lines += ["    " + b for label, b in bad if not label]
                if [label for label, _ in bad if label]:
                    per_case.append([label for label, _ in bad if label])
            else:
                passed += 1
                lines.append(f"✓ {tag}")
        # On one case two rules can select the same tensors; the mistake named is the one every failed case shares.
        named = _consistent(per_case)
        messages = dict((label, msg) for label, _, msg in _MOVED_MISTAKES)
        lines += [messages[label] for label in named]
        if not ctx.hidden:
            lines.append(PUBLIC_ONLY_NOTE)
        return Feedback(self.points * passed / len(cases), self.points, lines, mistakes=named)

    def _one(self, fn, spec: dict) -> list[tuple[str, str]] | None:
        """What is wrong with ``fn``'s selection on the case ``spec``: ``(label, sentence)`` pairs (label "" for a
        failure that is no known mistake); empty: right; None: ``fn`` is still the stub."""
        facts, want = _step_facts(spec)
        try:
            with quiet([]):
                got = probe(fn, _measure_moved, spec)
        except NotImplementedError:
            return None
        except Exception as e:
            return [("", f"{self.name}(opt) raised {type(e).__name__}: {e}")]
        if got["changed"]:
            return [("", f"{self.name} changed the value or gradient of {len(got['changed'])} parameters (e.g. "
                     f"{got['changed'][0]}): it must only read the optimizer, before the step.")]
        if got["not_a_list"]:
            return [("", f"{self.name} should return a list of parameters; got {got['not_a_list']}.")]
        kinds = [k for k, _ in got["elements"]]
        if "str" in kinds:
            return [("", "you returned strings; return the Parameter objects themselves (from opt.param_groups). " + READ_OWN)]
        others = sorted({v for k, v in got["elements"] if k == "other"})
        if others:
            return [("", f"{self.name} should return Parameter objects; got elements of type {', '.join(others)}.")]
        if "copy" in kinds:
            return [("", "some returned tensors are not parameters of the model (copies? .data or .detach() makes a new "
                     "tensor object). Return the parameters themselves. " + READ_OWN)]
        got_names = [v for _, v in got["elements"]]
        if len(got_names) != len(set(got_names)):
            return [("", "a parameter appears twice in your list; list each once.")]
        if set(got_names) == set(want):
            return []
        extra = [n for n in facts if n in set(got_names) and n not in set(want)]
        missing = [n for n in want if n not in set(got_names)]
        out = []
        if extra:
            out.append(("", f"{len(extra)} returned parameters do not move, e.g. {extra[0]}."))
        if missing:
            out.append(("", f"{len(missing)} parameters that move are missing, e.g. {missing[0]}."))
        out += [(label, "") for label, rule, _ in _MOVED_MISTAKES
                if set(got_names) == {n for n, f in facts.items() if rule(f)}]
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
        1,
        name="factor_update",
        reference=factor_update,
        public=_fu_public,
        hidden=_fu_hidden,
        outputs=("result",),
        mistakes=_fu_mistakes,
        rtol=1e-9,
        atol=1e-12,
    ),
    "p2": StepSelection("implement moved_by_step", 3),
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
            Mistake("three full steps", _full_lr_steps(P3["p"], P3["lr"], P3["wd"], 3),
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
