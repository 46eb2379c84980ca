"""The attention probe is the model's real attention, and it leaves the cache as it was."""

import copy
import types

import pytest
import torch

import hermes.probe

from hermes.cache import METADATA
from hermes.pipelines.session import StreamingSession
from hermes.probe import probe_attention
from tests.conftest import random_frames


def test_probe_equals_eager_output_attentions(tiny_model):
    session = StreamingSession(tiny_model, "full", random_frames(3, size=(16, 16)), chunk_frames=2)
    session.advance()
    cache = session.cache
    pseudo = tiny_model.question_embeds("What is happening in the video?")
    reference_cache = copy.deepcopy(cache)
    before = [t.clone() for kv in cache.layer_tensors() for t in kv] + [getattr(cache, n).clone() for n in METADATA]

    probed = probe_attention(tiny_model, cache, pseudo)

    # reference: transformers' eager attention with output_attentions, same model, same cache
    config = tiny_model.text_config
    previous, config._attn_implementation = config._attn_implementation, "eager"
    try:
        positions = torch.arange(reference_cache.next_position, reference_cache.next_position + pseudo.shape[0])
        with torch.no_grad():
            out = tiny_model.language_model(inputs_embeds=pseudo[None], position_ids=positions[None],
                                            cache=reference_cache, use_cache=True, output_attentions=True)
    finally:
        config._attn_implementation = previous
    cached = cache.num_tokens
    assert len(probed) == len(out.attentions) == 4
    for layer, weights in enumerate(out.attentions):  # (1, H, Q, T + Q)
        torch.testing.assert_close(probed[layer], weights[0, :, :, :cached].mean(dim=0), atol=1e-6, rtol=1e-5)
    # the deeper layers see propagated hidden states: their attention differs from layer 0's
    assert not torch.allclose(probed[0], probed[3])

    after = [t for kv in cache.layer_tensors() for t in kv] + [getattr(cache, n) for n in METADATA]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert config._attn_implementation == previous


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 7])
@pytest.mark.parametrize("block_heads", [None, 1, 2])
def test_grouped_probe_equals_repeat_interleave_in_float32(dtype, groups, block_heads, monkeypatch):
    """The grouped probe (no widened K/V) gives the scores of the straightforward computation: keys and
    values repeated over query groups, everything in float32, weights averaged over heads; in one batch
    of all heads, or (as on a CPU at long caches) in blocks of 1 or 2 of the 3 KV heads."""
    gen = torch.Generator().manual_seed(groups)
    kv_heads, q_len, cached, dim = 3, 5, 37, 16
    if block_heads is not None:
        monkeypatch.setattr(hermes.probe, "CPU_SCORE_BLOCK_BYTES", block_heads * 4 * groups * q_len * (cached + q_len))
        assert hermes.probe.kv_heads_per_block(kv_heads, groups * q_len, cached + q_len, torch.device("cpu")) == block_heads
    t_len = cached + q_len
    query = torch.randn(1, kv_heads * groups, q_len, dim, generator=gen).to(dtype)
    key = torch.randn(1, kv_heads, t_len, dim, generator=gen).to(dtype)
    value = torch.randn(1, kv_heads, t_len, dim, generator=gen).to(dtype)
    scaling = dim ** -0.5

    k32 = key.float().repeat_interleave(groups, dim=1)
    v32 = value.float().repeat_interleave(groups, dim=1)
    scores = query.float() @ k32.transpose(2, 3) * scaling  # (1, Hq, Q, T)
    scores[..., cached:] = scores[..., cached:].masked_fill(torch.ones(q_len, q_len, dtype=torch.bool).triu(1),
                                                             float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    expected_maps = weights[0, :, :, :cached].mean(dim=0)  # (Q, T)
    expected_out = (weights @ v32).transpose(1, 2)  # (1, Q, Hq, D)

    module = types.SimpleNamespace(layer_idx=0, num_key_value_groups=groups)
    hermes.probe._recorder = hermes.probe._ProbeRecorder(num_layers=2, cached=cached)  # layer 0 is not the last
    try:
        out, _ = hermes.probe.probe_attention_forward(module, query, key, value, None, scaling)
        maps = hermes.probe._recorder.maps[0]
    finally:
        hermes.probe._recorder = None
    assert maps.dtype == torch.float32
    torch.testing.assert_close(maps, expected_maps, atol=1e-6, rtol=1e-5)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected_out, **tol)
