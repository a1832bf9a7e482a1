"""Graded items of lesson 06, "The rank-one walk"."""

from __future__ import annotations

import math

import numpy as np

from ... import walk
from ..checkers import Case, Mistake
from .. import Array, Choice, Function, Numeric

READ_CE = "Reread 'Softmax, cross-entropy and D' in Know this."
READ_ADAMW = "Reread 'AdamW by hand' in Know this."
READ_STEPS = "Reread 'The eight steps, once by hand' in Know this."
READ_LSM = "Reread 'Softmax, cross-entropy and D' in Know this (the softmax rule) and P7's two ways in."


# --------------------------------------------------------------------------- references


def ce_grad(Y, target):
    """Reference for p1: ``D = softmax(Y) − onehot(target)`` for one row Y (1 × m)."""
    return walk.cross_entropy_backward(walk.cross_entropy_forward(Y, target)[1])


def adamw_step(param, grad, m, v, t, lr, betas, eps, weight_decay):
    """Reference for p2: one AdamW step with ``t`` = this step's number (1 for the first step)."""
    new, st = walk.adamw_step(param, grad, walk.AdamWState(m, v, int(t) - 1), lr, tuple(betas), eps, weight_decay)
    return new, st.m, st.v


def sgd_walk_step(X, W, A, B, s, target, lr):
    """Reference for p3: one SGD training step of the walk, ``(A_new, B_new)``."""
    rec = walk.run_walk(X, W, A, B, s, target, steps=1, optimizer="sgd", lr=lr)[0]
    return rec.A_after, rec.B_after


def log_softmax_backward(g, x):
    """Reference for p7: ``dx = g − softmax(x) Σ g`` row-wise."""
    return walk.log_softmax_backward(g, x)


# --------------------------------------------------------------------------- the lesson's worked walk


def _seed_records(steps=3, optimizer="adamw"):
    return walk.run_walk(**walk.worked_example(), steps=steps, optimizer=optimizer)


def _restarted_adamw(steps: int) -> np.ndarray:
    """A after ``steps`` AdamW steps when the optimizer state is thrown away after every step."""
    ex = walk.worked_example()
    for _ in range(steps):
        rec = walk.run_walk(**ex, steps=1)[0]
        ex = ex | dict(A=rec.A_after, B=rec.B_after)
    return ex["A"]


# --------------------------------------------------------------------------- p1 cases and mistakes


def _ce_public() -> list[Case]:
    return [
        Case(dict(Y=np.array([[1.19, 1.35]]), target=1), "the walk's first logits, target class 1"),
        Case(dict(Y=np.array([[0.5, -1.0, 2.0, 0.0]]), target=0), "four classes, target class 0"),
        Case(dict(Y=np.array([[1000.0, 1001.5, 998.0]]), target=2), "large logits: subtract the row's maximum before exp"),
    ]


def _ce_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for scale in (1.0, 3.0, 1.0, 1000.0, 2.0):
        m = int(rng.integers(2, 7))
        Y = rng.standard_normal((1, m)) * scale
        if scale == 1000.0:  # logits near 1000 whatever the draw: exp overflows unless the row's maximum is subtracted
            Y = 1000.0 + rng.standard_normal((1, m)) * 3.0
        out.append(Case(dict(Y=Y, target=int(rng.integers(0, m)))))
    return out


def _ce_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    Y, t = np.asarray(kw["Y"], dtype=np.float64), int(kw["target"])
    p = walk.softmax(Y)
    onehot = np.zeros_like(p)
    onehot[0, t] = 1.0
    out = [
        Mistake("sign", onehot - p, "the sign is flipped: D = ∂L/∂Y = p − onehot, not onehot − p (the loss falls when the target's logit rises). " + READ_CE),
        Mistake("no onehot", p, "you returned the probabilities p: subtract the one-hot of the target class. " + READ_CE),
        Mistake("log", walk.log_softmax(Y) - onehot, "you used log-softmax where softmax belongs: D = softmax(Y) − onehot. " + READ_CE),
        Mistake("onehot only", -onehot, "you returned −onehot, the gradient for log p, not for Y: go through the softmax too (add p). " + READ_CE),
    ]
    for j in range(p.shape[1]):
        if j != t:
            wrong = onehot * 0
            wrong[0, j] = 1.0
            out.append(Mistake("class", p - wrong, f"your one-hot marks class {j}, not the target class {t}: class indices are 0-based. " + READ_CE,
                               hint="your one-hot marks another class than the target: class indices are 0-based, and the "
                                    "1 goes at index target. " + READ_CE))
    return {"D": out, "result": out}


