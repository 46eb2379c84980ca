"""Checks on a video file before and after a decoder tries it, and their one-line errors.

docs/ARCHITECTURE.md, Sources: MP4/MOV box headers catch what decoders report badly or not at all (a
truncated file, no tracks, an empty file); one open by OpenCV's FFmpeg catches a file that is no video.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from hermes.errors import SourceError


def short_reason(exc: BaseException) -> str:
    """First line of a backend error, without decord's "[time] file.cc:123:" prefixes."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"(\[[\d:]+\]\s*\S+:\d+:\s*)+", "", text).strip()
    if text.startswith("Error reading "):  # decord's only words for "FFmpeg cannot open it"
        return ""
    return text[:160]


@dataclass(frozen=True)
class _Mp4Layout:
    """What the top-level boxes of an MP4/MOV (ISO-BMFF) file say, read without decoding.

    Attributes:
        tracks: number of 'trak' boxes in 'moov'; None if no complete 'moov' was found.
        cut_box: type of a box that runs past the end of the file (the file is truncated).
    """

    tracks: int | None
    cut_box: str | None


# Box types a truncated MP4 ends inside; anything else past the end is treated as foreign bytes.
_TOP_LEVEL_BOXES = {b"ftyp", b"moov", b"mdat", b"moof", b"mfra", b"free", b"skip", b"wide", b"uuid"}


def _read_box_header(f, offset: int, limit: int) -> tuple[bytes, int, int] | None:
    """(type, total size, header size) of the box at `offset`, or None if there is none."""
    if offset + 8 > limit:
        return None
    f.seek(offset)
    size, kind = struct.unpack(">I4s", f.read(8))
    header = 8
    if size == 1:  # a 64-bit size follows the type
        (size,) = struct.unpack(">Q", f.read(8))
        header = 16
    elif size == 0:  # the box runs to the end of its parent
        size = limit - offset
    return (kind, size, header) if size >= header else None


def scan_mp4(path: Path) -> _Mp4Layout | None:
    """Walk the top-level boxes of an MP4/MOV; None if the file does not start like one.

    A few header reads, however large the file: cheap enough to run on every open. It is the only
    reliable truncation check for the OpenCV backend, which stops quietly at a cut.
    """
    try:
        file_size = path.stat().st_size
        with path.open("rb") as f:
            first = _read_box_header(f, 0, file_size)
            if first is None or first[0] != b"ftyp":
                return None
            tracks: int | None = None
            offset = 0
            while (box := _read_box_header(f, offset, file_size)) is not None:
                kind, size, header = box
                if offset + size > file_size:
                    cut = kind.decode("latin-1") if kind in _TOP_LEVEL_BOXES else None
                    return _Mp4Layout(tracks=tracks, cut_box=cut)
                if kind == b"moov":
                    tracks, child = 0, offset + header
                    while (sub := _read_box_header(f, child, offset + size)) is not None:
                        tracks += sub[0] == b"trak"
                        child += sub[1]
                offset += size
            return _Mp4Layout(tracks=tracks, cut_box=None)
    except (OSError, struct.error):
        return None


def check_file(path: str | os.PathLike, *, probe: bool = False) -> Path:
    """Resolve `path` and refuse it unless it is a non-empty, readable, complete file.

    Args:
        path: the video file.
        probe: also refuse a file no demuxer recognises (a text file named `.mp4`) before any decoder
            or model loads: one open by OpenCV's FFmpeg (milliseconds, no torch) unless its MP4
            header lists tracks, where decord would only fail after the model had loaded.

    Returns:
        The resolved path.

    Raises:
        SourceError: one line saying what is wrong with the file and the fix.
    """
    file = Path(path).expanduser()
    if not file.exists():
        raise SourceError(f"video file not found: {file} (check the path)")
    if file.is_dir():
        raise SourceError(f"expected a video file, found a directory: {file} (pass a file path)")
    if not os.access(file, os.R_OK):
        raise SourceError(f"video file is not readable: {file} (check its permissions)")
    if file.stat().st_size == 0:
        raise SourceError(
            f"video file contains no frames: {file} (the file is empty; re-export or download it)"
        )
    layout = scan_mp4(file)
    if layout is not None and layout.cut_box is not None:
        raise SourceError(
            f"video file is truncated: {file} (its '{layout.cut_box}' box runs past the end of the "
            "file, e.g. an interrupted download or recording; re-download or re-encode it)"
        )
    if probe and not (layout is not None and layout.tracks):
        import cv2  # before decord, as everywhere (hermes.pipelines.sources: their bundled zlibs clash)

        if cv2.videoio_registry.hasBackend(cv2.CAP_FFMPEG):  # a build without it: left to the reader
            capture = cv2.VideoCapture(str(file), cv2.CAP_FFMPEG)
            try:
                opened = capture.isOpened()
            finally:
                capture.release()
            if not opened:
                raise unreadable_error(file, None)
    return file


def unreadable_error(file: Path, reason: str | None) -> SourceError:
    """The most specific one-line error for a file a backend could not open.

    `reason` is the backend's own explanation when it gave a useful one.
    """
    layout = scan_mp4(file)
    if layout is not None and layout.tracks == 0:
        return SourceError(
            f"video file contains no frames: {file} (the container holds no tracks; re-export it)"
        )
    reason = reason or ""
    if "video stream" in reason:
        return SourceError(
            f"video file contains no frames: {file} (no video stream found; is it audio only?)"
        )
    if "av_read_frame" in reason or "partial file" in reason:
        return SourceError(
            f"video file is truncated or corrupt: {file} (reading its packets failed: {reason}; "
            "re-download or re-encode it)"
        )
    detail = f" ({reason})" if reason else ""
    return SourceError(
        f"not a readable video: {file} (FFmpeg could not parse it{detail}: it is corrupt, "
        "truncated or not a video; re-download it or re-encode it to mp4)"
    )
