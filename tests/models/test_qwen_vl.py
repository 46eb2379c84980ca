"""Qwen2-VL and Qwen2.5-VL adapters: hermes's M-RoPE positions and token layout are the models' own."""

import dataclasses

import pytest
import torch

from hermes.cache import KIND_PREFIX
from hermes.memory import compact_positions
from hermes.pipelines.session import StreamingSession, format_prompt
from hermes.rope import RotarySpec, rotate_at
from tests.conftest import random_frames
from tests.models.tiny_models import tiny

QWEN = ["tiny-qwen2-vl", "tiny-qwen2.5-vl"]
SQUARE = (112, 112)  # resized to 112 x 112: 4 x 4 merged patches, 16 tokens per two-frame step
PROMPT = format_prompt("What is happening?", ["a cat", "a dog"])


def question_ids(adapter, prompt: str) -> list[int]:
    return adapter.tokenizer.encode(f"<|vision_end|>{prompt}<|im_end|>\n<|im_start|>assistant\n",
                                    add_special_tokens=False)


def official_inputs(adapter, frames, prompt: str) -> dict:
    """The model's own one-pass inputs for its video prompt: ids, token types, pixels, grid, step duration."""
    pixels, grid = adapter.preprocess([f.rgb for f in frames])
    n_video = int(grid.prod()) // adapter.merge_size ** 2
    prefix = adapter.tokenizer.encode(adapter.prefix_text(), add_special_tokens=False)
    question = question_ids(adapter, prompt)
    ids = prefix + [adapter.model.config.video_token_id] * n_video + question
    types = [0] * len(prefix) + [2] * n_video + [0] * len(question)
    inputs = dict(input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]),
                  pixel_values_videos=pixels, video_grid_thw=grid)
    if adapter.family == "qwen2_5_vl":  # seconds per grid step, as the processor reports it
        inputs["second_per_grid_ts"] = torch.tensor([frames[2].t_s - frames[0].t_s])
    return inputs


def rope_index(adapter, inputs) -> torch.Tensor:
    """(3, n) positions from transformers' own `get_rope_index`."""
    extra = {"second_per_grid_ts": inputs["second_per_grid_ts"]} if "second_per_grid_ts" in inputs else {}
    positions, _ = adapter.model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                      video_grid_thw=inputs["video_grid_thw"], **extra)
    return positions[:, 0]


def streamed_positions(adapter, frames, prompt: str, chunk_frames: int) -> torch.Tensor:
    """(3, n) positions hermes gives the prefix, the frames streamed in chunks, and the question."""
    session = StreamingSession(adapter, "full", frames, chunk_frames=chunk_frames)
    session.advance()
    question = session.cache.allocate_positions(len(question_ids(adapter, prompt)))
    return torch.cat([session.cache.positions[0], question], dim=1)


def reference_first_token_logits(adapter, frames, prompt: str) -> torch.Tensor:
    """Logits from transformers' own forward on the official video prompt, in one pass."""
    with torch.no_grad():
        out = adapter.model(**official_inputs(adapter, frames, prompt))
    return out.logits[0, -1].float()


@pytest.mark.parametrize("name", QWEN)
@pytest.mark.parametrize("chunk_frames", [2, 4, 8])
def test_positions_equal_the_models_get_rope_index(name, chunk_frames):
    adapter = tiny(name)
    frames = random_frames(8, size=SQUARE, interval_s=0.25)  # 4 steps, 0.5 s apart
    expected = rope_index(adapter, official_inputs(adapter, frames, PROMPT))
    assert torch.equal(streamed_positions(adapter, frames, PROMPT, chunk_frames), expected)


