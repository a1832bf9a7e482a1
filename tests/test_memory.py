"""coursekit.memory: lesson 17's ledger (7B base, 20M adapter) and clear errors on bad input."""

import math
from fractions import Fraction
import mmap
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coursekit import memory
from coursekit.memory import BUCKETS, GB, ledger, nf4_metadata_bytes, to_gb, total

N, A = 7_000_000_000, 20_000_000


def test_seed_full_fine_tuning_column():
    b = ledger(N, A, "full")
    assert list(b) == list(BUCKETS)
    np.testing.assert_allclose([to_gb(b[k]) for k in BUCKETS], [14, 14, 56, 0])
    np.testing.assert_allclose(to_gb(total(b)), 84)


def test_seed_lora_column():
    b = ledger(N, A, "lora")
    np.testing.assert_allclose([to_gb(b[k]) for k in BUCKETS], [14, 0, 0, 0.24])
    np.testing.assert_allclose(to_gb(total(b)), 14.24)


def test_seed_qlora_column():
    b = ledger(N, A, "qlora")
    np.testing.assert_allclose([to_gb(b[k]) for k in BUCKETS], [3.5, 0, 0, 0.24])
    np.testing.assert_allclose(to_gb(total(b)), 3.74)


def test_float_counts_and_case_are_accepted():
    assert ledger(7e9, 20e6, " QLoRA ") == ledger(N, A, "qlora")


def test_gb_is_decimal():
    assert GB == 1e9 and to_gb(2.5e9) == 2.5


def test_precision_policy_knobs():
    # An all-fp32 adapter (weights, grads, two moments): 16 bytes per adapter parameter.
    b = ledger(N, A, "lora", weight_bytes=4, grad_bytes=4)
    assert b["base_weights"] == 4 * N and b["adapter"] == 16 * A
    # An 8-bit base under QLoRA's bookkeeping.
    assert ledger(N, A, "qlora", code_bits=8)["base_weights"] == N


@given(n=st.integers(0, 10**12), a=st.integers(0, 10**9))
def test_bucket_identities(n, a):
    full, lora, qlora = (ledger(n, a, m) for m in ("full", "lora", "qlora"))
    assert total(full) == 12 * n
    assert lora["base_weights"] == 4 * qlora["base_weights"] == 2 * n
    assert lora["adapter"] == qlora["adapter"] == 12 * a
    assert full["adapter"] == lora["base_grads"] == qlora["base_moments"] == 0


def test_nf4_metadata():
    # Without double quantization: one fp32 absmax per 64 weights = 0.5 bits per weight.
    np.testing.assert_allclose(nf4_metadata_bytes(N, double_quant=False) * 8 / N, 0.5)
    # With it: 8/64 + 32/(64*256) ≈ 0.127 bits per weight (QLoRA paper).
    np.testing.assert_allclose(nf4_metadata_bytes(N) * 8 / N, 8 / 64 + 32 / (64 * 256), rtol=1e-6)
    assert nf4_metadata_bytes(0) == 0
    assert nf4_metadata_bytes(1) == 1 + 4  # one partial block, one partial second-level block


@pytest.mark.parametrize("bad", [-1, -7e9, math.inf, math.nan])
def test_bad_counts_raise_value_error(bad):
    with pytest.raises(ValueError, match="n_params"):
        ledger(bad, A, "lora")
    with pytest.raises(ValueError, match="n_adapter"):
        ledger(N, bad, "lora")


@pytest.mark.parametrize("bad", ["7e9", None, True, [7e9]])
def test_non_numbers_raise_type_error(bad):
    with pytest.raises(TypeError, match="n_params"):
        ledger(bad, A, "lora")


@pytest.mark.parametrize("method", ["qlora4", "peft", "", None, 3])
def test_unknown_method_names_the_choices(method):
    with pytest.raises(ValueError, match="unknown method.*'full', 'lora', 'qlora'"):
        ledger(N, A, method)


def test_bad_block_size():
    with pytest.raises(ValueError, match="blocksize"):
        nf4_metadata_bytes(N, blocksize=0)
    with pytest.raises(ValueError, match="n_params"):
        nf4_metadata_bytes(-5)


def test_module_exports():
    for name in memory.__all__:
        assert hasattr(memory, name)


# --------------------------------------------------------------------------- measured buckets (lesson 17)

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from coursekit.memory import SavedTensors, optimizer_state_bytes, peak_rss_delta, saved_activation_bytes, tensor_bytes  # noqa: E402

