"""Graded items of lesson 13, "Merging"."""

from __future__ import annotations

import numpy as np

from ... import lora, merging
from ..checkers import Case, Mistake
from .. import Choice, Function, Numeric
from ..lora_mistakes import merge_mistakes

READ_LAYOUT = "(Lesson 13, 'The merge in PEFT's layout'.)"
READ_DROPOUT = "(Lesson 13, 'Dropout, eval mode and the (1 − p) trap'.)"
READ_PRECISION = "(Lesson 13, 'Merging in low precision'.)"


# --------------------------------------------------------------------------- references


def merge(weight, lora_A, lora_B, lora_alpha, r, lora_dropout):
    """Reference for p1: ``weight + (lora_alpha / r) lora_B @ lora_A`` (m × d); lora_dropout plays no part."""
    return merging.merge_peft(weight, lora_A, lora_B, lora.scaling(lora_alpha, r))


def unmerge(weight_merged, lora_A, lora_B, lora_alpha, r):
    """Reference for p2: ``weight_merged − (lora_alpha / r) lora_B @ lora_A`` (m × d)."""
    return merging.unmerge_peft(weight_merged, lora_A, lora_B, lora.scaling(lora_alpha, r))


# --------------------------------------------------------------------------- cases


def _random_case(rng: np.random.Generator, square: bool = False) -> dict:
    d = int(rng.integers(2, 7))
    m = d if square else int(rng.integers(2, 7))
    r = int(rng.integers(2, 5))  # r >= 2 and lora_alpha != r: every wrong scale shows
    lora_alpha = float(rng.choice([a for a in (1, 2, 4, 8, 16, 32) if a != r]))
    return dict(
        weight=rng.standard_normal((m, d)),
        lora_A=rng.standard_normal((r, d)),
        lora_B=rng.standard_normal((m, r)),  # nonzero B: with B = 0 every wrong merge is right
        lora_alpha=lora_alpha,
        r=r,
        lora_dropout=float(rng.choice([0.05, 0.1, 0.2])),
    )


def _p1_public() -> list[Case]:
    rng = np.random.default_rng(13)
    return [
        Case(_random_case(rng, square=True), "square weight (m = d), lora_dropout > 0"),
        Case(_random_case(rng), "rectangular weight"),
        Case(_random_case(rng), "another rectangular weight"),
    ]


def _p1_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_random_case(rng, square=(i % 2 == 0))) for i in range(5)]


def _without_dropout(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k != "lora_dropout"}


def _p2_case(kw: dict) -> dict:
    kw = _without_dropout(kw)
    w = kw.pop("weight")
    kw["weight_merged"] = merge(w, kw["lora_A"], kw["lora_B"], kw["lora_alpha"], kw["r"], 0.0)
    return kw


def _p2_public() -> list[Case]:
    rng = np.random.default_rng(31)
    return [Case(_p2_case(_random_case(rng, square=True)), "square weight"), Case(_p2_case(_random_case(rng)), "rectangular weight")]


def _p2_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case(_p2_case(_random_case(rng, square=(i == 0)))) for i in range(4)]


# --------------------------------------------------------------------------- mistakes


def _row_vector(weight, lora_A, lora_B, **kw) -> dict:
    """The course's row-vector names: W = weight.T (d × m), A = lora_A.T (d × r), B = lora_B.T (r × m)."""
    return dict(W=np.asarray(weight).T, A=np.asarray(lora_A).T, B=np.asarray(lora_B).T, lora_alpha=kw["lora_alpha"], r=kw["r"])


def _scale_mistakes(rv: dict) -> list[Mistake]:
    """lesson 02's merge mistakes (wrong scales, update only), brought back to PEFT's m × d layout."""
    return [Mistake(m.label, m.value.T, m.message, m.hint) for m in merge_mistakes(rv)["W_merged"] if m.label != "transposed"]


def p1_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    weight, A, B = (np.asarray(kw[k], dtype=np.float64) for k in ("weight", "lora_A", "lora_B"))
    s, p = lora.scaling(kw["lora_alpha"], kw["r"]), float(kw["lora_dropout"])
    delta = s * B @ A
    out = _scale_mistakes(_row_vector(**kw))
    out += [
        Mistake("times (1-p)", weight + (1 - p) * delta,
                f"you multiplied the update by (1 − p) = {1 - p:g}. PEFT's lora_dropout is inverted dropout: it already "
                f"divides by (1 − p) while training, so in eval mode the adapter path is exactly s (XA) B and the merge "
                f"takes no dropout factor. {READ_DROPOUT}",
                hint=f"you multiplied the update by (1 − p). PEFT's lora_dropout is inverted dropout: it already divides "
                     f"by (1 − p) while training, so in eval mode the adapter path is exactly s (XA) B and the merge takes "
                     f"no dropout factor. {READ_DROPOUT}"),
        Mistake("over (1-p)", weight + delta / (1 - p),
                f"you divided the update by (1 − p) = {1 - p:g}: in eval mode dropout is the identity, so the merge takes no "
                f"dropout factor at all. {READ_DROPOUT}",
                hint=f"you divided the update by (1 − p): in eval mode dropout is the identity, so the merge takes no "
                     f"dropout factor at all. {READ_DROPOUT}"),
        Mistake("row-vector layout", (weight.T + s * A.T @ B.T),
                f"you returned the merged weight in the row-vector layout (d × m, W + s A B). In PEFT's layout weight is "
                f"m × d (out × in), and the merged weight must keep that shape: weight + s · lora_B @ lora_A. {READ_LAYOUT}"),
    ]
    if weight.shape[0] == weight.shape[1]:
        out.append(Mistake("update transposed", weight + delta.T,
                           f"you added the update transposed ((lora_B @ lora_A)ᵀ = lora_Aᵀ lora_Bᵀ): in PEFT's layout the update "
                           f"is lora_B @ lora_A, m × d like weight. {READ_LAYOUT}"))
    return {"weight_merged": out}


