"""Lesson 00's graded items: right answers score full, typical wrong answers score less and say why,
with and without the autograder's hidden cases; notebook points equal item points."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from coursekit.grading import check
from coursekit.grading.lessons.lesson00 import ITEMS

NB = Path(__file__).resolve().parents[1] / "solutions" / "00-setup-and-probes" / "00-setup-and-probes.ipynb"


def right_compare(a, b):
    """Right for P4: split at the dots (leaving out a local label after "+"), pad with 0, compare as numbers."""
    parts = lambda v: [int(x) for x in v.split("+")[0].split(".")]  # noqa: E731
    x, y = parts(a), parts(b)
    n = max(len(x), len(y))
    x, y = x + [0] * (n - len(x)), y + [0] * (n - len(y))
    return int(x > y) - int(x < y)


def strings_compare(a, b):
    """The classic slip: version strings compared as text, so "0.9" > "0.10"."""
    return int(a > b) - int(a < b)


def unpadded_compare(a, b):
    """Numbers, but tuples of different lengths: (0, 45) < (0, 45, 0)."""
    x, y = (tuple(int(p) for p in v.split("+")[0].split(".")) for v in (a, b))
    return int(x > y) - int(x < y)


def patch_ignored_compare(a, b):
    """Major and minor only: a patch release never counts."""
    x, y = (tuple(int(p) for p in v.split("+")[0].split("."))[:2] for v in (a, b))
    return int(x > y) - int(x < y)


def packaging_compare(a, b):
    """A library answer, allowed, that forgets the label rule: packaging sorts "2.5+cpu" after "2.5.0"."""
    from packaging.version import Version

    return int(Version(a) > Version(b)) - int(Version(a) < Version(b))


def packaging_label_dropped(a, b):
    """A library answer that follows the rules: the label left out, then packaging's order."""
    from packaging.version import Version

    va, vb = Version(a.split("+")[0]), Version(b.split("+")[0])
    return int(va > vb) - int(va < vb)


def bool_compare(a, b):
    """Answers "is a at least b?" instead of the order: a bool."""
    return right_compare(a, b) >= 0


def measured_dequantizations(first_input_needs_grad=False):
    """Count the native dequantize calls of one forward and backward through two frozen NF4 weights in a row, each
    with a trainable adapter beside it (00.p3's set-up), with the probe's recorder on bitsandbytes' CPU library."""
    import torch
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from coursekit import probes

    g = torch.Generator().manual_seed(0)
    (q1, s1), (q2, s2) = (F.quantize_4bit(torch.randn(64, 64, generator=g), blocksize=64, quant_type="nf4")
                          for _ in range(2))
    A1, A2 = (torch.randn(64, 4, generator=g).requires_grad_() for _ in range(2))
    B1, B2 = (torch.zeros(4, 64).requires_grad_() for _ in range(2))
    x = torch.randn(3, 64, generator=g).requires_grad_(first_input_needs_grad)
    calls, fallback = [], []
    with probes._spies(calls, fallback):
        h = bnb.matmul_4bit(x, q1.t(), quant_state=s1) + (x @ A1) @ B1
        y = bnb.matmul_4bit(h, q2.t(), quant_state=s2) + (h @ A2) @ B2
        y.sum().backward()
    assert B1.grad.abs().sum() > 0 and A2.grad is not None  # both adapters received their gradients
    return sum("dequantize" in c for c in calls) + len(fallback)


RIGHT = {
    "w1": "d", "w2": "a", "w3": "b", "p1": {"b", "d"}, "p2": "a", "p5": {"a", "d"},
    "p3": 3,
    "p4": right_compare,
    "p6": 576 * 1536 // 2 + 576 * 1536 // 64 * 4,
    "p7": ["small", "small_outlier", "big", "big_outlier"],
}

