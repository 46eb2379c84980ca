"""Memory policies on the tiny model: bounded, equal-length layers, correct positions, no trace of questions."""

import pytest
import torch

from hermes.cache import KIND_PREFIX, KIND_SUMMARY, KIND_VISUAL
from hermes.config import MemoryConfig, ModelConfig
from hermes.memory import compact_positions
from hermes.models.loading import load_model
from hermes.pipelines.session import StreamingSession
from hermes.rope import RotarySpec, rotate_at
from tests.conftest import random_frames

TPF = 196  # visual tokens per frame of the tiny model


def prefix_len(session) -> int:
    return int((session.cache.kinds[0] == KIND_PREFIX).sum())


def chunks(frames, size):
    return [frames[i:i + size] for i in range(0, len(frames), size)]


def probe_in_maintain(monkeypatch):
    """Make `hermes` probe inside `maintain` (as with a model whose attention cannot carry the pseudo-query
    in the chunk's prefill), so that a test's constructed `hermes.memory.probe_attention` gives its maps."""
    import hermes.memory

    monkeypatch.setattr(hermes.memory.HermesPolicy, "probe_queries", lambda self, cache, n_new: None)


@pytest.mark.slow
def test_hermes_stays_bounded_over_600_frames(tiny_model):
    budget = 3 * TPF + 50
    session = StreamingSession(tiny_model, MemoryConfig(policy="hermes", budget=budget), [], chunk_frames=8)
    p = prefix_len(session)
    sizes = []
    for chunk in chunks(random_frames(600, interval_s=0.5, size=(16, 16)), 8):
        session.ingest(chunk)
        lengths = {k.shape[-2] for k, _ in session.cache.layer_tensors()}
        seen = len(session.encoded_t_s) * TPF
        assert lengths == {p + min(budget, seen)}
        assert session.cache.positions.shape == (4, 1, p + min(budget, seen))  # (L, A, T), A = 1: 1-D RoPE
        sizes.append(session.cache.nbytes())
    first_full = next(i for i, n in enumerate(session.chunk_stats) if sum(
        c.frames for c in session.chunk_stats[: i + 1]) * TPF > budget)
    assert len(set(sizes[first_full:])) == 1  # bytes constant once eviction has started
    kinds = session.cache.kinds[:, p:]
    # only long-term layers (the last two of four) hold summary tokens (old ones compete for the budget
    # like any token, so there may be several), and their entries stand for every token seen
    summaries = (kinds == KIND_SUMMARY).sum(dim=1).tolist()
    assert summaries[:2] == [0, 0] and min(summaries[2:]) >= 1
    assert session.cache.counts[2:, p:].sum(dim=1).tolist() == [600 * TPF] * 2


@pytest.mark.slow
def test_hermes_with_a_budget_larger_than_the_stream_equals_full(tiny_model):
    frames = random_frames(6)
    full = StreamingSession(tiny_model, "full", frames, chunk_frames=2).ask("q", at=10.0)
    hermes = StreamingSession(tiny_model, MemoryConfig(policy="hermes", budget=6 * TPF), frames,
                              chunk_frames=2).ask("q", at=10.0)
    assert torch.equal(full.first_token_logits, hermes.first_token_logits)
    assert full.answer == hermes.answer


@pytest.mark.slow
def test_sensory_layer_keeps_the_newest_frame_and_smoothing_lifts_a_few_older_tokens(tiny_model):
    """Recency by token index (the reference): within the newest frames recency falls steeply, so the
    sensory layer keeps the whole newest frame, and deep attention (smoothing, lambda 0.1) lets some
    older tokens displace the tail of the frame before it."""
    session = StreamingSession(tiny_model, MemoryConfig(policy="hermes", budget=2 * TPF),
                               random_frames(20, size=(16, 16)), chunk_frames=4)
    session.advance()
    p = prefix_len(session)
    ids, frames = session.cache.token_ids[0, p:], session.cache.frame_index[0, p:]
    newest_id = int(ids.max())
    window = set(range(newest_id - TPF - 40 + 1, newest_id + 1))  # frame 19 and the last 40 tokens of frame 18
    assert window <= set(ids.tolist())
    assert int((frames < 18).sum()) > 0


@pytest.mark.slow
def test_with_equal_attention_every_layer_keeps_exactly_the_newest_tokens(tiny_model, monkeypatch):
    """Constant attention normalises to 0: scores are recency alone, decreasing with index distance."""
    import hermes.memory

    probe_in_maintain(monkeypatch)
    monkeypatch.setattr(hermes.memory, "probe_attention", lambda model, cache, embeds: [
        torch.full((embeds.shape[0], cache.num_tokens), 0.01) for _ in range(cache.num_layers)])
    session = StreamingSession(tiny_model, MemoryConfig(policy="hermes", budget=2 * TPF),
                               random_frames(20, size=(16, 16)), chunk_frames=4)
    session.advance()
    p = prefix_len(session)
    newest = session.cache.token_ids[0, -2 * TPF:]  # ids are consecutive within a chunk, in token order
    assert torch.equal(newest, torch.arange(int(newest[0]), int(newest[0]) + 2 * TPF))
    assert session.cache.frame_index[0, -2 * TPF:].tolist() == [18] * TPF + [19] * TPF
    for layer in range(2):  # sensory and working
        assert torch.equal(session.cache.token_ids[layer, p:], newest)
    for layer in (2, 3):  # long-term: the newest budget - 1 tokens (ties go to newer), then the new summary
        assert torch.equal(session.cache.token_ids[layer, p:-1], newest[1:])
        assert session.cache.kinds[layer, -1] == KIND_SUMMARY


