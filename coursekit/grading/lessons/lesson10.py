"""Graded items of lesson 10, "A whole block"."""

from __future__ import annotations

import numpy as np

from ... import attention, block, lora, mlp
from ..checkers import Case, Mistake
from .. import Choice, Function, Numeric

READ_BACK = "Reread 'Backward through the block' in Know this."
READ_COUNT = "Reread 'Counting adapters and parameters' in Know this."
READ_DETACH = "Reread 'Frozen is not detached, block edition' in Know this."

# SmolLM2-135M's projection shapes in PEFT's module names. The notebook reads them from the loaded
# model's config and asserts they equal these; tests/test_lesson10_items.py checks them against the
# prepared checkpoint's config.json when it exists.
SMOLLM2_CONFIG = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, num_hidden_layers=30)
SMOLLM2_SHAPES = {block.HF_NAMES[p]: sh for p, sh in block.projection_shapes(SMOLLM2_CONFIG).items()}
SMOLLM2_LAYERS = SMOLLM2_CONFIG["num_hidden_layers"]


# --------------------------------------------------------------------------- P1: dx at the block input, from dh


def _attention_half(dh, cache, o_transposed=True, norm=True, residual=True):
    """dx from the gradient dh at h = x + o, back through o_proj, attention, q/k/v and the first RMSNorm. The flags
    build the wrong variants P1 names: ``o_transposed=False`` multiplies by W_o instead of W_oᵀ, ``norm=False`` skips RMSNorm's backward,
    ``residual=False`` drops the residual share dh."""

    def proj_dX(p, D, transposed=True):
        pc = cache["proj"][p]
        W = pc["W"].T if transposed else pc["W"]
        dX = D @ W
        if "A" in pc:
            dX = dX + (pc["s"] * D @ pc["B"].T) @ pc["A"].T
        return dX

    dmh = proj_dX("o", dh, o_transposed)
    dQ, dK, dV = attention.attention_backward(attention.split_heads(dmh, cache["n_heads"]), cache["attn"])
    du1 = sum(proj_dX(p, attention.merge_heads(dT)) for p, dT in (("q", dQ), ("k", dK), ("v", dV)))
    branch = block.rmsnorm_backward(du1, cache["norm1"])[0] if norm else du1
    return dh + branch if residual else branch


def block_input_grad(dh, cache):
    """Reference for P1: ``dx = dh + RMSNorm-backward(du1)``, du1 summed over q, k and v, each fed from
    ``dh W_oᵀ`` (+ the o adapter's path) through attention's backward. Equals ``block_backward``'s ``"x"``."""
    dmh = block.projection_backward("o", dh, cache)[0]
    dQ, dK, dV = attention.attention_backward(attention.split_heads(dmh, cache["n_heads"]), cache["attn"])
    du1 = sum(block.projection_backward(p, attention.merge_heads(dT), cache)[0] for p, dT in (("q", dQ), ("k", dK), ("v", dV)))
    return dh + block.rmsnorm_backward(du1, cache["norm1"])[0]


