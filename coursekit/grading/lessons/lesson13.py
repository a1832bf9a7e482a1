"""Graded items of lesson 13, "Merging"."""

from __future__ import annotations

import numpy as np
import torch

from ... import lora, merging
from ..checkers import Case, Mistake, worded
from .. import Choice, Function, Numeric

READ_LAYOUT = "(Lesson 13, 'The merge in PEFT's layout'.)"
READ_PRECISION = "(Lesson 13, 'Merging in low precision'.)"
READ_LOW_PRECISION = "Reread 'Merging in low precision' in Know this."


# --------------------------------------------------------------------------- references


def _delta(lora_A, lora_B, lora_alpha, r):
    """ΔW = (lora_alpha / r) · lora_B @ lora_A in float32, as PEFT's get_delta_weight computes it for a float32 adapter."""
    return lora.scaling(lora_alpha, r) * (torch.as_tensor(lora_B).float() @ torch.as_tensor(lora_A).float())


def merge_unmerge(weight, lora_A, lora_B, lora_alpha, r):
    """Reference for p1: the bf16 weight a PEFT LoRA layer holds after merge() then unmerge() (peft 0.21,
    LoraLayer.merge without safe_merge, then unmerge). merge() adds the float32 ΔW in place, ``weight.data += ΔW``:
    torch computes the sum in float32 and stores it in bf16 (rounded once); unmerge() casts ΔW to bf16 and subtracts
    it in bf16 (rounded again). tests/test_lesson13_items.py runs PEFT itself on every case."""
    w = torch.as_tensor(weight)
    dW = _delta(lora_A, lora_B, lora_alpha, r)
    merged = (w.float() + dW).to(w.dtype)
    return (merged - dW.to(w.dtype)).double()          # bf16 values, in float64 (NumPy, which compares, has no bf16)


def unmerge(weight_merged, lora_A, lora_B, lora_alpha, r, fan_in_fan_out):
    """Reference for p2: the base weight from a merged one, in the layer's own layout. nn.Linear stores weight m × d
    (out × in) and ΔW = s · lora_B @ lora_A; transformers' Conv1D (GPT-2) stores it d × m, PEFT is told with
    ``fan_in_fan_out=True`` and transposes the update: ΔW = s · (lora_B @ lora_A)ᵀ (get_delta_weight)."""
    delta = lora.scaling(lora_alpha, r) * (np.asarray(lora_B) @ np.asarray(lora_A))
    return np.asarray(weight_merged) - (delta.T if fan_in_fan_out else delta)


# --------------------------------------------------------------------------- cases

# P1's adapters are drawn on a coarse grid (lora_A in quarters, lora_B in multiples of 2⁻¹⁰, r = 2 or 4, s a power of
# two), so that ΔW itself is a bf16 number: whether it is rounded to bf16 before the merge's addition or not, the merge
# rounds once, and only the rounding the question is about decides the answer.


def _p1_case(rng: np.random.Generator) -> dict:
    while True:
        d, m = int(rng.integers(3, 7)), int(rng.integers(3, 7))
        r = int(rng.choice([2, 4]))
        lora_alpha = float(rng.choice([a for a in (1, 2, 4, 8, 16, 32) if a != r]))
        kw = dict(
            weight=torch.tensor(rng.standard_normal((m, d)), dtype=torch.bfloat16),
            lora_A=torch.tensor(rng.integers(-4, 5, (r, d)) / 4, dtype=torch.float32),
            lora_B=torch.tensor(rng.integers(-8, 9, (m, r)) * 2.0**-10, dtype=torch.float32),
            lora_alpha=lora_alpha,
            r=r,
        )
        got = merge_unmerge(**kw)
        dW = _delta(kw["lora_A"], kw["lora_B"], lora_alpha, r)
        # every case: ΔW is a bf16 number, the round trip misses the base somewhere, and each named mistake misses too
        if (torch.equal(dW.bfloat16().float(), dW) and not torch.equal(got, kw["weight"].double())
                and all(not np.allclose(got.numpy(), mk.value) for mk in p1_mistakes(kw)["weight"])):
            return kw


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(13)
    return [Case(_p1_case(rng), "bf16 weight, float32 adapter"), Case(_p1_case(rng), "another layer"),
            Case(_p1_case(rng), "a third layer")]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_p1_case(rng)) for _ in range(5)]


