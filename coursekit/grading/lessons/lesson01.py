"""Graded items of lesson 01, "When to adapt" (solutions/01-when-to-adapt).

Choice and ordering keys live in ``autograder/keys/01.json``; the parameter count (p4) is the architecture's
arithmetic (tests/test_lesson01_items.py measures it on the model transformers builds), and the ledger function (p5)
is checked against :mod:`coursekit.memory` through :func:`_ledger_buckets`, which builds on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import Case, Choice, Function, Mistake, Numeric, Ordering
from ..checkers import worded
from ... import memory

_SEC_METHODS = "Reread Know this, 'Full fine-tuning, PEFT, LoRA, QLoRA'."
_SEC_LEDGER = "Reread Know this, 'The memory ledger'."


# --------------------------------------------------------------------------- p4: count a Llama model from its config

_SEC_COUNT = ("Real-world reps counts SmolLM2-135M matrix by matrix from each shape; this model's shapes differ from "
              "SmolLM2's, so work out each one from the configuration.")

#: P4's model: a Llama model bigger than SmolLM2-135M and laid out differently from it (q, k, v, o; gate, up, down; two
#: RMSNorm weights per layer and a final one; no biases). Two features the lesson's count of SmolLM2-135M does not have:
#: the input and output embeddings are NOT tied (the output layer has its own vocab × hidden matrix), and the attention
#: is wider than the hidden size (16 heads × 64 = 1024 against 960), so q and o are not hidden × hidden.
P4_CONFIG = dict(hidden=960, inter=2560, layers=32, heads=16, kv_heads=4, head_dim=64, vocab=49_152)
P4_TIED = False


def _llama_params(hidden: int, inter: int, layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int, *,
                  tied: bool = True, norms: bool = True, embedding: bool = True, mlp_matrices: int = 3) -> int:
    """Parameters of a Llama-architecture model without biases, counted from its configuration (Real-world reps counts
    SmolLM2-135M's special case: q and o hidden × hidden, the embedding tied); the keyword switches give the count a
    typical slip produces."""
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden   # q, k, v, o
    mlp = mlp_matrices * hidden * inter                                                                 # gate, up, down
    per_layer = attn + mlp + (2 * hidden if norms else 0)
    emb = vocab * hidden * ((1 if tied else 2) if embedding else 0)
    return emb + layers * per_layer + (hidden if norms else 0)


def _p4_expected() -> int:
    return _llama_params(**P4_CONFIG, tied=P4_TIED)


def _p4_mistakes() -> list[Mistake]:
    c, tied = P4_CONFIG, P4_TIED
    width = c["heads"] * c["head_dim"]
    return [
        Mistake("SmolLM2's count copied", _llama_params(**{**c, "heads": c["hidden"] // c["head_dim"]}, tied=True),
                f"that is Real-world reps' count of SmolLM2-135M with this model's numbers put in. Two of its shortcuts "
                f"hold for SmolLM2 only: there 9 query heads × 64 = 576 make q and o hidden × hidden and the embedding is "
                f"tied; here {c['heads']} heads × {c['head_dim']} = {width} make q map {c['hidden']} features to {width} "
                f"and o map them back, and the output layer has a vocabulary × hidden matrix of its own."),
        Mistake("tied", _llama_params(**c, tied=True),
                "you counted the embedding once, as for a tied model; here the input and output embeddings are not tied, "
                "so the output layer has a vocabulary × hidden matrix of its own, counted as well. " + _SEC_COUNT),
        Mistake("q and o hidden × hidden", _llama_params(**{**c, "heads": c["hidden"] // c["head_dim"]}, tied=tied),
                f"q_proj and o_proj are not hidden × hidden here: {c['heads']} query heads of width {c['head_dim']} make "
                f"the attention {width} wide, so q maps {c['hidden']} features to {width} and o maps {width} back to "
                f"{c['hidden']}. " + _SEC_COUNT),
        Mistake("full-width k and v", _llama_params(**{**c, "kv_heads": c["heads"]}, tied=tied),
                f"k_proj and v_proj are as wide as q here only if every query head has its own key/value head: with "
                f"{c['kv_heads']} key/value heads of width {c['head_dim']} (grouped-query attention) each maps "
                f"{c['hidden']} features to {c['kv_heads']} × {c['head_dim']} = {c['kv_heads'] * c['head_dim']}. " + _SEC_COUNT),
        Mistake("no norms", _llama_params(**c, tied=tied, norms=False),
                "you left out the RMSNorm weights: two vectors of the hidden size in every layer, and one more after "
                "the last layer. " + _SEC_COUNT),
        Mistake("no embeddings", _llama_params(**c, embedding=False),
                "the input embedding and the output layer are parameter matrices too, vocabulary × hidden each (two of "
                "them, since they are not tied). " + _SEC_COUNT),
        Mistake("two MLP matrices", _llama_params(**c, tied=tied, mlp_matrices=2),
                "a Llama MLP has three matrices, not two: gate and up (hidden → intermediate) and down "
                "(intermediate → hidden). " + _SEC_COUNT),
    ]


# --------------------------------------------------------------------------- p5: implement the ledger

class _BucketFunction(Function):
    """A Function item whose answer returns a dict of buckets; the dict is compared bucket by bucket."""

    def check(self, answer: Any, ctx: Any):
        if callable(answer):
            fn = answer

            def as_tuple(**kwargs: Any) -> Any:
                out = fn(**kwargs)
                if not isinstance(out, dict):
                    return out  # reported as "should return 4 values"
                missing = [b for b in memory.BUCKETS if b not in out]
                if missing:
                    raise KeyError(f"the returned dict has no key(s) {missing}; it needs exactly {list(memory.BUCKETS)}")
                return tuple(out[b] for b in memory.BUCKETS)

            answer = as_tuple
        return super().check(answer, ctx)


#: SmolLM2-135M (Real-world reps): parameters, the rank-16 adapter on all seven projections, and its tied embedding.
_SMOL = {"n_params": 134_515_008, "n_adapter": 4_884_480, "n_unfrozen": 49_152 * 576}


def _ledger_buckets(n_params: float, n_adapter: float, method: str, n_unfrozen: float = 0) -> dict[str, float]:
    """The ledger with ``n_unfrozen`` of the base's own parameters trained alongside the adapter: they are stored in
    bf16 under every method (a trained weight cannot stay as 4-bit codes; bitsandbytes quantizes the linear layers only)
    and carry bf16 gradients and two fp32 Adam moments, like full fine-tuning's parameters. Full fine-tuning already
    trains everything, so ``n_unfrozen`` changes nothing there. Built from :func:`coursekit.memory.ledger`."""
    if method == "full":
        return memory.ledger(n_params, 0, "full")
    frozen = memory.ledger(n_params - n_unfrozen, n_adapter, method)
    trained = memory.ledger(n_unfrozen, 0, "full")
    return {k: frozen[k] + trained[k] for k in memory.BUCKETS}


def _ledger_reference(n_params: int, n_adapter: int, method: str, n_unfrozen: int) -> tuple[float, ...]:
    b = _ledger_buckets(n_params, n_adapter, method, n_unfrozen)
    return tuple(b[k] for k in memory.BUCKETS)


def _ledger_public() -> list[Case]:
    cases = [Case({"n_params": 7_000_000_000, "n_adapter": 20_000_000, "method": m, "n_unfrozen": 0},
                  f"the lesson's example: 7B base, 20M adapter, {m}, nothing unfrozen") for m in memory.METHODS]
    cases += [Case({**_SMOL, "method": m}, f"SmolLM2-135M, r = 16 on every projection, its embedding unfrozen, {m}")
              for m in ("lora", "qlora")]
    return cases


def _ledger_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for m in memory.METHODS:
        for _ in range(2):
            n = int(rng.integers(10**8, 10**11))
            a = int(rng.integers(10**5, 10**8))
            u = int(rng.integers(10**6, n // 3))
            cases.append(Case({"n_params": n, "n_adapter": a, "method": m, "n_unfrozen": u}))
    return cases


def _ledger_mistakes(kwargs: dict, answers: dict) -> dict[str, list[Mistake]]:
    n, a, m, u = kwargs["n_params"], kwargs["n_adapter"], kwargs["method"], kwargs["n_unfrozen"]
    out: dict[str, list[Mistake]] = {"base_weights": [], "base_grads": [], "base_moments": [], "adapter": []}
    if m == "qlora":
        out["base_weights"].append(Mistake("bf16 base", 2 * n, "under QLoRA the frozen base is stored as 4-bit codes: "
                                                               "half a byte per frozen weight. " + _SEC_LEDGER))
        if u:
            out["base_weights"].append(Mistake("unfrozen in 4 bits", n / 2, (
                "you stored the unfrozen parameters as 4-bit codes too. A weight the optimizer updates cannot stay "
                "4-bit codes: keep it in bf16 (2 bytes), and only the frozen rest as half a byte. ") + _SEC_METHODS))
    out["base_weights"].append(Mistake("fp32 base", 4 * n, (
        "the base weights are not fp32: under QLoRA the frozen ones are stored as 4-bit codes (half a byte), the trained "
        "ones in bf16. " if m == "qlora" else "the base weights are bf16, 2 bytes each, not fp32. ") + _SEC_LEDGER))
    if m == "full":
        out["base_moments"] += [
            Mistake("one moment", 4 * n, "Adam keeps two moments per trainable parameter (m and v), each fp32: 8 bytes. " + _SEC_LEDGER),
            Mistake("bf16 moments", 2 * n, "the ledger assumes fp32 Adam moments, two of them: 8 bytes per parameter. " + _SEC_LEDGER),
        ]
        out["adapter"].append(Mistake("adapter in full FT", 12 * a, "full fine-tuning trains the base itself; it has no adapter, "
                                                                    "so that bucket is 0. " + _SEC_METHODS))
    else:
        out["base_grads"].append(Mistake("frozen grads", 2 * n, "only the unfrozen part of the base is trained under LoRA and "
                                                                "QLoRA: the frozen rest stores no gradient. " + _SEC_METHODS))
        out["base_moments"].append(Mistake("frozen moments", 8 * n, "a frozen weight has no optimizer state; only the "
                                                                    "unfrozen parameters carry Adam moments. " + _SEC_METHODS))
        if u:
            out["base_grads"].append(Mistake("unfrozen not trained", 0, (
                "the unfrozen parameters are trained: each stores a bf16 gradient (2 bytes) in the base buckets. ") + _SEC_METHODS))
            out["base_moments"].append(Mistake("unfrozen not trained", 0, (
                "the unfrozen parameters are trained: each carries two fp32 Adam moments (8 bytes). ") + _SEC_METHODS))
        out["adapter"] += [
            Mistake("no moments", 4 * a, "the adapter is trained: add its two fp32 Adam moments (8 bytes per parameter). " + _SEC_LEDGER),
            Mistake("moments only", 8 * a, "count the adapter's bf16 weights and gradients too (2 + 2 bytes), not only its moments. " + _SEC_LEDGER),
            Mistake("all fp32", 16 * a, "the ledger stores adapter weights and gradients in bf16 (2 bytes each); "
                                        "only the Adam moments are fp32. " + _SEC_LEDGER),
        ]
    # Every message quotes only the ledger's bytes-per-parameter rates, never the case's sizes: each is also the
    # hint a hidden case shows.
    return worded(out)


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 7

ITEMS = {
    # ------------------------------------------------------------------ warm-up
    "w1": Choice(
        "What QLoRA changes that LoRA does not",
        0,
        options="abcd",
        key="a",
        explain={
            "a": "LoRA decides what trains (the factors A and B, with W frozen); QLoRA keeps exactly that and also stores the frozen base's eligible weights as 4-bit codes (NF4) with one scale per block, while the adapter and the arithmetic stay in higher precision. In one line: LoRA changes what trains, QLoRA also changes how the base is stored. (Lesson 01, 'Full fine-tuning, PEFT, LoRA, QLoRA'.)",
            "b": "LoRA and QLoRA train the same adapter factors; the set of trainable parameters is the same. Reread Know this, 'Full fine-tuning, PEFT, LoRA, QLoRA'.",
            "c": "A and B keep their shapes (d × r and r × m): quantization changes the bytes of W, not its logical shape. Reread Know this, 'Full fine-tuning, PEFT, LoRA, QLoRA'.",
            "d": "The QLoRA paper also introduced paged optimizers, but its paged AdamW is the same AdamW algorithm with its state paged between GPU and CPU memory (lesson 00), so LoRA and QLoRA share the optimizer: what QLoRA changes is how the base is stored. Reread Know this, 'Full fine-tuning, PEFT, LoRA, QLoRA'.",
        },
    ),
    "w2": Choice(
        "Weekly-changing prices",
        0,
        options="abcd",
        key="c",
        explain={
            "a": "A weekly fine-tune chases facts that change faster than you can train and evaluate, and weights are not a dependable database of changing facts. Reread Know this, 'What is missing?'.",
            "b": "More trainable parameters do not make a model know next week's prices. Reread Know this, 'What is missing?'.",
            "c": "What is missing here is current facts, not behaviour, and facts that change every week belong in the input: retrieval or a tool call fetches the live price list at question time. Facts baked into weights go stale, and you cannot tell which ones did. (Lesson 01, 'What is missing?'.)",
            "d": "Constrained output fixes the shape of an answer, not the facts in it. Reread Know this, 'What is missing?'.",
        },
    ),
    "w3": Choice(
        "Largest bucket of full fine-tuning",
        0,
        options="abcd",
        key="d",
        explain={
            "a": "Activations can dominate at long sequences, but they are not a persistent tensor and the ledger leaves them out; among the ledger's buckets, look again. Reread Know this, 'The memory ledger'.",
            "b": "The bf16 weights are 2 bytes per parameter; another bucket costs four times as much. Reread Know this, 'The memory ledger'.",
            "c": "The bf16 gradients are 2 bytes per parameter, the same as the weights. Reread Know this, 'The memory ledger'.",
            "d": "Adam keeps two fp32 moment buffers, m and v, for every trainable parameter: 2 × 4 = 8 bytes, so 7 × 10⁹ × 8 = 56 GB. That is four times the bf16 weights (14 GB) and four times the bf16 gradients (14 GB), two thirds of the 84 GB total. (Lesson 01, 'The memory ledger'.)",
        },
    ),
    # ------------------------------------------------------------------ practice
    "p1": Choice(
        "Right labels in the wrong form: what to try first",
        2,
        options="abcd",
    ),
    "p2": Choice(
        "True statements about the ledger for any N and a",
        3,
        options="abcdef",
        multi=True,
    ),
    "p3": Ordering(
        "How would I start? Put the steps in order",
        2,
        labels={
            "base": "choose a supported base model",
            "baseline": "tune a prompt on the training examples only, then score it on the held-out evaluation set",
            "compare": "measure the trained adapter on the held-out evaluation set: task quality, peak memory and speed",
            "data": "build clean training examples in the model's chat format, and hold evaluation examples out of them",
            "method": "pick the adapter: LoRA if the 16-bit weights fit the budget, QLoRA if memory for the base is the limit",
        },
    ),
    "p4": Numeric(
        "parameters of a Llama model with hidden size 960, 32 layers, 16 query and 4 key/value heads, untied embedding",
        2,
        name="model_params",
        expected=_p4_expected,
        rtol=0,
        mistakes=_p4_mistakes,
        reread="Reread 'Real-world reps'.",
    ),
    "p5": _BucketFunction(
        "Implement the memory ledger with part of the base unfrozen",
        4,
        name="ledger",
        reference=_ledger_reference,
        public=_ledger_public,
        hidden=_ledger_hidden,
        outputs=memory.BUCKETS,
        mistakes=_ledger_mistakes,
        rtol=1e-9,
        atol=0.5,
    ),
    "p6": Choice(
        "A 34B base on a 48 GB GPU, 10 GB kept free, base as precise as fits",
        2,
        options="abcd",
    ),
}
