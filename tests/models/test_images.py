"""Frames as separate images (`VLMAdapter.encode_images`, the `recent-frames` baseline's input).

Expected counts come from each tiny model's geometry, not from the adapters: Qwen2-VL / Qwen2.5-VL
frames become 112 px squares of 14 px patches (8 x 8), merged 2 x 2 into 4 x 4 = 16 tokens per
image; Qwen3-VL 128 px of 16 px patches, again 16; LLaVA-OneVision's 108 px tower input in 4 px
patches is 27 x 27 = 729 unpooled tokens per image plus its image_newline; SmolVLM2's 128 px in 4 px
patches (32 x 32) pixel-shuffled by 4 x 4 is 64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hermes.positions import place
from tests.models.tiny_models import tiny

# family: (visual tokens per image, text tokens around each image in its layout)
PER_IMAGE = {
    "tiny-qwen2-vl": (16, 0),  # one vision block for all images: its delimiters are prefix and question
    "tiny-qwen2.5-vl": (16, 0),
    "tiny-qwen3-vl": (16, 2),  # <|vision_start|> ... <|vision_end|> around every image
    "tiny-llava-onevision": (729 + 1, 0),  # the image_newline counts with its image
    "tiny-smolvlm2": (64, 3),  # <fake_token_around_image><global-img> ... <fake_token_around_image>
}


def square_frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("name", list(PER_IMAGE))
def test_each_frame_is_one_image_of_the_family_size(name):
    model = tiny(name)
    visual, around = PER_IMAGE[name]
    chunk = model.encode_images(square_frames(4), [0.0, 1.0, 2.0, 3.0])
    assert torch.bincount(chunk.frame_index).tolist() == [visual + around] * 4
    assert chunk.embeds.shape[0] == sum(segment.n for segment in chunk.layout) == 4 * (visual + around)
    if "visual_pos_masks" in chunk.model_kwargs:  # Qwen3-VL: DeepStack reaches exactly the image tokens
        assert int(chunk.model_kwargs["visual_pos_masks"].sum()) == 4 * visual


def test_qwen25_four_frames_are_64_visual_tokens_not_32():
    """The video path merges frames in pairs (16 tokens per two-frame grid step); images do not."""
    model = tiny("tiny-qwen2.5-vl")
    frames = square_frames(4)
    assert model.encode_chunk(frames, [0.0, 1.0, 2.0, 3.0]).embeds.shape[0] == 32
    assert model.encode_images(frames, [0.0, 1.0, 2.0, 3.0]).embeds.shape[0] == 64


@pytest.mark.parametrize("name", list(PER_IMAGE))
def test_images_are_encoded_independently(name):
    """An image's tokens do not depend on the frames beside it (a video's grid step would mix two)."""
    model = tiny(name)
    frames = square_frames(4, seed=1)
    together = model.encode_images(frames, [0.0, 1.0, 2.0, 3.0])
    alone = model.encode_images(frames[2:3], [2.0])
    torch.testing.assert_close(together.embeds[together.frame_index == 2], alone.embeds, atol=1e-5, rtol=1e-4)


def test_qwen25_positions_are_simplestreams():
    """SimpleStream puts every image in one vision block; transformers 4.52.4's `get_rope_index` gives
    the first image its grid at the block's start s (temporal s, row s + r, column s + c) and numbers
    the rest as text from s + 4 (the grid's largest position, s + 3, plus one)."""
    model = tiny("tiny-qwen2.5-vl")
    chunk = model.encode_images(square_frames(4), [10.0, 11.0, 12.0, 13.0])
    s = 7
    positions = place(chunk.layout, s, None, num_axes=3).positions
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    first = torch.stack([torch.full((16,), s), s + rows.flatten(), s + cols.flatten()])
    assert torch.equal(positions[:, :16], first)
    assert torch.equal(positions[:, 16:], torch.arange(s + 4, s + 4 + 48).expand(3, 48))


def test_qwen3_every_image_is_its_own_block():
    """Qwen3-VL (SimpleStream's per-frame vision blocks): each image starts a block one past the
    previous largest position, with temporal offset 0 (no timestamps between images)."""
    model = tiny("tiny-qwen3-vl")
    chunk = model.encode_images(square_frames(2), [0.0, 1.0])
    positions = place(chunk.layout, 0, None, num_axes=3).positions
    # image 1: <|vision_start|> at 0, grid at 1 (t = 1, rows/cols 1..4), <|vision_end|> at 5
    # image 2: <|vision_start|> at 6, grid at 7, <|vision_end|> at 11
    for start, block in ((0, positions[:, :18]), (6, positions[:, 18:])):
        assert block[:, 0].tolist() == [start] * 3 and block[:, -1].tolist() == [start + 5] * 3
        assert block[0, 1:17].tolist() == [start + 1] * 16
        assert sorted(set(block[1, 1:17].tolist())) == [start + 1 + r for r in range(4)]


# family: (text before the first image, text from the last image to the answer, for question "Q?").
# Qwen-VL as SimpleStream writes it (lib/recent_window_eval_qwen25.py, lib/recent_window_eval_qwen3.py):
# no system turn, one vision block (Qwen2/2.5-VL) or a block per image (Qwen3-VL), a newline before
# the question. LLaVA-OneVision: the same ChatML turn; SmolVLM2: its chat template's `User:<image>Q?`.
FRAMING = {
    "tiny-qwen2-vl": ("<|im_start|>user\n<|vision_start|>", "<|vision_end|>\nQ?<|im_end|>\n<|im_start|>assistant\n"),
    "tiny-qwen2.5-vl": ("<|im_start|>user\n<|vision_start|>", "<|vision_end|>\nQ?<|im_end|>\n<|im_start|>assistant\n"),
    "tiny-qwen3-vl": ("<|im_start|>user\n", "\nQ?<|im_end|>\n<|im_start|>assistant\n"),
    "tiny-llava-onevision": ("<|im_start|>user\n", "\nQ?<|im_end|>\n<|im_start|>assistant\n"),
    "tiny-smolvlm2": ("<|im_start|>User:", "Q?<end_of_utterance>\nAssistant:"),
}


@pytest.mark.parametrize("name", list(FRAMING))
def test_images_framing_has_no_system_turn(name):
    model = tiny(name)
    prefix, question = FRAMING[name]
    assert model.images_prefix_text() == prefix
    torch.testing.assert_close(model.images_question_embeds("Q?"), model.embed_text(question))
