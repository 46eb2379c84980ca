"""The unit every source yields: one decoded RGB frame with its timestamp."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Frame:
    """One decoded frame.

    Attributes:
        t_s: presentation time in seconds from the start of the source (PTS for files, capture
            clock for live sources).
        rgb: (H, W, 3) uint8 RGB pixels, already rotated upright.
        index: position of the frame in the source's own decoding order (0-based).
    """

    t_s: float
    rgb: np.ndarray
    index: int
