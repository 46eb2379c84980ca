"""LLaVA-OneVision (SigLIP vision tower + Qwen2 language model): the paper's primary family. Prompt layout:
docs/ARCHITECTURE.md, Models, "Per family"."""

from __future__ import annotations

import numpy as np
import torch

from hermes.models.base import VisualChunk, VLMAdapter
from hermes.models.preprocess import normalise, resize_frames
from hermes.positions import Run

# SigLIP's normalisation, used by every LLaVA-OneVision checkpoint unless its processor config says otherwise.
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)


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
        self.mean, self.std = mean, std
        self.stop_on("<|im_end|>")

    def prefix_text(self) -> str:
        return f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n<|im_start|>user\n"

    def preprocess(self, frames_rgb: list[np.ndarray]) -> torch.Tensor:
        """(N, 3, S, S) normalised pixels: bicubic resize to the tower's square input."""
        pixels = resize_frames(frames_rgb, self.image_size, self.image_size, device=self.preprocess_device)  # (N, 3, S, S)
        return normalise(pixels, self.mean, self.std).to(self.device, self.dtype)

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

    # ---- frames as separate images ----------------------------------------------------------------

    @torch.inference_mode()
    def encode_images(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        """Every frame an image at the tower's base resolution, unpooled, with its own `image_newline` (730
        tokens at 384 px), as the model encodes a multi-image prompt's images (`batch_num_images`).
        """
        pixels = self.preprocess(frames_rgb)  # (N, 3, S, S)
        images = len(frames_rgb)
        # transformers crops a prompt's only image (anyres): a lone frame goes beside a copy of itself,
        # which changes nothing for it (the tower encodes each image on its own)
        pixels = pixels if images > 1 else pixels.repeat(2, 1, 1, 1)
        sizes = torch.tensor([[self.image_size, self.image_size]] * len(pixels), device=self.device)
        out = self.model.model.get_image_features(pixels, sizes, batch_num_images=torch.tensor([len(pixels)]),
                                                  return_dict=True)
        features = out.pooler_output[:images]  # per image: (tokens + 1, hidden), its newline last
        embeds = torch.cat(features).to(self.dtype)
        frame_index = torch.arange(images).repeat_interleave(features[0].shape[0])
        return VisualChunk(embeds, [Run(embeds.shape[0])], frame_index)