# --------------------------------------------------------------------------- p2 cases and mistakes


def _adam_case(rng: np.random.Generator, eps: float, weight_decay: float, t: int) -> dict:
    shape = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    return dict(
        param=rng.standard_normal(shape),
        grad=rng.standard_normal(shape) * 0.1,
        m=rng.standard_normal(shape) * 0.05,
        v=rng.uniform(0.0, 0.02, shape),
        t=t,
        lr=float(rng.choice([0.01, 0.05, 0.1])),
        betas=(float(rng.choice([0.8, 0.9])), float(rng.choice([0.99, 0.999]))),
        eps=eps,
        weight_decay=weight_decay,
    )


def _adam_public() -> list[Case]:
    r1, r2 = _seed_records(2)
    zeros = np.zeros((1, 2))
    seed = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    return [
        Case(dict(param=r1.B, grad=r1.dB, m=zeros, v=zeros, t=1, **seed), "the walk's B at step 1 (B → [0.01, −0.01])"),
        Case(dict(param=r2.A, grad=r2.dA, m=np.zeros((2, 1)), v=np.zeros((2, 1)), t=2, **seed),
             "the walk's A at step 2 (its moments are still zero: bias correction matters)"),
        Case(_adam_case(np.random.default_rng(64), eps=0.01, weight_decay=0.1, t=5), "weight decay 0.1, eps 0.01, step 5"),
    ]


def _adam_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_adam_case(rng, eps=float(rng.choice([1e-3, 1e-2, 0.05])), weight_decay=float(rng.choice([0.05, 0.2, 0.5])),
                            t=int(rng.integers(1, 12)))) for _ in range(5)]


def _adam_variant(kw: dict, bias=True, coupled=False, eps_inside=False, decay=True, t_shift=0):
    p, g, m, v = (np.asarray(kw[k], dtype=np.float64) for k in ("param", "grad", "m", "v"))
    b1, b2 = kw["betas"]
    lr, eps, wd, t = kw["lr"], kw["eps"], kw["weight_decay"] if decay else 0.0, int(kw["t"]) + t_shift
    if coupled:
        g = g + wd * p
    else:
        p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mh, vh = (m / (1 - b1**t), v / (1 - b2**t)) if bias else (m, v)
    den = np.sqrt(vh + eps) if eps_inside else np.sqrt(vh) + eps
    return p - lr * mh / den, m, v


def _adam_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    out = {"param": [], "m": [], "v": []}
    variants = [
        ("no bias correction", dict(bias=False), "no bias correction: divide m by (1 − β₁ᵗ) and v by (1 − β₂ᵗ) before the update. Both start at zero, "
                           "so early on they are biased toward zero, and without the correction the first steps have the wrong size."),
        ("coupled weight decay", dict(coupled=True), "weight decay coupled into the gradient (g + λθ, Adam with L2): AdamW decays the parameter directly, "
                             "θ ← θ(1 − lr·λ), and the moments see the loss gradient only."),
        ("eps inside the root", dict(eps_inside=True), "eps inside the square root (√(v̂ + ε)): AdamW divides by √v̂ + ε."),
        ("no weight decay", dict(decay=False), "the weight decay is missing: θ ← θ(1 − lr·λ) before the Adam update."),
    ]
    if int(kw["t"]) >= 2:
        variants.append(("step t − 1", dict(t_shift=-1), "bias correction with t − 1: t is this step's number (1 at the first step)."))
    for label, opts, msg in variants:
        p, m, v = _adam_variant(kw, **opts)
        for name, val in (("param", p), ("m", m), ("v", v)):
            if not np.allclose(val, adamw_step(**kw)[("param", "m", "v").index(name)], rtol=1e-12, atol=1e-15):
                # the messages quote formula constants (1 − β₁ᵗ), never a case's inputs: hidden cases may show them
                out[name].append(Mistake(label, val, msg + " " + READ_ADAMW, hint=msg + " " + READ_ADAMW))
    return out


