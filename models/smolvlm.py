"""SmolVLM2 (Idefics3: SigLIP tower, pixel-shuffle connector, SmolLM2/Llama language model, 1-D RoPE).
Prompt layout and frame preparation: docs/ARCHITECTURE.md, Models, "Per family"."""

from __future__ import annotations

import numpy as np
import torch

from hermes.models.base import VisualChunk, VLMAdapter
from hermes.models.preprocess import normalise, resize_frames
from hermes.positions import Run

STREAM_VIDEO_INTRO = "You are provided the following series of frames from a video.\n"
FAKE_IMAGE = "<fake_token_around_image>"
GLOBAL_IMAGE = "<global-img>"


def frame_stamp(t_s: float) -> str:
    """MM:SS of a stream time, as the processor prints frame timestamps."""
    return f"{int(t_s // 60):02d}:{int(t_s % 60):02d}"


class SmolVLMAdapter(VLMAdapter):
    """Adapter for `SmolVLMForConditionalGeneration` (SmolVLM2) checkpoints."""

    family = "smolvlm"

    def __init__(self, *args, mean=None, std=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = self.model.config
        self.image_size = config.vision_config.image_size
        side = self.image_size // config.vision_config.patch_size
        self.tokens_per_frame = side * side // (config.scale_factor ** 2)  # after the pixel shuffle
        self.mean = mean or (0.5, 0.5, 0.5)
        self.std = std or (0.5, 0.5, 0.5)
        self.stop_on("<end_of_utterance>")

    @property
    def language_model(self) -> torch.nn.Module:
        return self.model.model.text_model

    def prefix_text(self) -> str:
        system = f"System: {self.system_prompt}<end_of_utterance>\n" if self.system_prompt else ""
        return f"<|im_start|>{system}User: {STREAM_VIDEO_INTRO}"

    def question_embeds(self, prompt: str) -> torch.Tensor:
        return self.embed_text(f"\n\n{prompt}<end_of_utterance>\nAssistant:").to(self.dtype)

    def preprocess(self, frames_rgb: list[np.ndarray]) -> torch.Tensor:
        """(N, 3, S, S) normalised pixels at the vision tower's input size."""
        pixels = resize_frames(frames_rgb, self.image_size, self.image_size, quantize=True, device=self.preprocess_device)
        return normalise(pixels, self.mean, self.std).to(self.device, self.dtype)

    @torch.inference_mode()
    def encode_frames(self, frames_rgb: list[np.ndarray]) -> torch.Tensor:
        pixels = self.preprocess(frames_rgb)[None]  # (1, N, 3, S, S): one sample of N images
        out = self.model.model.get_image_features(pixels, return_dict=True)
        return torch.cat(out.pooler_output)  # (N * tokens_per_frame, hidden)

    @torch.inference_mode()
    def encode_chunk(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        return self.wrap_frames(frames_rgb, [f"\nFrame from {frame_stamp(t_s)}:" for t_s in times_s])

    def wrap_frames(self, frames_rgb: list[np.ndarray], heads: list[str]) -> VisualChunk:
        """Each frame's 64 tokens between `<fake_token_around_image><global-img>` and
        `<fake_token_around_image>`, after its text head (a timestamp, or nothing)."""
        visual = self.encode_frames(frames_rgb)
        per_frame = self.tokens_per_frame
        end = self.embed_text(FAKE_IMAGE)  # (1, hidden)
        pieces, frames = [], []
        for i, head_text in enumerate(heads):
            head = self.embed_text(f"{head_text}{FAKE_IMAGE}{GLOBAL_IMAGE}")
            pieces += [head, visual[i * per_frame:(i + 1) * per_frame], end]
            frames.append(torch.full((head.shape[0] + per_frame + 1,), i))
        embeds = torch.cat(pieces).to(self.dtype)
        return VisualChunk(embeds, [Run(embeds.shape[0])], torch.cat(frames))

    # ---- frames as separate images: the chat template's `User:<image>...<image>{text}` ----------------

    def images_prefix_text(self) -> str:
        return "<|im_start|>User:"

    def images_question_embeds(self, prompt: str) -> torch.Tensor:
        return self.embed_text(f"{prompt}<end_of_utterance>\nAssistant:").to(self.dtype)

    @torch.inference_mode()
    def encode_images(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        """Every frame one global image of 64 tokens, as the processor writes an image it does not cut into
        tiles (a real checkpoint's processor would tile a large frame; streaming uses one image per frame).
        """
        return self.wrap_frames(frames_rgb, [""] * len(frames_rgb))