F32 = 4  # bytes per float32


def _tiny():
    """Linear(4→3) → ReLU → Linear(3→2) in float32, on a batch of 5 rows (x is 5 × 4)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), torch.randn(5, 4)


def test_saved_bytes_of_a_trainable_tiny_net_by_hand():
    net, x = _tiny()
    with SavedTensors(exclude=net) as saved:
        net(x).sum()
    # Linear 1 saves its input x (5×4) for ∇W1 (x needs no gradient, so W1 is not saved);
    # ReLU saves its output (5×3); Linear 2 saves that same output for ∇W2 (one storage, counted once)
    # and W2 (3×2) for the gradient to the ReLU output, which is a parameter and excluded.
    assert saved.nbytes == (5 * 4 + 5 * 3) * F32 == 140
    assert saved.n_saved == 4 and saved.n_storages == 2
    assert saved.by_dtype == {"float32": 140}
    assert saved.largest(1) == [(80, (5, 4), "float32")]
    with SavedTensors() as all_saved:
        net(x).sum()
    assert all_saved.nbytes == 140 + 3 * 2 * F32  # W2's storage when parameters are not excluded


def test_a_frozen_net_saves_weights_not_its_input():
    net, x = _tiny()
    net.requires_grad_(False)
    x.requires_grad_(True)  # an earlier adapter needs ∇x: every layer must pass the gradient through
    with SavedTensors(exclude=net) as saved:
        net(x).sum()
    assert saved.nbytes == 5 * 3 * F32  # only the ReLU output; x is not needed (no ∇W)
    with SavedTensors() as all_saved:
        net(x).sum()
    assert all_saved.nbytes == (5 * 3 + 4 * 3 + 3 * 2) * F32  # + W1 and W2, saved for ∇x


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointing_keeps_only_the_region_input(use_reentrant):
    net, x = _tiny()
    x.requires_grad_(True)
    with SavedTensors(exclude=net) as saved:
        y = checkpoint(net, x, use_reentrant=use_reentrant).sum()
    assert saved.nbytes == 5 * 4 * F32
    y.backward()  # the recomputation inside backward is outside the context and not counted
    assert saved.nbytes == 80 and net[0].weight.grad is not None


def test_saved_activation_bytes_returns_the_result_and_releases_storages():
    net, x = _tiny()
    out, n = saved_activation_bytes(lambda: net(x).sum(), exclude=net)
    assert n == 140 and out.requires_grad
    out.backward()
    assert net[2].weight.grad.shape == (2, 3)
    with SavedTensors() as saved:
        pass
    assert saved.nbytes == 0 and saved.n_saved == 0 and "nbytes=0" in repr(saved)


def test_views_share_one_storage():
    w = torch.zeros(6, 4)
    assert tensor_bytes([w, w.t(), w[0], w[1:3]]) == 6 * 4 * F32
    assert tensor_bytes([w, torch.zeros(3, dtype=torch.bfloat16)]) == 96 + 6
    assert tensor_bytes([]) == 0


def test_adamw_state_after_one_step():
    lin = nn.Linear(4, 3)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    assert optimizer_state_bytes(opt) == 0  # created lazily at the first step
    lin(torch.randn(2, 4)).sum().backward()
    opt.step()
    # exp_avg and exp_avg_sq for 12 + 3 parameters, plus one float32 step counter per parameter tensor
    assert optimizer_state_bytes(opt) == 2 * 15 * F32 + 2 * F32 == 128


def test_exclude_rejects_other_types():
    with pytest.raises(TypeError, match="modules or tensors"):
        SavedTensors(exclude="model")


LINUX = os.path.exists("/proc/self/status")
MIB = 1 << 20


def _touch_fresh_pages(nbytes, hold=0.0):
    """Map ``nbytes`` of anonymous memory, write every page, keep it ``hold`` seconds, unmap it: new resident pages
    whatever the allocator has cached (a long-lived test worker's malloc may serve a big tensor from free, resident heap)."""
    m = mmap.mmap(-1, nbytes)
    for off in range(0, nbytes, mmap.PAGESIZE):
        m[off] = 1
    time.sleep(hold)
    m.close()
    return nbytes


@pytest.mark.skipif(not LINUX, reason="peak_rss_delta reads /proc/self/status")
def test_peak_rss_delta_sees_fresh_pages_that_come_and_go():
    out, delta = peak_rss_delta(lambda: _touch_fresh_pages(200 * MIB, hold=0.05))
    assert out == 200 * MIB
    assert delta >= 0.9 * 200 * MIB


@pytest.mark.skipif(not LINUX, reason="peak_rss_delta reads /proc/self/status")
def test_without_a_working_high_water_mark_the_sampler_still_sees_the_peak(monkeypatch):
    monkeypatch.setattr(memory, "_hwm_verdict", False)  # as on a kernel whose VmHWM forgets freed pages
    monkeypatch.setattr(memory, "_reset_high_water_mark", lambda: pytest.fail("the mark must not be used"))
    _, delta = peak_rss_delta(lambda: _touch_fresh_pages(200 * MIB, hold=0.05))
    assert delta >= 0.9 * 200 * MIB


@pytest.mark.skipif(not LINUX, reason="peak_rss_delta reads /proc/self/status")
def test_a_high_water_mark_that_never_rises_is_found_out(monkeypatch):
    real = memory._proc_status_bytes
    # VmHWM that only ever reports the current RSS: the mark of a kernel that forgets freed pages
    monkeypatch.setattr(memory, "_proc_status_bytes", lambda f: real("VmRSS") if f == "VmHWM" else real(f))
    monkeypatch.setattr(memory, "_hwm_verdict", None)
    assert memory.hwm_sees_freed_peaks() is False
    monkeypatch.setattr(memory, "_proc_status_bytes", real)
    monkeypatch.setattr(memory, "_hwm_verdict", None)
    # this machine's own answer is whatever the experiment says; it is cached for the process
    verdict = memory.hwm_sees_freed_peaks()
    assert memory._hwm_verdict is verdict


@pytest.mark.skipif(not LINUX, reason="peak_rss_delta reads /proc/self/status")
def test_peak_rss_delta_sees_a_large_tensor_in_a_fresh_process():
    # a fresh interpreter: no heap left over from earlier tests for malloc to reuse
    code = (
        "import torch; from coursekit.memory import peak_rss_delta\n"
        "n = 50_000_000\n"
        "out, delta = peak_rss_delta(lambda: float(torch.ones(n).sum()))\n"
        "print(out, delta)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out, delta = res.stdout.split()
    assert float(out) == 50_000_000
    assert int(delta) >= 0.9 * 50_000_000 * F32


def test_peak_rss_delta_returns_the_result_and_propagates_errors():
    out, _ = peak_rss_delta(lambda: "x")
    assert out == "x"
    with pytest.raises(ZeroDivisionError):
        peak_rss_delta(lambda: 1 / 0)
    assert not any(t.name == "coursekit-rss-sampler" for t in threading.enumerate())


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, "1ms", True, 61, 1e10])
def test_peak_rss_delta_rejects_a_bad_interval(bad):
    with pytest.raises(ValueError, match="interval"):
        peak_rss_delta(lambda: None, interval=bad)


