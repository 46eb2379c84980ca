"""`recent-frames` (SimpleStream): each answer comes from the newest frames re-encoded fresh."""

from __future__ import annotations

import pytest
import torch

from hermes.baselines.recent_frames import pick_recent
from hermes.config import MemoryConfig, build_config
from hermes.errors import ConfigError
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import make_frame


def frames(times_s):
    return [Frame(index=i, t_s=t, rgb=make_frame(t, size=(64, 48), seed=3)) for i, t in enumerate(times_s)]


@pytest.mark.parametrize(
    ("times", "count", "fps", "expected"),
    [
        ([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0], 4, 1.0, [0, 2, 4, 6]),  # 2 fps thinned to 1 fps from the newest
        ([0.0, 2.0, 4.0], 4, 1.0, [0, 1, 2]),  # fewer frames than asked: all of them
        ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 2, 1.0, [4, 5]),
        ([], 4, 1.0, []),
    ],
)
def test_pick_recent(times, count, fps, expected):
    assert pick_recent(times, count, fps) == expected


def test_preset_resolves():
    cfg = build_config(memory="recent-frames")
    assert (cfg.memory.policy, cfg.memory.recent_frames, cfg.memory.recent_fps) == ("recent-frames", 4, 1.0)


def test_bad_settings_are_config_errors(tiny_model):
    with pytest.raises(ConfigError, match="recent_frames"):
        StreamingSession(tiny_model, MemoryConfig(policy="recent-frames", recent_frames=0))


def test_answer_equals_a_fresh_session_on_the_last_frames_only(tiny_model):
    """The golden rule: answering at t is answering from scratch on the 4 newest frames at 1 fps."""
    stream = frames([i * 0.5 for i in range(16)])  # 0 .. 7.5 s at 2 fps
    memory = MemoryConfig(policy="recent-frames", recent_frames=4, recent_fps=1.0)
    session = StreamingSession(tiny_model, memory, stream, chunk_frames=4, max_new_tokens=3)
    first = session.ask("What is there?", at=5.2)  # frames 0 .. 5.0 seen; newest 4 at 1 fps: 2, 3, 4, 5 s
    second = session.ask("What is there?", at=7.9)  # 4.5, 5.5, 6.5, 7.5 s
    assert session.cache.num_visual_tokens == 0  # no KV memory is kept between questions
    for answer, times in ((first, [2.0, 3.0, 4.0, 5.0]), (second, [4.5, 5.5, 6.5, 7.5])):
        fresh = StreamingSession(tiny_model, "full", frames(times), chunk_frames=4, max_new_tokens=3)
        fresh.advance()
        expected = fresh.ask("What is there?")
        assert answer.answer == expected.answer
        torch.testing.assert_close(answer.first_token_logits, expected.first_token_logits)
    assert first.frames_seen == 11 and first.last_frame_t_s == 5.0


@pytest.mark.parametrize("policy", ["recent-frames", "rekv"])
def test_baselines_refuse_a_memory_directory_they_would_not_persist(policy, tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="cannot run with --memory-dir"):
        StreamingSession(tiny_model, MemoryConfig(policy=policy), frames([0.0]), memory_dir=tmp_path / "mem")
