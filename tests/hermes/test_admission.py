"""Admission over time: long-term layers must keep taking in new content on a stream of equally salient chunks.

Each chunk's tokens draw their pseudo-query attention from the same distribution, afresh at every
probe, so no chunk deserves more room than another. Selecting on the fresh probe (the reference,
our default) keeps a fair share of the newest chunk; a running sum of attention (our former
default) lets old tokens' sums outgrow any newcomer, and the long-term layers freeze on the start.
"""

from __future__ import annotations

import types

import pytest
import torch
from transformers import Qwen2Config

import hermes.memory
from hermes.cache import KIND_PREFIX, KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.memory import HermesPolicy

LAYERS, PREFIX, CHUNK, BUDGET = 10, 4, 64, 128


def newest_chunk_share(monkeypatch, chunks: int, **memory) -> float:
    """Share of the newest chunk's tokens the long-term layers hold after `chunks` chunks (mean over layers)."""
    gen = torch.Generator().manual_seed(7)
    config = Qwen2Config(num_hidden_layers=LAYERS, hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    cache = HermesCache(config)
    model = types.SimpleNamespace(text_config=config, num_layers=LAYERS, max_position_embeddings=32768,
                                  question_embeds=lambda text: torch.zeros(2, 1))
    policy = HermesPolicy(MemoryConfig(policy="hermes", budget=BUDGET, **memory), model)
    monkeypatch.setattr(hermes.memory, "probe_attention", lambda model_, cache_, embeds: [
        torch.rand(embeds.shape[0], cache_.num_tokens, generator=gen) for _ in range(LAYERS)])

    def append(n: int, kind: int, frames: torch.Tensor | None) -> None:
        for layer in range(LAYERS):
            cache.update(torch.randn(1, 1, n, 16, generator=gen), torch.randn(1, 1, n, 16, generator=gen), layer)
        cache.record(torch.arange(cache.next_position, cache.next_position + n)[None], kind, frames)
        cache.next_position += n

    append(PREFIX, KIND_PREFIX, None)
    for chunk in range(chunks):
        append(CHUNK, KIND_VISUAL, torch.full((CHUNK,), chunk))
        policy.maintain(cache)
    longterm = [layer for layer, band in enumerate(policy.bands) if band == "longterm"]
    newest = cache.frame_index[longterm] == chunks - 1  # (layers, T)
    return float(newest.sum(dim=1).float().mean()) / CHUNK


def test_long_term_layers_keep_a_fifth_of_the_newest_chunk_after_ten_chunks(monkeypatch):
    assert newest_chunk_share(monkeypatch, 10) >= 0.2


def test_a_running_sum_freezes_long_term_layers_on_old_content(monkeypatch):
    assert newest_chunk_share(monkeypatch, 10, accumulation="sum") < 0.05


@pytest.mark.parametrize("decay", [0.5, 0.9])
def test_an_ema_keeps_admitting(monkeypatch, decay):
    assert newest_chunk_share(monkeypatch, 10, accumulation="ema", accumulate_decay=decay) >= 0.2
