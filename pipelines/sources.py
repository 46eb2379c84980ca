"""Frame sources: one `open_source(spec)` for files, image folders, webcams and network streams.

docs/ARCHITECTURE.md, Sources. Every source yields `Frame(t_s, rgb, index)` and shares one small interface
(`FrameSource`): `.live`, `.stats`, `.gaps`, `.close()`, `.describe()` and use as a context
manager. What a spec means:

- an int or a digit string (``0``, ``"1"``): a webcam index (live);
- ``rtsp://``, ``rtsps://``, ``rtmp://``, ``rtmps://``, ``http(s)://`` URLs: a live network stream,
  except an http(s) URL whose path ends in a media extension (``.mp4`` ...), which is a file
  served over HTTP: downloaded to a temporary file, then read as a file (timestamps, every frame);
- a directory: an image sequence at ``fps`` frames per second (default 1.0);
- an existing file (or ``file://`` URL): the video-file reader of `hermes.pipelines.video`.

URLs may carry credentials; nothing this package prints, logs or raises contains them:
`redact_url` is applied to every message.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterator
from urllib.parse import unquote, urlsplit

# Loaded before anything can import decord: decord's wheel bundles zlib 1.2.3, and when it loads
# first OpenCV's libpng binds to that zlib and rejects every PNG ("bad parameters to zlib").
import cv2  # noqa: F401

from hermes.errors import SourceError, UsageError, closest
from hermes.redact import redact_url  # noqa: F401 (the sources' messages use it; callers import it from here too)
# the interface lives beside `Frame` so the readers (images, live, video) need not import this module
from hermes.pipelines.frames import Frame, FrameSource, Gap, ReadAhead  # noqa: F401 (Gap: callers import it here)

log = logging.getLogger(__name__)

STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https")
SUPPORTED_SCHEMES = STREAM_SCHEMES + ("file",)
# An http(s) URL ending in one of these is a file on a web server, not a live stream.
MEDIA_EXTENSIONS = (".mp4", ".mkv", ".avi", ".mov", ".webm")

_INDEX_RE = re.compile(r"^\s*[0-9]+\s*$")  # ASCII digits only: int("²") would fail
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class VideoFileSource(FrameSource):
    """Adapts `hermes.pipelines.video.VideoFile` (PTS timestamps, in order) to `FrameSource`."""

    live = False

    def __init__(self, video: Any, path: str, *, fps: float | None = None,
                 start_s: float = 0.0, end_s: float | None = None) -> None:
        """Wrap an opened video file.

        Args:
            video: the object `open_video` returned (has ``.frames(...)`` and ``.info``).
            path: the file path, for `describe`.
            fps: target sampling rate; None keeps every frame.
            start_s: first timestamp to yield.
            end_s: stop before this timestamp; None reads to the end.

        Raises:
            SourceError: `start_s` or `end_s` lies outside the video.
        """
        super().__init__()
        self._video = video
        self._path = path
        self._fps = fps
        try:
            # Called now, not on first iteration: a bad start_s/end_s fails at open time.
            # decoded on a reader thread, a chunk ahead of the model (`ReadAhead`)
            self._frames = ReadAhead(video.frames(fps=fps, start_s=start_s, end_s=end_s))
        except BaseException:
            self.close()
            raise

    @property
    def info(self) -> Any:
        """The video file's metadata, as `open_video` reports it."""
        return self._video.info

    def __iter__(self) -> Iterator[Frame]:
        for frame in self._frames:
            # The file reader samples internally, so read == sampled == taken from here.
            self._stats.frames_read += 1
            self._stats.frames_sampled += 1
            self._stats.frames_taken += 1
            yield frame

    def close(self) -> None:
        frames = getattr(self, "_frames", None)
        if frames is not None:
            frames.close()  # the reader stops before the decoder it uses is released
        close = getattr(self._video, "close", None)
        if callable(close):
            close()

    def describe(self) -> str:
        fps = f", sampled at {self._fps:g} fps" if self._fps else ""
        return f"video file {redact_url(self._path)}{fps}"


_LIVE_OPTIONS = {
    "maxsize", "policy", "open_timeout_s", "read_timeout_s", "reconnect_timeout_s",
    "backoff_initial_s", "backoff_max_s", "rtsp_transport", "analyze_duration_s", "stall_s",
}
_HTTP_FILE_OPTIONS = {"backend", "open_timeout_s"}
_VIDEO_OPTIONS = {"backend", "start_s", "end_s"}
_IMAGE_OPTIONS: set[str] = set()


def _check_options(options: dict[str, Any], allowed: set[str], kind: str) -> None:
    """Reject options the chosen kind of source does not take, with a did-you-mean hint."""
    for name in options:
        if name not in allowed:
            close = closest(name, sorted(_LIVE_OPTIONS | _VIDEO_OPTIONS), cutoff=0.6)
            hint = f"; did you mean {close!r}?" if close is not None else ""
            valid = ", ".join(sorted(allowed)) or "none"
            raise UsageError(f"unknown option {name!r} for a {kind} source (valid: {valid}){hint}")