# --------------------------------------------------------------------------- p3 cases and mistakes


def _walk_case(rng: np.random.Generator) -> dict:
    d, m, r = int(rng.integers(2, 5)), int(rng.integers(2, 5)), int(rng.integers(1, 4))
    return dict(
        X=rng.standard_normal((1, d)),
        W=rng.standard_normal((d, m)),
        A=rng.standard_normal((d, r)),
        B=rng.standard_normal((r, m)),  # nonzero: a zero B hides a dA computed with the updated B
        s=float(rng.choice([0.5, 2.0, 4.0])),
        target=int(rng.integers(0, m)),
        lr=float(rng.choice([0.1, 0.5])),
    )


def _walk_public() -> list[Case]:
    return [
        Case(walk.worked_example() | dict(lr=0.1), "the lesson's walk, SGD lr 0.1"),
        Case(_walk_case(np.random.default_rng(65)), "nonzero B, s ≠ 1"),
    ]


def _walk_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_walk_case(rng)) for _ in range(5)]


def _walk_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    X, W, A, B = (np.asarray(kw[k], dtype=np.float64) for k in ("X", "W", "A", "B"))
    s, lr = float(kw["s"]), float(kw["lr"])
    D = ce_grad(X @ W + s * (X @ A) @ B, int(kw["target"]))
    dB, dA = s * (X @ A).T @ D, X.T @ (s * D @ B.T)
    B_new, A_new = B - lr * dB, A - lr * dA
    out_A = [
        Mistake("updated B", A - lr * X.T @ (s * D @ B_new.T),
                "you computed ∇A with B already updated: finish the backward pass (∇A = Xᵀ dZ with this step's B), then update both. " + READ_STEPS),
        Mistake("ascent", A + lr * dA, "A moved up the gradient: SGD subtracts, A − lr·∇A (or D's sign is flipped). " + READ_CE),
    ]
    out_B = [
        Mistake("updated A", B - lr * s * (X @ A_new).T @ D,
                "you computed ∇B with A already updated: all gradients use this step's factors; update afterwards. " + READ_STEPS),
        Mistake("ascent", B + lr * dB, "B moved up the gradient: SGD subtracts, B − lr·∇B (or D's sign is flipped). " + READ_CE),
    ]
    if s != 1.0:
        out_A.append(Mistake("missing s", A - lr * X.T @ (D @ B.T), f"∇A is missing the scale: dZ = s D Bᵀ with s = {s:g}. " + READ_STEPS,
                             hint="∇A is missing the scale: dZ = s D Bᵀ. " + READ_STEPS))
        out_B.append(Mistake("missing s", B - lr * (X @ A).T @ D, f"∇B is missing the scale: ∇B = s Zᵀ D with s = {s:g}. " + READ_STEPS,
                             hint="∇B is missing the scale: ∇B = s Zᵀ D. " + READ_STEPS))
    return {"A_new": out_A, "B_new": out_B}


# --------------------------------------------------------------------------- p7 cases and mistakes


def _lsm_public() -> list[Case]:
    rng = np.random.default_rng(67)
    return [
        Case(dict(g=np.array([[1.0, 1.0]]), x=np.array([[0.1, 0.9]])), "x = [0.1, 0.9], g = [1, 1]"),
        Case(dict(g=rng.standard_normal((2, 4)), x=rng.standard_normal((2, 4))), "two rows of four"),
        # softmax(x)[1] underflows to 0: the rule composed from the log and the softmax rule, p ⊙ (g/p − Σ g), is NaN here
        Case(dict(g=np.array([[0.5, -1.0, 2.0]]), x=np.array([[1000.0, 200.0, 1003.0]])),
             "logits hundreds apart: a probability underflows to 0"),
    ]


def _lsm_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for _ in range(4):
        n, m = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        out.append(Case(dict(g=rng.standard_normal((n, m)), x=rng.standard_normal((n, m)) * 2)))
    return out


