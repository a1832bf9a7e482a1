"""Graded items of lesson 00, "Setup and probes" (solutions/00-setup-and-probes).

Choice and ordering keys live in the instructor's ``autograder/keys/00.json``; numeric answers are computed here; the implement item
``p4`` is checked against :func:`version_order` (the packaging library's version order).
"""

from __future__ import annotations

import numpy as np

from ...probes import nibble_pack
from ..checkers import Case, Mistake
from .. import Choice, Function, Numeric, Ordering

# --------------------------------------------------------------------------- p3: dequantizations in one step


def _dequant_count(n_weights: int = 2, first_input_needs_grad: bool = False) -> float:
    """How many times ``dequantize_4bit`` rebuilds a frozen 4-bit weight in one forward and one backward pass through
    ``n_weights`` frozen NF4 projections in a row, each with a trainable LoRA adapter beside it.

    bitsandbytes' ``MatMul4Bit`` (``bitsandbytes/autograd/_functions.py``) dequantizes once in forward (inside the
    default ``gemm_4bit``) and once more in backward only when its input needs a gradient (``ctx.needs_input_grad``):
    the adapter's gradients never need W. Every input after the first needs one (the adapters below train through
    it); the first is data. tests/test_lesson00_items.py counts the native calls on this machine and compares."""
    return float(n_weights + (n_weights - 1) + int(first_input_needs_grad))


def _dequant_mistakes() -> list[Mistake]:
    return [
        Mistake("every weight twice", 4, "that dequantizes W₁ in backward too. Backward rebuilds a weight only to pass "
                                         "the gradient on to its input; x is data and needs none, and adapter₁'s own "
                                         "gradients need x and the gradient at h, never W₁ (Know this: 'Which "
                                         "implementation runs each 4-bit op, and why it matters')."),
        Mistake("forward only", 2, "that counts the forward pass only. The float weight is not kept between the passes, "
                                   "and adapter₁ trains through h, so backward must rebuild W₂ to form h's gradient "
                                   "(Know this: 'Which implementation runs each 4-bit op, and why it matters')."),
        Mistake("backward only", 1, "the forward pass rebuilds both weights first (the default gemm_4bit dequantizes, "
                                    "then calls F.linear); add those two (Know this: 'Which implementation runs each "
                                    "4-bit op, and why it matters')."),
    ]


# --------------------------------------------------------------------------- p4: compare_versions


def version_order(a: str, b: str) -> int:
    """00.p4's reference: −1 if release ``a`` comes before release ``b``, 0 if they are the same release, 1 if ``a``
    comes after. Versions are dot-separated numbers, compared part by part as numbers, a missing part counting as 0;
    a local label after "+" (torch's "2.13.0+cpu") names a build, not a release, and is left out. The packaging
    library's ``Version`` (the order pip uses) decides; tests/test_lesson00_items.py checks a by-hand rule against it."""
    from packaging.version import Version

    va, vb = Version(a.split("+")[0]), Version(b.split("+")[0])
    return int(va > vb) - int(va < vb)


def _parts(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split("."))


def _sign(x, y) -> int:
    return int(x > y) - int(x < y)


def _strings_compared(a: str, b: str) -> int:
    return _sign(a, b)


def _unpadded(a: str, b: str) -> int:
    return _sign(_parts(a), _parts(b))


def _patch_ignored(a: str, b: str) -> int:
    return _sign(_parts(a)[:2], _parts(b)[:2])


def _label_ordered(a: str, b: str) -> int:
    """The packaging library's order on the strings as they are: it sorts a local label (+cpu) after the bare release,
    so a library answer that does not leave the label out gets the same release wrong."""
    from packaging.version import Version

    va, vb = Version(a), Version(b)
    return int(va > vb) - int(va < vb)


def _version_cases() -> list[Case]:
    return [
        Case({"a": "0.50.2", "b": "0.45.0"}, "a later minor release"),
        Case({"a": "0.50.2", "b": "0.50.2"}, "the very version"),
        Case({"a": "0.9.1", "b": "0.10.0"}, "0.9 comes before 0.10"),
        Case({"a": "2.13.0+cpu", "b": "2.9.1"}, "torch's local label +cpu"),
        Case({"a": "0.45", "b": "0.45.0"}, "a missing part counts as 0"),
        Case({"a": "0.50.1", "b": "0.50.2"}, "an earlier patch release"),
        Case({"a": "2.5+cpu", "b": "2.5.0"}, "a +cpu build of 2.5 is release 2.5.0"),
    ]


