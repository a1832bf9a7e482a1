"""The memory ledger: persistent training tensors, counted in bytes, one bucket at a time.

A single headline number hides where memory goes; a ledger splits it into buckets (lesson 17,
"the memory ledger")::

    bucket          full fine-tuning      LoRA                 QLoRA
    base_weights    N · 2 B (bf16)        N · 2 B (bf16)       N · 0.5 B (4-bit codes)
    base_grads      N · 2 B (bf16)        0 (frozen)           0 (frozen)
    base_moments    N · 2 · 4 B (Adam)    0 (frozen)           0 (frozen)
    adapter         0 (no adapter)        a · (2 + 2 + 2·4) B  a · (2 + 2 + 2·4) B

N is the base parameter count and a the adapter's. Adam (and AdamW) keeps two moment buffers per
trainable parameter (Kingma & Ba 2015), assumed fp32 here; weights and gradients are bf16. For
N = 7e9 and a = 20e6 this gives the partial totals lesson 17 quotes: 84 GB, 14.24 GB and 3.74 GB.

Units: every function returns **bytes** (floats, because a 4-bit code is half a byte); GB means
decimal gigabytes, 1 GB = 1e9 bytes, as in lesson 17. The totals are deliberately partial: they leave
out activations, quantization metadata (see :func:`nf4_metadata_bytes`), fp32 master copies,
attention buffers, temporary dequantized weights, kernel workspace and allocator overhead.

Measured buckets (lesson 17): :func:`tensor_bytes` (persistent tensors, each storage once),
:func:`optimizer_state_bytes` (AdamW's moments after a step), :class:`SavedTensors` /
:func:`saved_activation_bytes` (what autograd saves for backward, deterministic) and
:func:`peak_rss_delta` (the process's peak resident growth, noisy).
"""

from __future__ import annotations

import math
import threading
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

if TYPE_CHECKING:  # torch is imported lazily: the ledger itself is plain arithmetic
    import torch

__all__ = [
    "GB",
    "METHODS",
    "BUCKETS",
    "BYTES_PER_PARAM",
    "ledger",
    "total",
    "to_gb",
    "nf4_metadata_bytes",
    "tensor_bytes",
    "SavedTensors",
    "saved_activation_bytes",
    "optimizer_state_bytes",
    "peak_rss_delta",
    "hwm_sees_freed_peaks",
    "resident_bytes",
]

GB = 1e9
"""Bytes in one decimal gigabyte (the ledger's unit)."""

METHODS = ("full", "lora", "qlora")
"""Training methods the ledger knows: full fine-tuning, LoRA on a 16-bit base, QLoRA on a 4-bit base."""

BUCKETS = ("base_weights", "base_grads", "base_moments", "adapter")
"""Ledger buckets, in the order of the module docstring's table."""

BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "nf4": 0.5, "fp4": 0.5}
"""Storage bytes of one value in each format (4-bit formats pack two codes into a byte)."""


