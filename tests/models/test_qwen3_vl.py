"""Qwen3-VL adapter: timestamped grid steps, interleaved M-RoPE and DeepStack, as the model's own forward."""

import pytest
import torch

from hermes.cache import KIND_PREFIX
from hermes.memory import compact_positions
from hermes.pipelines.session import StreamingSession, format_prompt
from hermes.rope import RotarySpec, rotate_at
from tests.conftest import random_frames
from tests.models.tiny_models import tiny

PROMPT = format_prompt("What is happening?", ["a cat", "a dog"])
SQUARE = (128, 128)  # 4 x 4 merged 16 px patches: 16 tokens per two-frame step


def official_inputs(adapter, frames, prompt: str) -> dict:
    """The model's own one-pass inputs: `<t seconds><|vision_start|>pads<|vision_end|>` per grid step."""
    tok = adapter.tokenizer
    pixels, grid = adapter.preprocess([f.rgb for f in frames])
    steps, per_step = int(grid[0, 0]), int(grid[0, 1:].prod()) // adapter.merge_size ** 2
    times = [f.t_s for f in frames] + [frames[-1].t_s] * (2 * steps - len(frames))
    ids = tok.encode(adapter.prefix_text(), add_special_tokens=False)
    types = [0] * len(ids)
    for k in range(steps):
        head = tok.encode(f"<{(times[2 * k] + times[2 * k + 1]) / 2:.1f} seconds><|vision_start|>",
                          add_special_tokens=False)
        ids += head + [adapter.model.config.video_token_id] * per_step + [adapter.model.config.vision_end_token_id]
        types += [0] * len(head) + [2] * per_step + [0]
    question = tok.encode(f"{prompt}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    ids += question
    types += [0] * len(question)
    return dict(input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]),
                pixel_values_videos=pixels, video_grid_thw=grid)


def reference_first_token_logits(adapter, frames, prompt: str) -> torch.Tensor:
    with torch.no_grad():
        out = adapter.model(**official_inputs(adapter, frames, prompt))
    return out.logits[0, -1].float()


