"""Qwen3-VL: the Qwen-VL vision tower (16 px patches, DeepStack) and a Qwen3 language model with
interleaved M-RoPE. Prompt layout (one timestamped block per grid step), positions and DeepStack:
docs/ARCHITECTURE.md, Models, "Per family"."""

from __future__ import annotations

import numpy as np
import torch

from hermes.models.base import VisualChunk, VLMAdapter
from hermes.models.qwen_vl import QwenVLAdapter
from hermes.positions import GridStep, Run


class Qwen3VLAdapter(QwenVLAdapter):
    """Adapter for `Qwen3VLForConditionalGeneration` checkpoints."""

    family = "qwen3_vl"
    default_mean = default_std = (0.5, 0.5, 0.5)
    default_min_pixels = 128 * 32 * 32
    default_max_pixels = 448 * 448

    def prefix_text(self) -> str:
        return self.chat_start()

    def question_embeds(self, prompt: str) -> torch.Tensor:
        return self.embed_text(f"{prompt}<|im_end|>\n<|im_start|>assistant\n").to(self.dtype)

    def step_times(self, steps: int, times_s: list[float]) -> list[float]:
        """Timestamp of each grid step: the mean time of its frames (a padded step: the last frame's)."""
        size = self.temporal_patch_size
        padded = times_s + [times_s[-1]] * (steps * size - len(times_s))
        return [sum(padded[k * size:(k + 1) * size]) / size for k in range(steps)]

    @torch.inference_mode()
    def encode_chunk(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        visual, (steps, rows, cols), out = self.vision(frames_rgb)
        per_step = rows * cols
        first, starts = self.step_frames(steps, times_s)
        end = self.embed_text(self.vision_end)  # (1, hidden)
        pieces, layout, frames, is_visual = [], [], [], []
        for k, stamp in enumerate(self.step_times(steps, times_s)):
            head = self.embed_text(f"<{stamp:.1f} seconds>{self.vision_start}")  # (m, hidden)
            pieces += [head, visual[k * per_step:(k + 1) * per_step], end]
            layout += [Run(head.shape[0]), GridStep(rows, cols, starts[k]), Run(1)]
            n = head.shape[0] + per_step + 1
            frames.append(torch.full((n,), first[k]))
            is_visual.append(torch.cat([torch.zeros(head.shape[0], dtype=torch.bool),
                                        torch.ones(per_step, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)]))
        self.tokens_per_frame = -(-per_step // self.temporal_patch_size)
        return VisualChunk(torch.cat(pieces).to(self.dtype), layout, torch.cat(frames), self.deepstack(out, is_visual))

    def deepstack(self, out, is_visual: list[torch.Tensor]) -> dict:
        """The prefill's DeepStack inputs: the vision output's features and the mask of the visual tokens.

        Args:
            out: the vision output of `vision`.
            is_visual: per grid step or image, (n,) bool: which of its tokens are visual.

        Returns:
            `visual_pos_masks` (1, tokens) bool on the device and `deepstack_visual_embeds`, per level
            (visual tokens, hidden).
        """
        levels = [torch.cat(level) for level in out.deepstack_features]  # per level: (visual tokens, hidden)
        return {"visual_pos_masks": torch.cat(is_visual)[None].to(self.device), "deepstack_visual_embeds": levels}

    # ---- frames as separate images: SimpleStream's Qwen3-VL input (lib/recent_window_eval_qwen3.py) ----

    # plain ChatML around the images: each image carries its own vision delimiters (not Qwen2-VL's one block)
    images_prefix_text = VLMAdapter.images_prefix_text
    images_question_embeds = VLMAdapter.images_question_embeds

    @torch.inference_mode()
    def encode_images(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        """Every frame an image in its own block, `<|vision_start|>[h x w]<|vision_end|>`, no timestamp, each
        grid starting a block (temporal offset 0), as `get_rope_index` places images.
        """
        visual, (images, rows, cols), out = self.vision(frames_rgb, as_images=True)
        per_image = rows * cols
        start, end = self.embed_text(self.vision_start), self.embed_text(self.vision_end)  # (1, hidden) each
        pieces, layout, is_visual = [], [], []
        for k in range(images):
            pieces += [start, visual[k * per_image:(k + 1) * per_image], end]
            layout += [Run(1), GridStep(rows, cols, times_s[k]), Run(1)]
            is_visual.append(torch.cat([torch.zeros(1, dtype=torch.bool), torch.ones(per_image, dtype=torch.bool),
                                        torch.zeros(1, dtype=torch.bool)]))
        frame_index = torch.arange(images).repeat_interleave(per_image + 2)
        return VisualChunk(torch.cat(pieces).to(self.dtype), layout, frame_index, self.deepstack(out, is_visual))
