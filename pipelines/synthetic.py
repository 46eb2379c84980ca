"""Deterministic synthetic videos for the offline demo and for tests.

`make_frame(t_s, size, seed)` draws coloured shapes that move, bounce off the borders and appear and
disappear on a schedule: a pure function, so a test can recompute any frame without decoding.
`write_synthetic_video` writes them as an mp4 with OpenCV alone (the demo uses it: no dev packages).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hermes.errors import SourceError

# dark enough that every shape colour stands out after lossy compression (synthetic_bench draws on it too)
BACKGROUND_RGB = (24, 24, 32)

# Saturated, well separated colours, so tests can recognise a shape by colour after mp4v coding.
_PALETTE_RGB = (
    (230, 40, 40),  # red
    (40, 200, 60),  # green
    (50, 90, 240),  # blue
    (240, 220, 40),  # yellow
    (230, 60, 220),  # magenta
)

_NUM_SHAPES = 4


@dataclass(frozen=True)
class _Shape:
    """One moving shape; positions and sizes are fractions of the frame so any size works."""

    kind: str  # "rect" or "disc"
    rgb: tuple[int, int, int]
    x0: float  # start centre, fraction of width
    y0: float  # start centre, fraction of height
    vx: float  # velocity, frame widths per second
    vy: float  # velocity, frame heights per second
    radius: float  # half-size, fraction of min(width, height)
    period_s: float  # visibility cycle length
    visible_s: float  # visible for the first `visible_s` of every cycle
    phase_s: float  # offset of the cycle


def _shapes(seed: int) -> list[_Shape]:
    """The seeded shape set; the same seed always gives the same shapes."""
    rng = np.random.default_rng(seed)
    colour_order = rng.permutation(len(_PALETTE_RGB))
    shapes = []
    for i in range(_NUM_SHAPES):
        period_s = float(rng.uniform(2.0, 5.0))
        shapes.append(
            _Shape(
                kind="rect" if i % 2 == 0 else "disc",
                rgb=_PALETTE_RGB[int(colour_order[i])],
                x0=float(rng.uniform(0.2, 0.8)),
                y0=float(rng.uniform(0.2, 0.8)),
                vx=float(rng.uniform(-0.3, 0.3)),
                vy=float(rng.uniform(-0.3, 0.3)),
                radius=float(rng.uniform(0.08, 0.15)),
                period_s=period_s,
                # The first shape is always visible so no frame is ever empty.
                visible_s=period_s if i == 0 else float(rng.uniform(0.4, 0.8)) * period_s,
                phase_s=float(rng.uniform(0.0, period_s)),
            )
        )
    return shapes


def bounce(x: float) -> float:
    """Fold an unbounded coordinate into [0, 1] as if it bounced between two walls."""
    x = x % 2.0
    return 2.0 - x if x > 1.0 else x


def make_frame(t_s: float, size: tuple[int, int] = (160, 120), seed: int = 0) -> np.ndarray:
    """Render the synthetic picture at time `t_s`.

    Args:
        t_s: time in seconds from the start of the video.
        size: (width, height) in pixels.
        seed: selects the shape set (colours, paths, visibility schedule).

    Returns:
        (height, width, 3) uint8 RGB array.
    """
    width, height = int(size[0]), int(size[1])
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[:] = BACKGROUND_RGB
    ys, xs = np.mgrid[0:height, 0:width]
    for shape in _shapes(seed):
        if (t_s + shape.phase_s) % shape.period_s >= shape.visible_s:
            continue  # hidden during this part of its cycle
        cx = bounce(shape.x0 + shape.vx * t_s) * (width - 1)
        cy = bounce(shape.y0 + shape.vy * t_s) * (height - 1)
        r_px = max(2.0, shape.radius * min(width, height))
        if shape.kind == "rect":
            mask = (np.abs(xs - cx) <= r_px) & (np.abs(ys - cy) <= r_px)
        else:
            mask = (xs - cx) ** 2 + (ys - cy) ** 2 <= r_px**2
        frame[mask] = shape.rgb
    return frame


def write_synthetic_video(
    path: str | Path,
    *,
    duration_s: float = 8.0,
    fps: float = 10.0,
    size: tuple[int, int] = (160, 120),
    seed: int = 0,
) -> Path:
    """Write a constant-frame-rate mp4 whose frame `i` is `make_frame(i / fps, size, seed)`.

    Args:
        path: output file (parent directories are created).
        duration_s: length of the video in seconds.
        fps: constant frame rate.
        size: (width, height) in pixels; mp4v needs both even.
        seed: selects the shape set.

    Returns:
        The path written, as a `Path`.

    Raises:
        ValueError: on a non-positive duration or fps, or an odd / non-positive size.
        SourceError: if OpenCV cannot open a writer for `path`.
    """
    width, height = int(size[0]), int(size[1])
    if duration_s <= 0 or fps <= 0:
        raise ValueError(f"duration_s and fps must be positive, got {duration_s} and {fps}")
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"size must be positive even (width, height), got {size}")
    num_frames = max(1, int(round(duration_s * fps)))
    return write_mp4(path, (make_frame(i / fps, (width, height), seed) for i in range(num_frames)), fps,
                     (width, height))


def write_mp4(path: str | Path, frames: Iterable[np.ndarray], fps: float, size: tuple[int, int]) -> Path:
    """Write RGB frames as a constant-frame-rate mp4 (OpenCV, mp4v).

    Args:
        path: output file (parent directories are created).
        frames: (height, width, 3) uint8 RGB frames, in order.
        fps: constant frame rate.
        size: (width, height) in pixels of every frame.

    Returns:
        The path written, as a `Path`.

    Raises:
        SourceError: if OpenCV cannot open a writer for `path`.
    """
    import cv2

    out_path = Path(path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(out_path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (int(size[0]), int(size[1])))
    if not writer.isOpened():
        raise SourceError(
            f"cannot write video file: {out_path} (OpenCV has no mp4v writer for it; "
            "check the directory is writable and opencv-python is installed with FFmpeg)"
        )
    try:
        for rgb in frames:
            writer.write(np.ascontiguousarray(rgb[:, :, ::-1]))  # OpenCV wants BGR
    finally:
        writer.release()
    return out_path
