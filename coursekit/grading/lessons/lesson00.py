"""Graded items of lesson 00, "Setup and probes" (solutions/00-setup-and-probes).

Choice and ordering keys live encoded in ``keys/00.key``; numeric answers are computed here from the
machine at grade time (a probe answer must match the machine it is graded on); the implement item
``p4`` is checked against :func:`coursekit.probes.nibble_pack`.
"""

from __future__ import annotations

import os

import numpy as np

from ...probes import nibble_pack
from ..checkers import Case, Mistake
from .. import Choice, Function, Numeric, Ordering

# --------------------------------------------------------------------------- p3: cores torch uses


def _torch_threads(seen: dict) -> float:
    """What torch.get_num_threads() returned in the student's own kernel (coursekit.grading.seen_here): the answer
    depends on the machine and the thread settings the notebook ran under, not on the grader's."""
    return float(seen["torch_threads"])


def _thread_mistakes(seen: dict) -> list[Mistake]:
    out = []
    n, cores = seen["torch_threads"], seen["cpu_count"]
    if cores != n:
        out.append(Mistake("os", cores, "that is os.cpu_count(), every core the OS reports; torch may use "
                                        "fewer (affinity, OMP_NUM_THREADS). Ask torch.get_num_threads()."))
    if n != 1:
        out.append(Mistake("one", 1, "1 is what a single Python thread looks like; torch runs its CPU kernels on a "
                                     "thread pool. Ask torch.get_num_threads()."))
    return out


# --------------------------------------------------------------------------- p4: nibble_pack


def _pack_cases() -> list[Case]:
    return [
        Case({"codes": np.array([1, 2])}, "two codes [1, 2] → one byte"),
        Case({"codes": np.array([15, 0, 3, 9])}, "four codes → two bytes"),
        Case({"codes": np.array([7, 8, 5])}, "odd count: the last byte is padded with a 0 code"),
        Case({"codes": np.arange(16)}, "all sixteen codes 0..15"),
    ]


def _pack_hidden(rng: np.random.Generator) -> list[Case]:
    return [Case({"codes": rng.integers(0, 16, size=int(n))}) for n in rng.integers(1, 64, size=6)]


def _low_first(codes: np.ndarray) -> np.ndarray:
    q = np.asarray(codes).astype(np.int64)
    if q.size % 2:
        q = np.concatenate([q, [0]])
    return ((q[1::2] << 4) | q[0::2]).astype(np.uint8)


def _pack_mistakes(kwargs: dict, answers: dict) -> dict:
    codes = np.asarray(kwargs["codes"])
    # The messages quote the packing rule's fixed numbers (element 2i, shift 4, a 0 pad code), never the case's
    # codes: hidden cases show them as hints, with the section to reread.
    low_first = ("you put the first code of each pair in the LOW nibble. bitsandbytes puts element 2i in the high "
                 "nibble: packed = (q[0::2] << 4) | q[1::2] (Know this: 'Reading the bytes').")
    ms = [Mistake("low-first", _low_first(codes), low_first, hint=low_first)]
    if codes.size % 2:
        ms.append(Mistake("no-pad", nibble_pack(codes)[:-1],
                          "with an odd number of codes the last code still needs a byte: pad with one 0 code.",
                          hint="with an odd number of codes the last code still needs a byte: pad with one 0 code "
                               "(Know this: 'Reading the bytes')."))
    else:
        ms.append(Mistake("bytes-per-code", codes.astype(np.float64),
                          "one byte per code wastes half the storage: two 4-bit codes share one byte.",
                          hint="one byte per code wastes half the storage: two 4-bit codes share one byte (Know this: "
                               "'Reading the bytes')."))
    return {"result": ms}


def _pack_dtype(fn, case: Case) -> list[str] | None:
    got = fn(**{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in case.kwargs.items()})
    dt = str(getattr(got, "dtype", type(got).__name__)).replace("torch.", "")
    if dt != "uint8":
        return [f"values are right but the dtype is {dt}; return uint8 (one byte per pair of codes), "
                f"e.g. np.asarray(..., dtype=np.uint8)."]
    return None


# --------------------------------------------------------------------------- p6: packed bytes


def _packed_bytes() -> float:
    d, m = 576, 1536  # SmolLM2-135M: hidden 576, intermediate 1536 (an up_proj weight)
    return float(nibble_pack(np.zeros(d * m, dtype=np.int64)).nbytes)


