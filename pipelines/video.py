"""Reading video files: metadata, timestamp-based sampling and upright RGB frames.

`open_video(path)` returns a `VideoFile` whose `.frames(fps, start_s, end_s)` yields
`hermes.pipelines.frames.Frame`s: RGB uint8, rotated upright from the container's rotation
metadata, each carrying its presentation timestamp (PTS) in seconds from the first frame. Two
backends read files (docs/ARCHITECTURE.md, Sources):

* ``decord`` (preferred): demuxes the whole packet index at open, so every frame's PTS is known up
  front; the frames to keep are chosen by `sample_indices` and decoded in bounded batches with
  `get_batch`. Note: decord's FFmpeg prints its own diagnostics to stderr on bad files.
* ``opencv`` (fallback where decord is missing): decodes sequentially; the same sampling rule is
  applied one frame at a time (`StreamingPicker`), with `CAP_PROP_POS_MSEC` as the PTS.

Sampling is by timestamp, never by frame index, so variable-frame-rate files are sampled at the
requested rate in *time*. Every failure a user can act on raises `SourceError` with one line naming
the path, what was wrong and the fix.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# cv2 must be loaded before decord: decord's wheel bundles zlib 1.2.3, and loaded first it makes
# OpenCV reject every PNG ("libpng error: bad parameters to zlib").
import cv2
import numpy as np

from hermes.errors import SourceError, UsageError
from hermes.pipelines.frames import Frame
from hermes.pipelines.sampling import PTS_TOLERANCE_S, StreamingPicker, check_fps, sample_indices
from hermes.pipelines.video_checks import check_file, short_reason, unreadable_error
from hermes.redact import redact_url


# Upper bound on the decoded pixels held at once by the decord backend.
_BATCH_BYTES = 64 * 2**20
_MAX_BATCH_FRAMES = 32

BACKENDS = ("auto", "decord", "opencv")


@dataclass(frozen=True)
class VideoInfo:
    """What a video file holds, as the chosen backend reports it.

    Attributes:
        path: the file.
        duration_s: length in seconds (end of the last frame).
        native_fps: average frame rate (frames / duration).
        width, height: size of the yielded (upright) frames, in pixels.
        num_frames: number of frames in the container.
        rotation_deg: clockwise rotation applied to make frames upright (0, 90, 180 or 270).
        variable_frame_rate: True when frame intervals differ. The OpenCV backend cannot see
            timestamps without decoding and always reports False.
        backend: "decord" or "opencv".
    """

    path: Path
    duration_s: float
    native_fps: float
    width: int
    height: int
    num_frames: int
    rotation_deg: int
    variable_frame_rate: bool
    backend: str


# --------------------------------------------------------------------------------------------
# Sampling by timestamp
# --------------------------------------------------------------------------------------------


def _rotate_upright(rgb: np.ndarray, rotation_deg: int) -> np.ndarray:
    """Rotate a (..., H, W, 3) array clockwise by `rotation_deg` (np.rot90 k < 0 is clockwise)."""
    if rotation_deg == 0:
        return rgb
    return np.rot90(rgb, k=-(rotation_deg // 90), axes=(-3, -2))


def _open_capture(file: Path):
    """An OpenCV capture with automatic rotation off (we rotate ourselves, like for decord)."""

    cap = cv2.VideoCapture(str(file), cv2.CAP_FFMPEG)
    if cap.isOpened():
        cap.set(cv2.CAP_PROP_ORIENTATION_AUTO, 0)
    return cap


def _cv2_rotation_deg(cap) -> int:
    """Clockwise display rotation from the container metadata, snapped to 0/90/180/270."""

    rotation = cap.get(cv2.CAP_PROP_ORIENTATION_META)
    if not math.isfinite(rotation):
        return 0
    return int(round(rotation / 90.0)) % 4 * 90


def _is_variable_rate(pts_s: np.ndarray) -> bool:
    """True when frame intervals differ by more than float32 timestamp noise or 1%."""
    if len(pts_s) < 3:
        return False
    intervals_s = np.diff(pts_s)
    median_s = float(np.median(intervals_s))
    return bool(np.max(np.abs(intervals_s - median_s)) > max(2e-3, 0.01 * median_s))


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except Exception:  # ImportError, or a broken native library: not usable either way
        return False
    return True


def available_backends() -> list[str]:
    """The file backends that import in this environment, preferred first ("decord", "opencv")."""
    candidates = (("decord", "decord"), ("opencv", "cv2"))
    return [name for name, module in candidates if _importable(module)]


def open_video(path: str | os.PathLike, backend: str = "auto") -> VideoFile:
    """Open a video file for reading.

    Args:
        path: the video file.
        backend: "decord", "opencv", or "auto" (decord when importable, else OpenCV).

    Returns:
        An open `VideoFile`; close it (or use it as a context manager) when done.

    Raises:
        SourceError: the file is missing, unreadable, empty, not a video, truncated or has no
            frames.
        UsageError: unknown backend, or "decord" requested where it is not installed.
    """
    if backend not in BACKENDS:
        raise UsageError(f"unknown video backend {backend!r} (use one of {', '.join(BACKENDS)})")
    if backend == "auto":
        backend = "decord" if _importable("decord") else "opencv"
    elif backend == "decord" and not _importable("decord"):
        raise UsageError(
            "video backend 'decord' is not installed (pip install decord, or use backend='opencv')"
        )
    file = check_file(path)
    return _DecordVideo(file) if backend == "decord" else _OpenCVVideo(file)


def open_http_video(url: str, backend: str = "auto", timeout_s: float = 30.0) -> VideoFile:
    """Open a video file served over HTTP(S): downloaded whole into a temporary folder, then read
    like a local file, so frames are sampled by their timestamps whether or not the server supports
    Range requests (OpenCV reading the URL itself got 0 frames without Range, shifted times with
    it). The folder is removed when the video is closed.

    Args:
        url: an http(s) URL; `user:password@` in it becomes a Basic authorisation header.
        backend: as for `open_video`.
        timeout_s: connection and read timeout.

    Raises:
        SourceError: unreachable server, an HTTP error status, a download cut short, or a file that
            is not a readable video; no message contains credentials.
    """
    import base64
    import shutil
    import tempfile
    import urllib.error
    import urllib.request
    from pathlib import PurePosixPath
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    headers = {"User-Agent": "hermes-video"}
    if parts.username is not None:
        secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(secret).decode()
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))  # keeps [IPv6] and the port
    shown = redact_url(url)
    try:
        parts.port  # noqa: B018 -- a port that is not a number raises here, not as an internal error later
    except ValueError as exc:
        raise SourceError(f"invalid URL {shown}: {exc}") from None
    folder = Path(tempfile.mkdtemp(prefix="hermes-http-"))
    target = folder / (PurePosixPath(parts.path).name or "video.mp4")
    try:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as reply:
                expected = reply.headers.get("Content-Length")
                with target.open("wb") as out:
                    shutil.copyfileobj(reply, out, 1 << 20)
        except urllib.error.HTTPError as exc:
            raise SourceError(f"cannot download {shown}: HTTP {exc.code} {exc.reason} (check the URL)") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise SourceError(f"cannot download {shown}: {redact_url(reason)} (is the server up?)") from None
        got = target.stat().st_size
        if expected is not None and expected.isdigit() and got < int(expected):
            raise SourceError(f"download of {shown} stopped after {got} of {expected} bytes; try again")
        video = open_video(target, backend=backend)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    video._download_dir = folder
    return video


class VideoFile(ABC):
    """An open video file. Use `.info` for metadata and `.frames()` to read."""

    info: VideoInfo

    def frames(
        self, fps: float | None = None, start_s: float = 0.0, end_s: float | None = None
    ) -> Iterator[Frame]:
        """Yield upright RGB frames sampled at `fps` by timestamp (rule: `sample_indices`).

        Args:
            fps: sampling rate; None (or >= the native rate) yields every frame.
            start_s: first target time in seconds; the frame on screen then comes first.
            end_s: exclusive end in seconds; None reads to the end of the video.

        Returns:
            An iterator of `Frame(t_s=PTS in seconds, rgb=(H, W, 3) uint8, index)`.

        Raises:
            SourceError: `start_s`/`end_s` outside the video (raised here, before iterating), or
                the file turns out truncated or corrupt while decoding (raised while iterating).
            UsageError: `fps` is not a positive number.
        """
        if self._closed:
            raise ValueError(f"video is closed: {self.info.path}")
        check_fps(fps)
        info = self.info
        # One frame interval of slack: users pass durations rounded or taken from other tools.
        slack_s = 1.0 / info.native_fps if info.native_fps > 0 else PTS_TOLERANCE_S
        if not 0.0 <= start_s < info.duration_s:
            raise SourceError(
                f"start_s={start_s:g} is outside the video: {info.path} (it is "
                f"{info.duration_s:.3f} s long; use 0 <= start_s < {info.duration_s:.3f})"
            )
        if end_s is not None and not start_s < end_s <= info.duration_s + slack_s:
            raise SourceError(
                f"end_s={end_s:g} is outside the video: {info.path} (it is "
                f"{info.duration_s:.3f} s long; use {start_s:g} < end_s <= {info.duration_s:.3f})"
            )
        end = info.duration_s if end_s is None else min(end_s, info.duration_s)
        return self._iter_frames(fps, start_s, end)

    @abstractmethod
    def _iter_frames(self, fps: float | None, start_s: float, end_s: float) -> Iterator[Frame]:
        """Backend-specific reading; arguments are already validated."""

    @abstractmethod
    def _release(self) -> None:
        """Free the backend's reader."""

    _closed = False

    _download_dir: Path | None = None  # the temporary folder of a video downloaded over HTTP

    def close(self) -> None:
        """Release the file (and delete it if it was downloaded); further `frames()` calls raise."""
        if not self._closed:
            self._closed = True
            self._release()
            if self._download_dir is not None:
                import shutil

                shutil.rmtree(self._download_dir, ignore_errors=True)

    def __enter__(self) -> VideoFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing sensible to do
            pass