@pytest.mark.parametrize("name", QWEN)
def test_long_video_positions_match_and_text_continues_after_the_largest(name):
    """Video tokens: exactly transformers' positions. Text after the block: max + 1 on all axes
    (Qwen's reference get_rope_index); transformers 5.24 restarts at start + max(h, w) instead."""
    adapter = tiny(name)
    frames = random_frames(12, size=SQUARE, interval_s=0.5)  # 6 steps; Qwen2.5-VL: 2 positions per step
    inputs = official_inputs(adapter, frames, PROMPT)
    expected, ours = rope_index(adapter, inputs), streamed_positions(adapter, frames, PROMPT, 4)
    video = inputs["mm_token_type_ids"][0] == 2
    assert torch.equal(ours[:, video], expected[:, video])
    last_video = int(video.nonzero().max())
    start = int(expected[1, video].min())
    step = 1 if adapter.family == "qwen2_vl" else 2
    assert int(ours[:, last_video].max()) == start + 5 * step  # the last step's temporal position
    assert ours[:, last_video + 1].tolist() == [start + 5 * step + 1] * 3
    assert expected[:, last_video + 1].tolist() == [start + 4] * 3  # transformers: start + max(h, w)


def test_qwen2_5_temporal_positions_follow_stream_time():
    adapter = tiny("tiny-qwen2.5-vl")
    frames = random_frames(6, size=SQUARE, interval_s=0.5)
    frames[2:] = [dataclasses.replace(f, t_s=f.t_s + 10.0) for f in frames[2:]]  # a 10 s gap after the first step
    session = StreamingSession(adapter, "full", frames, chunk_frames=2)
    session.advance()
    p = int((session.cache.kinds[0] == KIND_PREFIX).sum())
    temporal = session.cache.positions[0, 0, p:].unique().tolist()
    # steps at 0 s, 11 s, 12 s; 2 positions per second (tokens_per_second = 2)
    assert temporal == [p, p + 22, p + 24]


