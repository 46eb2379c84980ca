"""The recall gate (hermes.recall_gate): a question about the current frame recalls nothing, one about
something level 1 no longer holds still recalls, and the cap bounds what is spliced."""

import numpy as np
import pytest

from hermes.cache import KIND_PREFIX
from hermes.config import MemoryConfig
from hermes.lower import content_vector
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.rope import RotarySpec
from tests.conftest import random_frames

TPF = 196  # tokens per frame of the tiny model


def stream(n: int = 24) -> list[Frame]:
    """Noise frames; frames 8-11 solid red (the needle, evicted by the end), 20-23 solid blue (on screen now)."""
    frames = random_frames(n, interval_s=0.5, size=(16, 16), seed=3)
    colour = {**{i: (250, 10, 10) for i in range(8, 12)}, **{i: (10, 10, 250) for i in range(20, n)}}
    return [Frame(f.t_s, np.full_like(f.rgb, colour[i]) if i in colour else f.rgb, i) for i, f in enumerate(frames)]


def frame_vector(model, frame: Frame):
    """Query by example (a random model's text and vision do not align): a frame's own last-layer key content,
    encoded alone, as the question's search vector."""
    probe = StreamingSession(model, "full", [frame])
    probe.advance()
    keys, _ = probe.cache.layer_tensors()[-1]
    visual = probe.cache.kinds[-1] != KIND_PREFIX
    return content_vector(keys[0][:, visual], probe.cache.positions[-1][:, visual],
                          RotarySpec.from_text_config(model.text_config))


def ask(model, monkeypatch, vector, **memory):
    cfg = MemoryConfig(policy="hermes", budget=2 * TPF, compress_threshold=0.0, recall=True, recall_top_k=2, **memory)
    session = StreamingSession(model, cfg, stream(), chunk_frames=4)
    monkeypatch.setattr(type(session.lower), "question_vector", lambda self, cache, embeds: vector)
    answer = session.ask("What colour?", at=100.0)
    session.close()
    return answer.recall


@pytest.mark.slow
def test_the_gate_recalls_nothing_for_the_current_frame_and_still_recalls_the_needle(tiny_model, monkeypatch):
    frames = stream()
    now, needle = frame_vector(tiny_model, frames[-1]), frame_vector(tiny_model, frames[9])
    assert ask(tiny_model, monkeypatch, now)["records"] >= 1  # ungated, the current frame's question recalls
    assert ask(tiny_model, monkeypatch, now, recall_gate="above_frames")["records"] == 0
    gated = ask(tiny_model, monkeypatch, needle, recall_gate="above_frames")
    assert gated["records"] >= 1 and gated["tokens"] > 0


@pytest.mark.slow
def test_the_cap_bounds_recalled_tokens_by_level_1(tiny_model, monkeypatch):
    needle = frame_vector(tiny_model, stream()[9])
    assert ask(tiny_model, monkeypatch, needle)["tokens"] > TPF  # uncapped: more than half the 2-frame budget
    assert 0 < ask(tiny_model, monkeypatch, needle, recall_max_ratio=0.5)["tokens"] <= TPF