def p2_mistakes(kw: dict, got: dict | None = None) -> dict[str, list[Mistake]]:
    Wm, A, B = (np.asarray(kw[k], dtype=np.float64) for k in ("weight_merged", "lora_A", "lora_B"))
    s = lora.scaling(kw["lora_alpha"], kw["r"])
    # Unmerging is merging with −B: lesson 02's wrong scales apply unchanged.
    out = _scale_mistakes(_row_vector(Wm, A, -B, lora_alpha=kw["lora_alpha"], r=kw["r"]))
    out += [
        Mistake("added", Wm + s * B @ A, "you added the update a second time: unmerge subtracts it, weight_merged − s · lora_B @ lora_A."),
        Mistake("row-vector layout", (Wm - s * B @ A).T,
                f"your base weight is transposed (d × m): in PEFT's layout it keeps weight_merged's shape, m × d. {READ_LAYOUT}"),
        Mistake("unchanged", Wm, "you returned weight_merged unchanged: subtract s · lora_B @ lora_A to get the base back."),
    ]
    return {"weight": out}


# --------------------------------------------------------------------------- items

P4_CASE = dict(W=1.0, delta=0.005, dtype="bfloat16")

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
        key="b",
        explain={
            "a": "W + sAB − sAB rounds twice: in float32 you get W back to within a few units in the last place, not bit for bit.",
            "b": "Each step rounds once: fl(W + sAB) is off by at most half a unit in the last place, and subtracting sAB rounds again, so you get W back to about one or two units in the last place (float32's spacing is 2⁻²³ ≈ 1.2e-7 at 1.0). The lesson's toy layer comes back within 1e-6 of its base after unmerge(), and that works because merge() keeps A and B. (Lesson 13, 'Merging in low precision'.)",
            "c": "A and B are kept (PEFT keeps them after merge()), so the update can be subtracted again.",
            "d": "Rounding does not need a zero B to be small: float32 keeps the update to within about 1e-7 of W (the lesson measures a few parts in 10⁸).",
        },
    ),
    "p1": Function(
        "implement merge (PEFT layout)",
        3,
        name="merge",
        reference=merge,
        public=_p1_public,
        hidden=_p1_hidden,
        outputs=("weight_merged",),
        mistakes=p1_mistakes,
    ),
    "p2": Function(
        "implement unmerge (PEFT layout)",
        2,
        name="unmerge",
        reference=unmerge,
        public=_p2_public,
        hidden=_p2_hidden,
        outputs=("weight",),
        mistakes=p2_mistakes,
    ),
    "p3": Numeric(
        "the spacing of bfloat16 numbers at 300",
        1,
        name="spacing",
        expected=lambda: merging.spacing(300.0, "bfloat16"),
        rtol=1e-2,  # the prompt: graded to 2 significant digits
        mistakes=lambda: [
            Mistake("at one", 2.0**-7, "2⁻⁷ is the spacing at 1.0. The spacing is one unit in the last place of the number, so it "
                                       f"grows with its binade: 300 lies in [2⁸, 2⁹), where it is 2⁸ · 2⁻⁷. {READ_PRECISION}"),
            Mistake("scaled", 300 * 2.0**-7, "you multiplied the spacing at 1.0 by 300. The spacing is constant across a binade and "
                                             "doubles at each power of two: 300 lies in [2⁸, 2⁹), so it is 2⁸ · 2⁻⁷, not 300 · 2⁻⁷. "
                                             f"{READ_PRECISION}"),
            Mistake("next binade", 4.0, "4 is the spacing in [2⁹, 2¹⁰), from 512 on. 300 is below 512: its binade is [2⁸, 2⁹). "
                                        f"{READ_PRECISION}"),
            Mistake("half", 1.0, "1 is half the spacing (the largest update that rounds away); the question asks for the gap to the "
                                 f"next bfloat16 number. {READ_PRECISION}"),
            Mistake("float16", 2.0**-2, f"2⁻² is float16's spacing at 300 (11 significant bits); bfloat16 keeps 8. {READ_PRECISION}"),
        ],
    ),
    "p4": Numeric(
        "relative residual of a bfloat16 merge of one entry: w = 1.0, Δw = 0.005",
        2,
        name="relative_residual",
        expected=lambda: merging.merge_residual(**P4_CASE),
        rtol=1e-2,  # the prompt: graded to 2 significant digits
        mistakes=lambda: [
            Mistake("rounds away", 1.0, "1.005 is not rounded back to 1.0: half the spacing above 1.0 is smaller than 0.005, so it rounds "
                                        f"to the next bfloat16 number up. {READ_PRECISION}"),
            Mistake("exact", 0.0, f"that is exact arithmetic; in bfloat16 1.005 is not a number, it rounds to a neighbour. {READ_PRECISION}"),
            Mistake("carried", 2.0**-7, "0.0078125 is the update the merged entry carries; the question asks for "
                                        "|carried − Δw| / |Δw|."),
            Mistake("absolute", 2.0**-7 - 0.005, "that is the absolute error |carried − Δw|; the question asks for it relative to |Δw|."),
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