def _unsupported(spec: str, scheme: str) -> SourceError:
    schemes = ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES)
    return SourceError(
        f"unsupported source scheme {scheme!r} in {redact_url(spec)}: expected a video file, an "
        f"image folder, a webcam index or one of {schemes}"
    )


def is_live(spec: str | int | os.PathLike) -> bool:
    """Whether `open_source(spec)` opens a live source (a webcam, a stream URL) rather than a recording.

    Args:
        spec: what `open_source` takes.

    Returns:
        True for a webcam index or a URL of a supported live scheme; False for a path, a ``file://``
        URL or an http(s) URL of a video file (downloaded, then read as a file).
    """
    if isinstance(spec, int) or (isinstance(spec, str) and _INDEX_RE.match(spec)):
        return True
    text = os.fspath(spec)
    match = _SCHEME_RE.match(text)
    if not match or match.group(1).lower() not in SUPPORTED_SCHEMES or match.group(1).lower() == "file":
        return False
    return not (match.group(1).lower() in ("http", "https")
                and PurePosixPath(urlsplit(text).path).suffix.lower() in MEDIA_EXTENSIONS)


def open_source(spec: str | int | os.PathLike, *, fps: float | None = None,
                **options: Any) -> FrameSource:
    """Open whatever `spec` names as a `FrameSource`.

    Args:
        spec: a webcam index (int or digit string), a stream URL (rtsp, rtmp, http(s)), a
            directory of images, or a video file path / ``file://`` URL.
        fps: target frames per second. Live and file sources sample to it by timestamp (None
            keeps every frame); for an image folder it is the rate of the sequence (default 1.0).
        **options: per kind. Live streams and webcams: ``maxsize``, ``policy`` (``latest`` or
            ``fifo``), ``open_timeout_s``, ``read_timeout_s``, ``reconnect_timeout_s``,
            ``backoff_initial_s``, ``backoff_max_s``, ``rtsp_transport``, ``analyze_duration_s``
            (see `hermes.pipelines.live.LiveSource`). Video files: ``backend``, ``start_s``,
            ``end_s``. Image folders: none.

    Returns:
        An open source; use it as a context manager or call ``close()``.

    Raises:
        SourceError: the source is missing, unreachable, empty or of an unsupported scheme
            (exit code 3); the message is one line and contains no credentials.
        UsageError: an option is unknown or its value is out of range (exit code 2).
    """
    if isinstance(spec, bool):
        raise UsageError(f"source must be a path, URL or webcam index, got {spec!r}")
    if isinstance(spec, int) or (isinstance(spec, str) and _INDEX_RE.match(spec)):
        from hermes.pipelines.live import LiveSource

        _check_options(options, _LIVE_OPTIONS, "webcam")
        return LiveSource(int(spec), fps=fps, **options)

    text = os.fspath(spec)
    match = _SCHEME_RE.match(text)
    if match:
        scheme = match.group(1).lower()
        if scheme not in SUPPORTED_SCHEMES:
            raise _unsupported(text, scheme)
        if scheme == "file":
            text = unquote(urlsplit(text).path)
        elif scheme in ("http", "https") and \
                PurePosixPath(urlsplit(text).path).suffix.lower() in MEDIA_EXTENSIONS:
            from hermes.pipelines.video import open_http_video  # downloaded, then read as a file

            _check_options(options, _HTTP_FILE_OPTIONS, "video-over-HTTP")
            video = open_http_video(text, backend=options.get("backend", "auto"),
                                    timeout_s=options.get("open_timeout_s", 30.0))
            return VideoFileSource(video, text, fps=fps)
        else:
            from hermes.pipelines.live import LiveSource

            _check_options(options, _LIVE_OPTIONS, "live stream")
            return LiveSource(text, fps=fps, **options)

    path = Path(text).expanduser()
    if path.is_dir():
        from hermes.pipelines.images import ImageFolderSource

        _check_options(options, _IMAGE_OPTIONS, "image folder")
        return ImageFolderSource(path, fps=1.0 if fps is None else fps)
    if path.is_file():
        from hermes.pipelines.video import open_video  # lazy: decord/PyAV load only when needed

        _check_options(options, _VIDEO_OPTIONS, "video file")
        video = open_video(str(path), backend=options.get("backend", "auto"))
        log.info("opened video file %s", redact_url(path))
        return VideoFileSource(video, str(path), fps=fps, start_s=options.get("start_s", 0.0),
                               end_s=options.get("end_s"))
    if path.suffix:  # it looks like a file name: say so plainly
        raise SourceError(f"video file not found: {redact_url(text)} (check the path)")
    raise SourceError(
        f"source not found: {redact_url(text)} is not an existing file or folder; expected a video "
        f"file, an image folder, a webcam index (0, 1, ...) or an rtsp://, rtmp:// or "
        f"http(s):// URL"
    )
