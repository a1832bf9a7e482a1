"""coursekit.rope: the tables, the rotation and its backward against transformers' own Llama code."""

import numpy as np
import pytest
import torch
from transformers.models.llama import modeling_llama

from coursekit import rope


def test_tables_match_transformers_rotary_module_to_float32_rounding():
    cfg = modeling_llama.LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64,
                                     rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})
    cos_t, sin_t = modeling_llama.LlamaRotaryEmbedding(cfg)(torch.zeros(1), torch.arange(32)[None])
    cos, sin = rope.rope_cos_sin(32, 64, 100000.0)
    assert cos.shape == sin.shape == (32, 64) and cos.dtype == np.float64
    np.testing.assert_allclose(cos, cos_t[0].double().numpy(), atol=32 * 2.0**-23)
    np.testing.assert_allclose(sin, sin_t[0].double().numpy(), atol=32 * 2.0**-23)


def test_forward_is_transformers_apply_rotary_pos_emb_and_start_shifts_positions():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 8))
    cos, sin = rope.rope_cos_sin(7, 8, 10.0, start=5)
    want, _ = modeling_llama.apply_rotary_pos_emb(torch.from_numpy(x), torch.from_numpy(x), torch.from_numpy(cos),
                                                  torch.from_numpy(sin), unsqueeze_dim=0)
    np.testing.assert_allclose(rope.rope_forward(x, cos, sin), want.numpy(), rtol=1e-13, atol=1e-14)
    full_cos, _ = rope.rope_cos_sin(12, 8, 10.0)
    np.testing.assert_allclose(cos, full_cos[5:], rtol=0, atol=1e-15)


def test_backward_is_autograd_and_inverts_the_forward():
    rng = np.random.default_rng(1)
    cos, sin = rope.rope_cos_sin(5, 6, 100.0)
    x = torch.from_numpy(rng.standard_normal((4, 5, 6))).requires_grad_()
    dy = rng.standard_normal((4, 5, 6))
    rope.rope_forward(x, torch.from_numpy(cos), torch.from_numpy(sin)).backward(torch.from_numpy(dy))
    np.testing.assert_allclose(rope.rope_backward(dy, cos, sin), x.grad.numpy(), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(rope.rope_backward(rope.rope_forward(dy, cos, sin), cos, sin), dy, rtol=1e-12, atol=1e-13)


def test_backward_works_on_torch_tensors():
    cos, sin = (torch.from_numpy(t) for t in rope.rope_cos_sin(3, 4))
    dy = torch.randn(2, 3, 4, dtype=torch.float64)
    out = rope.rope_backward(dy, cos, sin)
    assert isinstance(out, torch.Tensor) and out.shape == dy.shape
    torch.testing.assert_close(out, dy * cos - rope.rotate_half(dy) * sin)


@pytest.mark.parametrize("args, err, says", [
    (dict(T=0, head_dim=4), ValueError, "T must be a positive integer"),
    (dict(T=3, head_dim=5), ValueError, "even"),
    (dict(T=3, head_dim=4, base=1.0), ValueError, "greater than 1"),
])
def test_tables_refuse_bad_sizes(args, err, says):
    with pytest.raises(err, match=says):
        rope.rope_cos_sin(**args)


def test_rotation_refuses_mismatched_tables_odd_widths_and_none():
    cos, sin = rope.rope_cos_sin(3, 4)
    with pytest.raises(ValueError, match=r"cos and sin must both have shape \(T, d\) = \(4, 4\)"):
        rope.rope_forward(np.zeros((2, 4, 4)), cos, sin)
    with pytest.raises(ValueError, match="even head width"):
        rope.rope_backward(np.zeros((3, 3)), cos[:, :3], sin[:, :3])
    with pytest.raises(TypeError, match="dy must be an array"):
        rope.rope_backward(None, cos, sin)