def _packed_mistakes() -> list[Mistake]:
    n = 576 * 1536
    return [
        Mistake("one-byte", n, "that is one byte per weight; a 4-bit code takes half a byte."),
        Mistake("bits", n * 4, "that is the number of bits (and also the fp32 size in bytes); a byte holds 8 bits, "
                               "two 4-bit codes."),
        Mistake("bf16", n * 2, "that is the bf16 size (2 bytes per weight)."),
        Mistake("with absmax", n // 2 + (n // 64) * 4, "that adds the fp32 absmax (one per block of 64); the question "
                                                      "asks for the packed codes alone."),
    ]


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 7

ITEMS = {
    # Warm-up
    "w1": Choice(
        "Where do the implement-a-kernel and compute-a-value items of a lesson sit?", 0,
        key="c",
        explain={
            "a": "Warm-up is a short check of what you bring in (about 3 questions), not where you build things.",
            "b": "Know this is exposition with runnable cells; nothing there is graded.",
            "c": "Practice is the graded part of a lesson: it holds the autograded items (implement a function, compute a value, choose an option, order steps) plus a few free-text answers an instructor grades by hand. Warm-up only checks what you bring in, and Know this is ungraded exposition. (Lesson 00, 'How this course works'.)",
            "d": "Going further lists primary sources to read; it is not graded.",
        },
    ),
    "w2": Choice(
        "What does the autograder add to the cases a grade cell runs while you work?", 0,
        key="b",
        explain={
            "a": "If it ran only the public cases, hard-coding their answers would earn full marks. Reread 'How to get feedback'.",
            "b": "When your instructor autogrades the submission, the same grade cell also runs hidden, randomized cases, so an answer that only fits the visible cases earns less. A function that is right in general passes them as well. (Lesson 00, 'How to get feedback'.)",
            "c": "Nothing is compared with your classmates; every answer is checked against coursekit's reference.",
            "d": "The autograder does not grade style or timing; it runs the same checks plus hidden cases.",
        },
    ),
    "w3": Choice(
        "A lesson's prose says 'the maximum error is 0.07'. Where does that number come from?", 0,
        key="a",
        explain={
            "a": "Every number quoted in the prose is computed by a code cell and checked by an assert against what the cell computes. When CI re-runs the notebook, a stale number fails the build instead of drifting silently. (Lesson 00, 'How this course works'.)",
            "b": "A number copied from a paper or a document is exactly what this course avoids; versions change.",
            "c": "Nothing is typed in by hand; if it were, nbval could not catch a stale number.",
            "d": "The grader checks your answers, not the prose; the prose is checked by asserts when nbval runs the notebook.",
        },
    ),
    # Practice
    "p1": Choice(
        "Which op has no CPU kernel in bitsandbytes 0.50.2 and so runs the pure-torch default on CPU?", 1,
    ),
    "p2": Choice(
        "In 'dequantize_4bit falls back to pure torch', what does 'fall back' mean?", 1,
    ),
    "p3": Numeric(
        "How many CPU threads does torch use for its kernels on this machine?", 1, name="answer_p3",
        expected=_torch_threads, rtol=0, atol=0, mistakes=_thread_mistakes, unit="threads", machine=True,
    ),
    "p4": Function(
        "Implement nibble_pack(codes): two 4-bit codes per byte, as bitsandbytes packs them", 3, name="nibble_pack",
        reference=nibble_pack, public=_pack_cases, hidden=_pack_hidden, mistakes=_pack_mistakes, extra=_pack_dtype,
        rtol=0, atol=0,
    ),
    "p5": Choice(
        "On this machine, which implementation dequantizes an NF4 weight of shape (4, 63), blocksize 64?", 1,
    ),
    "p6": Numeric(
        "How many bytes do the packed 4-bit codes of a 576 × 1536 weight take (absmax not counted)?", 1,
        name="answer_p6", expected=_packed_bytes, rtol=0, atol=0, mistakes=_packed_mistakes, unit="bytes",
    ),
    "p7": Ordering(
        "Put the five parts of a lesson in order", 1,
        labels={
            "further": "Going further",
            "know": "Know this",
            "practice": "Practice",
            "reps": "Real-world reps",
            "warmup": "Warm-up",
        },
    ),
}