@pytest.mark.parametrize("chunk_frames", [2, 4, 8])
def test_positions_equal_the_models_get_rope_index(chunk_frames):
    adapter = tiny("tiny-qwen3-vl")
    frames = random_frames(8, size=SQUARE, interval_s=0.5)
    inputs = official_inputs(adapter, frames, PROMPT)
    expected, _ = adapter.model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                     video_grid_thw=inputs["video_grid_thw"])
    session = StreamingSession(adapter, "full", frames, chunk_frames=chunk_frames)
    session.advance()
    question = len(adapter.tokenizer.encode(f"{PROMPT}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
    ours = torch.cat([session.cache.positions[0], session.cache.allocate_positions(question)], dim=1)
    assert torch.equal(ours, expected[:, 0])


def test_each_step_has_its_timestamp_and_belongs_to_its_frame():
    adapter = tiny("tiny-qwen3-vl")
    frames = random_frames(5, size=SQUARE, interval_s=0.5)  # odd: the last step repeats frame 4
    chunk = adapter.encode_chunk([f.rgb for f in frames], [f.t_s for f in frames])
    assert [adapter.step_times(3, [f.t_s for f in frames])] == [[0.25, 1.25, 2.0]]
    assert chunk.frame_index.unique().tolist() == [0, 2, 4]
    assert chunk.model_kwargs["visual_pos_masks"].sum() == 3 * 16  # DeepStack goes to the grid tokens only
    assert all(level.shape == (48, 64) for level in chunk.model_kwargs["deepstack_visual_embeds"])
    session = StreamingSession(adapter, "full", frames, chunk_frames=4)
    session.advance()
    p = int((session.cache.kinds[0] == KIND_PREFIX).sum())
    assert session.cache.frame_index[0, p:].unique().tolist() == [0, 2, 4]


@pytest.mark.parametrize("chunk_frames", [2, 4])
def test_streamed_chunks_equal_the_models_own_one_pass_forward(chunk_frames):
    adapter = tiny("tiny-qwen3-vl")
    frames = random_frames(8, size=SQUARE, interval_s=0.5)
    answer = StreamingSession(adapter, "full", frames, chunk_frames=chunk_frames).ask(
        "What is happening?", options=["a cat", "a dog"], at=100.0)
    torch.testing.assert_close(answer.first_token_logits, reference_first_token_logits(adapter, frames, PROMPT),
                               atol=1e-4, rtol=1e-4)


def test_deepstack_features_reach_the_language_model():
    """Without DeepStack the logits differ: the adapter must pass it, as the model's forward does."""
    adapter = tiny("tiny-qwen3-vl")
    frames = random_frames(4, size=SQUARE)
    session = StreamingSession(adapter, "full", frames, chunk_frames=4)
    with_deepstack = session.ask("q", at=10.0).first_token_logits
    original = adapter.encode_chunk

    def without(frames_rgb, times_s):
        chunk = original(frames_rgb, times_s)
        chunk.model_kwargs.clear()
        return chunk

    adapter.encode_chunk = without
    try:
        plain = StreamingSession(adapter, "full", frames, chunk_frames=4).ask("q", at=10.0).first_token_logits
    finally:
        del adapter.encode_chunk
    assert not torch.allclose(with_deepstack, plain, atol=1e-4)


def test_streaming_equals_one_pass_and_greedy_answers_match():
    adapter = tiny("tiny-qwen3-vl")
    frames = random_frames(12)
    streamed = StreamingSession(adapter, "full", frames, chunk_frames=4, max_new_tokens=8)
    one_pass = StreamingSession(adapter, "full", frames, chunk_frames=len(frames), max_new_tokens=8)
    a, b = streamed.ask("Describe the video.", at=10.0), one_pass.ask("Describe the video.", at=10.0)
    torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-5, rtol=1e-5)
    assert a.answer == b.answer
    assert torch.equal(streamed.cache.positions, one_pass.cache.positions)


def test_compaction_moves_whole_frames_with_equal_deltas_and_exact_keys():
    """Interleaved M-RoPE: a compacted frame keeps its own layout (timestamp, grid, delimiter) shifted
    equally on all axes, and its layer-0 keys equal keys computed at the new positions."""
    adapter = tiny("tiny-qwen3-vl")
    frames = random_frames(6, size=SQUARE, interval_s=0.5)
    session = StreamingSession(adapter, "full", frames, chunk_frames=2)
    session.advance()
    cache = session.cache
    p = int((cache.kinds[0] == KIND_PREFIX).sum())
    chunks = [frames[i:i + 2] for i in (0, 2, 4)]
    embeds = torch.cat([adapter.embed_text(adapter.prefix_text())]
                       + [adapter.encode_chunk([f.rgb for f in c], [f.t_s for f in c]).embeds for c in chunks])
    frame = cache.frame_index[0]
    keep = torch.cat([torch.arange(p), (frame == 2).nonzero().squeeze(1), (frame == 4).nonzero().squeeze(1)])
    before = cache.positions[0][:, keep].clone()
    cache.select_(keep.expand(cache.num_layers, -1).contiguous())
    spec = RotarySpec.from_text_config(adapter.text_config)
    assert spec.mrope_interleaved
    compact_positions(cache, spec)
    after = cache.positions[0]
    delta = after - before
    second = cache.frame_index[0] == 2
    assert delta[:, second].unique().numel() == 1 and int(delta[0, second][0]) < 0  # frame 2 moved as one
    assert int(after[:, second].min()) == p  # right after the prefix, where frame 0 was
    assert delta[:, :p].eq(0).all()
    layer0 = adapter.language_model.layers[0]
    with torch.no_grad():
        raw = layer0.self_attn.k_norm(layer0.self_attn.k_proj(layer0.input_layernorm(embeds[keep]))
                                      .view(len(keep), -1, spec.head_dim)).transpose(0, 1)  # (Hkv, T, D)
    torch.testing.assert_close(cache.layer_tensors()[0][0][0], rotate_at(raw, after, spec), atol=2e-5, rtol=1e-5)
