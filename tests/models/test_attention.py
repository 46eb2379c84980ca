"""`hermes_sdpa` computes what transformers' `sdpa` computes, without widening grouped K/V heads."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hermes.models.attention import hermes_sdpa_attention_forward


class _Attention(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.training = False


@pytest.mark.parametrize("groups", [1, 4, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hermes_sdpa_equals_transformers_sdpa_with_a_mask(groups, dtype):
    torch.manual_seed(groups)
    kv_heads, q_len, cached, dim = 2, 5, 37, 16
    query = torch.randn(1, kv_heads * groups, q_len, dim, dtype=dtype)
    key = torch.randn(1, kv_heads, cached + q_len, dim, dtype=dtype)
    value = torch.randn(1, kv_heads, cached + q_len, dim, dtype=dtype)
    # new tokens see the whole cache and, causally, each other; some cached tokens are masked out
    mask = torch.ones(q_len, cached + q_len, dtype=torch.bool)
    mask[:, cached:] = torch.ones(q_len, q_len, dtype=torch.bool).tril()
    mask[:, 3:6] = False
    mask = mask[None, None]
    module = _Attention(groups)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim ** -0.5)
    got, weights = hermes_sdpa_attention_forward(module, query, key, value, mask, scaling=dim ** -0.5)
    assert weights is None
    assert got.shape == (1, q_len, kv_heads * groups, dim)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    # and it is attention over the unmasked tokens: masked-out values change nothing
    value2 = value.clone()
    value2[:, :, 3:6] += 100.0
    again, _ = hermes_sdpa_attention_forward(module, query, key, value2, mask, scaling=dim ** -0.5)
    torch.testing.assert_close(again, got, atol=tol, rtol=tol)
