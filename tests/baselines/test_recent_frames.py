"""`recent-frames` (SimpleStream): each answer comes from the newest frames re-encoded fresh."""

from __future__ import annotations

import pytest
import torch

from hermes.baselines.recent_frames import pick_recent, simplestream_prompt
from hermes.config import MemoryConfig, build_config
from hermes.errors import ConfigError
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import make_frame
from tests.models.tiny_models import tiny


def frames(times_s, size=(64, 48)):
    return [Frame(index=i, t_s=t, rgb=make_frame(t, size=size, seed=3)) for i, t in enumerate(times_s)]


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


@pytest.mark.slow  # about 10 s: two answers over 4 LLaVA-OneVision images of 730 tokens, each twice
def test_answer_is_simplestreams_input_on_the_last_frames_only(tiny_model):
    """The golden rule: answering at t is answering from scratch on the 4 newest frames at 1 fps, fed as
    SimpleStream feeds them: no system turn, the frames as separate images, the question after them."""
    stream = frames([i * 0.5 for i in range(16)])  # 0 .. 7.5 s at 2 fps
    memory = MemoryConfig(policy="recent-frames", recent_frames=4, recent_fps=1.0)
    session = StreamingSession(tiny_model, memory, stream, chunk_frames=4, max_new_tokens=3)
    first = session.ask("What is there?", at=5.2)  # frames 0 .. 5.0 seen; newest 4 at 1 fps: 2, 3, 4, 5 s
    second = session.ask("What is there?", at=7.9)  # 4.5, 5.5, 6.5, 7.5 s
    assert session.cache.num_visual_tokens == 0  # no KV memory is kept between questions
    for answer, times in ((first, [2.0, 3.0, 4.0, 5.0]), (second, [4.5, 5.5, 6.5, 7.5])):
        expected = answer_by_hand(tiny_model, frames(times), "<|im_start|>user\n",
                                  "\nWhat is there?<|im_end|>\n<|im_start|>assistant\n")
        assert answer.answer == expected.text
        torch.testing.assert_close(answer.first_token_logits, expected.first_token_logits)
    assert first.frames_seen == 11 and first.last_frame_t_s == 5.0


def answer_by_hand(model, picked, prefix: str, question: str):
    """Greedy answer from a fresh cache: `prefix`, the frames as images, then `question` (literal texts)."""
    cache = model.new_cache()
    embeds = model.embed_text(prefix)
    model.prefill(embeds, cache.allocate_positions(embeds.shape[0]), cache)
    chunk = model.encode_images([f.rgb for f in picked], [f.t_s for f in picked])
    model.prefill(chunk.embeds, cache.place(chunk.layout), cache, **chunk.model_kwargs)
    return model.generate_greedy(model.embed_text(question), cache, 3)


def test_qwen25_answer_sees_16_tokens_per_frame_in_simplestreams_prompt():
    """On Qwen2.5-VL each of the 4 frames is one image of 16 tokens (64, where a video chunk held 32),
    after SimpleStream's prefix, and a multiple-choice question is worded by its OVO-Bench template."""
    model = tiny("tiny-qwen2.5-vl")
    stream = frames([0.0, 1.0, 2.0, 3.0], size=(64, 64))  # square: 112 x 112 px, 4 x 4 merged patches
    memory = MemoryConfig(policy="recent-frames", recent_frames=4, recent_fps=1.0)
    session = StreamingSession(model, memory, stream, chunk_frames=4, max_new_tokens=3)
    session.advance()
    cache = session.memory.answer_cache(model, session.cache, "What is there?")
    prefix = "<|im_start|>user\n<|vision_start|>"  # lib/recent_window_eval_qwen25.py: no system turn
    assert cache.num_tokens == len(model.tokenizer.encode(prefix)) + 64
    assert cache.num_visual_tokens == 64
    answer = session.ask("What is there?", options=["red", "blue"])
    expected = answer_by_hand(model, stream, prefix,
                              "<|vision_end|>\nWhat is there?\nOptions: A. red; B. blue;\n"
                              "Only give the best option's letter directly.<|im_end|>\n<|im_start|>assistant\n")
    # The reply to a question with options is the offered letter the model ranks highest (either spelling).
    letters = model.letter_token_ids("AB")
    best = max(letters, key=lambda token: expected.first_token_logits[token].item())
    assert answer.answer == letters[best]
    torch.testing.assert_close(answer.first_token_logits, expected.first_token_logits)


def test_simplestream_prompt():
    assert simplestream_prompt("Where?") == "Where?"
    assert simplestream_prompt("Where?", ["left", "right", "up"]) == (
        "Where?\nOptions: A. left; B. right; C. up;\nOnly give the best option's letter directly.")


@pytest.mark.parametrize("policy", ["recent-frames", "rekv"])
def test_baselines_refuse_a_memory_directory_they_would_not_persist(policy, tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="cannot run with --memory-dir"):
        StreamingSession(tiny_model, MemoryConfig(policy=policy), frames([0.0]), memory_dir=tmp_path / "mem")