def _lsm_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    # The messages say what went wrong in the derivation, and which check-yourself case shows it; they quote formula
    # pieces, never a case's inputs (hidden cases may show them).
    g, x = np.asarray(kw["g"], dtype=np.float64), np.asarray(kw["x"], dtype=np.float64)
    p = walk.softmax(x)
    said = [  # (label, value, message): the messages quote constants of the rule, never a case's numbers, so each is its hint
        ("softmax rule", walk.softmax_backward(g, p),
         "that is the softmax rule with g as its upstream, as if g were ∂L/∂p; g is the gradient at log p, so the "
         "chain rule through the log comes first (the softmax's upstream is g / p), then the softmax rule, then "
         "simplify. " + READ_LSM),
        ("no sum", g - p, "the row sum is missing: p multiplies the sum of the row's g, Σ_j g_j, and g − p is right only "
         "when a row of g sums to 1 (g = −onehot sums to −1). " + READ_LSM),
        ("sign", p * g.sum(axis=1, keepdims=True) - g, "the sign is flipped: ∂log_softmax(x)_j/∂x_j = 1 − p_j is "
         "positive, so dx carries +g; g = −onehot(target) must give p − onehot, not onehot − p. " + READ_LSM),
        ("all sum", g - p * g.sum(), "the sum runs over the whole array: sum each row separately (axis=1, keepdims=True). " + READ_LSM),
        ("transposed Jacobian", g - (g * p).sum(axis=1, keepdims=True),
         "you summed g against the Jacobian's other index: with ℓ = log_softmax(x), dx_k = Σ_j g_j ∂ℓ_j/∂x_k, and "
         "∂ℓ_j/∂x_k = δ_jk − p_k (the p of the logit you differentiate by), not δ_jk − p_j. " + READ_LSM),
        ("softmax of g", g - walk.softmax(g) * g.sum(axis=1, keepdims=True),
         "the probabilities in the rule are softmax(x), of the logits, not a softmax of the upstream gradient g. " + READ_LSM),
    ]
    out = [Mistake(label, value, message, hint=message) for label, value, message in said]
    return {"dx": out, "result": out}


# --------------------------------------------------------------------------- predictions (p4, p5)

# P4: the loss scaled by c, so B's first gradient is c·g (|g| ≈ 0.138, printed). AdamW's first step moves an entry by
# lr·|cg|/(|cg| + ε), about lr while |cg| is large next to ε; it falls to lr/10 at |cg| = ε/9, so c = ε/(9|g|). No call
# the lesson shows gives c: the student solves the first-step rule for it (or searches c with their own adamw_step).
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
P4_FRACTION = 10  # the step asked for is lr / P4_FRACTION


def _largest(moves_at_most, lo: float, hi: float) -> float:
    """The largest x in [lo, hi] (geometric bisection) with moves_at_most(x) true, for a monotone condition."""
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if moves_at_most(mid) else (lo, mid)
    return lo


def _p4_first_move(rec, c: float, step=None) -> float:
    """How far B's entries move at the walk's first step (``rec``) when the loss (so ∇B) is c times as large;
    ``step(g)`` is a mistaken first step to use instead of AdamW's."""
    g = c * rec.dB
    if step is None:
        new = walk.adamw_step(rec.B, g, walk.AdamWState.zeros_like(rec.B), LR, BETAS, EPS, 0.0)[0]
        return float(np.abs(new - rec.B).max())
    return float(np.abs(step(g)).max())


def _p4_scale(step=None) -> float:
    rec = _seed_records(1)[0]
    return _largest(lambda c: _p4_first_move(rec, c, step) <= LR / P4_FRACTION * (1 + 1e-12), 1e-30, 1e10)


