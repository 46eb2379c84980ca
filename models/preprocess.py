"""Frame preprocessing shared by the adapters, in torch: transformers' processors step by step without
torchvision or Pillow (docs/ARCHITECTURE.md, Models, "Per family"). `model.preprocess_on` picks where the
resize runs: the host, or the model's device from uint8 frames (~6 MB of PCIe per 1080p frame instead of a
host bicubic pass); CUDA's bicubic kernel rounds differently in the last float32 bits."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def read_normalisation(model_dir: str | Path | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Image mean/std from a checkpoint's (video) preprocessor config, or None when it names none."""
    if model_dir is not None:
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            path = Path(model_dir) / name
            if path.is_file():
                data = json.loads(path.read_text())
                if "image_mean" in data and "image_std" in data:
                    return tuple(data["image_mean"]), tuple(data["image_std"])
    return None


def upload_frames(frames_rgb: list[np.ndarray], device: torch.device | None = None) -> torch.Tensor:
    """Frames as one (N, H, W, 3) uint8 tensor on `device` (None: the host), each copied where it lands."""
    if device is None:
        return torch.from_numpy(np.stack(frames_rgb))
    return torch.stack([torch.from_numpy(np.ascontiguousarray(f)).to(device) for f in frames_rgb])


def resize_frames(frames_rgb: list[np.ndarray], height: int, width: int, *, quantize: bool = False,
                  device: torch.device | None = None) -> torch.Tensor:
    """Frames as (N, 3, height, width) float32 in [0, 1], bicubic-resized with antialiasing.

    Args:
        frames_rgb: N frames, each (H, W, 3) uint8 RGB (all the same size).
        quantize: round the resized pixels to 8-bit levels (as a uint8 resize does).
        device: where the resize runs (the uint8 frames are uploaded first); None: the host.
    """
    pixels = upload_frames(frames_rgb, device).permute(0, 3, 1, 2).float()  # (N, 3, H, W) in [0, 255]
    if pixels.shape[-2:] != (height, width):
        pixels = F.interpolate(pixels, size=(height, width), mode="bicubic", antialias=True, align_corners=False)
        pixels = pixels.round() if quantize else pixels
        pixels = pixels.clamp_(0.0, 255.0)
    return pixels / 255.0


# How far the device's resize may be from the host's, in 8-bit levels (max over pixels): float32
# rounding of the same bicubic kernel; one level where `quantize` rounds a value near a half level.
DEVICE_TOLERANCE_LEVELS = 0.01
DEVICE_TOLERANCE_LEVELS_QUANTIZED = 1.0


def device_resize_error_levels(device: torch.device, *, quantize: bool, seed: int = 0) -> float:
    """Max |host - device| of `resize_frames` in 8-bit levels, on a random 270x480 frame resized to
    224x224 (random pixels are a bicubic kernel's worst case).
    """
    frame = np.random.default_rng(seed).integers(0, 256, (270, 480, 3), dtype=np.uint8)
    host = resize_frames([frame], 224, 224, quantize=quantize)
    on_device = resize_frames([frame], 224, 224, quantize=quantize, device=device).cpu()
    return float((host - on_device).abs().max()) * 255.0


def resolve_preprocess_device(preprocess_on: str, device: torch.device) -> torch.device | None:
    """Where frames are resized for `model.preprocess_on` on a model on `device`: None for the host.

    "auto" takes a CUDA device when `device_resize_error_levels` stays within the tolerances there.
    """
    if preprocess_on == "host" or (preprocess_on == "auto" and device.type != "cuda"):
        return None
    if preprocess_on == "auto":
        errors = (device_resize_error_levels(device, quantize=False), device_resize_error_levels(device, quantize=True))
        if errors[0] > DEVICE_TOLERANCE_LEVELS or errors[1] > DEVICE_TOLERANCE_LEVELS_QUANTIZED:
            logging.getLogger(__name__).warning(
                "model.preprocess_on=auto: resizing on the host; %s's resize differs by %.3g / %.3g 8-bit levels "
                "(unrounded / rounded)", device, *errors)
            return None
    return device


def normalise(pixels: torch.Tensor, mean, std) -> torch.Tensor:
    """(pixels - mean) / std per channel; pixels (N, 3, H, W) in [0, 1]."""
    mean_t = torch.tensor(mean, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=pixels.dtype, device=pixels.device).view(1, -1, 1, 1)
    return (pixels - mean_t) / std_t


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize target: sides multiples of `factor`, area in [min_pixels, max_pixels].

    Raises:
        ValueError: an aspect ratio above 200 (the processors refuse it too).
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"frame aspect ratio must be below 200, got {max(height, width) / min(height, width):.0f}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(video: torch.Tensor, patch_size: int, merge_size: int,
             temporal_patch_size: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Qwen-VL's flat patch layout of one video, merge windows contiguous (a frame count not a multiple of
    `temporal_patch_size` is padded by repeating the last frame).

    Args:
        video: (N, C, H, W) normalised frames; H and W multiples of patch_size * merge_size.
        patch_size: spatial patch side in pixels.
        merge_size: spatial merge of the vision tower's patch merger.
        temporal_patch_size: frames per temporal grid step.

    Returns:
        ((T * gh * gw, C * temporal_patch_size * patch_size**2) patches, (T, gh, gw) grid in patches).
    """
    if pad := -video.shape[0] % temporal_patch_size:  # odd chunk: repeat the last frame
        video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
    frames, channels, height, width = video.shape
    grid_t, grid_h, grid_w = frames // temporal_patch_size, height // patch_size, width // patch_size
    patches = video.reshape(grid_t, temporal_patch_size, channels, grid_h // merge_size, merge_size, patch_size,
                            grid_w // merge_size, merge_size, patch_size)
    # (t, tp, c, bh, mh, ph, bw, mw, pw) -> (t, bh, bw, mh, mw, c, tp, ph, pw): merge windows contiguous
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
    return flat, (grid_t, grid_h, grid_w)
