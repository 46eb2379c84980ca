"""Sampling frames by timestamp: which frames a stream at a target fps keeps.

The rule, shared by every file backend: target times t_k = start + k / fps; for each, the frame on
screen at t_k (the last with PTS <= t_k) is kept, each frame at most once. `StreamingPicker` applies it one frame
at a time (when timestamps are only known while decoding); `sample_indices` runs it over a whole list
of timestamps (when they are known up front), so both readers pick by one implementation of the rule.

Two other rules pick frames by timestamp, on purpose not this one:
- live input (`pipelines.live._Sampler`) must decide when a frame arrives: "on screen at t_k" needs
  the next frame's timestamp, and a camera that stalls would hold its last frame back for the whole
  stall. It keeps a frame once its slot is due, allowing a quarter interval of capture-clock jitter;
- the `recent-frames` baseline (`hermes.baselines.recent_frames.pick_recent`) thins backwards from the
  newest frame, each taken frame at least 1/fps before the previous one, so it returns the last N
  frames SimpleStream asks for (targets counted back from the newest would pick one frame twice when
  the stream is sampled more slowly than the baseline's rate).
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
    return fps is None or fps >= native_fps * (1.0 - 1e-9)


def check_fps(fps: float | None) -> None:
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

    Rule: target times are ``t_k = start_s + k / fps`` for k = 0, 1, 2, ... while ``t_k < end``.
    For each target the frame on screen at ``t_k`` is picked, i.e. the last frame with
    ``pts <= t_k`` (the first frame if there is none). A frame is picked at most once, so when
    `fps` exceeds the local frame rate duplicates are skipped and fewer frames come back.
    When `fps` is None or >= the native rate, every frame on screen during ``[start_s, end)`` is
    picked: the one showing at `start_s` and every later one with ``pts < end``.
    Comparisons allow `PTS_TOLERANCE_S` of rounding in the timestamps.

    Args:
        pts_s: presentation timestamps in seconds, in increasing order.
        fps: sampling rate in frames per second; None for every frame.
        start_s: first target time.
        end_s: exclusive end time; None means the end of the last frame, estimated as its PTS
            plus the median frame interval.
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

    picker, picked = StreamingPicker(fps, start_s, end_s, native_fps), []
    for i in range(n):
        if picker.push(float(pts[i]), float(pts[i + 1]) if i + 1 < n else None):
            picked.append(i)
        if picker.done:
            break
    return picked


class StreamingPicker:
    """The sampling rule (see `sample_indices`) for readers that learn timestamps one frame at a time.

    Frame i is picked iff some target maps to it, which is decided as soon as the PTS of frame
    i + 1 is known (or the stream ended).
    """

    def __init__(self, fps: float | None, start_s: float, end_s: float, native_fps: float):
        self._fps = fps
        self._start_s = start_s
        self._end_s = end_s
        self.every_frame = every_frame(fps, native_fps)
        self._k = 0  # first target not yet known to lie before the current frame
        self._seen_first = False
        self.done = False  # no later frame can be picked: the reader may stop

    def _target_plus_tol(self, k: int) -> float | None:
        """Target k plus the tolerance, or None when target k is at or after the end."""
        t_s = self._start_s + float(k) / self._fps
        return t_s + PTS_TOLERANCE_S if t_s < self._end_s - PTS_TOLERANCE_S else None

    def push(self, pts_s: float, next_pts_s: float | None) -> bool:
        """Whether the frame at `pts_s` is picked; `next_pts_s` is the next frame's (None: last)."""
        is_first = not self._seen_first
        self._seen_first = True
        if self.every_frame:
            tol = PTS_TOLERANCE_S
            shown_in_range = next_pts_s is None or next_pts_s > self._start_s + tol
            if pts_s >= self._end_s - tol and not is_first and pts_s > self._start_s + tol:
                self.done = True
                return False
            return shown_in_range
        if not is_first:  # targets before the first frame belong to the first frame
            while (t := self._target_plus_tol(self._k)) is not None and t < pts_s:
                self._k += 1
        t = self._target_plus_tol(self._k)
        if t is None:
            self.done = True
            return False
        return next_pts_s is None or t < next_pts_s


# --------------------------------------------------------------------------------------------
# Opening files
# --------------------------------------------------------------------------------------------
