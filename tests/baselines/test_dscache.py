"""`dscache` (DSCache): a frame-level past cache in level 1, a fresh instant cache per question."""

from __future__ import annotations

import pytest
import torch

from hermes.baselines.dscache import sampled_past
from hermes.cache import KIND_VISUAL
from hermes.config import MemoryConfig, build_config
from hermes.errors import ConfigError
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import make_frame


def frames(times_s, size=(64, 48)):
    return [Frame(index=i, t_s=t, rgb=make_frame(t, size=size, seed=5)) for i, t in enumerate(times_s)]


@pytest.mark.parametrize(
    ("count", "stride", "expected"),
    [
        (7, 1, [0, 1, 2, 3, 4, 5, 6]),  # ls_1: the whole past
        (7, 2, [1, 3, 5]),  # range((7 - 2) % 2, 7, 2): the newest past frame is left out
        (6, 3, [0, 3]),  # range((6 - 3) % 3, 6, 3)
        (1, 2, []),  # fewer past frames than the stride: no past at all
    ],
)
def test_sampled_past_follows_sample_long_cache(count, stride, expected):
    assert sampled_past(torch.arange(count) + 10, stride).tolist() == [10 + i for i in expected]


def test_preset_is_the_llava_ovo_bench_log():
    memory = build_config(memory="dscache").memory
    # 24-4_s1.0_ls_1: context_len + 1 = 25 past frames of 196 tokens, frame_len 4 (+ 1), ls_1
    assert (memory.policy, memory.budget, memory.recent_frames, memory.past_stride) == ("dscache", 25 * 196, 4, 1)


def test_refuses_a_memory_directory(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="cannot run with --memory-dir"):
        StreamingSession(tiny_model, MemoryConfig(policy="dscache"), frames([0.0]), memory_dir=tmp_path / "mem")


def test_keeps_the_past_within_budget_and_answers_from_past_then_a_decoupled_instant(tiny_model):
    """At a budget of 3 frames and 1 + 1 instant frames, after 12 frames level 1 holds frames 7-11 (3 past,
    2 instant); the answer cache holds the prefix, past frames 7-9 as level 1 holds them, then frames 10-11
    encoded on the prefix alone, all at consecutive positions."""
    stream = frames([float(i) for i in range(12)])
    probe = StreamingSession(tiny_model, "full", stream[:1], chunk_frames=1)
    probe.advance()
    per_frame = probe.cache.num_visual_tokens
    memory = MemoryConfig(policy="dscache", budget=3 * per_frame, recent_frames=1, recent_fps=1.0)
    session = StreamingSession(tiny_model, memory, stream, chunk_frames=4, max_new_tokens=2)
    session.advance()
    level1 = session.cache.layers[0]
    assert sorted(set(level1.frame_index[level1.kinds == KIND_VISUAL].tolist())) == [7, 8, 9, 10, 11]

    answer = session.memory.answer_cache(tiny_model, session.cache, "What is there?")
    prefix_len = answer.prefix_len
    in_order = []  # per layer, the visual entries by position (cache order does not matter to attention)
    for layer, held in zip(answer.layers, session.cache.layers):
        visual = (layer.kinds == KIND_VISUAL).nonzero().squeeze(1)
        order = visual[layer.positions[0, visual].argsort()]
        in_order.append(order)
        assert layer.frame_index[order].unique_consecutive().tolist() == [7, 8, 9, 10, 11]
        assert layer.positions[0, order].tolist() == list(range(prefix_len, prefix_len + 5 * per_frame))
        past = layer.values[0][:, order[:3 * per_frame]]
        held_past = held.values[0][:, (held.kinds == KIND_VISUAL) & (held.frame_index <= 9)]
        torch.testing.assert_close(past, held_past)  # values as level 1 encoded them (keys only re-rotated)

    # the instant frames by hand: on the prefix alone, nothing of the past before them
    alone = tiny_model.new_cache()
    tiny_model.encode_prefix(alone)
    chunk = tiny_model.encode_chunk([f.rgb for f in stream[10:]], [f.t_s for f in stream[10:]])
    tiny_model.prefill(chunk.embeds, alone.place(chunk.layout), alone, **chunk.model_kwargs)
    for layer, order, by_hand in zip(answer.layers, in_order, alone.layers):
        instant = layer.values[0][:, order[3 * per_frame:]]
        torch.testing.assert_close(instant, by_hand.values[0][:, prefix_len:])
    assert session.ask("What is there?").answer is not None