def _count(name: str, value: object) -> float:
    """A parameter count: a finite, non-negative real number (7e9 is accepted as well as 7_000_000_000)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number of parameters, got {type(value).__name__} {value!r}.")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite, non-negative parameter count, got {value!r}.")
    return v


def _method(method: object) -> str:
    m = method.strip().lower() if isinstance(method, str) else method
    if m not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(repr(x) for x in METHODS)}.")
    return m


def ledger(
    n_params: float,
    n_adapter: float = 0,
    method: str = "lora",
    *,
    weight_bytes: float = 2.0,
    grad_bytes: float = 2.0,
    moment_bytes: float = 4.0,
    n_moments: int = 2,
    code_bits: float = 4.0,
) -> dict[str, float]:
    """Bytes of the persistent training tensors, by bucket (the module docstring's table; lesson 17).

    Args:
        n_params: parameters in the base model, N (e.g. 7e9).
        n_adapter: trainable adapter parameters, a (e.g. 20e6). Ignored for ``"full"``: full
            fine-tuning trains the base itself and has no adapter (its adapter bucket is 0).
        method: ``"full"``, ``"lora"`` or ``"qlora"`` (case-insensitive).
        weight_bytes: bytes per stored 16-bit weight (base under full/LoRA, adapter always); 2 for bf16.
        grad_bytes: bytes per gradient entry of a trainable parameter; 2 for bf16.
        moment_bytes: bytes per optimizer moment entry; 4 for fp32.
        n_moments: optimizer buffers per trainable parameter; 2 for Adam/AdamW (m and v).
        code_bits: bits per base weight under QLoRA; 4 for NF4 (QLoRA, Dettmers et al. 2023,
            arXiv:2305.14314). Block scales are *not* included: see :func:`nf4_metadata_bytes`.

    Returns:
        ``{"base_weights", "base_grads", "base_moments", "adapter"}`` → bytes (float). The adapter
        bucket holds its weights, gradients and moments: ``a · (weight + grad + n_moments · moment)``.

    Raises:
        TypeError: a count is not a number. ValueError: a negative or non-finite count, or an
        unknown method.

    Example: ``ledger(7e9, 20e6, "qlora")`` → base_weights 3.5e9, adapter 0.24e9 (3.74 GB in all).
    """
    n = _count("n_params", n_params)
    a = _count("n_adapter", n_adapter)
    m = _method(method)
    for name, v in (("weight_bytes", weight_bytes), ("grad_bytes", grad_bytes), ("moment_bytes", moment_bytes),
                    ("n_moments", n_moments), ("code_bits", code_bits)):
        _count(name, v)
    optimizer_bytes = n_moments * moment_bytes
    if m == "full":
        return {
            "base_weights": n * weight_bytes,
            "base_grads": n * grad_bytes,
            "base_moments": n * optimizer_bytes,
            "adapter": 0.0,
        }
    # LoRA and QLoRA freeze the base: no gradient and no optimizer state for it.
    base = n * weight_bytes if m == "lora" else n * code_bits / 8
    return {
        "base_weights": base,
        "base_grads": 0.0,
        "base_moments": 0.0,
        "adapter": a * (weight_bytes + grad_bytes + optimizer_bytes),
    }


def total(buckets: Mapping[str, float]) -> float:
    """The partial total of a ledger, in bytes (the ledger's "partial total": what it leaves out is listed in the module docstring)."""
    return float(sum(buckets.values()))


def to_gb(n_bytes: float) -> float:
    """Bytes → decimal gigabytes (1 GB = 1e9 bytes)."""
    return float(n_bytes) / GB


def nf4_metadata_bytes(n_params: float, blocksize: int = 64, double_quant: bool = True, blocksize2: int = 256) -> float:
    """Bytes of NF4 block scales (the "+ quantization metadata" the QLoRA partial total leaves out).

    Without double quantization each block of ``blocksize`` weights keeps one fp32 absmax: 32/64 =
    0.5 extra bits per weight. With it (QLoRA, arXiv:2305.14314, section 3), the absmax values are
    themselves quantized to 8 bits, with one fp32 constant per ``blocksize2`` of them: 8/64 +
    32/(64·256) ≈ 0.127 extra bits per weight. The parameters are treated as one flat tensor
    (real models block each tensor separately, which adds a few partial blocks).

    Returns bytes (float). Raises ValueError on a negative count or a non-positive block size.
    """
    n = _count("n_params", n_params)
    for name, b in (("blocksize", blocksize), ("blocksize2", blocksize2)):
        if isinstance(b, bool) or not isinstance(b, Integral) or b <= 0:
            raise ValueError(f"{name} must be a positive integer, got {b!r}.")
    blocks = math.ceil(n / blocksize)
    if not double_quant:
        return 4.0 * blocks
    return 1.0 * blocks + 4.0 * math.ceil(blocks / blocksize2)


# --------------------------------------------------------------------------- measured buckets


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held by ``tensors``, each underlying storage once (a view of a bigger tensor counts its whole storage).

    Args: any iterable of torch tensors (parameters, buffers, optimizer state...). Returns bytes (int).
    Source: ``Tensor.untyped_storage().nbytes()``; two tensors share memory iff they share a storage.
    """
    import torch

    seen: dict[tuple[int, int], int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
            k = _storage_key(t)
            seen[k] = k[1]
    return int(sum(seen.values()))


def _exclusion_keys(exclude: object) -> set[tuple[int, int]]:
    import torch

    if exclude is None:
        return set()
    items = exclude if isinstance(exclude, (list, tuple, set)) else [exclude]
    keys: set[tuple[int, int]] = set()
    for x in items:
        if isinstance(x, torch.nn.Module):
            tensors = [*x.parameters(), *x.buffers()]
        elif isinstance(x, torch.Tensor):
            tensors = [x]
        else:
            raise TypeError(f"exclude takes modules or tensors, got {type(x).__name__}")
        keys |= {_storage_key(t) for t in tensors if t.untyped_storage().nbytes() > 0}
    return keys


class SavedTensors:
    """What autograd saved for backward while the context was open, counted by unique storage.

    Use as ``with memory.SavedTensors(exclude=model) as saved: loss = model(**batch).loss``; then
    ``saved.nbytes`` is the bytes of every distinct storage that some operation saved for its backward
    (activations: layer inputs, softmax outputs, masks...), ``saved.n_saved`` the number of saves (one
    storage saved by two operations counts once in ``nbytes``, twice in ``n_saved``) and
    ``saved.by_dtype`` the bytes per dtype; ``saved.largest(k)`` lists the biggest. Storages of
    ``exclude`` (modules: their parameters and buffers; or tensors) are left out: a frozen weight that a
    matmul saves to form its input gradient is already counted with the weights. Units: bytes (int).
    Deterministic for a fixed model and batch (no allocator involved). The numbers are final when the
    context exits (``nbytes`` is 0 inside it).

    How: ``torch.autograd.graph.saved_tensors_hooks`` calls a pack hook for every tensor an autograd
    node saves (``ctx.save_for_backward`` and built-in ops); storages are identified by their data
    pointer and held until the context exits, so a freed address cannot be counted twice.
    Gradient checkpointing (``torch.utils.checkpoint``, reentrant or not) shows up as what it keeps:
    the inputs of each checkpointed region, which torch saves with ``save_for_backward``; the saves
    inside a region go to checkpoint's own hooks or happen under ``no_grad`` (hooks nest: only the
    innermost context sees a save). Not seen: tensors a custom ``autograd.Function`` keeps as plain
    ``ctx`` attributes (bitsandbytes' ``MatMul4Bit`` keeps only its packed weight that way, which is a
    parameter anyway).
    """

    def __init__(self, exclude: object = None) -> None:
        import torch

        self._exclude = _exclusion_keys(exclude)
        self._storages: dict[tuple[int, int], torch.UntypedStorage] = {}
        self._dtypes: dict[tuple[int, int], torch.dtype] = {}
        self._shapes: dict[tuple[int, int], tuple[int, ...]] = {}
        self.n_saved = 0
        self.nbytes = 0
        self.by_dtype: dict[str, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.n_saved += 1
        try:
            k = _storage_key(t)
        except (NotImplementedError, RuntimeError):  # sparse or other storage-less tensors: not counted
            return t
        if k[1] > 0:
            if k not in self._exclude and k not in self._storages:
                self._storages[k] = t.untyped_storage()
                self._dtypes[k] = t.dtype
                self._shapes[k] = tuple(t.shape)
        return t

    def __enter__(self) -> "SavedTensors":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        self.nbytes = int(sum(k[1] for k in self._storages))
        by: dict[str, int] = {}
        for k, dt in self._dtypes.items():
            name = str(dt).replace("torch.", "")
            by[name] = by.get(name, 0) + k[1]
        self.by_dtype = by
        self._storages.clear()  # release the references; the graph keeps what backward needs

    def __repr__(self) -> str:
        return f"SavedTensors(nbytes={self.nbytes:,}, n_storages={self.n_storages}, n_saved={self.n_saved})"

    @property
    def n_storages(self) -> int:
        """Distinct storages saved (after exclusion)."""
        return len(self._dtypes)

    def largest(self, k: int = 5) -> list[tuple[int, tuple[int, ...], str]]:
        """The ``k`` largest saved storages as ``(bytes, shape of the first tensor saved from it, dtype)``."""
        rows = [(key[1], self._shapes[key], str(self._dtypes[key]).replace("torch.", "")) for key in self._dtypes]
        return sorted(rows, key=lambda r: -r[0])[:k]


def saved_activation_bytes(fn: Callable[[], Any], exclude: object = None) -> tuple[Any, int]:
    """Run ``fn()`` and count the bytes autograd saved for backward (see :class:`SavedTensors`).

    Returns ``(fn(), bytes)``: keep the result (e.g. the loss) alive if you want to call backward on it.
    """
    with SavedTensors(exclude=exclude) as saved:
        out = fn()
    return out, saved.nbytes


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state`` (AdamW: ``exp_avg``, ``exp_avg_sq`` and the ``step`` counter).

    The state is created lazily at the first ``step()``: before it, this is 0. Units: bytes (int).
    """
    return tensor_bytes(v for st in optimizer.state.values() for v in st.values() if hasattr(v, "untyped_storage"))


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB (KiB)
    except OSError:
        return None
    return None


def resident_bytes() -> int | None:
    """This process's resident memory now (``VmRSS`` in ``/proc/self/status``), in bytes; None off Linux."""
    return _proc_status_bytes("VmRSS")


def _reset_high_water_mark() -> bool:
    """Write ``5`` to ``/proc/self/clear_refs`` (Linux: reset ``VmHWM`` to the current ``VmRSS``); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


_CALIBRATION_BYTES = 64 << 20
_hwm_verdict: bool | None = None
_hwm_lock = threading.Lock()  # one calibration at a time; counts the peak_rss_delta calls in progress
_active_calls = 0
_MAX_INTERVAL = 60.0


def hwm_sees_freed_peaks() -> bool:
    """Whether this kernel's ``VmHWM`` can be reset and then remembers a peak that was freed before it is read.

    Checked once per process, by experiment: reset the mark, map 64 MiB of anonymous memory, write
    every page, unmap it, read ``VmHWM``. The answer depends on the kernel, not on Python: the
    high-water mark is bookkeeping the kernel updates only on some paths (Linux folds the current
    RSS into it when pages are unmapped), and a sandboxed or older kernel may accept the reset but
    never raise the mark for memory already returned. Returns False off Linux.
    """
    global _hwm_verdict
    with _hwm_lock:
        if _hwm_verdict is None:
            _hwm_verdict = _calibrate()
    return _hwm_verdict


def _calibrate() -> bool:
    import mmap

    before = _proc_status_bytes("VmRSS")
    if before is None or not _reset_high_water_mark():
        return False
    m = mmap.mmap(-1, _CALIBRATION_BYTES)
    for off in range(0, _CALIBRATION_BYTES, mmap.PAGESIZE):
        m[off] = 1  # a write fault makes each page resident
    m.close()
    peak = _proc_status_bytes("VmHWM")
    return peak is not None and peak - before >= 0.75 * _CALIBRATION_BYTES


class _RssSampler:
    """A daemon thread that reads ``VmRSS`` every ``interval`` seconds and keeps the largest value seen."""

    def __init__(self, interval: float):
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="coursekit-rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            rss = _proc_status_bytes("VmRSS")
            if rss is not None and rss > self.peak:
                self.peak = rss
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def peak_rss_delta(fn: Callable[[], Any], *, interval: float = 0.001) -> tuple[Any, int | None]:
    """Run ``fn()``; return ``(fn(), peak resident memory during it minus resident memory before it)`` in bytes.

    Two witnesses of the peak, and the larger wins:

    - the kernel's high-water mark ``VmHWM``, reset before ``fn`` by writing ``5`` to
      ``/proc/self/clear_refs`` and read after it; used only where :func:`hwm_sees_freed_peaks`
      found by experiment that this kernel keeps the mark for memory freed before the read;
    - a thread that samples ``VmRSS`` every ``interval`` seconds (default 1 ms) while ``fn`` runs. It
      misses a spike shorter than the interval or one during which ``fn`` holds the GIL, so where the
      high-water mark does not work the result can be low for very short calls.

    It measures the whole process's resident pages, so it includes allocator caching and anything
    other threads allocate, and it *undercounts* memory that the allocator reuses from pages already
    resident (a second call of the same ``fn`` often reads less than the first). A rough, noisy
    number: compare orders of magnitude, not bytes.

    The mark belongs to the process: only the outermost of nested or concurrent calls resets and
    reads it (the others rely on their sampler), and the reset also lowers what
    ``resource.getrusage(...).ru_maxrss`` reports afterwards (``coursekit.train.peak_rss_mb``).

    Returns ``(out, None)`` where ``/proc/self/status`` does not exist (not Linux). An exception from
    ``fn`` propagates after the sampler has stopped. Raises ValueError for an interval that is not a
    number of seconds in (0, 60].
    """
    global _active_calls
    if isinstance(interval, bool) or not isinstance(interval, Real) or not 0 < float(interval) <= _MAX_INTERVAL:
        raise ValueError(f"peak_rss_delta: interval must be a number of seconds in (0, {_MAX_INTERVAL:g}], got {interval!r}")
    interval = float(interval)  # Event.wait refuses a Fraction or a NumPy scalar
    use_hwm = hwm_sees_freed_peaks()
    before = _proc_status_bytes("VmRSS")
    if before is None:
        return fn(), None
    with _hwm_lock:
        outermost = _active_calls == 0
        _active_calls += 1
    try:
        use_hwm = use_hwm and outermost and _reset_high_water_mark()
        with _RssSampler(interval) as sampler:
            out = fn()
        peaks = [sampler.peak, _proc_status_bytes("VmRSS") or 0]
        if use_hwm:
            peaks.append(_proc_status_bytes("VmHWM") or 0)
    finally:
        with _hwm_lock:
            _active_calls -= 1
    return out, max(0, max(peaks) - before)
