"""LLaVA-OneVision (SigLIP vision tower + Qwen2 language model): the paper's primary family.

Layout of a stream, matching the model's own video prompt (`<video>` expands to every frame's 196
tokens followed by one `image_newline` embedding):

    <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n      prefix (kept forever)
    [196 tokens of frame 0][196 tokens of frame 1] ...                   visual tokens, chunk by chunk
    [image_newline]\\n{question}<|im_end|>\\n<|im_start|>assistant\\n      question (answer time only)

Frames are resized to the vision tower's square input and normalised here rather than by
transformers' video processor, which would pull in torchvision and Pillow for one resize.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hermes.models.base import VLMAdapter

# SigLIP's normalisation, used by every LLaVA-OneVision checkpoint unless its processor config says otherwise.
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)


def read_normalisation(model_dir: str | Path | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Image mean/std from a checkpoint's (video) preprocessor config, or SigLIP's defaults."""
    if model_dir is not None:
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            path = Path(model_dir) / name
            if path.is_file():
                data = json.loads(path.read_text())
                if "image_mean" in data and "image_std" in data:
                    return tuple(data["image_mean"]), tuple(data["image_std"])
    return DEFAULT_MEAN, DEFAULT_STD


class LlavaOnevisionAdapter(VLMAdapter):
    """Adapter for `LlavaOnevisionForConditionalGeneration` checkpoints."""

    family = "llava_onevision"

    def __init__(self, *args, mean=DEFAULT_MEAN, std=DEFAULT_STD, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        vision = self.model.config.vision_config
        self.image_size = vision.image_size
        side = vision.image_size // vision.patch_size
        pooled = -(-side // 2)  # the model pools each frame's patch grid 2x2 (ceil)
        self.tokens_per_frame = pooled * pooled
        self._mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self._std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.eos_token_ids = {i for i in (im_end, self.tokenizer.eos_token_id) if isinstance(i, int) and i >= 0}

    @property
    def language_model(self) -> torch.nn.Module:
        return self.model.model.language_model

    @property
    def text_config(self):
        return self.model.config.text_config

    def prefix_text(self) -> str:
        return f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n<|im_start|>user\n"

    def preprocess(self, frames_rgb: list[np.ndarray]) -> torch.Tensor:
        """(N, 3, S, S) normalised pixels: bicubic resize to the tower's square input."""
        pixels = torch.from_numpy(np.stack(frames_rgb)).permute(0, 3, 1, 2).float() / 255.0  # (N, 3, H, W)
        if pixels.shape[-2:] != (self.image_size, self.image_size):
            pixels = F.interpolate(pixels, size=(self.image_size, self.image_size), mode="bicubic",
                                   antialias=True, align_corners=False).clamp_(0.0, 1.0)
        return ((pixels - self._mean) / self._std).to(self.device, self.dtype)

    @torch.inference_mode()
    def encode_frames(self, frames_rgb: list[np.ndarray]) -> torch.Tensor:
        pixels = self.preprocess(frames_rgb)[None]  # (1, N, 3, S, S): one video of N frames
        out = self.model.model.get_video_features(pixels, return_dict=True)
        # The model appends one image_newline after the whole video; it belongs to the question.
        return out.pooler_output[0, :-1]  # (N * tokens_per_frame, hidden)

    def question_embeds(self, prompt: str) -> torch.Tensor:
        newline = self.model.model.image_newline[None].to(self.device, self.dtype)  # (1, hidden)
        text = self.embed_text(f"\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
        return torch.cat([newline, text.to(self.dtype)])