def _version_hidden(rng: np.random.Generator) -> list[Case]:
    cases = []
    for k in range(8):
        a = [int(rng.integers(0, 3)), int(rng.integers(1, 20)), 0 if k % 4 == 3 else int(rng.integers(0, 12))]
        b = list(a)
        b[1 + k % 2] = max(b[1 + k % 2] + int(rng.choice([-1, 1])) * int(rng.integers(1, 9)), 0)  # minor or patch moves
        va, vb = ".".join(map(str, a)), ".".join(map(str, b))
        if k % 4 == 3:
            va = va[:-2]                                                  # "1.14" for "1.14.0"
        if k % 3 == 1:
            va += "+cpu"
        cases.append(Case({"a": va, "b": vb} if k % 2 else {"a": vb, "b": va}))
    return cases


# Each message names the rule, never the case's versions: hidden cases show them as hints. "unpadded parts" comes
# first: where one case's answer equals two mistakes, the first listed is named unless other cases say otherwise.
_VERSION_MISTAKES = (
    ("unpadded parts", _unpadded,
     "your parts are numbers, but a version with fewer parts comes out smaller: (0, 45) < (0, 45, 0) for tuples. "
     "Count a missing part as 0 before comparing (Know this: 'Verify against your installed version')."),
    ("strings compared", _strings_compared,
     "you compared the version strings character by character, so \"0.9\" comes after \"0.10\" (the character 9 "
     "sorts after 1). Split at the dots and compare the parts as numbers (Know this: 'Verify against your installed "
     "version')."),
    ("label ordered", _label_ordered,
     "you let the label after + take part in the order, so a +cpu build came out after its own release. The packaging "
     "library's Version does that (it sorts a local label after the bare release); a label names a build, not a "
     "release: leave it out before comparing (Know this: 'Verify against your installed version')."),
    ("patch ignored", _patch_ignored,
     "you compared the first two numbers only, so a patch release (the third number) never counts, and fixes often "
     "arrive in one. Compare every part (Know this: 'Verify against your installed version')."),
)


def _version_mistakes(kwargs: dict, answers: dict) -> dict:
    right = version_order(**kwargs)
    ms = []
    for label, variant, msg in _VERSION_MISTAKES:
        try:
            got = variant(**kwargs)
        except ValueError:  # int("0+cpu"): that variant cannot answer this case
            continue
        if got != right:
            ms.append(Mistake(label, got, msg, hint=msg))
    return {"result": ms}


def _version_type(fn, case: Case) -> list[str] | None:
    got = fn(**dict(case.kwargs))
    if isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, np.integer)):
        return [f"the value is right but it is a {type(got).__name__}; return the int −1, 0 or 1."]
    return None


# --------------------------------------------------------------------------- p6: packed bytes


