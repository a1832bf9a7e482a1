"""coursekit.memory: the seed's ledger (7B base, 20M adapter) and clear errors on bad input."""

import math

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