@pytest.mark.slow
def test_sliding_keeps_sinks_and_the_recent_window(tiny_model):
    session = StreamingSession(tiny_model, MemoryConfig(policy="sliding", budget=TPF + 4, sink_tokens=4),
                               random_frames(10, size=(16, 16)), chunk_frames=3)
    session.advance()
    p = prefix_len(session)
    ids = session.cache.token_ids[:, p:]
    first_visual = p  # ids are assigned in order: the prefix first, then frame 0's tokens
    expected = list(range(first_visual, first_visual + 4)) + list(range(p + 9 * TPF, p + 10 * TPF))
    assert all(row.tolist() == expected for row in ids)


def test_uniform_keeps_evenly_spaced_whole_frames(tiny_model):
    session = StreamingSession(tiny_model, MemoryConfig(policy="uniform", budget=3 * TPF),
                               random_frames(9, size=(16, 16)), chunk_frames=9)
    session.advance()
    p = prefix_len(session)
    assert sorted(set(session.cache.frame_index[0, p:].tolist())) == [0, 4, 8]


@pytest.mark.slow
def test_a_token_with_high_deep_attention_survives(tiny_model, monkeypatch):
    """Constructed attention: one old token gets all of the deep layers' attention."""
    import hermes.memory

    target = {}

    def fake_probe(model, cache, embeds):
        scores = []
        for layer in range(cache.num_layers):
            row = torch.full((embeds.shape[0], cache.num_tokens), 1e-4)
            row[:, cache.token_ids[layer] == target["id"]] = 1.0
            scores.append(row)
        return scores

    probe_in_maintain(monkeypatch)
    monkeypatch.setattr(hermes.memory, "probe_attention", fake_probe)
    session = StreamingSession(tiny_model, MemoryConfig(policy="hermes", budget=2 * TPF),
                               random_frames(6, size=(16, 16)), chunk_frames=1)
    session.advance(until_s=0.4)  # frame 0 only: no eviction yet
    p = prefix_len(session)
    target["id"] = int(session.cache.token_ids[0, p + 5])  # a token of the oldest frame
    neighbour = int(session.cache.token_ids[0, p + 6])  # same frame, no attention
    session.advance()
    # Long-term layers score by attention alone. Working layer 1 (recency weight 0.75): the target
    # scores 0.7 * 0.25 + 0.3 * 1 = 0.475 after smoothing, above every token of the second-newest frame
    # (recency exp(-20 * 1/5) ~ 0.02), so it takes one of the second frame's slots. The sensory layer
    # inherits 0.1 * 0.475 through smoothing, again above the second-newest frame's ~0.9 * 0.02.
    holds = [target["id"] in session.cache.token_ids[layer].tolist() for layer in range(4)]
    assert holds == [True, True, True, True]
    assert not any(neighbour in session.cache.token_ids[layer].tolist() for layer in range(4))


@pytest.mark.slow
def test_questions_and_pseudo_queries_never_stay_in_memory(tiny_model):
    session = StreamingSession(tiny_model, MemoryConfig(policy="hermes", budget=TPF + 7),
                               random_frames(16, size=(16, 16)), chunk_frames=2)
    recorded = set()
    for at in (1.0, 2.0, 3.5, 5.0, 8.0):
        session.ask("What happened?", at=at)
        session.ask("And now?")
        kinds = session.cache.kinds
        assert set(kinds.unique().tolist()) <= {KIND_PREFIX, KIND_VISUAL, KIND_SUMMARY}
        visual_ids = session.cache.token_ids[kinds != KIND_SUMMARY]
        recorded |= set(range(int(visual_ids.max()) + 1))
        # every non-summary entry is a prefix or frame token, laid down by ingest in frame order
        assert (session.cache.frame_index[kinds == KIND_VISUAL] < len(session.encoded_t_s)).all()
        assert session.cache.num_tokens == prefix_len(session) + min(TPF + 7, len(session.encoded_t_s) * TPF)


@pytest.mark.slow
def test_positions_stay_in_range_far_beyond_max_position_embeddings():
    model = load_model(ModelConfig(name="tiny-llava-onevision", max_new_tokens=4))
    model.text_config.max_position_embeddings = 512
    cfg = MemoryConfig(policy="hermes", budget=100, position_reserve=64)
    frames = random_frames(53, size=(16, 16))  # 53 * 196 = 10388 tokens: 20x the position range
    session = StreamingSession(model, cfg, frames, chunk_frames=1, max_new_tokens=4)
    answers = []
    for at in (5.0, 13.0, 26.0):
        answers.append(session.ask("What is it?", at=at))
        assert int(session.cache.positions.max()) < 512
        assert session.cache.next_position < 512
    assert all(torch.isfinite(a.first_token_logits).all() for a in answers)
    assert len(session.encoded_t_s) == 52


