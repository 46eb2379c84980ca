"""LLaVA-OneVision adapter: hermes's own token layout must be the model's own video prompt."""

import json

import pytest
import torch

from hermes.config import ModelConfig
from hermes.errors import ModelError
from hermes.models.loading import load_model
from hermes.pipelines.session import StreamingSession, format_prompt
from tests.conftest import random_frames


def reference_first_token_logits(adapter, frames, prompt: str, answer_prefix: str = "") -> torch.Tensor:
    """Logits from transformers' own forward on the official `<video>` prompt, in one pass."""
    tok = adapter.tokenizer
    video_id = adapter.model.config.video_token_id
    ids = (tok.encode(adapter.prefix_text(), add_special_tokens=False)
           + [video_id] * (len(frames) * adapter.tokens_per_frame + 1)  # frames, then one image_newline
           + tok.encode(f"\n{prompt}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
           + tok.encode(answer_prefix, add_special_tokens=False))
    pixels = adapter.preprocess([f.rgb for f in frames])[None]
    with torch.no_grad():
        out = adapter.model(input_ids=torch.tensor([ids]), pixel_values_videos=pixels)
    return out.logits[0, -1].float()


def test_tokens_per_frame_matches_real_model(tiny_model):
    assert tiny_model.tokens_per_frame == 196
    assert tiny_model.encode_frames([f.rgb for f in random_frames(2)]).shape == (392, 64)


@pytest.mark.parametrize("chunk_frames", [1, 3, 8])
def test_streamed_chunks_equal_the_models_own_one_pass_forward(tiny_model, chunk_frames):
    frames = random_frames(8)
    session = StreamingSession(tiny_model, "full", frames, chunk_frames=chunk_frames, max_new_tokens=6)
    answer = session.ask("What is happening?", options=["a cat", "a dog"], at=100.0)
    expected = reference_first_token_logits(tiny_model, frames, format_prompt("What is happening?",
                                                                              ["a cat", "a dog"]))
    torch.testing.assert_close(answer.first_token_logits, expected, atol=1e-4, rtol=1e-4)


def test_an_answer_prefix_continues_the_assistant_turn(tiny_model):
    frames = random_frames(4)
    session = StreamingSession(tiny_model, "full", frames, chunk_frames=2, max_new_tokens=4)
    answer = session.ask("Which?", options=["x", "y"], at=10.0, answer_prefix="Best option:(")
    expected = reference_first_token_logits(tiny_model, frames, format_prompt("Which?", ["x", "y"]),
                                            answer_prefix="Best option:(")
    torch.testing.assert_close(answer.first_token_logits, expected, atol=1e-4, rtol=1e-4)


def test_streaming_equals_one_pass_and_greedy_answers_match(tiny_model):
    frames = random_frames(12)
    streamed = StreamingSession(tiny_model, "full", frames, chunk_frames=4, max_new_tokens=8)
    one_pass = StreamingSession(tiny_model, "full", frames, chunk_frames=len(frames), max_new_tokens=8)
    a = streamed.ask("Describe the video.", at=10.0)
    b = one_pass.ask("Describe the video.", at=10.0)
    torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-5, rtol=1e-5)
    assert a.answer == b.answer
    for (k1, v1), (k2, v2) in zip(streamed.cache.layer_tensors(), one_pass.cache.layer_tensors()):
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)


def test_tiny_model_is_seeded():
    a = load_model(ModelConfig(name="tiny-llava-onevision", seed=3))
    b = load_model(ModelConfig(name="tiny-llava-onevision", seed=3))
    c = load_model(ModelConfig(name="tiny-llava-onevision", seed=4))
    wa, wb, wc = (m.model.lm_head.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_loads_from_a_local_directory(tiny_model, tmp_path):
    tiny_model.model.save_pretrained(tmp_path)
    tiny_model.tokenizer.save_pretrained(tmp_path)
    local = load_model(ModelConfig(name=str(tmp_path), device="cpu", dtype="float32"))
    frames = random_frames(3)
    a = StreamingSession(tiny_model, "full", frames).ask("Q?", at=5.0)
    b = StreamingSession(local, "full", frames).ask("Q?", at=5.0)
    torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-5, rtol=1e-5)


def test_unknown_model_id_is_a_model_error():
    with pytest.raises(ModelError, match="unknown model 'llava-onevison-0.5b'.*did you mean 'llava-onevision-0.5b'"):
        load_model(ModelConfig(name="llava-onevison-0.5b"))


def test_hub_id_not_available_offline_is_a_model_error():
    with pytest.raises(ModelError, match="model 'nobody/no-such-model' is not on this machine.*hermes-video pull nobody/no-such-model"):
        load_model(ModelConfig(name="nobody/no-such-model"))


def test_unsupported_architecture_lists_supported_families(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelError, match="unsupported model architecture 'bert'.*llava_onevision"):
        load_model(ModelConfig(name=str(tmp_path)))