# item, wrong answer, text the feedback must contain
WRONG = [
    ("w1", "a", "not an error"),
    ("w1", "c", "Nothing moves to a GPU"),
    ("w2", "b", "not 4"),
    ("w2", "c", "two 4-bit codes, not four"),
    ("w3", "a", "same pool as every other kernel"),
    ("w3", "c", "not a number to correct"),
    ("w3", "d", "binds Python code, not torch's C++ kernels"),
    ("p1", {"b", "c", "d"}, "here it does not happen"),          # gemm_4bit read off the table's tiny tensor
    ("p1", {"d"}, "applies only to the codes"),                     # the fallback taken for the whole call
    ("p1", {"b"}, "quantizing has no such rule"),                   # the odd-dimension rule applied to quantizing
    ("p1", {"a", "b", "c", "d"}, "plain fp32 that need no rebuilding"),
    ("p2", "b", "rounds to the nearest level and moves"),
    ("p2", "c", "off by its own magnitude"),
    ("p2", "d", "the ends of the NF4 table"),
    ("p5", {"a", "c", "d"}, "Turn the x W shape into the stored one"),  # the x W shapes read as stored shapes
    ("p5", {"a", "b", "d"}, "holds only on AVX512 CPUs"),             # the blocksize rule applied on every CPU
    ("p5", {"a"}, "so 2048 itself falls back"),                      # the blocksize rule read as "more than 2048"
    ("p3", 4, "x is data and needs none"),
    ("p3", 2, "counts the forward pass only"),
    ("p3", 1, "rebuilds both weights first"),
    ("p6", 576 * 1536 // 2, "add one fp32 absmax"),
    ("p6", 576 * 1536 + 576 * 1536 // 64 * 4, "half a byte"),
    ("p6", 576 * 1536 // 2 + 576 * 1536 // 64, "as double quantization does"),
    ("p6", 576 * 1536 // 2 + 576 * 1536 // 128 * 4, "one absmax per 64 bytes"),
    ("p6", 576 * 1536 * 4, "number of bits"),
    ("p6", 576 * 1536 * 2, "bf16"),
    ("p6", "lots", "single number"),
    ("p7", ["small", "big", "small_outlier", "big_outlier"], "far more than one ruined block of 64"),
    ("p7", ["small_outlier", "small", "big", "big_outlier"], "63 weights out of 884,736"),
    ("p7", ["big_outlier", "small", "small_outlier", "big"], "ruins 4095 weights"),
    ("p4", strings_compare, "character by character"),
    ("p4", unpadded_compare, "Count a missing part as 0"),
    ("p4", patch_ignored_compare, "first two numbers only"),
    ("p4", bool_compare, "got bool"),
    ("p4", 42, "should be a function"),
]


def right(item):
    return RIGHT[item]


def test_p3_key_is_what_bitsandbytes_does_here():
    """The key counts what the installed bitsandbytes does: two forward dequantizations and one backward one (W₁'s
    input is data, so backward skips it); with an input that needs a gradient, W₁ is rebuilt in backward too."""
    from coursekit.grading.lessons.lesson00 import _dequant_count

    assert measured_dequantizations() == ITEMS["p3"].expected() == RIGHT["p3"] == 3
    assert measured_dequantizations(first_input_needs_grad=True) == _dequant_count(first_input_needs_grad=True) == 4


def recorded_native_calls():
    """00.p1's four calls, each run with the probe's recorder on bitsandbytes' native library: the native functions
    each one called on this machine, and whether dequantize_4bit handed its work to the torch fallback."""
    import torch
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from coursekit import probes

    g = torch.Generator().manual_seed(0)
    W = torch.randn(1536, 575, generator=g)                     # an odd last dimension
    q, st = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    q_dq, st_dq = F.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=True)
    x = torch.randn(3, 575, generator=g)
    runs = {
        "a": lambda: F.dequantize_4bit(q, st),
        "b": lambda: F.dequantize_4bit(q_dq, st_dq),
        "c": lambda: bnb.matmul_4bit(x, q.t(), quant_state=st),
        "d": lambda: F.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=True),
    }
    out = {}
    for letter, run in runs.items():
        ob = probes.observe_op(run)
        assert ob["error"] is None, ob
        out[letter] = ob
    return out


def test_p1_key_is_what_the_recorder_sees_here():
    """The key lists the calls whose recorded native functions are not empty: an odd last dimension sends
    dequantize_4bit's decoding to torch (a), also inside gemm_4bit's default (c), but a double-quantized absmax is
    still rebuilt by dequantize_blockwise's kernel first (b), and quantizing has no odd-dimension rule (d)."""
    import re

    from coursekit.grading.keys import load as key_file

    seen = recorded_native_calls()
    assert {k for k, ob in seen.items() if ob["native_calls"]} == RIGHT["p1"] == set(key_file("00")["keys"]["p1"])
    assert seen["a"]["native_calls"] == [] and seen["a"]["torch_fallback"]
    assert seen["c"]["native_calls"] == [] and seen["c"]["torch_fallback"]
    # double quantization: the nested absmax goes through dequantize_blockwise's kernel, the codes through torch
    assert seen["b"]["torch_fallback"] and all(re.match(r"cdequantize_blockwise_cpu_fp32", c) for c in seen["b"]["native_calls"])
    assert seen["d"]["native_calls"] and all(re.match(r"cquantize_blockwise_cpu_", c) for c in seen["d"]["native_calls"])
    assert not seen["d"]["torch_fallback"] and 575 % 2 == 1


P5_OPTIONS = {  # the options: x W shape (inputs × outputs), blocksize, whether the CPU has AVX512
    "a": ((576, 1536), 4096, True), "b": ((576, 1536), 4096, False),
    "c": ((1536, 575), 64, True), "d": ((4, 63), 2048, True),
}


def p5_fell_back(stored=True, avx512_rule=None, threshold=None):
    """The options whose dequantize_4bit, run under the probe's recorder, hands the work to torch. Each option is built
    as the nn.Linear it names and its stored weight (outputs × inputs) quantized at its blocksize, with bitsandbytes'
    ``_has_avx512`` set to the option's CPU (the kernel reads it at each call, so both CPUs run on any machine).
    The mistaken readings: ``stored=False`` quantizes the x W shape as if it were stored; ``avx512_rule`` forces the
    CPU flag for every option; ``threshold`` reads the rule as "more than 2048": an option at exactly that blocksize
    is run at half of it, below the rule, as that reader expects."""
    import torch
    import bitsandbytes.backends.cpu.ops as cpu_ops
    import bitsandbytes.functional as F
    from coursekit import probes

    saved, out = cpu_ops._has_avx512, set()
    try:
        for letter, ((d_in, d_out), blocksize, avx512) in P5_OPTIONS.items():
            weight = torch.nn.Linear(d_in, d_out, bias=False).weight.data
            assert tuple(weight.shape) == (d_out, d_in)
            w = weight if stored else weight.t().contiguous()
            cpu_ops._has_avx512 = avx512 if avx512_rule is None else avx512_rule
            q, st = F.quantize_4bit(w, blocksize=blocksize, quant_type="nf4")
            if threshold is not None and blocksize == threshold:
                q, st = F.quantize_4bit(w, blocksize=threshold // 2, quant_type="nf4")   # read as under the rule
            ob = probes.observe_op(lambda: F.dequantize_4bit(q, st))
            assert ob["error"] is None, ob
            if ob["torch_fallback"]:
                out.add(letter)
    finally:
        cpu_ops._has_avx512 = saved
    return out


def test_p5_key_is_what_dequantize_4bit_does():
    """P5's key, run: only the AVX512 blocksize rule (2048 or more, on an AVX512 CPU) sends an option to torch, since
    every stored last dimension is even. Each named wrong set is the mistaken reading run the same way."""
    from coursekit.grading.keys import load as key_file

    assert p5_fell_back() == RIGHT["p5"] == set(key_file("00")["keys"]["p5"]) == {"a", "d"}
    for wrong, text in (({"stored": False}, "Turn the x W shape into the stored one"),
                        ({"avx512_rule": True}, "holds only on AVX512 CPUs"),
                        ({"threshold": 2048}, "so 2048 itself falls back")):
        got = p5_fell_back(**wrong)
        assert got != RIGHT["p5"], wrong
        fb = check("00.p5", got)
        assert not fb.full and text in fb.text(), (wrong, got, fb.text())
    assert p5_fell_back(stored=False) == {"a", "c", "d"}
    assert p5_fell_back(avx512_rule=True) == {"a", "b", "d"}
    assert p5_fell_back(threshold=2048) == {"a"}


def round_trip_blocks(seed=0, n_blocks=2000):
    import torch
    import bitsandbytes.functional as F

    W = torch.randn(n_blocks * 64, generator=torch.Generator().manual_seed(seed))
    q, st = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    return W.reshape(-1, 64), F.dequantize_4bit(q, st).reshape(-1, 64), st


@pytest.mark.parametrize("seed", [0, 1])
def test_p2_key_is_the_value_that_comes_back_exactly(seed):
    """In every block exactly one value comes back bit for bit, the one of largest magnitude (±1 × absmax: ±1 are the
    NF4 table's ends); the value closest to the block's mean and the smallest one never do, and the smallest one
    nearly always comes back as 0.0."""
    import torch

    from coursekit.grading.keys import load as key_file

    W, W_hat, st = round_trip_blocks(seed)
    assert (W != 0).all()
    exact = W == W_hat
    assert exact.sum(1).eq(1).all()
    pick = lambda idx: exact.gather(1, idx[:, None]).squeeze(1)  # noqa: E731
    assert pick(W.abs().argmax(1)).all()
    assert not pick((W - W.mean(1, keepdim=True)).abs().argmin(1)).any()
    smallest = W.abs().argmin(1)
    assert not pick(smallest).any()
    assert (W_hat.gather(1, smallest[:, None]) == 0).double().mean() > 0.98  # "nearly always the level 0"
    assert st.code.min().item() == -1.0 and st.code.max().item() == 1.0 and (st.code == 0).sum() == 1
    assert RIGHT["p2"] == key_file("00")["keys"]["p2"] == "a"


def mean_errors(seed=0, outlier_at=(700, 300)):
    """00.p7's four round trips of one 1536 × 576 standard normal weight: mean |W_hat − W|, and the mean absmax of
    each blocksize."""
    import torch
    import bitsandbytes.functional as F

    W = torch.randn(1536, 576, generator=torch.Generator().manual_seed(seed))
    W_out = W.clone()
    W_out[outlier_at] = 100.0
    errors, absmax = {}, {}
    for size, bs in (("small", 64), ("big", 4096)):
        for suffix, Wt in (("", W), ("_outlier", W_out)):
            q, st = F.quantize_4bit(Wt, blocksize=bs, quant_type="nf4")
            errors[size + suffix] = (F.dequantize_4bit(q, st) - Wt).abs().double().mean().item()
            if not suffix:
                absmax[bs] = st.absmax.mean().item()
    return errors, absmax


@pytest.mark.parametrize("seed,outlier_at", [(0, (700, 300)), (1, (0, 0)), (2, (1535, 575))])
def test_p7_key_is_the_measured_order_of_mean_errors(seed, outlier_at):
    """The key orders the four round trips by their measured mean error, whatever the seed and wherever the outlier
    sits; the hints' numbers (mean absmax about 2.6 and 3.8, 63 and 4095 ruined weights among 884,736) are measured
    here too."""
    import torch
    import bitsandbytes.functional as F

    from coursekit.grading.keys import load as key_file

    errors, absmax = mean_errors(seed, outlier_at)
    assert sorted(errors, key=errors.get) == RIGHT["p7"] == key_file("00")["keys"]["p7"]
    assert abs(absmax[64] - 2.6) < 0.1 and abs(absmax[4096] - 3.8) < 0.1
    assert 1536 * 576 == 884_736
    # The outlier is its block's absmax and comes back exactly; the rest of its block (63 or 4095 weights) is ruined.
    for bs, ruined in ((64, 63), (4096, 4095)):
        W = torch.randn(1536, 576, generator=torch.Generator().manual_seed(seed))
        W[outlier_at] = 100.0
        q, st = F.quantize_4bit(W, blocksize=bs, quant_type="nf4")
        flat = outlier_at[0] * 576 + outlier_at[1]
        block = slice(flat // bs * bs, flat // bs * bs + bs)
        W_hat = F.dequantize_4bit(q, st).reshape(-1)[block]
        orig = W.reshape(-1)[block]
        assert W_hat.numel() - 1 == ruined and (W_hat == 100.0).sum() == 1
        # every other weight lands on one of the three levels nearest 0, times 100
        assert (W_hat[orig != 100.0].abs() < 0.1 * 100).all()


def test_every_item_has_a_right_answer_here():
    assert set(ITEMS) == set(RIGHT)


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item", sorted(RIGHT))
def test_right_answers_score_full(item, hidden):
    fb = check(f"00.{item}", right(item), hidden=hidden)
    assert fb.full, fb.text()
    assert fb.points == ITEMS[item].points


@pytest.mark.parametrize("hidden", [False, True])
@pytest.mark.parametrize("item,answer,text", WRONG)
def test_wrong_answers_score_less_and_teach(item, answer, text, hidden):
    fb = check(f"00.{item}", answer, hidden=hidden)
    assert not fb.full, fb.text()
    assert text in fb.text(), fb.text()


def test_p4_hidden_cases_catch_a_hard_coded_answer():
    from coursekit.grading.lessons.lesson00 import _version_cases

    table = {(c.kwargs["a"], c.kwargs["b"]): right_compare(**c.kwargs) for c in _version_cases()}

    def hard_coded(a, b):
        return table.get((a, b), 0)

    public = check("00.p4", hard_coded, hidden=False)
    graded = check("00.p4", hard_coded, hidden=True)
    assert public.full
    assert graded.points < ITEMS["p4"].points * 0.9, graded.text()
    assert "hidden case" in graded.text()


def test_p4_key_is_the_packaging_order_and_the_by_hand_rule():
    """The reference is packaging's Version order (what pip uses) with the local label left out; the by-hand rule of the
    model solution agrees with it on every public and hidden case, on random versions and on the installed torch and
    bitsandbytes, and the lesson's questions come out as the prose expects (0.50.2 has a 0.45.0 fix, torch is past 2.5)."""
    import bitsandbytes
    import torch

    from coursekit.grading.lessons.lesson00 import _version_cases, _version_hidden, version_order

    rng = np.random.default_rng(0)
    cases = [c.kwargs for c in _version_cases()] + [c.kwargs for seed in range(5)
                                                    for c in _version_hidden(np.random.default_rng(seed))]
    for _ in range(300):
        cases.append({k: ".".join(str(int(x)) for x in rng.integers(0, 12, size=int(rng.integers(1, 4))))
                      + ("+cpu" if rng.random() < 0.3 else "") for k in ("a", "b")})
    cases += [{"a": torch.__version__, "b": "2.5"}, {"a": bitsandbytes.__version__, "b": "0.45.0"}]
    for kw in cases:
        assert version_order(**kw) == right_compare(**kw), kw
    assert version_order(bitsandbytes.__version__, "0.45.0") == 1 and version_order(torch.__version__, "2.5") == 1
    hidden = [c.kwargs for c in _version_hidden(np.random.default_rng(1))]
    assert {version_order(**kw) for kw in hidden} >= {-1, 1} and any("+" in kw["a"] + kw["b"] for kw in hidden)


@pytest.mark.parametrize("fn,label", [(strings_compare, "strings compared"), (unpadded_compare, "unpadded parts"),
                                      (patch_ignored_compare, "patch ignored"), (packaging_compare, "label ordered")])
def test_p4_each_mistaken_variant_is_named(fn, label):
    """Each named mistake is what that mistaken variant, run as a student's function, actually returns: the feedback
    names it, with and without the hidden cases, and the variant loses points."""
    for hidden in (False, True):
        fb = check("00.p4", fn, hidden=hidden)
        assert not fb.full and label in fb.mistakes, (label, fb.mistakes, fb.text())


def test_p4_a_library_answer_is_held_to_the_same_rules():
    """The task allows a library (nothing could check that it is not used) and asks for its rules: packaging's Version
    on the raw strings orders the +cpu label and loses the public case that shows it, with the reason; the same
    library with the label left out scores full."""
    for hidden in (False, True):
        fb = check("00.p4", packaging_compare, hidden=hidden)
        assert 0 < fb.points < ITEMS["p4"].points and fb.mistakes == ["label ordered"], fb.text()
        assert "leave it out before comparing" in fb.text() and "+cpu build of 2.5" in fb.text(), fb.text()
        assert check("00.p4", packaging_label_dropped, hidden=hidden).full


def test_p4_stub_scores_zero():
    def stub(a, b):
        raise NotImplementedError()

    fb = check("00.p4", stub, hidden=True)
    assert fb.points == 0 and "NotImplementedError" in fb.text()


def test_notebook_points_match_items():
    nb = json.loads(NB.read_text())
    graded = {}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("grade"):
            src = "".join(cell["source"])
            item = src.split('grade("00.')[1].split('"')[0]
            graded[item] = meta["points"]
            assert meta["grade_id"] == f"{item}_test" and meta["locked"]
            assert src.count("grade(") == 1, "a test cell is one call (after its import)"
    assert graded == {k: v.points for k, v in ITEMS.items()}
    assert not any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


def test_w3_explanations_are_what_torch_does_here():
    """W3's key and explanations, each measured in a fresh interpreter: torch's intra-op pool follows OMP_NUM_THREADS or
    MKL_NUM_THREADS set lower than the cores, and the process's CPU affinity (taskset), while os.cpu_count() still counts
    every core (c); and whatever sets the pool, or torch.set_num_threads, the libraries under its kernels (OpenMP, and
    MKL, which computes a float32 matmul in torch's x86 builds) report the same count (a, b), as the lesson's cell
    reads them from torch.__config__.parallel_info()."""
    import os
    import shutil
    import subprocess
    import sys

    probe = ("import os, re, sys, torch\n"
             "if len(sys.argv) > 1: torch.set_num_threads(int(sys.argv[1]))\n"
             "libs = re.findall(r'(\\w+)_get_max_threads\\(\\) : (\\d+)', torch.__config__.parallel_info())\n"
             "print(os.cpu_count(), torch.get_num_threads(), *(f'{k}={v}' for k, v in libs))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}

    def run(*args, prefix=(), **extra):
        out = subprocess.run([*prefix, sys.executable, "-c", probe, *args], env={**env, **extra}, capture_output=True,
                             text=True, check=True).stdout.split()
        n_os, n_torch, libs = int(out[0]), int(out[1]), dict(o.split("=") for o in out[2:])
        assert "omp" in libs and all(int(v) == n_torch for v in libs.values()), out   # OpenMP (and MKL): torch's count
        return n_os, n_torch, libs

    n_os, n_torch, libs = run()
    assert 1 <= n_torch <= n_os
    if "BLAS_INFO=mkl" in __import__("torch").__config__.show():
        assert "mkl" in libs                    # the float32 matmul's BLAS is MKL here, and it has torch's count
    assert run(OMP_NUM_THREADS="1")[:2] == (n_os, 1)
    assert run(MKL_NUM_THREADS="1")[:2] == (n_os, 1)
    assert run("1")[:2] == (n_os, 1)            # torch.set_num_threads(1) sets OpenMP's and MKL's count too
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1:
        core = min(os.sched_getaffinity(0))
        # pinned to one core: os.cpu_count() unchanged, torch and its libraries use one thread
        assert run(prefix=("taskset", "-c", str(core)))[:2] == (n_os, 1)
    explain = ITEMS["w3"].explain
    assert ITEMS["w3"].key == RIGHT["w3"] == "b"
    assert "OMP_NUM_THREADS" in explain["c"] and "CPU affinity" in explain["c"] and "cgroup" not in explain["c"]
    assert "parallel_info()" in explain["a"] and "MKL" in explain["a"]


def test_gemv_4bit_computes_in_bf16_whatever_the_input_dtype():
    """The lesson (and the glossary): the fused CPU gemv_4bit kernel exists only with AVX512-BF16, and an fp32 input is
    cast to bf16 and the result back, so its fp32 output is exactly its bf16 output, widened."""
    import torch
    import bitsandbytes.functional as F

    registered = torch._C._dispatch_has_kernel_for_dispatch_key("bitsandbytes::gemv_4bit", "CPU")
    assert registered == F.has_avx512bf16()
    if not registered:
        pytest.skip("no AVX512-BF16 here: gemv_4bit has no CPU kernel")
    g = torch.Generator().manual_seed(0)
    q, st = F.quantize_4bit(torch.randn(64, 128, generator=g), blocksize=64, quant_type="nf4")
    x = torch.randn(1, 128, generator=g)
    run = lambda a: torch.ops.bitsandbytes.gemv_4bit(a, q, st.shape, st.absmax, st.code, st.blocksize)  # noqa: E731
    out32, out16 = run(x), run(x.to(torch.bfloat16))
    assert out32.dtype == torch.float32 and out16.dtype == torch.bfloat16
    assert torch.equal(out32, out16.float())


def test_self_test_paragraph_names_the_probe_cases():
    """The paragraph 'Native does not mean right' names the self-test's bad cases by their shapes and blocksizes."""
    from coursekit import probes

    assert probes.BAD_CASE["shape"] == (5, 80) and probes.BAD_CASE["blocksize"] == 64
    assert probes.LARGER_BLOCK_CASE["shape"] == (576, 576) and probes.LARGER_BLOCK_CASE["blocksize"] == 128
    text = NB.read_text()
    assert "a 5 × 80 weight" in text and "576 × 576 one at blocksize 128" in text
