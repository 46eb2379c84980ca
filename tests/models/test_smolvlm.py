"""SmolVLM2 adapter: frame stamps and image delimiters, pixel shuffle, 1-D positions, as the model's own forward."""

import pytest
import torch

from hermes.models.smolvlm import STREAM_VIDEO_INTRO, frame_stamp
from hermes.pipelines.session import StreamingSession, format_prompt
from tests.conftest import random_frames
from tests.models.tiny_models import tiny

PROMPT = format_prompt("What is happening?", ["a cat", "a dog"])


def reference_first_token_logits(adapter, frames, prompt: str) -> torch.Tensor:
    """transformers' own forward on the video prompt the processor builds (with the streaming intro)."""
    tok = adapter.tokenizer
    image = adapter.model.config.image_token_id
    ids = tok.encode(adapter.prefix_text(), add_special_tokens=False)
    for f in frames:
        ids += tok.encode(f"\nFrame from {frame_stamp(f.t_s)}:<fake_token_around_image><global-img>",
                          add_special_tokens=False)
        ids += [image] * adapter.tokens_per_frame + tok.encode("<fake_token_around_image>", add_special_tokens=False)
    ids += tok.encode(f"\n\n{prompt}<end_of_utterance>\nAssistant:", add_special_tokens=False)
    with torch.no_grad():
        pixels = adapter.preprocess([f.rgb for f in frames])[None]  # (1, N, 3, S, S)
        out = adapter.model(input_ids=torch.tensor([ids]), pixel_values=pixels)
    return out.logits[0, -1].float()


def test_prompt_and_tokens_per_frame_match_the_real_model():
    adapter = tiny("tiny-smolvlm2")
    assert adapter.tokens_per_frame == 64  # 32 x 32 patches, pixel shuffle 4x
    assert adapter.prefix_text() == f"<|im_start|>System: You are a helpful assistant.<end_of_utterance>\nUser: " \
                                    f"{STREAM_VIDEO_INTRO}"
    assert frame_stamp(75.9) == "01:15"
    chunk = adapter.encode_chunk([f.rgb for f in random_frames(2)], [0.0, 75.9])
    heads = [len(adapter.tokenizer.encode(f"\nFrame from {stamp}:<fake_token_around_image><global-img>"))
             for stamp in ("00:00", "01:15")]
    assert chunk.frame_index.bincount().tolist() == [head + 64 + 1 for head in heads]  # stamp, image, delimiter
    assert chunk.layout[0].n == chunk.embeds.shape[0]  # one run of consecutive 1-D positions


@pytest.mark.parametrize("chunk_frames", [1, 3, 6])
@pytest.mark.slow
def test_streamed_chunks_equal_the_models_own_one_pass_forward(chunk_frames):
    adapter = tiny("tiny-smolvlm2")
    frames = random_frames(6)
    answer = StreamingSession(adapter, "full", frames, chunk_frames=chunk_frames).ask(
        "What is happening?", options=["a cat", "a dog"], at=100.0)
    torch.testing.assert_close(answer.first_token_logits, reference_first_token_logits(adapter, frames, PROMPT),
                               atol=1e-4, rtol=1e-4)


def test_streaming_equals_one_pass_and_greedy_answers_match():
    adapter = tiny("tiny-smolvlm2")
    frames = random_frames(8)
    streamed = StreamingSession(adapter, "full", frames, chunk_frames=3, max_new_tokens=8)
    one_pass = StreamingSession(adapter, "full", frames, chunk_frames=len(frames), max_new_tokens=8)
    a, b = streamed.ask("Describe the video.", at=10.0), one_pass.ask("Describe the video.", at=10.0)
    torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-5, rtol=1e-5)
    assert a.answer == b.answer
    assert streamed.cache.positions.shape[1] == 1  # 1-D RoPE: one axis
    assert streamed.cache.positions[0, 0].tolist() == list(range(streamed.cache.num_tokens))
