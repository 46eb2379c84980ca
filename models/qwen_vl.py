"""Qwen2-VL and Qwen2.5-VL: a ViT whose 2x2 patch merger feeds a Qwen2 language model with M-RoPE.

Prompt layout, frame preparation and positions: docs/ARCHITECTURE.md, Models, "Per family". Two
frames form one temporal grid step and an odd chunk repeats its last frame, as the processor does for
an odd video, so only even `stream.chunk_frames` streams equal one pass.
"""

from __future__ import annotations

import numpy as np
import torch

from hermes.models.base import VisualChunk, VLMAdapter
from hermes.models.preprocess import normalise, patchify, resize_frames, smart_resize
from hermes.positions import GridStep, Run

# OpenAI CLIP's normalisation: the Qwen2-VL / Qwen2.5-VL processors' default.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class QwenVLAdapter(VLMAdapter):
    """Adapter for `Qwen2VLForConditionalGeneration` checkpoints, and the base of the Qwen-VL family.

    Args:
        mean, std: image normalisation (the checkpoint's, when it names one).
        min_pixels, max_pixels: area bounds per frame for the smart resize. Defaults: the video
            processor's minimum (128 merged patches) and a streaming cap of 448 x 448 px (256 merged
            patches per two-frame step, about LLaVA-OneVision's 196 tokens per frame).
    """

    family = "qwen2_vl"
    default_mean, default_std = CLIP_MEAN, CLIP_STD
    default_min_pixels = 128 * 28 * 28
    default_max_pixels = 448 * 448
    vision_start, vision_end = "<|vision_start|>", "<|vision_end|>"

    def __init__(self, *args, mean=None, std=None, min_pixels: int | None = None, max_pixels: int | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        vision = self.model.config.vision_config
        self.patch_size = vision.patch_size
        self.merge_size = vision.spatial_merge_size
        self.temporal_patch_size = vision.temporal_patch_size
        self.mean = mean or self.default_mean
        self.std = std or self.default_std
        self.min_pixels = min_pixels or self.default_min_pixels
        self.max_pixels = max_pixels or self.default_max_pixels
        # until frames arrive: a square frame at the pixel cap
        side = int(self.max_pixels ** 0.5) // (self.patch_size * self.merge_size)
        self.tokens_per_frame = -(-side * side // self.temporal_patch_size)
        self.stop_on("<|im_end|>", "<|endoftext|>")

    @property
    def tokens_per_second(self) -> float | None:
        """Temporal positions per second of stream time; None: one per grid step (Qwen2-VL)."""
        return None

    def chat_start(self) -> str:
        """The ChatML opening up to the user's content (no system turn without a system prompt)."""
        system = f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n" if self.system_prompt else ""
        return f"{system}<|im_start|>user\n"

    def prefix_text(self) -> str:
        return self.chat_start() + self.vision_start

    def question_embeds(self, prompt: str) -> torch.Tensor:
        return self.embed_text(f"{self.vision_end}{prompt}<|im_end|>\n<|im_start|>assistant\n").to(self.dtype)

    # ---- frames -----------------------------------------------------------------------------------

    def frame_size(self, height: int, width: int) -> tuple[int, int]:
        """Resized (height, width) of a frame: smart resize to multiples of patch x merge."""
        return smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)

    def preprocess(self, frames_rgb: list[np.ndarray], as_images: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames to the model's video input, or to its image input (one image per frame).

        All frames of a chunk take the size smart resize gives the first one. As images, each frame is its
        own one-step grid holding the frame twice (the image processor's padding to `temporal_patch_size`).

        Returns:
            (pixel values (T * gh * gw, 3 * tps * ps * ps) on the model's device and dtype,
             grid_thw (G, 3) int64: steps, patch rows and columns per grid; G = 1 for a video, else images).
        """
        height, width = self.frame_size(*frames_rgb[0].shape[:2])
        pixels = resize_frames(frames_rgb, height, width, quantize=True, device=self.preprocess_device)
        pixels = normalise(pixels, self.mean, self.std)
        videos = [pixels[i:i + 1] for i in range(len(pixels))] if as_images else [pixels]
        parts = [patchify(v, self.patch_size, self.merge_size, self.temporal_patch_size) for v in videos]
        patches = torch.cat([p for p, _ in parts])
        return patches.to(self.device, self.dtype), torch.tensor([grid for _, grid in parts], device=self.device)

    @torch.inference_mode()
    def vision(self, frames_rgb: list[np.ndarray], as_images: bool = False):
        """The model's own video features for one chunk (as images: its image features, one per frame):
        (embeds (T * h * w, hidden), step-major then row-major; (T, h, w) grid in merged patches; the
        vision output, which Qwen3-VL reads DeepStack from).
        """
        pixels, grid_thw = self.preprocess(frames_rgb, as_images)
        features = self.model.model.get_image_features if as_images else self.model.model.get_video_features
        out = features(pixels, grid_thw, return_dict=True)
        steps = int(grid_thw[:, 0].sum())
        rows, cols = grid_thw[0, 1:].tolist()
        return torch.cat(out.pooler_output), (steps, rows // self.merge_size, cols // self.merge_size), out

    def encode_frames(self, frames_rgb: list[np.ndarray]) -> torch.Tensor:
        return self.vision(frames_rgb)[0]

    def step_frames(self, steps: int, times_s: list[float]) -> tuple[list[int], list[float]]:
        """First frame index and stream time of each grid step (a padded last step repeats the last frame)."""
        first = [min(k * self.temporal_patch_size, len(times_s) - 1) for k in range(steps)]
        return first, [times_s[i] for i in first]

    @torch.inference_mode()
    def encode_chunk(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        embeds, (steps, rows, cols), _ = self.vision(frames_rgb)
        first, starts = self.step_frames(steps, times_s)
        layout = [GridStep(rows, cols, t, self.tokens_per_second) for t in starts]
        frame_index = torch.tensor(first).repeat_interleave(rows * cols)
        self.tokens_per_frame = -(-rows * cols // self.temporal_patch_size)
        return VisualChunk(embeds, layout, frame_index)

    # ---- frames as separate images: SimpleStream's Qwen2.5-VL input (lib/recent_window_eval_qwen25.py) ----

    def images_prefix_text(self) -> str:
        return f"<|im_start|>user\n{self.vision_start}"

    def images_question_embeds(self, prompt: str) -> torch.Tensor:
        return self.embed_text(f"{self.vision_end}\n{prompt}<|im_end|>\n<|im_start|>assistant\n").to(self.dtype)

    @torch.inference_mode()
    def encode_images(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        """Every frame an image of h x w merged patches, all in the one vision block SimpleStream opens, at
        the positions its transformers (4.52.4) gives: the first image its grid, the others' tokens as text.
        """
        embeds, (images, rows, cols), _ = self.vision(frames_rgb, as_images=True)
        per_image = rows * cols
        layout = [GridStep(rows, cols, times_s[0], self.tokens_per_second), Run((images - 1) * per_image)]
        return VisualChunk(embeds, layout, torch.arange(images).repeat_interleave(per_image))


class Qwen25VLAdapter(QwenVLAdapter):
    """Adapter for `Qwen2_5_VLForConditionalGeneration`: Qwen2-VL plus absolute-time temporal positions."""

    family = "qwen2_5_vl"

    @property
    def tokens_per_second(self) -> float:
        return float(self.model.config.vision_config.tokens_per_second)