def _decord():
    """decord, with its FFmpeg's console messages (hundreds of lines on a damaged file) off unless
    logging is at debug level: errors reach the user as one `SourceError` line instead."""
    import logging

    import decord

    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        decord.logging.set_level(decord.logging.QUIET)
    return decord


class _DecordVideo(VideoFile):
    """decord reader: PTS of every frame at open, batched decoding of the sampled indices."""

    def __init__(self, file: Path):
        decord = _decord()

        try:
            self._reader = decord.VideoReader(str(file), ctx=decord.cpu(0))
            num_frames = len(self._reader)
            if num_frames == 0:
                raise SourceError(f"video file contains no frames: {file} (re-export it)")
            pts = self._reader.get_frame_timestamp(range(num_frames)).astype(np.float64)
            first_rgb = _to_numpy(self._reader[0])
        except (decord.DECORDError, RuntimeError) as exc:  # decord raises both on bad input
            raise unreadable_error(file, short_reason(exc)) from None
        # Rounded to microseconds: decord's float32 seconds otherwise print as 0.30000001.
        self._pts_s = np.round(pts[:, 0], 6)
        duration_s = float(np.round(pts[-1, 1], 6))

        # decord builds differ: some apply the display matrix, some do not. Compare its first
        # frame with OpenCV's unrotated one to know whether we still have to rotate.
        rotation_deg, self._rotate_deg = 0, 0
        cap = _open_capture(file)
        try:
            if cap.isOpened():
                rotation_deg = _cv2_rotation_deg(cap)
                ok, raw_bgr = cap.read() if rotation_deg else (False, None)
                if ok:
                    self._rotate_deg = _rotation_still_needed(
                        first_rgb, raw_bgr[:, :, ::-1], rotation_deg
                    )
                else:  # cannot compare: assume decord left the frames as stored
                    self._rotate_deg = rotation_deg
        finally:
            cap.release()
        height, width = _rotate_upright(first_rgb, self._rotate_deg).shape[:2]
        self.info = VideoInfo(
            path=file,
            duration_s=duration_s,
            native_fps=float(self._reader.get_avg_fps()),
            width=int(width),
            height=int(height),
            num_frames=num_frames,
            rotation_deg=rotation_deg,
            variable_frame_rate=_is_variable_rate(self._pts_s),
            backend="decord",
        )
        self._batch_frames = int(
            max(1, min(_MAX_BATCH_FRAMES, _BATCH_BYTES // max(1, width * height * 3)))
        )

    def _iter_frames(self, fps: float | None, start_s: float, end_s: float) -> Iterator[Frame]:
        decord = _decord()
        indices = sample_indices(
            self._pts_s, fps, start_s, end_s, native_fps=self.info.native_fps
        )
        for lo in range(0, len(indices), self._batch_frames):
            batch = indices[lo : lo + self._batch_frames]
            try:
                rgb = _to_numpy(self._reader.get_batch(batch))
            except (decord.DECORDError, RuntimeError) as exc:
                raise SourceError(
                    f"video file is truncated or corrupt: {self.info.path} (decoding frames "
                    f"{batch[0]}-{batch[-1]} of {self.info.num_frames} failed: "
                    f"{short_reason(exc)}; re-download or re-encode it)"
                ) from None
            rgb = _rotate_upright(rgb, self._rotate_deg)
            for j, index in enumerate(batch):
                # A copy per frame so a kept frame does not pin its whole batch in memory.
                pixels = np.ascontiguousarray(rgb[j])
                yield Frame(t_s=float(self._pts_s[index]), rgb=pixels, index=index)

    def _release(self) -> None:
        self._reader = None


def _to_numpy(array) -> np.ndarray:
    """decord NDArray (or a tensor, if someone set another decord bridge) to numpy."""
    return array.asnumpy() if hasattr(array, "asnumpy") else np.asarray(array)


def _rotation_still_needed(decoded_rgb: np.ndarray, raw_rgb: np.ndarray, rotation_deg: int) -> int:
    """`rotation_deg` if `decoded_rgb` is still as stored (`raw_rgb`), 0 if already upright."""
    upright = _closeness(decoded_rgb, _rotate_upright(raw_rgb, rotation_deg))
    return 0 if upright < _closeness(decoded_rgb, raw_rgb) else rotation_deg


def _closeness(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute pixel difference; infinite when the shapes differ."""
    if a.shape != b.shape:
        return math.inf
    return float(np.mean(np.abs(a.astype(np.int16) - b.astype(np.int16))))


class _OpenCVVideo(VideoFile):
    """OpenCV reader: sequential decoding, PTS from CAP_PROP_POS_MSEC."""

    def __init__(self, file: Path):

        self._cap = _open_capture(file)
        if not self._cap.isOpened():
            self._cap.release()
            raise unreadable_error(file, None)  # OpenCV gives no reason
        num_frames = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        native_fps = float(self._cap.get(cv2.CAP_PROP_FPS))
        if num_frames <= 0:
            self._cap.release()
            raise SourceError(f"video file contains no frames: {file} (re-export it)")
        if not native_fps > 0:  # timestamps and duration would be meaningless
            self._cap.release()
            raise SourceError(
                f"video file has no frame rate: {file} (re-encode it, e.g. to mp4, or install "
                "decord, which reads per-frame timestamps)"
            )
        self._rotate_deg = _cv2_rotation_deg(self._cap)
        coded_w = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        coded_h = int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        swap = self._rotate_deg in (90, 270)
        self.info = VideoInfo(
            path=file,
            duration_s=round(num_frames / native_fps, 6),
            native_fps=native_fps,
            width=coded_h if swap else coded_w,
            height=coded_w if swap else coded_h,
            num_frames=num_frames,
            rotation_deg=self._rotate_deg,
            variable_frame_rate=False,
            backend="opencv",
        )
        self._position = 0  # frames already decoded from the capture

    def _iter_frames(self, fps: float | None, start_s: float, end_s: float) -> Iterator[Frame]:

        info = self.info
        if self._position:
            # A previous pass moved the capture. Reopen rather than seek: OpenCV's seek is
            # approximate and can land past the end of short files.
            self._cap.release()
            self._cap = _open_capture(info.path)
            self._position = 0
            if not self._cap.isOpened():
                raise SourceError(
                    f"video file can no longer be opened: {info.path} (was it moved or deleted?)"
                )
        picker = StreamingPicker(fps, start_s, end_s, info.native_fps)
        # One frame of lookahead: frame i is picked or not once frame i+1's PTS is known, so its
        # pixels are retrieved before grabbing the next one.
        held: tuple[int, float, np.ndarray] | None = None
        while True:
            if not self._cap.grab():
                self._check_complete(held)
                break
            pts_s = round(self._cap.get(cv2.CAP_PROP_POS_MSEC) / 1000.0, 6)
            if held is not None:
                if picker.push(held[1], pts_s):
                    yield self._to_frame(held)
                if picker.done:
                    return
            ok, bgr = self._cap.retrieve()
            if not ok:
                raise SourceError(
                    f"video file is truncated or corrupt: {info.path} (frame {self._position} "
                    "could not be decoded; re-download or re-encode it)"
                )
            held = (self._position, pts_s, bgr)
            self._position += 1
        if held is not None and picker.push(held[1], None):
            yield self._to_frame(held)

    def _check_complete(self, last: tuple[int, float, np.ndarray] | None) -> None:
        """Raise if decoding stopped well before the announced end (OpenCV reports no errors)."""
        info = self.info
        # Frame counts of some containers are estimates: only a shortfall of over ~1 s counts.
        missing = info.num_frames - self._position
        if missing > max(2, round(info.native_fps)):
            at = f"{last[1]:.3f} s" if last is not None else "the start"
            raise SourceError(
                f"video file is truncated or corrupt: {info.path} (decoding stopped at {at} after "
                f"{self._position} of {info.num_frames} frames; re-download or re-encode it)"
            )

    def _to_frame(self, held: tuple[int, float, np.ndarray]) -> Frame:
        index, pts_s, bgr = held
        rgb = _rotate_upright(bgr[:, :, ::-1], self._rotate_deg)
        return Frame(t_s=pts_s, rgb=np.ascontiguousarray(rgb), index=index)

    def _release(self) -> None:
        self._cap.release()