@pytest.mark.skipif(not LINUX, reason="peak_rss_delta reads /proc/self/status")
@pytest.mark.parametrize("interval", [np.float32(0.001), Fraction(1, 1000), 1])
def test_any_real_interval_in_range_works_and_the_sampler_survives(interval, capfd):
    # the sampler thread passes the interval to Event.wait, which refuses a Fraction or a NumPy scalar
    _, delta = peak_rss_delta(lambda: _touch_fresh_pages(64 * MIB, hold=0.05), interval=interval)
    assert delta >= 0 and "Traceback" not in capfd.readouterr().err


@pytest.mark.skipif(not (LINUX and memory.hwm_sees_freed_peaks()), reason="needs a high-water mark that keeps freed peaks")
def test_a_nested_call_does_not_erase_the_outer_peak():
    # the mark belongs to the process: an inner call must not reset it under the outer one
    def outer():
        _touch_fresh_pages(200 * MIB)  # allocated and freed before the inner call; the slow sampler misses it
        _, inner = peak_rss_delta(lambda: None)
        return inner

    inner, delta = peak_rss_delta(outer, interval=30)
    assert delta >= 0.9 * 200 * MIB and inner < 50 * MIB
    assert memory._active_calls == 0


def test_off_linux_the_delta_is_none(monkeypatch):
    monkeypatch.setattr(memory, "_proc_status_bytes", lambda f: None)
    monkeypatch.setattr(memory, "_hwm_verdict", None)
    assert peak_rss_delta(lambda: 7) == (7, None)
