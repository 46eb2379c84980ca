"""Sampling frames by timestamp: which frames a file read at a target fps keeps.

docs/ARCHITECTURE.md, Sources. One rule for every file backend, applied to all timestamps at once
(`sample_indices`, decord) or one frame at a time (`StreamingPicker`, OpenCV) by the same vectorised
code (`StreamingPicker._picks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hermes.errors import UsageError

# A frame whose PTS is within this much after a target time counts as on screen at that target.
# It absorbs float rounding (decord reports PTS as float32: ~0.25 ms error after an hour) and is
# far below any real frame interval.
PTS_TOLERANCE_S = 5e-4


def every_frame(fps: float | None, native_fps: float) -> bool:
    """Whether sampling at `fps` keeps every frame of a file at `native_fps` (None: every frame)."""
    return fps is None or fps >= native_fps * (1.0 - 1e-9)


def check_fps(fps: float | None) -> None:
    """Refuse an fps that is not a positive finite number (None, every frame, is accepted).

    Raises:
        UsageError: `fps` is zero, negative, NaN or infinite.
    """
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise UsageError(f"fps must be a positive number, got {fps!r} (pass e.g. fps=1.0)")


def sample_indices(
    pts_s: Sequence[float],
    fps: float | None,
    start_s: float = 0.0,
    end_s: float | None = None,
    *,
    native_fps: float | None = None,
) -> list[int]:
    """Choose which frames to keep when sampling at `fps`, by timestamp.

    Rule: target times are ``t_k = start_s + k / fps`` while ``t_k < end``; for each, the frame on
    screen at ``t_k`` (the last with ``pts <= t_k``, else the first) is picked, each frame at most
    once. When `fps` is None or >= the native rate, every frame on screen during ``[start_s, end)``
    is picked. Comparisons allow `PTS_TOLERANCE_S` of rounding.

    Args:
        pts_s: presentation timestamps in seconds, in increasing order.
        fps: sampling rate in frames per second; None for every frame.
        start_s: first target time.
        end_s: exclusive end time; None means the last PTS plus the median frame interval.
        native_fps: the file's average frame rate; None estimates it from `pts_s`.

    Returns:
        Increasing, unique frame indices into `pts_s`.

    Raises:
        UsageError: if `fps` is not a positive number.
    """
    check_fps(fps)
    pts = np.asarray(pts_s, dtype=np.float64)
    n = len(pts)
    if n == 0:
        return []
    if n == 1:
        return [0] if end_s is None or start_s < end_s else []
    if end_s is None:
        end_s = float(pts[-1] + np.median(np.diff(pts)))
    if start_s >= end_s:
        return []
    if native_fps is None:
        span_s = float(pts[-1] - pts[0])
        native_fps = (n - 1) / span_s if span_s > 0 else math.inf
    first = np.zeros(n, dtype=bool)
    first[0] = True
    picked, stop = StreamingPicker(fps, start_s, end_s, native_fps)._picks(pts, np.append(pts[1:], np.inf), first)
    if stop.any():  # the picker is done at its first stop: no later frame is picked
        picked[int(np.argmax(stop)):] = False
    return np.flatnonzero(picked).tolist()


class StreamingPicker:
    """The sampling rule (see `sample_indices`) for readers that learn timestamps one frame at a time.

    Frame i is picked iff some target maps to it, which is decided as soon as the PTS of frame
    i + 1 is known (or the stream ended).
    """

    def __init__(self, fps: float | None, start_s: float, end_s: float, native_fps: float):
        self._start_s = start_s
        self._end_s = end_s
        self.every_frame = every_frame(fps, native_fps)
        if not self.every_frame:  # t_k + tolerance for every target t_k < end - tolerance
            t_s = start_s + np.arange(max(0, math.ceil((end_s - start_s) * fps)) + 2, dtype=np.float64) / fps
            # then inf: past the last target nothing is on screen
            self._targets_s = np.append(t_s[t_s < end_s - PTS_TOLERANCE_S] + PTS_TOLERANCE_S, np.inf)
        self._k = 0  # first target not before the last frame pushed
        self._seen_first = False
        self.done = False  # no later frame can be picked: the reader may stop

    def _picks(self, pts_s: np.ndarray, next_pts_s: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(picked, stop) per frame, for frames following those pushed so far (next PTS inf: the last)."""
        tol = PTS_TOLERANCE_S
        if self.every_frame:
            stop = (pts_s >= self._end_s - tol) & ~first & (pts_s > self._start_s + tol)
            return (next_pts_s > self._start_s + tol) & ~stop, stop
        # a frame's target is the first one not before it; targets before the first frame are its own
        k = np.where(first, 0, np.searchsorted(self._targets_s[:-1], pts_s, side="left"))
        k = np.maximum.accumulate(np.maximum(k, self._k))
        self._k = int(k[-1])
        stop = k >= len(self._targets_s) - 1
        return ~stop & (self._targets_s[k] < next_pts_s), stop

    def push(self, pts_s: float, next_pts_s: float | None) -> bool:
        """Whether the frame at `pts_s` is picked; `next_pts_s` is the next frame's (None: last)."""
        first = np.array([not self._seen_first])
        self._seen_first = True
        picked, stop = self._picks(np.array([pts_s], dtype=np.float64),
                                   np.array([math.inf if next_pts_s is None else next_pts_s]), first)
        self.done = bool(stop[0])
        return bool(picked[0])
