"""Writers for the video files the reader tests need: VFR, rotated, truncated, empty, fake.

Uses PyAV (`av`, a dev dependency) where OpenCV's writer cannot express the property under test
(explicit per-frame timestamps, rotation metadata, moov-first layout). Every writer is
deterministic and returns the path it wrote. The content of every frame is
`hermes.pipelines.synthetic.make_frame(t_s)`, so tests can recompute what a frame should show.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from hermes.pipelines.synthetic import make_frame, write_synthetic_video

SIZE = (160, 120)  # (width, height)
MARKER_PX = 16  # side of the square marker drawn in the stored top-left corner
MARKER_RGB = (255, 0, 0)

# The variable-frame-rate fixture: irregular gaps, a burst (250/260/270) and a long pause.
VFR_PTS_MS = (0, 40, 100, 250, 260, 270, 600, 1000, 1033, 1500)


def stored_frame(t_s: float, size: tuple[int, int] = SIZE, marker: bool = False) -> np.ndarray:
    """The picture a fixture encodes at time `t_s` (before any rotation metadata is applied)."""
    rgb = make_frame(t_s, size, seed=0)
    if marker:
        rgb[:MARKER_PX, :MARKER_PX] = MARKER_RGB
    return rgb


def _encode(
    path: Path,
    pts_ms: Sequence[int],
    *,
    rotation_cw_deg: int = 0,
    marker: bool = False,
    faststart: bool = False,
    size: tuple[int, int] = SIZE,
) -> Path:
    """Encode frames at the given PTS (milliseconds) as MPEG-4 Part 2 in an mp4.

    mpeg4 has no B-frames by default, so packets come out in presentation order and the muxer
    records clean per-frame durations (libx264's reordering muddles the last frame's duration).
    """
    import av

    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), mode="w", options=options) as container:
        # `rate` only sets the nominal rate; the real timing comes from each frame's pts.
        stream = container.add_stream("mpeg4", rate=30)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.codec_context.options = {"qscale": "2"}  # near-lossless: pixel tests stay tight
        if rotation_cw_deg:
            # PyAV takes the display-matrix angle, counter-clockwise; players (and the legacy
            # "rotate" tag) speak of the clockwise rotation to apply, hence the minus sign.
            stream.set_display_rotation(-rotation_cw_deg)
        container.start_encoding()  # writes the header even when no frame follows
        for t_ms in pts_ms:
            frame = av.VideoFrame.from_ndarray(stored_frame(t_ms / 1000, size, marker), "rgb24")
            frame.pts = int(t_ms)
            frame.time_base = Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def write_vfr_video(path: Path, pts_ms: Sequence[int]) -> Path:
    """A variable-frame-rate mp4 whose frames have exactly the given PTS (ms, increasing)."""
    return _encode(Path(path), pts_ms)


def write_rotated_video(
    path: Path, rotation_cw_deg: int, num_frames: int = 5, fps: int = 10
) -> Path:
    """A CFR mp4 whose container says "rotate clockwise by `rotation_cw_deg` to display".

    The stored (coded) frames are `stored_frame(t, marker=True)`: a red square in the stored
    top-left corner, so a test can check where it lands once the reader turns frames upright.
    """
    pts_ms = [round(i * 1000 / fps) for i in range(num_frames)]
    return _encode(Path(path), pts_ms, rotation_cw_deg=rotation_cw_deg, marker=True)


def write_zero_frame_video(path: Path) -> Path:
    """An mp4 written by a muxer that never received a frame (no tracks, just a header)."""
    return _encode(Path(path), [])


def write_truncated_video(path: Path, fraction: float = 0.6, moov_first: bool = True) -> Path:
    """The first `fraction` of the bytes of a valid 8 s, 10 fps mp4.

    moov_first=True (faststart layout) keeps the index intact, so readers can open the file and
    only fail while reading or decoding; False (OpenCV writer layout, index at the end) cuts the
    index off, so opening fails.
    """
    path = Path(path)
    full = path.with_name(path.stem + "_full.mp4")
    if moov_first:
        _encode(full, [i * 100 for i in range(80)], faststart=True)
    else:
        write_synthetic_video(full, duration_s=8.0, fps=10.0, size=SIZE)
    data = full.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    full.unlink()
    return path


def write_corrupted_video(path: Path) -> Path:
    """A valid 8 s, 10 fps mp4 whose middle third of the payload is overwritten with zeros."""
    path = Path(path)
    write_synthetic_video(path, duration_s=8.0, fps=10.0, size=SIZE)
    data = bytearray(path.read_bytes())
    lo, hi = len(data) // 3, len(data) // 2
    data[lo:hi] = bytes(hi - lo)
    path.write_bytes(bytes(data))
    return path


def write_text_as_mp4(path: Path) -> Path:
    """A text file with an .mp4 name."""
    path = Path(path)
    path.write_text("this is not a video\n" * 20)
    return path


def write_empty_file(path: Path) -> Path:
    """A zero-byte file with an .mp4 name."""
    path = Path(path)
    path.write_bytes(b"")
    return path
