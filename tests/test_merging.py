"""coursekit.merging: PEFT-layout merge/unmerge against PEFT itself and lesson 02's row-vector merge;
spacing against the IEEE formats; merge_residual against hand-worked cases; bad input."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit import lora, merging


def _peft_case(rng, m, d, r):
    return rng.standard_normal((m, d)), rng.standard_normal((r, d)), rng.standard_normal((m, r))


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), d=st.integers(1, 6), r=st.integers(1, 4), s=st.floats(-4, 4), seed=st.integers(0, 2**16))
def test_merge_peft_is_the_transpose_of_the_row_vector_merge(m, d, r, s, seed):
    weight, A, B = _peft_case(np.random.default_rng(seed), m, d, r)
    merged = merging.merge_peft(weight, A, B, s)
    assert merged.shape == (m, d)
    np.testing.assert_allclose(merged, lora.merge(weight.T, A.T, B.T, s).T)
    np.testing.assert_allclose(merged, weight + s * B @ A, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merging.unmerge_peft(merged, A, B, s), weight, rtol=1e-10, atol=1e-10)


def test_merge_peft_matches_peft_merge():
    from peft import LoraConfig, get_peft_model

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(5, 3, bias=False)

        def forward(self, x):
            return self.proj(x)

    torch.manual_seed(0)
    pm = get_peft_model(One(), LoraConfig(r=2, lora_alpha=6, lora_dropout=0.2, target_modules=["proj"]))
    layer = pm.base_model.model.proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    w0 = layer.base_layer.weight.detach().clone()
    ours = merging.merge_peft(w0, layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach(), layer.scaling["default"])
    layer.merge()
    torch.testing.assert_close(layer.base_layer.weight.detach(), ours)


def test_merge_peft_shape_errors_name_the_argument():
    w, A, B = _peft_case(np.random.default_rng(0), 3, 5, 2)
    with pytest.raises(lora.LoRAShapeError, match=r"lora_A must have shape \(r, 5\).*transposed"):
        merging.merge_peft(w, A.T, B, 1.0)
    with pytest.raises(lora.LoRAShapeError, match=r"lora_B must have shape \(3, 2\).*got \(2, 3\)"):
        merging.merge_peft(w, A, B.T, 1.0)
    with pytest.raises(lora.LoRAShapeError, match="weight must be a 2-D array"):
        merging.merge_peft(w[0], A, B, 1.0)
    with pytest.raises(lora.LoRADtypeError, match="floating point"):
        merging.merge_peft(w.astype(int), A.astype(int), B.astype(int), 1.0)


def test_spacing_of_the_formats():
    assert merging.spacing(1.0, "bfloat16") == 2**-7
    assert merging.spacing(1.0, torch.bfloat16) == 2**-7
    assert merging.spacing(1.0, "float16") == 2**-10
    assert merging.spacing(1.0, "float32") == 2**-23 == torch.finfo(torch.float32).eps
    assert merging.spacing(-3.0, "bfloat16") == 2**-6  # sign does not matter; [2, 4) has twice the spacing
    out = merging.spacing(np.array([[0.5, 1.0], [2.0, 4.0]]), "bfloat16")
    np.testing.assert_array_equal(out, [[2**-8, 2**-7], [2**-6, 2**-5]])


def test_merge_residual_hand_cases():
    # 0.005 rounds to 0.0050048828125 in bf16; 1.0050049 is nearer 1 + 2**-7 than 1.0.
    assert merging.merge_residual(1.0, 0.005, "bfloat16") == pytest.approx((2**-7 - 0.005) / 0.005)
    # Below half the spacing the update vanishes: residual 1. Exactly representable: residual 0.
    assert merging.merge_residual(1.0, 0.003, "bfloat16") == pytest.approx(1.0)
    assert merging.merge_residual(1.0, 2**-7, "bfloat16") == 0.0
    assert merging.merge_residual(np.ones(3), np.full(3, 1e-4), "float64") < 1e-10


def test_merge_residual_orders_the_dtypes():
    g = np.random.default_rng(0)
    W, dW = g.standard_normal((16, 16)), 1e-4 * g.standard_normal((16, 16))
    bf, fp16, fp32 = (merging.merge_residual(W, dW, t) for t in ("bfloat16", "float16", "float32"))
    assert bf > 0.9 and fp32 < 1e-3 and fp32 < fp16 < bf + 0.1
    assert merging.merge_residual(torch.tensor(W), torch.tensor(dW), "float32") == fp32


def test_merge_residual_bad_input():
    with pytest.raises(ValueError, match="one shape"):
        merging.merge_residual(np.zeros((2, 2)), np.zeros((2, 3)), "float32")
    with pytest.raises(ValueError, match="all zeros"):
        merging.merge_residual(np.ones((2, 2)), np.zeros((2, 2)), "float32")
    with pytest.raises(ValueError, match="dtype must be one of"):
        merging.merge_residual(np.ones(2), np.ones(2), "int8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        merging.spacing(1.0, torch.int8)
    with pytest.raises(TypeError, match="delta must be"):
        merging.merge_residual(np.ones(2), "0.1", "float32")