def _p2_case(rng: np.random.Generator, fan_in_fan_out: bool, square: bool) -> dict:
    d = int(rng.integers(2, 7))
    m = d if square else int(rng.choice([k for k in range(2, 7) if k != d]))
    r = int(rng.integers(2, 5))  # r >= 2 and lora_alpha != r: every wrong scale shows
    lora_alpha = float(rng.choice([a for a in (1, 2, 4, 8, 16, 32) if a != r]))
    shape = (d, m) if fan_in_fan_out else (m, d)
    return dict(weight_merged=rng.standard_normal(shape), lora_A=rng.standard_normal((r, d)),
                lora_B=rng.standard_normal((m, r)),  # nonzero B: with B = 0 every wrong unmerge is right
                lora_alpha=lora_alpha, r=r, fan_in_fan_out=fan_in_fan_out)


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(31)
    return [Case(_p2_case(rng, False, False), "nn.Linear layout (fan_in_fan_out=False)"),
            Case(_p2_case(rng, True, False), "Conv1D layout (fan_in_fan_out=True), d ≠ m"),
            Case(_p2_case(rng, True, True), "Conv1D layout (fan_in_fan_out=True), square")]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_p2_case(rng, fan, sq)) for fan, sq in ((True, True), (True, False), (False, False), (True, True), (False, True))]


# --------------------------------------------------------------------------- mistakes


def p1_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    w = torch.as_tensor(kw["weight"])
    dW = _delta(kw["lora_A"], kw["lora_B"], kw["lora_alpha"], kw["r"])
    merged = (w.float() + dW).to(w.dtype)
    out = [
        Mistake("unchanged", w.double().numpy(),
                "you returned the base weight, as exact arithmetic (or a float32 weight) would: the layer's weight is bf16, "
                "so merge() stores W + ΔW rounded to bf16's grid, and the subtraction rounds again: an entry whose update "
                f"did not survive the merge whole comes back off the base. {READ_PRECISION}"),
        Mistake("merged only", merged.double().numpy(),
                f"that is the merged weight: unmerge() then subtracts ΔW (cast to bf16) from it, in bf16. {READ_PRECISION}"),
        Mistake("added twice", (merged + dW.to(w.dtype)).double().numpy(),
                f"you added ΔW a second time: unmerge subtracts it. {READ_PRECISION}"),
        Mistake("scale missing", ((w.float() + dW / lora.scaling(kw["lora_alpha"], kw["r"])).to(w.dtype)
                                  - (dW / lora.scaling(kw["lora_alpha"], kw["r"])).to(w.dtype)).double().numpy(),
                f"the scale is missing: ΔW = (lora_alpha / r) · lora_B @ lora_A. {READ_LAYOUT}"),
    ]
    return {"weight": worded(out)}   # the messages quote no case's values


def p2_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    Wm, A, B = (np.asarray(kw[k], dtype=np.float64) for k in ("weight_merged", "lora_A", "lora_B"))
    s = lora.scaling(kw["lora_alpha"], kw["r"])
    fan = bool(kw["fan_in_fan_out"])
    delta = s * B @ A
    layout = (lambda x: x.T) if fan else (lambda x: x)
    right = Wm - layout(delta)
    out = [
        Mistake("added", Wm + layout(delta), "you added the update a second time: unmerge subtracts it."),
        Mistake("unchanged", Wm, "you returned weight_merged unchanged: subtract the update to get the base back."),
        Mistake("scale missing", Wm - layout(B @ A), f"the scale is missing: the update is (lora_alpha / r) · lora_B @ lora_A. {READ_LAYOUT}"),
        Mistake("row-vector layout", right.T,
                f"your base weight is the transpose of the layer's: it keeps weight_merged's shape and layout. {READ_LAYOUT}"),
    ]
    if fan and Wm.shape[0] == Wm.shape[1]:
        out.append(Mistake("update not transposed", Wm - delta,
                           "you subtracted lora_B @ lora_A as nn.Linear lays it out (m × d). With fan_in_fan_out=True the "
                           "layer stores its weight d × m (in × out, Conv1D), and PEFT transposes the update to match: "
                           f"weight_merged − s · (lora_B @ lora_A)ᵀ. {READ_LAYOUT}"))
    if not fan and Wm.shape[0] == Wm.shape[1]:
        out.append(Mistake("update transposed", Wm - delta.T,
                           "you transposed the update on an nn.Linear layer (fan_in_fan_out=False): there weight is m × d, "
                           f"like lora_B @ lora_A. {READ_LAYOUT}"))
    return {"weight": worded([mk for mk in out if mk.value.shape != right.shape or not np.allclose(mk.value, right)])}