@pytest.mark.parametrize("name", QWEN)
@pytest.mark.parametrize("chunk_frames", [2, 4])
def test_streamed_chunks_equal_the_models_own_one_pass_forward(name, chunk_frames):
    adapter = tiny(name)
    frames = random_frames(8, size=SQUARE, interval_s=0.25)
    answer = StreamingSession(adapter, "full", frames, chunk_frames=chunk_frames, max_new_tokens=6).ask(
        "What is happening?", options=["a cat", "a dog"], at=100.0)
    expected = reference_first_token_logits(adapter, frames, PROMPT)
    torch.testing.assert_close(answer.first_token_logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", QWEN)
@pytest.mark.slow
def test_streaming_equals_one_pass_and_greedy_answers_match(name):
    adapter = tiny(name)
    frames = random_frames(12)  # 48 x 64 frames: 4 x 5 merged patches per step
    streamed = StreamingSession(adapter, "full", frames, chunk_frames=4, max_new_tokens=8)
    one_pass = StreamingSession(adapter, "full", frames, chunk_frames=len(frames), max_new_tokens=8)
    a, b = streamed.ask("Describe the video.", at=10.0), one_pass.ask("Describe the video.", at=10.0)
    torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-5, rtol=1e-5)
    assert a.answer == b.answer
    assert torch.equal(streamed.cache.positions, one_pass.cache.positions)
    for (k1, v1), (k2, v2) in zip(streamed.cache.layer_tensors(), one_pass.cache.layer_tensors()):
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_an_odd_chunk_repeats_its_last_frame_like_the_processor():
    adapter = tiny("tiny-qwen2-vl")
    frames = random_frames(3, size=SQUARE)
    odd = adapter.encode_chunk([f.rgb for f in frames], [f.t_s for f in frames])
    even = adapter.encode_frames([f.rgb for f in frames] + [frames[-1].rgb])
    torch.testing.assert_close(odd.embeds, even, atol=1e-6, rtol=1e-6)
    assert len(odd.layout) == 2 and odd.frame_index.unique().tolist() == [0, 2]
    # and an odd video in one pass is what the model computes for it
    answer = StreamingSession(adapter, "full", frames, chunk_frames=3).ask(PROMPT, at=10.0)
    torch.testing.assert_close(answer.first_token_logits, reference_first_token_logits(adapter, frames, PROMPT),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_compaction_moves_keys_exactly_to_their_new_3d_positions():
    """Layer 0 keys depend only on the token: compacted keys equal keys computed at the new (t, h, w)."""
    adapter = tiny("tiny-qwen2-vl")
    frames = random_frames(6, size=SQUARE)  # 3 steps of 16 tokens
    session = StreamingSession(adapter, "full", frames, chunk_frames=2)
    session.advance()
    cache = session.cache
    p = int((cache.kinds[0] == KIND_PREFIX).sum())
    # step 0: rows 1-2 only; step 1: evicted; step 2: whole
    keep = torch.cat([torch.arange(p), p + torch.arange(4, 12), p + 32 + torch.arange(16)])
    before = cache.positions[0][:, keep].clone()
    embeds = torch.cat([adapter.embed_text(adapter.prefix_text()),
                        adapter.encode_frames([f.rgb for f in frames])])[keep]
    cache.select_(keep.expand(cache.num_layers, -1).contiguous())
    spec = RotarySpec.from_text_config(adapter.text_config)
    compact_positions(cache, spec)
    after = cache.positions[0]
    assert torch.equal(after[:, :p], before[:, :p])  # the prefix never moves
    step0, step2 = after[:, p:p + 8], after[:, p + 8:]

    def layout(pos):  # offsets from the per-axis minimum: what a group keeps
        return pos - pos.min(dim=1, keepdim=True).values

    # each step becomes a one-step block packed right after the previous one, keeping its h/w layout
    assert step0.min(dim=1).values.tolist() == [p] * 3 and torch.equal(layout(step0), layout(before[:, p:p + 8]))
    assert step2.min(dim=1).values.tolist() == [int(step0.max()) + 1] * 3
    assert torch.equal(layout(step2), layout(before[:, p + 8:]))
    assert cache.next_position == int(after.max()) + 1 and cache.block is None
    layer0 = adapter.language_model.layers[0]
    with torch.no_grad():
        raw = layer0.self_attn.k_proj(layer0.input_layernorm(embeds))  # (T, Hkv * D)
    raw = raw.view(len(keep), -1, spec.head_dim).transpose(0, 1)  # (Hkv, T, D)
    torch.testing.assert_close(cache.layer_tensors()[0][0][0], rotate_at(raw, after, spec), atol=2e-5, rtol=1e-5)
    # streaming goes on: the next chunk opens a new block after the packed entries
    session.ingest(random_frames(2, size=SQUARE, seed=1))
    assert int(cache.positions[0, :, -16:].min()) == int(after.max()) + 1
    assert torch.isfinite(session.ask("And now?").first_token_logits).all()


@pytest.mark.slow
def test_frames_after_a_summary_token_are_placed_after_it(monkeypatch):
    # The long-term layers' summary sits right after the newest kept token (max over the three axes + 1,
    # on every axis); a chunk streamed after it must start later on the temporal axis too, not inside
    # the old video block below it. Checked as each chunk arrives, before maintenance refolds.
    from hermes.cache import KIND_SUMMARY
    from hermes.config import MemoryConfig

    adapter = tiny("tiny-qwen2-vl")
    session = StreamingSession(adapter, MemoryConfig(policy="hermes", budget=24), (), chunk_frames=2)
    maintain = type(session.memory).maintain
    gaps = []

    def checked_maintain(self, cache, **kwargs):
        self.settle_chunk(cache)  # what maintain does first: each layer's copy of the chunk at its own positions
        for layer in range(cache.positions.shape[0]):
            summary = cache.kinds[layer] == KIND_SUMMARY
            if bool(summary.any()):
                newest = cache.frame_index[layer] == int(cache.frame_index[layer].max())
                gaps.append(int(cache.positions[layer, 0][newest].min()) - int(cache.positions[layer, 0][summary].max()))
        return maintain(self, cache, **kwargs)

    monkeypatch.setattr(type(session.memory), "maintain", checked_maintain)
    frames = random_frames(8)
    for start in range(0, 8, 2):
        session.ingest(frames[start:start + 2])
    assert gaps and min(gaps) > 0, gaps  # a summary was made, and every later chunk came after it
