"""Graded items of lesson 10, "A whole block"."""

from __future__ import annotations

import numpy as np

from ... import attention, block, mlp
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


# --------------------------------------------------------------------------- P2: the v adapter's gradients, from dh


def v_adapter_grads(dh, cache):
    """Reference for P2: ``(dA_v, dB_v)`` for the gradient dh at h = x + o: dh goes back through o_proj (base path
    and, when o is adapted, its adapter's path) into the heads, attention's backward hands dV to v, and v's adapter
    (input u1 = RMSNorm(x)) takes ∇B = s (u1 A_v)ᵀ dV and ∇A = u1ᵀ (s dV B_vᵀ). Equals ``block_backward``'s A_v, B_v."""
    return _v_grads(dh, cache)


def _v_grads(dh, cache, o_base=True, o_adapter=True, through_o=True, head="v", v_input="u1", scale=True):
    """The v adapter's factor gradients from dh by the lesson's rules; the flags build the wrong variants P2 names:
    ``o_base=False`` drops o's frozen path dh W_oᵀ (frozen taken for detached), ``o_adapter=False`` drops o's adapter
    path, ``through_o=False`` feeds dh to the heads as if o were not there, ``head`` picks the head gradient handed to v,
    ``v_input="x"`` uses the block input x instead of u1, ``scale=False`` leaves s out of v's factor gradients."""
    if through_o:
        pc = cache["proj"]["o"]
        dmh = dh @ pc["W"].T if o_base else np.zeros_like(pc["X"])
        if "A" in pc and o_adapter:
            dmh = dmh + (pc["s"] * dh @ pc["B"].T) @ pc["A"].T
    else:
        dmh = dh
    dQ, dK, dV = attention.attention_backward(attention.split_heads(dmh, cache["n_heads"]), cache["attn"])
    D = attention.merge_heads({"q": dQ, "k": dK, "v": dV}[head])
    pv = cache["proj"]["v"]
    X = pv["X"] if v_input == "u1" else cache["x"]
    s = pv["s"] if scale else 1.0
    return X.T @ (s * D @ pv["B"].T), s * (X @ pv["A"]).T @ D


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(102)
    return [
        Case(_p1_case(rng, ("q", "v"), T=4, d=8, n_heads=2, f=12, r=2, s=2.0), "Q/V adapters, o_proj frozen"),
        Case(_p1_case(rng, ("v", "o"), T=5, d=6, n_heads=3, f=10, r=1, s=0.5), "v and o adapted: o's adapter is a second road"),
        Case(_p1_case(rng, block.PROJECTIONS, T=3, d=8, n_heads=4, f=16, r=3, s=4.0), "all seven adapted"),
    ]


def _random_block_cases(rng: np.random.Generator, must: str, make) -> list[Case]:
    """Three random blocks with ``must`` adapted and each other projection with probability ½, built by ``make``
    (``_p1_case`` or ``_p5_case``): P2's and P5's hidden cases."""
    cases = []
    for _ in range(3):
        n_heads = int(rng.integers(1, 4))
        d = n_heads * int(rng.integers(2, 5))
        others = [p for p in block.PROJECTIONS if p != must and rng.random() < 0.5]
        cases.append(Case(make(rng, [must] + others, T=int(rng.integers(2, 7)), d=d, n_heads=n_heads,
                               f=int(rng.integers(4, 17)), r=int(rng.integers(1, 4)), s=float(rng.choice([0.5, 2.0, 4.0])))))
    return cases


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    return _random_block_cases(rng, "v", _p1_case)