def _p1_case(rng: np.random.Generator, targets, T: int, d: int, n_heads: int, f: int, r: int, s: float) -> dict:
    w, ad = block.init_block(rng, d=d, n_heads=n_heads, f=f, targets=targets, r=r)
    _, cache = block.block_forward(rng.standard_normal((T, d)), w, ad, s=s, n_heads=n_heads)
    return dict(dh=rng.standard_normal((T, d)), cache=cache)


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(101)
    return [
        Case(_p1_case(rng, ("q", "v"), T=4, d=8, n_heads=2, f=12, r=2, s=2.0), "Q/V adapters, o_proj frozen"),
        Case(_p1_case(rng, (), T=3, d=6, n_heads=3, f=8, r=1, s=1.0), "no adapter at all, every weight frozen"),
        Case(_p1_case(rng, block.PROJECTIONS, T=5, d=8, n_heads=4, f=10, r=3, s=0.5), "all seven adapted"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for _ in range(3):
        n_heads = int(rng.integers(1, 4))
        d = n_heads * int(rng.integers(2, 5))
        # some of q, k, v adapted, o never: its frozen W_o alone carries dh to the heads
        targets = [p for p in ("q", "k", "v") if rng.random() < 0.5] or ["v"]
        cases.append(Case(_p1_case(rng, targets + [p for p in ("gate", "up", "down") if rng.random() < 0.5],
                                   T=int(rng.integers(2, 7)), d=d, n_heads=n_heads, f=int(rng.integers(4, 17)),
                                   r=int(rng.integers(1, 4)), s=float(rng.choice([0.5, 2.0, 4.0])))))
    return cases


def _p1_mistakes(kw: dict, got: dict) -> dict:
    dh, cache = kw["dh"], kw["cache"]
    # the messages name tensors (u1, norm1), no number of the case: each is its own hint on a hidden case
    attention_left_out = ("you returned dh, the residual share alone, as if the frozen projections passed nothing back. A frozen "
                          "weight stays in the graph: o_proj passes dh W_oᵀ back to the heads, and q, k and v pass their "
                          "gradients on to u1 and through RMSNorm to x, where they add to dh. " + READ_BACK)
    residual_left_out = ("you returned the attention branch alone; h = x + o also passes dh straight to x: "
                         "dx = dh + RMSNorm-backward(du1). " + READ_BACK)
    norm_skipped = ("you added du1, the gradient at u1, without passing it back through RMSNorm (block.rmsnorm_backward "
                    "with cache['norm1']). " + READ_BACK)
    return {"dx": [
        Mistake("no attention branch", dh, attention_left_out, hint=attention_left_out),
        Mistake("no residual", _attention_half(dh, cache, residual=False), residual_left_out, hint=residual_left_out),
        Mistake("skipped RMSNorm", _attention_half(dh, cache, norm=False), norm_skipped, hint=norm_skipped),
        Mistake("W_o not transposed", _attention_half(dh, cache, o_transposed=False), "o = mh W_o sends dh W_oᵀ back to "
                "mh, not dh W_o (W_o is square here, so both run). " + READ_BACK),
    ]}


# --------------------------------------------------------------------------- P2: LoRA parameters of one block


def lora_param_count(shapes, targets, r):
    """Reference for P2: ``Σ_{t in targets} r (d_in + d_out)`` over one block."""
    return sum(lora.param_count(int(shapes[t][0]), int(shapes[t][1]), int(r)) for t in targets)


def _p2_public() -> list[Case]:
    return [
        Case(dict(shapes=dict(SMOLLM2_SHAPES), targets=["q_proj", "v_proj"], r=8), "SmolLM2's shapes, Q/V, r = 8"),
        Case(dict(shapes={"q_proj": (4096, 4096)}, targets=["q_proj"], r=16), "lesson 02's 4096 × 4096 at r = 16"),
        Case(dict(shapes=dict(SMOLLM2_SHAPES), targets=["gate_proj", "down_proj"], r=4), "gate and down, r = 4"),
    ]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for _ in range(4):
        d, f, kv = (int(v) for v in rng.integers(8, 300, size=3))
        shapes = {"q_proj": (d, d), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (d, d),
                  "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}
        k = int(rng.integers(1, 7))  # never all seven, so "summed every shape" differs from the answer
        targets = [str(t) for t in rng.choice(sorted(shapes), size=k, replace=False)]
        cases.append(Case(dict(shapes=shapes, targets=targets, r=int(rng.choice([2, 4, 8, 16, 32])))))
    return cases


def _p2_mistakes(kw: dict, got: dict) -> dict:
    shapes, targets, r = kw["shapes"], kw["targets"], kw["r"]
    sel = [shapes[t] for t in targets]
    return {"result": [
        Mistake("dense", sum(d * m for d, m in sel), "that is the size of the dense weights d·m; an adapter has r(d + m) entries (A is d × r, B is r × m). " + READ_COUNT),
        Mistake("square", sum(2 * r * d for d, _ in sel), "you used 2·r·d_in, as if every projection were square: k_proj, v_proj (GQA) and the MLP are not. Use each module's own d_in and d_out. " + READ_COUNT,
                hint="you used 2·r·d_in, as if every projection were square: k_proj, v_proj (GQA) and the MLP are not. Use each module's own d_in and d_out. " + READ_COUNT),
        Mistake("all shapes", sum(r * (d + m) for d, m in shapes.values()), "you summed over every module in shapes; count only the target modules. " + READ_COUNT),
        Mistake("twice", 2 * sum(r * (d + m) for d, m in sel), "r(d + m) already counts both factors (r·d for A, r·m for B); don't double it. " + READ_COUNT),
        Mistake("r²", sum(r * (d + m) + r * r for d, m in sel), "there is no r × r matrix in LoRA: A is d × r and B is r × m. " + READ_COUNT),
    ]}


# --------------------------------------------------------------------------- W2: a fork, by hand

#: W2's one-number MLP fork (lesson 09): u feeds G = u W_gate and U = u W_up, both frozen; backward has reached G and U.
W2_CASE = dict(w_gate=3.0, w_up=0.5, dG=2.0, dU=-1.0)


def _w2_expected() -> float:
    c = W2_CASE
    return c["dG"] * c["w_gate"] + c["dU"] * c["w_up"]


def _w2_mistakes() -> list[Mistake]:
    c = W2_CASE
    return [
        Mistake("gate only", c["dG"] * c["w_gate"], "that is the gate's share alone; u also feeds up_proj, and where one tensor "
                "feeds two projections their input gradients add: du = dG W_gateᵀ + dU W_upᵀ. " + READ_BACK),
        Mistake("up only", c["dU"] * c["w_up"], "that is the up projection's share alone; u also feeds gate_proj, and the two "
                "shares add: du = dG W_gateᵀ + dU W_upᵀ. " + READ_BACK),
        Mistake("weights left out", c["dG"] + c["dU"], "you added the output gradients without passing each back through its "
                "projection: each share is D Wᵀ, here dG · W_gate and dU · W_up. " + READ_BACK),
        Mistake("frozen passes nothing", 0.0, "frozen weights get no gradient of their own, but they stay in the graph and pass "
                "D Wᵀ back to their input (lesson 05). " + READ_BACK),
        Mistake("averaged", _w2_expected() / 2, "the two shares add; they are not averaged. " + READ_BACK),
    ]


# --------------------------------------------------------------------------- P3: a one-number block with a detached down_proj

#: P3's block with one number per tensor (T = 1, d = 1, the RMSNorms left out, the gated MLP replaced by the frozen linear
#: stand-in w_d · (w_u · h)): h = x + w_o · (w_v + s·a·b) · x, y = h + w_d · w_u · h, every base weight frozen, dy = 1,
#: and the down projection's output computed under no_grad (detached).
P3_CASE = dict(w_v=0.5, s=2.0, a=0.5, b=0.25, w_o=2.0, w_u=3.0, w_d=0.25, dy=1.0)


def scalar_block_dx(w_v, s, a, b, w_o, w_u, w_d, dy, detach_down=True, adapter=True, scale=True, attention=True):
    """∂L/∂x of P3's one-number block by the lesson's rules: the residual y = h + dn hands dy to h, and the MLP branch adds
    its share w_u w_d dy unless the down projection is detached; h = x + o hands dh to x, and the attention branch adds
    w_o (w_v + s a b) dh (single position: attention passes v through). The flags build the wrong variants P3 names."""
    dh = dy + (0.0 if detach_down else w_u * w_d * dy)
    w_eff = w_v + ((s if scale else 1.0) * a * b if adapter else 0.0)
    return dh + (w_o * w_eff * dh if attention else 0.0)


def _p3_expected() -> float:
    return float(scalar_block_dx(**P3_CASE))


def _p3_mistakes() -> list[Mistake]:
    c = P3_CASE
    return [
        Mistake("detach ignored", scalar_block_dx(**c, detach_down=False), "that is the block without the cut: a detached "
                "down_proj output is a constant, so the MLP branch adds nothing to dh, and dh = dy. " + READ_DETACH),
        Mistake("frozen passes nothing", scalar_block_dx(**c, attention=False), "that is the residual share alone. The cut is "
                "in the MLP branch; the attention branch is untouched, and its frozen o_proj and v_proj still pass the gradient "
                "back to x (frozen is not detached). " + READ_DETACH),
        Mistake("everything cut", 0.0, "the residual adds pass the gradient around both branches: even with every branch cut, "
                "dx would still be dy. " + READ_DETACH),
        Mistake("adapter left out", scalar_block_dx(**c, adapter=False), "v_proj carries an adapter, so its input gradient "
                "has two paths: the base path w_v and the adapter's s·a·b. " + READ_BACK),
        Mistake("missing s", scalar_block_dx(**c, scale=False), "the adapter's path is scaled: v = (w_v + s·a·b)·x, with "
                "s = 2. " + READ_BACK),
    ]


# --------------------------------------------------------------------------- P5: the o adapter's gradients inside the block


def o_adapter_grads(dy, cache):
    """Reference for P5: ``(dA_o, dB_o)`` from :func:`coursekit.block.block_backward`."""
    g = block.block_backward(dy, cache)
    return g["A_o"], g["B_o"]


def _p5_case(rng: np.random.Generator, targets, T: int, d: int, n_heads: int, f: int, r: int, s: float) -> dict:
    w, ad = block.init_block(rng, d=d, n_heads=n_heads, f=f, targets=targets, r=r)
    x = rng.standard_normal((T, d))
    _, cache = block.block_forward(x, w, ad, s=s, n_heads=n_heads)
    return dict(dy=rng.standard_normal((T, d)), cache=cache)


def _p5_public() -> list[Case]:
    rng = np.random.default_rng(10)
    return [
        Case(_p5_case(rng, ("o",), T=4, d=8, n_heads=2, f=12, r=2, s=2.0), "only o adapted, s = 2"),
        Case(_p5_case(rng, ("q", "v", "o"), T=5, d=6, n_heads=3, f=10, r=1, s=0.5), "q, v and o adapted, rank 1"),
        Case(_p5_case(rng, block.PROJECTIONS, T=3, d=8, n_heads=4, f=16, r=3, s=4.0), "all seven adapted"),
    ]


def _p5_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for _ in range(3):
        n_heads = int(rng.integers(1, 4))
        d = n_heads * int(rng.integers(2, 5))
        others = [p for p in block.PROJECTIONS if p != "o" and rng.random() < 0.5]
        cases.append(Case(_p5_case(rng, ["o"] + others, T=int(rng.integers(2, 7)), d=d, n_heads=n_heads,
                                   f=int(rng.integers(4, 17)), r=int(rng.integers(1, 4)), s=float(rng.choice([0.5, 2.0, 4.0])))))
    return cases


def _p5_mistakes(kw: dict, got: dict) -> dict:
    dy, cache = kw["dy"], kw["cache"]
    dh = dy + block.rmsnorm_backward(_du2(dy, cache), cache["norm2"])[0]
    s = cache["s"]
    out = {"dA_o": [], "dB_o": []}

    def add(D, label, msg, scale=1.0, hint=""):
        """Both factor gradients computed from the wrong dh ``D``; ``hint`` (if the message quotes the case's s) says the
        same without it."""
        _, dA, dB = block.projection_backward("o", D, cache)
        out["dA_o"].append(Mistake(label, scale * dA, msg, hint))
        out["dB_o"].append(Mistake(label, scale * dB, msg, hint))

    add(dy, "residual only", "you used dy as the gradient at the o projection's output, the residual path alone. "
        "h = x + o feeds the MLP branch too, so dh = dy + (the MLP branch's gradient through RMSNorm). " + READ_BACK)
    add(dh - dy, "MLP only", "you used only the MLP branch's gradient at h; the residual add y = h + MLP(h) also passes dy "
        "straight to h: dh = dy + the MLP branch. " + READ_BACK)
    add(dh, "missing s", f"the scale s = {s:g} is missing: dB_o = s (mh A_o)ᵀ dh and dA_o = mhᵀ (s dh B_oᵀ). " + READ_BACK, 1.0 / s,
        hint="the scale s is missing: dB_o = s (mh A_o)ᵀ dh and dA_o = mhᵀ (s dh B_oᵀ). " + READ_BACK)
    skipped = ("you stopped at the RMSNorm input's gradient du2 without passing it back through RMSNorm (and without "
               "adding the residual dy). " + READ_BACK)
    add(_du2(dy, cache), "skipped RMSNorm", skipped, hint=skipped)  # "du2" is a name, not a number of the case
    return out


def _du2(dy, cache):
    dH = block.projection_backward("down", dy, cache)[0]
    dG, dU = mlp.swiglu_backward(dH, cache["swiglu"])
    return block.projection_backward("gate", dG, cache)[0] + block.projection_backward("up", dU, cache)[0]


# --------------------------------------------------------------------------- items

# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 11

ITEMS = {
    "w1": Choice(
        "the input of the o_proj adapter",
        0,
        key="c",
        explain={
            "a": "x is the block's input; it reaches o_proj only through RMSNorm, q/k/v and attention. Every adapter consumes its own projection's input. Reread 'The block, projection by projection' in Know this.",
            "b": "u1 = RMSNorm(x) is what q, k and v (and their adapters) see; o_proj sees the attention output. Reread 'The block, projection by projection' in Know this.",
            "c": "Every adapter consumes its own projection's input, and o_proj computes o = mh W_o, where mh = merge_heads(C) joins the contexts C = P V of all heads back into one T × d matrix; so the o_proj adapter computes mh W_o + s (mh A) B, with as many rows in A as mh has columns. (Lesson 10, 'The block, projection by projection'.)",
            "d": "P is T × T per head and has no projection weight; the context P V of every head, merged, is o_proj's input. Reread 'The block, projection by projection' in Know this.",
        },
    ),
    "w2": Numeric(
        "the gradient at a tensor that feeds two frozen projections",
        0,
        name="∂L/∂u",
        expected=_w2_expected,
        rtol=1e-9,
        mistakes=_w2_mistakes,
    ),
    "w3": Choice(
        "a frozen o_proj between the loss and the q/v adapters",
        0,
        key="a",
        explain={
            "a": "requires_grad=False only stops autograd from forming ∇W_o; the product o = mh W_o stays in the graph, so the gradient dh arriving at o's output goes back as dh W_oᵀ, is split into heads, and attention's backward hands dQ to q's adapter and dV to v's. Only a detach (or torch.no_grad()) on o_proj would cut that road. (Lesson 10, 'Frozen is not detached, block edition'.)",
            "b": "Freezing only stops W_o from being updated (no ∇W_o is formed); the product mh W_o stays in the graph, so dh W_oᵀ reaches the attention heads. Reread 'Frozen is not detached, block edition' in Know this.",
            "c": "The residual h = x + o bypasses attention entirely: q and v sit inside the attention branch, and they are fed through o_proj, frozen or not. Reread 'Frozen is not detached, block edition' in Know this.",
            "d": "q and v are on the same side of o_proj; both get gradient through it (q via the scores, v via the weighted sum). Reread 'Frozen is not detached, block edition' in Know this.",
        },
    ),
    "p1": Function(
        "dx at the block input, from the gradient at h",
        2,
        name="block_input_grad",
        reference=block_input_grad,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("dx",),
        mistakes=_p1_mistakes,
        rtol=1e-7,
        atol=1e-10,
        # the per-projection backward is what the item asks for; attention's and RMSNorm's kernels stay available
        withheld=("coursekit.block:block_backward", "coursekit.block:projection_backward", "coursekit.lora:lora_backward"),
    ),
    "p2": Function(
        "LoRA parameters of one block",
        3,
        name="lora_param_count",
        reference=lora_param_count,
        public=_p2_public,
        hidden=_p2_hidden,
        mistakes=_p2_mistakes,
        rtol=0,
        atol=0,
    ),
    "p3": Numeric(
        "∂L/∂x of a one-number block whose down_proj is detached",
        2,
        name="∂L/∂x",
        expected=_p3_expected,
        rtol=1e-9,
        mistakes=_p3_mistakes,
    ),
    "p4": Choice(
        "a blanket detach of a frozen o_proj",
        2,
    ),
    "p5": Function(
        "the o adapter's gradients inside the block",
        4,
        name="o_adapter_grads",
        reference=o_adapter_grads,
        public=_p5_public,
        hidden=_p5_hidden,
        outputs=("dA_o", "dB_o"),
        mistakes=_p5_mistakes,
        rtol=1e-7,
        atol=1e-10,
    ),
    "p6": Choice(
        "what computing the first RMSNorm under no_grad changes",
        2,
        options="abcde",
        multi=True,
    ),
}