# --------------------------------------------------------------------------- items

# P3: the smallest positive bfloat16 weight into which a merge of the update 0.005 carries nothing.
P3_DELTA = 0.005


def _positive_numbers(dtype: torch.dtype) -> torch.Tensor:
    """Every positive finite number of the 16-bit float ``dtype``, in increasing order (read off its bit patterns)."""
    top = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}[dtype]     # the bit pattern of +inf
    return torch.arange(1, top, dtype=torch.int32).to(torch.int16).view(dtype)


def smallest_lost(delta: float = P3_DELTA, dtype: torch.dtype = torch.bfloat16, rule: str = "merge") -> float:
    """The smallest positive number w of ``dtype`` that a merge of ``delta`` leaves unchanged, found by trying every one
    (the key of p3 for bfloat16). ``rule`` "merge" runs the merge as PEFT's merge() does, the float32 sum w + Δw stored in
    ``dtype``; "whole spacing" is the mistaken rule that an update is lost whenever it is below the spacing of w (not half
    of it)."""
    w = _positive_numbers(dtype)
    if rule == "merge":
        lost = (w.float() + torch.tensor(delta, dtype=torch.float32)).to(dtype) == w
    else:
        lost = torch.as_tensor(merging.spacing(w.float(), dtype)) > delta
    return float(w[lost].min())


# P4: twelve merges of the same update, one after the other, into one bfloat16 entry (each sum stored in bf16 before the next
# merge): 504 → 506 → … → 512 (each 1.2 rounds up to the spacing 2), then stuck at 512, where the spacing is 4.
P4_START, P4_DELTA, P4_MERGES = 504.0, 1.2, 12


def merged_in_turn(start: float = P4_START, delta: float = P4_DELTA, merges: int = P4_MERGES,
                   dtype: torch.dtype = torch.bfloat16, rounding: str = "nearest", at_once: bool = False) -> float:
    """The entry after ``merges`` merges of ``delta``, each as PEFT's merge() does it (the float32 sum stored in ``dtype``);
    ``at_once`` merges the summed update once instead. The mistaken variants: ``rounding`` "toward zero" (each sum
    truncated to the grid below it) and "spacing 2" (a fixed grid of 2, bfloat16's spacing below 512, kept past it)."""
    w = torch.tensor(start, dtype=dtype)
    steps = [(delta * merges)] if at_once else [delta] * merges
    for d in steps:
        total = w.float() + torch.tensor(d, dtype=torch.float32)
        if rounding == "nearest":
            w = total.to(dtype)
        elif rounding == "toward zero":
            up = total.to(dtype)
            w = up if up.float() <= total else torch.nextafter(up, torch.zeros_like(up))
        else:                                                        # "spacing 2"
            w = torch.round(total / 2) * 2
    return float(w)


def relative_residual_in_turn(**kw) -> float:
    """|(w after the merges) − w − merges · Δw| / (merges · Δw): the relative residual of the whole update (the key of p4)."""
    total = kw.get("merges", P4_MERGES) * kw.get("delta", P4_DELTA)
    return abs((merged_in_turn(**kw) - kw.get("start", P4_START)) - total) / total


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 12