def _p2_mistakes(kw: dict, got: dict) -> dict:
    dh, cache = kw["dh"], kw["cache"]
    out = {"dA_v": [], "dB_v": []}

    def add(label, msg, **flags):
        dA, dB = _v_grads(dh, cache, **flags)
        out["dA_v"].append(Mistake(label, dA, msg, msg))   # no message quotes a number of the case: each is its own hint
        out["dB_v"].append(Mistake(label, dB, msg, msg))

    add("frozen o passes nothing", "you let only o's adapter (if any) pass dh back to the heads, as if the frozen W_o were "
        "detached. Frozen is not detached: o_proj passes dh W_oᵀ back to the heads, plus its adapter's path when o is "
        "adapted. " + READ_DETACH, o_base=False)
    add("o adapter path left out", "o_proj's adapter is a second road from dh to the heads: the gradient at mh is "
        "dh W_oᵀ + (s dh B_oᵀ) A_oᵀ when o is adapted, not dh W_oᵀ alone. " + READ_BACK, o_adapter=False)
    add("o_proj skipped", "you split dh into heads directly; the heads' output mh reaches h only through o = mh W_o, so "
        "the gradient at mh is dh W_oᵀ (+ o's adapter path). " + READ_BACK, through_o=False)
    add("dQ for v", "you fed v's adapter the queries' gradient dQ; each adapter takes the upstream gradient of its own "
        "projection's output, and v's is dV from attention's backward. " + READ_BACK, head="q")
    add("dK for v", "you fed v's adapter the keys' gradient dK; each adapter takes the upstream gradient of its own "
        "projection's output, and v's is dV from attention's backward. " + READ_BACK, head="k")
    add("input x", "you used the block input x as the adapter's input; v_proj reads u1 = RMSNorm(x), "
        "cache['proj']['v']['X']. " + READ_BACK, v_input="x")
    add("missing s", "the scale s is missing: dB_v = s (u1 A_v)ᵀ dV and dA_v = u1ᵀ (s dV B_vᵀ). " + READ_BACK, scale=False)
    return out


# --------------------------------------------------------------------------- W2: factor matrices PEFT creates

#: W2's configuration: SmolLM2-135M's layers, adapters on the four attention projections.
W2_TARGETS = ("q", "k", "v", "o")


def _w2_expected() -> float:
    return float(block.factor_count(W2_TARGETS, SMOLLM2_LAYERS))


def _w2_mistakes() -> list[Mistake]:
    n, L = len(W2_TARGETS), SMOLLM2_LAYERS
    return [
        Mistake("adapters", float(block.adapter_count(W2_TARGETS, L)), "that is the number of adapters, one per adapted "
                "projection in each layer; each adapter owns two factor matrices, lora_A and lora_B. " + READ_COUNT),
        Mistake("one layer", float(2 * n), "that is one layer's count; each of the model's layers gets its own adapters. "
                + READ_COUNT),
        Mistake("one layer's adapters", float(n), "that is the number of adapters in one layer; each of the model's layers "
                "gets its own, and each adapter owns two factor matrices. " + READ_COUNT),
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
    return _random_block_cases(rng, "o", _p5_case)


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
        "factor matrices PEFT creates for q, k, v and o adapters on SmolLM2-135M",
        0,
        name="factor matrices",
        expected=_w2_expected,
        rtol=0,
        mistakes=_w2_mistakes,
    ),
    "w3": Choice(
        'the modules target_modules="all-linear" adapts on SmolLM2-135M',
        0,
        key="a",
        explain={
            "a": "PEFT's all-linear selects every nn.Linear except the output layer: in each of the 30 layers q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj. lm_head is left out (on SmolLM2 it is tied to the embedding anyway), and the embedding and the RMSNorm gains are not nn.Linear modules, so they get none. (Lesson 10, 'The real model'.)",
            "b": "all-linear leaves the output layer out on purpose: lm_head is the one nn.Linear it skips (on SmolLM2 it is tied to the embedding anyway). Reread 'The real model' in Know this.",
            "c": "all-linear selects nn.Linear layers only (and Conv1D): the embedding is an nn.Embedding and the RMSNorm gains are vectors, so all-linear gives neither an adapter (PEFT can wrap an embedding, but only if you name it in target_modules), and it also skips lm_head, the output layer. Reread 'The real model' in Know this.",
            "d": "That is the Q/V configuration, which you name explicitly with target_modules=[\"q_proj\", \"v_proj\"]; all-linear takes every nn.Linear but the output layer, all seven projections of every layer. Reread 'The real model' in Know this.",
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
        "the v adapter's gradients, from the gradient at h",
        3,
        name="v_adapter_grads",
        reference=v_adapter_grads,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("dA_v", "dB_v"),
        mistakes=_p2_mistakes,
        rtol=1e-7,
        atol=1e-10,
        # as in P1: the per-projection backward is what the item asks for; attention's and RMSNorm's kernels stay available
        withheld=("coursekit.block:block_backward", "coursekit.block:projection_backward", "coursekit.lora:lora_backward"),
    ),
    "p3": Numeric(
        "∂L/∂x of a one-number block whose down_proj is detached",
        2,
        name="∂L/∂x",
        reread=READ_DETACH,
        expected=_p3_expected,
        rtol=1e-9,
        mistakes=_p3_mistakes,
    ),
    "p4": Choice(
        "a blanket detach of a frozen k_proj",
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
        "what handing down_proj a detached hidden product H changes",
        2,
        options="abcde",
        multi=True,
    ),
}
