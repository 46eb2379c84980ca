"""The frames of one benchmark video, whatever form the benchmark ships it in.

A `VideoRecord` points at one of three kinds of pixels:

* a video file (most benchmarks), read with `hermes.pipelines.video.open_video`, optionally
  only between `start_s` and `end_s` (MVBench bounds);
* a `.npy` frame array (RVS-Movie: one frame per second, (T, H, W, 3) uint8), read memory-mapped
  through `rvs.load_npy_frames` (which refuses pickles);
* a folder of extracted frames (MVBench Episodic Reasoning: `00001.jpg ...` at 3 fps).

`open_record_frames` turns any of them into one iterator of `hermes.pipelines.frames.Frame`
sampled by timestamp at the configured rate, so the runner feeds a `StreamingSession` the same
way for all of them. Arrays and folders have no timestamps of their own: frame `i` is at
`i / frame_fps`. Sampling uses the same rule as video files (`sampling.sample_indices`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hermes.errors import SourceError
from hermes.pipelines.frames import Frame

from .records import VideoRecord



class RecordFrames:
    """The sampled frames of one record; close it (or use `with`) when done.

    Attributes:
        frames: Iterator of `Frame`s in time order (t_s in seconds of the original video).
        kind: "video", "npy" or "folder".
        path: The file or folder read.
    """

    def __init__(self, frames: Iterator[Frame], kind: str, path: Path, closer=None) -> None:
        """Args:
        frames: The frame iterator.
        kind: What was opened ("video", "npy", "folder").
        path: The file or folder.
        closer: Called once on `close()` (releases a decoder); None when nothing to release.
        """
        self.frames = frames
        self.kind = kind
        self.path = path
        self._closer = closer

    def close(self) -> None:
        """Release the decoder, if any; safe to call twice."""
        closer, self._closer = self._closer, None
        if closer is not None:
            closer()

    def __enter__(self) -> RecordFrames:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_record_frames(record: VideoRecord, fps: float, backend: str = "auto") -> RecordFrames:
    """Open the pixels of `record` as frames sampled at `fps`.

    Args:
        record: A record whose video is on disk (`record.available`).
        fps: Target sampling rate in frames per second (by timestamp).
        backend: Video-file decoder: "auto", "decord" or "opencv".

    Returns:
        The open `RecordFrames`.

    Raises:
        SourceError: The video is not on disk, cannot be read, its bounds lie outside it, or a
            frame folder/array is empty, malformed or has no known frame rate.
    """
    path = record.frames_dir or record.video_path
    if path is None:
        raise SourceError(f"{record.video_id}: no video on disk; download it into the data root")
    path = Path(path)
    start_s = record.start_s or 0.0
    if path.is_dir():
        return _folder_frames(record, path, fps, start_s)
    if path.suffix.casefold() == ".npy":
        return _npy_frames(record, path, fps, start_s)
    return _video_frames(path, fps, backend, start_s, record.end_s)


def _video_frames(path: Path, fps: float, backend: str, start_s: float, end_s: float | None) -> RecordFrames:
    """A video file, optionally between `start_s` and `end_s`."""
    from hermes.pipelines.video import open_video  # decoders load only when a video is read

    video = open_video(path, backend=backend)
    try:
        if end_s is not None:
            # MVBench bounds sometimes run past the clip; its official reader clamps to the
            # last frame, and so does this.
            end_s = min(end_s, video.info.duration_s)
        frames = video.frames(fps=fps, start_s=start_s, end_s=end_s)
    except BaseException:
        video.close()
        raise
    return RecordFrames(frames, "video", path, closer=video.close)


def _picked(num_frames: int, rate_fps: float, fps: float, start_s: float, end_s: float | None) -> list[int]:
    """Indices of frames (at `rate_fps`) kept when sampling at `fps` in [start_s, end_s)."""
    from hermes.pipelines.sampling import sample_indices

    pts_s = np.arange(num_frames, dtype=np.float64) / rate_fps
    duration_s = num_frames / rate_fps
    end = duration_s if end_s is None else min(end_s, duration_s)
    if start_s >= end:
        return []
    return sample_indices(pts_s, fps, start_s, end, native_fps=rate_fps)


def _npy_frames(record: VideoRecord, path: Path, fps: float, start_s: float) -> RecordFrames:
    """An RVS `.npy` frame array (memory-mapped; only sampled frames are read)."""
    from .benchmarks import rvs

    array = rvs.load_npy_frames(path)
    if len(array) == 0:
        raise SourceError(f"frame array {path} holds no frames; re-download it")
    # A copy: the memory map is read-only and the model may normalise in place.
    return _indexed(record, path, len(array), lambda i: np.ascontiguousarray(array[i]), rvs.NPY_FPS, fps, start_s,
                    "npy")


def _folder_frames(record: VideoRecord, folder: Path, fps: float, start_s: float) -> RecordFrames:
    """A folder of extracted frames."""
    from hermes.pipelines.images import IMAGE_EXTENSIONS, list_images, read_image  # an image decoder, for folders only

    files = list_images(folder)
    if not files:
        raise SourceError(f"frame folder {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}); re-extract it")
    return _indexed(record, folder, len(files), lambda i: read_image(files[i]), None, fps, start_s, "folder")


def _indexed(record: VideoRecord, path: Path, count: int, read, default_rate: float | None, fps: float,
             start_s: float, kind: str) -> RecordFrames:
    """Frames without timestamps of their own, frame i at i / frame_fps, `read(i)` for each sampled one."""
    rate = record.frame_fps or default_rate
    if not rate or rate <= 0:
        raise SourceError(
            f"{record.video_id}: {path} holds frames without timestamps and the benchmark states no frame rate"
        )
    picked = _picked(count, float(rate), fps, start_s, record.end_s)
    return RecordFrames((Frame(t_s=i / rate, rgb=read(i), index=i) for i in picked), kind, path)