def _p4_mistakes() -> list[Mistake]:
    return [
        Mistake("|g| left out of the denominator", _p4_scale(lambda g: LR * g / EPS), "you divided by ε alone: the first "
                "step is lr·g/(|g| + ε), and |g| stays in the denominator, so it reaches lr/10 at |g| = ε/9, not ε/10. "
                + READ_ADAMW),
        Mistake("ε under the square root", _p4_scale(lambda g: LR * g / np.sqrt(g * g + EPS)), "you put ε under the "
                "square root, lr·g/√(g² + ε); AdamW adds ε outside it, lr·g/(√v̂ + ε) = lr·g/(|g| + ε) at the first step. "
                + READ_ADAMW),
        Mistake("an SGD step", _p4_scale(lambda g: LR * g), "that is where an SGD step lr·|g| would be lr/10. AdamW's first "
                "step divides by |g| + ε, so it stays near lr until |g| comes down to ε. " + READ_ADAMW),
    ]


# P5: A's gradient is zero at step 1, so its moments are still zero when its first gradient g arrives at step t = 2:
# m = (1 − β₁)g, v = (1 − β₂)g², and the bias corrections divide by 1 − β₁² and 1 − β₂², which no longer cancel:
# |ΔA| = lr·((1 − β₁)/(1 − β₁²)) / √((1 − β₂)/(1 − β₂²)) = lr·√(1 + β₂)/(1 + β₁). The lesson prints it for β₁ = 0.9
# (lr·0.744); the item asks for the β₁ that makes it lr, √(1 + β₂) − 1, which no printed run gives.


def _p5_move(rec, beta1: float, beta2: float = BETAS[1]) -> float:
    """How far A moves at the walk's step 2 (``rec``: A's first nonzero gradient, its moments still zero, t = 2)."""
    new, _ = walk.adamw_step(rec.A, rec.dA, walk.AdamWState(np.zeros_like(rec.A), np.zeros_like(rec.A), 1),
                             LR, (beta1, beta2), EPS, 0.0)
    return float(np.abs(new - rec.A).max())


def _p5_beta1(move=None) -> float:
    """The β₁ in (0, 1) for which A's move at step 2 is lr (the move falls as β₁ grows); ``move(β₁)`` is a mistaken
    formula for the move to use instead of AdamW's."""
    if move is None:
        rec = _seed_records(2)[1]
        return _largest(lambda b1: _p5_move(rec, b1) >= LR, 1e-12, 1 - 1e-12)
    return _largest(lambda b1: move(b1) >= LR, 1e-12, 1 - 1e-12)


def _p5_mistakes() -> list[Mistake]:
    b2 = BETAS[1]
    return [
        Mistake("no bias correction", _p5_beta1(lambda b1: LR * (1 - b1) / math.sqrt(1 - b2)), "that is where the move "
                "would be lr without bias correction, lr·(1 − β₁)/√(1 − β₂). At t = 2 the corrections divide m by 1 − β₁² "
                "and v by 1 − β₂², and with m = (1 − β₁)g and v = (1 − β₂)g² they leave lr·√(1 + β₂)/(1 + β₁). "
                + READ_ADAMW),
        Mistake("v's correction not square-rooted", _p5_beta1(lambda b1: LR * ((1 - b1) / (1 - b1**2)) * (1 - b2**2) / (1 - b2)),
                "you left the square root off v's correction: the step divides by √v̂, so the corrections leave "
                "lr·√(1 + β₂)/(1 + β₁), not lr·(1 + β₂)/(1 + β₁). " + READ_ADAMW),
    ]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 7