ITEMS = {
    "w1": Choice(
        "the merged weight in PEFT's layout",
        0,
        key="b",
        explain={
            "a": "lora_A.weight is r × d and lora_B.weight is m × r: lora_A @ lora_B pairs d with m (usually an error), and even when d = m it gives an r × r matrix, not the m × d update. (Lesson 13, 'The merge in PEFT's layout'.)",
            "b": "nn.Linear and PEFT store every matrix transposed: weight = Wᵀ, lora_A.weight = Aᵀ (r × d) and lora_B.weight = Bᵀ (m × r). Transposing W + sAB gives Wᵀ + s BᵀAᵀ, so the factors swap places: weight + s · lora_B.weight @ lora_A.weight, (m × r)(r × d) = m × d, which is exactly what PEFT's get_delta_weight adds. (Lesson 13, 'The merge in PEFT's layout'.)",
            "c": "The scale s = lora_alpha / r is part of the adapter's output, so it is part of the merge too. (Lesson 13, 'The merge in PEFT's layout'.)",
            "d": "weight is m × d and lora_B @ lora_A is m × d already: transposing it adds the wrong matrix (or fails). (Lesson 13, 'The merge in PEFT's layout'.)",
        },
    ),
    "w2": Choice(
        "which 16-bit weight computes the function QLoRA trained",
        0,
        key="b",
        explain={
            "a": "W + sAB computes XW + s(XA)B, and that differs from what was trained, XQ(W) + s(XA)B, by X(W − Q(W)): the 4-bit rounding error of the base, which the adapter was trained alongside. It gives the base its 16-bit weights back, so it is a different model; whether it is better or worse is measured on held-out data, not assumed. Reread 'Where to merge: a trade-off you measure' in Know this.",
            "b": "In training every adapted layer used Q(W), the dequantized 4-bit weight, and the adapter learned on top of it. Matrix products distribute: XQ(W) + s(XA)B = X(Q(W) + sAB), so this one weight is the trained function, up to the rounding of storing the sum in 16 bits. The merge onto the 16-bit W is the other candidate, a different model to be measured against it. (Lesson 13, 'Where to merge: a trade-off you measure'.)",
            "c": "Quantizing again puts Q(W) + sAB back on the 4-bit grid, which is much coarser than a typical update: only part of sAB survives, and a new rounding error is added on top. Reread 'Where to merge: a trade-off you measure' in Know this.",
            "d": "W and Q(W) differ by the 4-bit rounding of the base, which is far larger than 16-bit rounding: on the lesson's real layer it was larger than the whole update of its synthetic adapter. The three weights are three different layers. Reread 'Where to merge: a trade-off you measure' in Know this.",
        },
    ),
    "w3": Choice(
        "merge, then unmerge, in float32",
        0,
        key="d",
        explain={
            "a": "W + sAB − sAB rounds twice: in float32 you get W back to within a unit or two in the last place of the merged value W + sAB, not bit for bit.",
            "b": "Rounding does not need a zero B to be small: float32 keeps the update to within about 1e-7 of W (the lesson measures a few parts in 10⁸).",
            "c": "A and B are kept (PEFT keeps them after merge()), so the update can be subtracted again.",
            "d": "Each step rounds once: fl(W + sAB) is off by at most half a unit in the last place, and subtracting sAB rounds again, so you get W back to about one or two units in the last place of the merged value W + sAB (float32's spacing is 2⁻²³ ≈ 1.2e-7 at 1.0; for a weight much smaller than its update that is many of the weight's own units). The lesson's toy layer comes back within 1e-6 of its base after unmerge(), and that works because merge() keeps A and B. (Lesson 13, 'Merging in low precision'.)",
        },
    ),
    "p1": Function(
        "implement merge_unmerge: the bf16 weight PEFT's merge() then unmerge() leaves",
        3,
        name="merge_unmerge",
        reference=merge_unmerge,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("weight",),
        mistakes=p1_mistakes,
        rtol=0,
        atol=0,   # bf16 numbers: the round trip is exact arithmetic on the grid, either right or a spacing off
    ),
    "p2": Function(
        "implement unmerge for nn.Linear and Conv1D (fan_in_fan_out) layers",
        2,
        name="unmerge",
        reference=unmerge,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("weight",),
        mistakes=p2_mistakes,
    ),
    "p3": Numeric(
        "the smallest positive bfloat16 weight that a merge of the update 0.005 leaves unchanged",
        1,
        name="w",
        expected=smallest_lost,
        rtol=2e-3,  # the prompt: graded to 3 significant digits (the largest weight that keeps the update, 1.992, is not it)
        reread=READ_LOW_PRECISION,
        mistakes=lambda: [
            Mistake("proportional, half", P3_DELTA / (merging.spacing(1.0, "bfloat16") / 2),
                    "you took the spacing as proportional to w (w · 2⁻⁷, so that half of it reaches 0.005 at 1.28). The spacing "
                    "is constant across a binade [2ᵉ, 2ᵉ⁺¹) and doubles at each power of two, so the update is lost from the "
                    f"first binade whose half spacing is at least 0.005, from its lower end on. {READ_PRECISION}"),
            Mistake("proportional", P3_DELTA / merging.spacing(1.0, "bfloat16"),
                    "you took the spacing as proportional to w (w · 2⁻⁷ = 0.005 at 0.64), and compared the update with the "
                    "whole spacing. The spacing is constant across a binade and doubles at each power of two; an update "
                    f"is lost when it is at most half of it. {READ_PRECISION}"),
            Mistake("whole spacing", smallest_lost(rule="whole spacing"),
                    "you compared the update with the whole spacing: from 1.0 on it is 2⁻⁷ ≈ 0.0078 > 0.005, but rounding to "
                    "nearest keeps an update larger than half the spacing (1.005 rounds up to 1 + 2⁻⁷, not back to 1.0). "
                    f"{READ_PRECISION}"),
            Mistake("largest kept", float(_positive_numbers(torch.bfloat16)[
                        _positive_numbers(torch.bfloat16) < smallest_lost()].max()),
                    "that is the largest bfloat16 weight that still keeps the update (it rounds up to the next number); the "
                    f"question asks for the smallest one that loses it. {READ_PRECISION}"),
            Mistake("float16", smallest_lost(dtype=torch.float16),
                    f"that is float16's answer (11 significant bits, spacing 2⁻¹⁰ at 1.0); bfloat16 keeps 8. {READ_PRECISION}"),
        ],
    ),
    "p4": Numeric(
        "relative residual of twelve bfloat16 merges of Δw = 1.2, one after the other, into the entry 504",
        2,
        name="relative_residual",
        expected=relative_residual_in_turn,
        # The prompt: graded to 2 significant digits. 0.44 is 1.0 % off 4/9, so 1.2 % lets it pass by a real margin (not by
        # a rounding of the comparison), and 0.45, the next 2-digit value, 1.25 % off, still fails.
        rtol=1.2e-2,
        reread=READ_LOW_PRECISION,
        mistakes=lambda: [
            Mistake("at once", relative_residual_in_turn(at_once=True),
                    "that is one merge of the summed update, 14.4 (518.4 rounds to 520). Merged one at a time, each sum is "
                    f"rounded to bfloat16 before the next update is added. {READ_PRECISION}"),
            Mistake("all lost", relative_residual_in_turn(rounding="toward zero"),
                    "not every merge rounds back to 504: below 512 the spacing is 2, half of it is 1, and 1.2 is more, so "
                    "505.2 rounds to the nearest number, 506 (truncating it to 504 is not round to nearest). "
                    f"{READ_PRECISION}"),
            Mistake("spacing 2", relative_residual_in_turn(rounding="spacing 2"),
                    "each merge below 512 carries 2 for 1.2, as you found, but from 512 = 2⁹ on the spacing is 4: 513.2 rounds "
                    f"back to 512, so the later merges carry nothing. {READ_PRECISION}"),
            Mistake("float16", relative_residual_in_turn(dtype=torch.float16),
                    f"that is float16's grid (spacing 0.25 at 504); the weight is bfloat16, spacing 2 there. {READ_PRECISION}"),
            Mistake("carried", merged_in_turn() - P4_START,
                    "that is the update the entry carries after the twelve merges; the question asks for |carried − 14.4| / 14.4."),
            Mistake("absolute", abs(merged_in_turn() - P4_START - P4_MERGES * P4_DELTA),
                    "that is the absolute error |carried − 14.4|; the question asks for it relative to the 14.4 you meant to add."),
        ],
    ),
    "p5": Choice(
        "the bfloat16 merge residual once W and ΔW are both divided by 64",
        1,
    ),
    "p6": Choice(
        "W + sAB's distance from the trained function when the update is ten times larger",
        1,
    ),
}
