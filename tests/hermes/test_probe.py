"""The attention probe is the model's real attention, and it leaves the cache as it was."""

import copy

import torch

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