def test_compaction_moves_keys_exactly_to_their_new_positions(tiny_model):
    """Layer 0 keys depend only on the token itself: compacted keys equal keys computed at the new positions."""
    session = StreamingSession(tiny_model, "full", random_frames(3, size=(16, 16)), chunk_frames=3)
    session.advance()
    cache = session.cache
    p = prefix_len(session)
    keep = torch.cat([torch.arange(p), torch.arange(p + 10, p + 60), torch.arange(p + 300, p + 400)])
    embeds = torch.cat([tiny_model.embed_text(tiny_model.prefix_text()),
                        tiny_model.encode_frames([f.rgb for f in random_frames(3, size=(16, 16))])])[keep]
    cache.select_(keep.expand(4, -1).contiguous())
    spec = RotarySpec.from_text_config(tiny_model.text_config)
    compact_positions(cache, spec)
    assert cache.positions[0, 0].tolist() == list(range(len(keep)))
    layer0 = tiny_model.language_model.layers[0]
    with torch.no_grad():
        raw = layer0.self_attn.k_proj(layer0.input_layernorm(embeds))  # (T, Hkv * D)
    raw = raw.view(len(keep), -1, spec.head_dim).transpose(0, 1)  # (Hkv, T, D)
    expected = rotate_at(raw, torch.arange(len(keep)), spec)
    torch.testing.assert_close(cache.layer_tensors()[0][0][0], expected, atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_eager_reindexing_keeps_positions_consecutive(tiny_model):
    session = StreamingSession(tiny_model, MemoryConfig(policy="hermes", budget=TPF, reindex="eager"),
                               random_frames(5, size=(16, 16)), chunk_frames=1)
    session.advance()
    p = prefix_len(session)
    for row in session.cache.positions[:, 0]:
        assert sorted(row.tolist()) == list(range(p + TPF))


def _visual_lengths_and_probes(tiny_model, monkeypatch, policy: str, headroom: float, n_frames: int):
    """Visual entries per layer after each one-frame chunk, and whether each chunk ran the probe (in its
    prefill, or a pass of its own)."""
    import hermes.memory as memory_module

    probes = []
    real_probe = memory_module.probe_attention
    monkeypatch.setattr(memory_module, "probe_attention", lambda *a, **k: probes.append(1) or real_probe(*a, **k))
    real_queries = memory_module.HermesPolicy.probe_queries

    def counted_queries(self, cache, n_new):
        embeds = real_queries(self, cache, n_new)
        if embeds is not None:
            probes.append(1)
        return embeds

    monkeypatch.setattr(memory_module.HermesPolicy, "probe_queries", counted_queries)
    session = StreamingSession(tiny_model, MemoryConfig(policy=policy, budget=4 * TPF, evict_headroom=headroom), [],
                               chunk_frames=1)
    p = prefix_len(session)
    lengths, probed = [], []
    for frame in random_frames(n_frames, interval_s=0.5, size=(16, 16)):
        before = len(probes)
        session.ingest([frame])
        assert len({k.shape[-2] for k, _ in session.cache.layer_tensors()}) == 1  # all layers the same length
        lengths.append(session.cache.num_tokens - p)
        probed.append(len(probes) > before)
    return lengths, probed, session


@pytest.mark.slow
def test_evict_headroom_evicts_below_the_budget_so_the_probe_runs_once_per_three_chunks(tiny_model, monkeypatch):
    # budget 4 frames, headroom 0.5: a fifth frame evicts down to 2 frames, and two more fit before the next
    lengths, probed, _ = _visual_lengths_and_probes(tiny_model, monkeypatch, "hermes", 0.5, 11)
    assert lengths == [TPF * n for n in (1, 2, 3, 4, 2, 3, 4, 2, 3, 4, 2)]
    assert probed == [False] * 4 + [True, False, False] * 2 + [True]
    # the reference's behaviour (no headroom): back to exactly the budget, a probe after every chunk once full
    lengths, probed, _ = _visual_lengths_and_probes(tiny_model, monkeypatch, "hermes", 0.0, 7)
    assert lengths == [TPF * n for n in (1, 2, 3, 4, 4, 4, 4)]
    assert probed == [False] * 4 + [True] * 3


def test_sliding_with_headroom_keeps_its_sinks_and_the_newest_window_of_the_smaller_size(tiny_model, monkeypatch):
    lengths, _, session = _visual_lengths_and_probes(tiny_model, monkeypatch, "sliding", 0.25, 5)
    assert lengths == [TPF * n for n in (1, 2, 3, 4, 3)]
    p = prefix_len(session)
    keep = 3 * TPF  # budget 4 frames less a quarter
    expected = list(range(p, p + 4)) + list(range(p + 5 * TPF - (keep - 4), p + 5 * TPF))
    assert all(row.tolist() == expected for row in session.cache.token_ids[:, p:])
