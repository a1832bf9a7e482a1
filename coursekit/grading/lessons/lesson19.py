"""Graded items of lesson 19, "Capstone: a real QLoRA run"."""

from __future__ import annotations

import json

import numpy as np

from .. import Array, Choice, Function, Numeric, Ordering
from ..checkers import Case, Mistake

P1_TICKET = "The spindle motor trips the breaker at start-up."
P1_LABEL = "electrical"


def supervised_positions() -> np.ndarray:
    """Positions whose label is not -100 in the rendered P1 example (computed with the course's tokenizer)."""
    from ... import data, model

    enc = data.encode_example(data.chat_example(P1_TICKET, P1_LABEL), model.load_tokenizer())
    return np.array([i for i, l in enumerate(enc["labels"]) if l != data.IGNORE_INDEX], dtype=np.float64)


def _p1_mistakes() -> list[Mistake]:
    pos = supervised_positions()
    return [
        Mistake("no end token", pos[:-1], "the end-of-turn token <|im_end|> is supervised too: it teaches the model to stop."),
        Mistake("shifted", pos - 1, "these are the positions one to the left: labels are aligned with input_ids, and "
                                    "the model shifts them once itself. Don't shift by hand."),
        Mistake("shifted right", pos + 1, "these are one position to the right of the answer tokens; labels sit on the tokens themselves."),
    ]


def window_loss_reference(loss_sums, counts):
    """Token-weighted loss of an accumulation window: Σ loss sums / Σ supervised tokens."""
    n = sum(counts)
    if n == 0:
        raise ValueError("no supervised token in the window")
    return sum(loss_sums) / n


def _p5_public() -> list[Case]:
    return [
        Case({"loss_sums": [2.0, 4.0], "counts": [2, 8]}, "the report's case: 2 tokens summing 2.0, 8 summing 4.0"),
        Case({"loss_sums": [3.0, 1.0, 9.0], "counts": [6, 1, 30]}, "three micro-batches of unequal size"),
    ]


def _p5_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for _ in range(5):
        k = int(rng.integers(2, 6))
        counts = [int(c) for c in rng.integers(1, 40, size=k)]
        sums = [float(c * rng.uniform(0.1, 3.0)) for c in counts]
        out.append(Case({"loss_sums": sums, "counts": counts}))
    return out


def _p5_mistakes(kw: dict, got: dict) -> dict:
    sums, counts = kw["loss_sums"], kw["counts"]
    means = [s / c for s, c in zip(sums, counts)]
    return {"result": [
        Mistake("mean of means", float(np.mean(means)), "you averaged the micro-batches' mean losses: a micro-batch with "
                "few supervised tokens then weighs as much as one with many. Divide the total loss by the total token count."),
        Mistake("sum", float(sum(sums)), "that is the total loss; divide it by the total number of supervised tokens."),
    ]}


def last_summary() -> dict:
    """The summary the capstone run of this lesson wrote (default configuration)."""
    from ... import capstone, train

    path = capstone.run_dir(train.TrainConfig()) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError("no capstone summary yet: run the cell with capstone.run(cfg) above first, "
                                "with the default configuration")
    return json.loads(path.read_text())


ITEMS = {
    "w1": Choice("what the optimizer updates in QLoRA", 1),
    "w2": Choice("what a label of -100 means", 1),
    "w3": Choice("why the baseline uses the same prompt", 1),
    "p1": Array("supervised positions of the rendered example", 2, name="supervised",
                expected=supervised_positions, rtol=0, atol=0, mistakes=_p1_mistakes),
    "p2": Ordering("from a 4-bit-trained adapter to one deployable model", 2, labels={
        "attach": "attach the saved adapter",
        "load_bf16": "load the base in bf16",
        "merge": "merge W + sAB and unload the adapter",
        "save": "save the adapter with its base identity",
        "train": "train the adapter against the NF4 base",
        "verify": "verify greedily against the probes and the held-out split",
    }),
    "p3": Choice("reading the loss curve", 1),
    "p4": Numeric("held-out accuracy gain of this run, in percentage points", 1, name="gain_points",
                  expected=lambda: 100 * (last_summary()["tuned_accuracy"] - last_summary()["baseline_accuracy"]),
                  rtol=0, atol=0.01,
                  mistakes=lambda: [Mistake("fraction", last_summary()["tuned_accuracy"] - last_summary()["baseline_accuracy"],
                                            "that is the gain as a fraction; the question asks for percentage points (× 100).")]),
    "p5": Function("implement window_loss", 2, name="window_loss", reference=window_loss_reference,
                   public=_p5_public, hidden=_p5_hidden, outputs=("result",), mistakes=_p5_mistakes),
    "p6": Choice("where to merge", 1),
    "p7": Choice("what catches a cut gradient path before a long run", 1),
}