def _packed_bytes() -> float:
    d, m = 576, 1536  # SmolLM2-135M: hidden 576, intermediate 1536 (an up_proj weight)
    # bitsandbytes' QuantState: packed codes, two per byte, and one fp32 absmax per block of 64 weights.
    return float(nibble_pack(np.zeros(d * m, dtype=np.int64)).nbytes + (d * m // 64) * 4)


def _packed_mistakes() -> list[Mistake]:
    n = 576 * 1536
    read = "(Lesson 00, 'A 4-bit round trip on this CPU'.)"
    return [
        Mistake("codes only", n // 2, f"that is the packed codes alone; add one fp32 absmax (4 bytes) per block of 64 "
                                      f"weights. {read}"),
        Mistake("one-byte", n + (n // 64) * 4, f"that counts one byte per weight; a 4-bit code takes half a byte. {read}"),
        Mistake("absmax per 64 bytes", n // 2 + (n // 2 // 64) * 4, "that is one absmax per 64 bytes of codes; a block "
                                                                    f"is 64 weights, 32 bytes of codes. {read}"),
        Mistake("8-bit absmax", n // 2 + n // 64, "that stores each absmax in one byte, as double quantization does; "
                                                  f"without it each absmax is fp32, 4 bytes. {read}"),
        Mistake("bits", n * 4, "that is the number of bits of the codes (and also the fp32 size in bytes); a byte holds "
                               f"8 bits, two 4-bit codes. {read}"),
        Mistake("bf16", n * 2, "that is the bf16 size (2 bytes per weight)."),
    ]


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 7

ITEMS = {
    # Warm-up
    "w1": Choice(
        "What runs when a bitsandbytes op with no CPU kernel is called on a CPU tensor?", 0,
        key="d",
        explain={
            "a": "A missing CPU kernel is not an error: the dispatcher falls through to the op's default registration. (Lesson 00, 'Which implementation runs each 4-bit op, and why it matters'.)",
            "b": "The op does its work: the default implementation computes the same result as a native kernel would. (Lesson 00, 'Which implementation runs each 4-bit op, and why it matters'.)",
            "c": "Nothing moves to a GPU behind your back (there is none here); the op runs on the CPU, in its default implementation. (Lesson 00, 'Which implementation runs each 4-bit op, and why it matters'.)",
            "d": "The dispatcher picks the kernel registered for the tensor's device; when the CPU has none, the op's default registration runs: generic torch code that computes the same result, usually more slowly, and possibly different in the last bits. That is a fallback. (Lesson 00, 'Which implementation runs each 4-bit op, and why it matters'.)",
        },
    ),
    "w2": Choice(
        "How many levels does a 4-bit code address, and how many codes fit in a byte?", 0,
        key="a",
        explain={
            "a": "Four bits hold 2⁴ = 16 different values, so a code indexes a table of 16 levels, and a byte (8 bits) holds two codes, one per nibble: a packed 4-bit weight takes half a byte per value. (Lesson 00, 'A 4-bit round trip on this CPU'.)",
            "b": "Four bits hold 2⁴ = 16 values, not 4: the 4 is the number of bits. (Lesson 00, 'A 4-bit round trip on this CPU'.)",
            "c": "A byte has 8 bits, room for two 4-bit codes, not four. (Lesson 00, 'A 4-bit round trip on this CPU'.)",
            "d": "A 4-bit code has no separate sign bit: it is an index, and the table it indexes holds negative and positive levels. Two codes share a byte. (Lesson 00, 'A 4-bit round trip on this CPU'.)",
        },
    ),
    "w3": Choice(
        "How many threads do torch's CPU kernels use when os.cpu_count() and torch.get_num_threads() disagree?", 0,
        key="b",
        explain={
            "a": "A matmul runs on the same pool as every other kernel: torch sets the libraries its kernels call to its own count (torch.set_num_threads sets OpenMP's and, on x86, MKL's, the BLAS library behind a float32 matmul), and torch.__config__.parallel_info() prints omp_get_max_threads() and mkl_get_max_threads() equal to torch.get_num_threads(). So the matmul gets 2 threads, not 8. (Lesson 00, 'What is installed here'.)",
            "b": "torch runs its CPU kernels (matmuls, elementwise ops) on an intra-op thread pool whose size torch.get_num_threads() reports, and it sets the libraries they call (OpenMP, MKL) to the same count. It can be smaller than os.cpu_count(): torch counts physical cores, not hyperthreads; the process may be pinned to fewer cores (its CPU affinity); or OMP_NUM_THREADS may lower it. That is why the probe asks torch, not the OS. (Lesson 00, 'What is installed here'.)",
            "c": "Counting physical cores is one of the rules torch sizes its pool by, and torch.get_num_threads() reports the size that came out of them: 2 here, not a number to correct. torch takes OMP_NUM_THREADS (or MKL_NUM_THREADS) when one is set to fewer threads than the cores; unset, it takes the physical cores (not the hyperthreads os.cpu_count() also counts), and no more than the cores this process may run on (its CPU affinity, which taskset or a container's cpuset narrows). Ask torch, do not halve os.cpu_count(). (Lesson 00, 'What is installed here'.)",
            "d": "The global interpreter lock binds Python code, not torch's C++ kernels, which release it and run on torch's own thread pool. (Lesson 00, 'What is installed here'.)",
        },
    ),
    # Practice
    "p1": Choice(
        "For which of four calls on a weight with an odd last dimension does the probe's recorder see a native C++ "
        "function called?", 1, options="abcd",
        multi=True,
    ),
    "p2": Choice(
        "Which value of a block of 64 random weights comes back exactly from an NF4 round trip?", 1,
    ),
    "p3": Numeric(
        "How many times is a frozen 4-bit weight dequantized in one step through two adapted layers?", 1,
        name="answer_p3", expected=_dequant_count, rtol=0, atol=0, mistakes=_dequant_mistakes,
        unit="dequantizations",
        reread="Reread 'Which implementation runs each 4-bit op, and why it matters' in Know this.",
    ),
    "p4": Function(
        "Implement compare_versions(a, b): −1, 0 or 1 as release a comes before, is, or comes after release b", 3,
        name="compare_versions", reference=version_order, public=_version_cases, hidden=_version_hidden,
        mistakes=_version_mistakes, extra=_version_type, rtol=0, atol=0,
    ),
    "p5": Choice(
        "Which projections, given in x W notation with a blocksize and a CPU, does dequantize_4bit hand to the pure-torch code?", 1, options="abcd",
        multi=True,
    ),
    "p6": Numeric(
        "How many bytes do the packed codes and fp32 absmax of a 576 × 1536 NF4 weight take (blocksize 64)?", 1,
        name="answer_p6", expected=_packed_bytes, rtol=0, atol=0, mistakes=_packed_mistakes, unit="bytes",
        reread="Reread 'A 4-bit round trip on this CPU' in Know this.",
    ),
    "p7": Ordering(
        "Order four NF4 round trips of one weight by their mean error: blocksize 64 or 4096, with or without an outlier",
        1,
        labels={
            "big": "blocksize 4096",
            "big_outlier": "blocksize 4096, after one weight is set to 100",
            "small": "blocksize 64",
            "small_outlier": "blocksize 64, after one weight is set to 100",
        },
    ),
}