ITEMS = {
    "w1": Choice(
        "D for softmax cross-entropy, one row",
        0,
        key="c",
        explain={
            "a": "p alone ignores which class is right; the gradient must push the target's logit up. Reread 'Softmax, cross-entropy and D' in Know this.",
            "b": "That is −D: with it, gradient descent would push the target's probability down. Reread 'Softmax, cross-entropy and D' in Know this.",
            "c": "L = −log p[target] sends g = ∂L/∂p = −onehot(target) / p to the softmax, and the softmax rule p ⊙ (g − Σ_j g_j p_j), whose row sum is −1 here, turns it into dY = p − onehot. Each wrong logit gets +p_j and the target gets p[target] − 1 < 0, so a descent step lowers the wrong logits and raises the target; in the toy D ≈ [0.460085, −0.460085]. (Lesson 06, 'Softmax, cross-entropy and D'.)",
            "d": "−log p is the loss itself, not its gradient with respect to the logits. Reread 'Softmax, cross-entropy and D' in Know this.",
        },
    ),
    "w2": Numeric(
        "the cross-entropy loss for target class 1 with logits Y = [1.19, 1.35]",
        0,
        name="loss",
        expected=lambda: _seed_records(1)[0].loss,
        rtol=0,
        atol=5e-6,
        mistakes=lambda: [
            Mistake("wrong class", -math.log(0.460085), "that is −log p[0]; the target is class 1 (0-based), p[1] = 0.539915."),
            Mistake("no minus", math.log(0.539915), "the loss is −log p[target]: a loss of a probability below one is positive."),
            Mistake("log10", -math.log10(0.539915), "that is log base 10; cross-entropy uses the natural log (np.log)."),
            Mistake("1-p", 1 - 0.539915, "1 − p is not the cross-entropy; take −log p[target]."),
            Mistake("no softmax", -math.log(1.35), "that is −log of the logit Y[1] itself; turn the logits into "
                    "probabilities first, p = softmax(Y) = exp(Y) / Σ exp(Y) = [0.460085, 0.539915], then take −log p[1]."),
        ],
    ),
    "w3": Choice(
        "which tensors are the optimizer's parameters in the walk",
        0,
        key="a",
        explain={
            "a": "The optimizer updates only the trainable parameters, A and B, as in torch.optim.AdamW([A, B], ...); W is frozen and gets no gradient. X does get ∇X = DWᵀ + dZAᵀ, but only to pass the signal on to earlier layers: it is the layer's input, not something this layer learns. (Lesson 06, 'The eight steps, once by hand'.)",
            "b": "W is frozen: it passes gradient to X (D Wᵀ) but is never in the optimizer. Reread 'The toy: one projection as a classifier' in Know this.",
            "c": "X gets a gradient so that earlier layers could learn, but X is an input, not a parameter of this layer. Reread 'The toy: one projection as a classifier' in Know this.",
            "d": "A is in the optimizer from the start; at step one its gradient happens to be zero, so AdamW leaves it where it is. Reread 'Why ∇A is zero at step one' in Know this.",
        },
    ),
    "p1": Function(
        "implement ce_grad",
        3,
        name="ce_grad",
        reference=ce_grad,
        public=_ce_public,
        hidden=_ce_hidden,
        outputs=("D",),
        mistakes=_ce_mistakes,
        rtol=1e-9,
        atol=1e-12,
    ),
    "p2": Function(
        "implement adamw_step",
        4,
        name="adamw_step",
        reference=adamw_step,
        public=_adam_public,
        hidden=_adam_hidden,
        outputs=("param", "m", "v"),
        mistakes=_adam_mistakes,
        rtol=1e-9,
        atol=1e-12,
    ),
    "p3": Function(
        "implement sgd_walk_step",
        3,
        name="sgd_walk_step",
        reference=sgd_walk_step,
        public=_walk_public,
        hidden=_walk_hidden,
        outputs=("A_new", "B_new"),
        mistakes=_walk_mistakes,
        rtol=1e-9,
        atol=1e-12,
    ),
    "p4": Numeric(
        "the largest loss scale c at which AdamW's first step moves B by at most lr/10",
        1,
        name="c",
        reread=READ_ADAMW,
        expected=_p4_scale,
        rtol=1e-3,  # the prompt asks for 3 significant digits
        mistakes=_p4_mistakes,
    ),
    "p5": Numeric(
        "the β₁ for which A's first nonzero step (t = 2, moments zero) moves it by exactly lr",
        2,
        name="beta1",
        reread=READ_ADAMW,
        expected=_p5_beta1,
        rtol=1e-3,  # the prompt asks for 3 significant digits
        mistakes=_p5_mistakes,
    ),
    "p6": Choice(
        "Adam with L2 (coupled decay) on an entry whose loss gradient is zero",
        1,
    ),
    "p7": Function(
        "implement log_softmax_backward",
        2,
        name="log_softmax_backward",
        reference=log_softmax_backward,
        public=_lsm_public,
        hidden=_lsm_hidden,
        outputs=("dx",),
        mistakes=_lsm_mistakes,
        rtol=1e-9,
        atol=1e-12,
    ),
}
