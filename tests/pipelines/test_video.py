"""Tests for the video-file reader (`hermes.pipelines.video`) and the synthetic video writer.

Expected frames and timestamps are computed from first principles (integer or rational
arithmetic on the known frame times), never by calling the code under test.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import video_fixtures as vf

from hermes.errors import SourceError, UsageError
from hermes.pipelines import video_checks
from hermes.pipelines.synthetic import make_frame, write_synthetic_video
from hermes.pipelines.sampling import PTS_TOLERANCE_S
from hermes.pipelines.video import (
    VideoInfo,
    _rotation_still_needed,
    available_backends,
    open_video,
)
from hermes.pipelines.sampling import StreamingPicker, sample_indices

CFR_FPS = 10
CFR_FRAMES = 80  # 8 s


def reference_picks(pts_ms, fps, start_ms, end_ms) -> list[int]:
    """The sampling rule, literally and exactly (rationals): the oracle for `sample_indices`."""
    picks: list[int] = []
    k = 0
    while (t := Fraction(start_ms) + Fraction(1000 * k) / Fraction(fps)) < end_ms:
        on_screen = max((i for i, p in enumerate(pts_ms) if p <= t), default=0)
        if on_screen not in picks:
            picks.append(on_screen)
        k += 1
    return picks


def read_all(path, backend, **kwargs):
    with open_video(path, backend) as video:
        return list(video.frames(**kwargs))


# --------------------------------------------------------------------------------------------
# sample_indices: pure function
# --------------------------------------------------------------------------------------------


def test_sample_indices_cfr_every_third_frame():
    pts_s = [i / 30 for i in range(90)]  # 3 s at 30 fps
    assert sample_indices(pts_s, 10.0, end_s=3.0) == list(range(0, 90, 3))


def test_sample_indices_cfr_non_divisor_rate():
    pts_s = [i / 30 for i in range(90)]
    # Target k/7 s shows frame floor(30 k / 7); k/7 < 3 s  <=>  k < 21.
    assert sample_indices(pts_s, 7.0, end_s=3.0) == [(30 * k) // 7 for k in range(21)]


def test_sample_indices_survives_accumulated_float_error():
    pts_s = np.cumsum([0.0] + [1 / 30] * 899)  # 30 s of running-sum timestamps
    assert sample_indices(pts_s, 5.0, end_s=30.0) == list(range(0, 900, 6))


def test_sample_indices_skips_duplicates():
    # Frame 0 is on screen for 1 s: the ten targets in [0, 1) all map to it, picked once.
    assert sample_indices([0.0, 1.0, 1.05, 2.0], 10.0, end_s=2.0, native_fps=1.0) == [0, 1, 2]


def test_sample_indices_targets_before_first_frame_take_the_first_frame():
    assert sample_indices([0.5, 1.0], 4.0, start_s=0.0, end_s=1.2, native_fps=100.0) == [0, 1]


def test_sample_indices_start_and_end():
    pts_s = [i / 10 for i in range(100)]
    # Targets 2.05, 2.55, ..., 4.55 s show frames 20, 25, ..., 45; 5.05 s is past the end.
    assert sample_indices(pts_s, 2.0, start_s=2.05, end_s=5.0) == [20, 25, 30, 35, 40, 45]


def test_sample_indices_fps_none_is_every_frame_on_screen_in_range():
    pts_s = [i / 10 for i in range(100)]
    assert sample_indices(pts_s, None) == list(range(100))
    # The frame showing at 2.05 s (pts 2.0) starts the range; pts 5.0 is at the exclusive end.
    assert sample_indices(pts_s, None, start_s=2.05, end_s=5.0) == list(range(20, 50))


def test_sample_indices_fps_at_or_above_native_is_every_frame():
    pts_s = [0.0, 0.1, 0.11, 0.12, 0.5, 0.6]  # average 10 fps with a burst
    assert sample_indices(pts_s, 10.0, native_fps=10.0) == list(range(6))
    assert sample_indices(pts_s, 50.0, native_fps=10.0) == list(range(6))
    # Below the native rate the burst is thinned by the timestamp rule.
    assert sample_indices(pts_s, 5.0, end_s=0.7, native_fps=10.0) == [0, 3, 5]


def test_sample_indices_edge_cases():
    assert sample_indices([], 1.0) == []
    assert sample_indices([0.0], 1.0) == [0]
    assert sample_indices([0.0, 1.0], 1.0, start_s=2.0, end_s=1.0) == []
    for bad_fps in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(UsageError):
            sample_indices([0.0, 1.0], bad_fps)


def test_sample_indices_matches_the_rule_on_random_timestamps():
    rng = random.Random(1234)
    for _ in range(300):
        # PTS on a 10 ms grid and targets on a whole-ms grid: never closer than the tolerance
        # unless equal, so the exact oracle and the float implementation must agree.
        pts_ms = sorted(rng.sample(range(0, 5000, 10), rng.randint(1, 60)))
        fps = rng.choice([1, 2, 4, 5, 8, 10, 20, 25, 40])
        start_ms = rng.randint(0, 3000)
        end_ms = start_ms + rng.randint(1, 4000)
        got = sample_indices(
            [p / 1000 for p in pts_ms], float(fps), start_ms / 1000, end_ms / 1000,
            native_fps=math.inf,
        )
        assert got == reference_picks(pts_ms, fps, start_ms, end_ms), (pts_ms, fps, start_ms)


@pytest.mark.parametrize("fps", [None, 0.8, 4.0, 8.0, 30.0])  # targets on a whole-ms grid, as above
def test_streaming_picker_frame_by_frame_follows_the_rule(fps):
    """The OpenCV path decides frame by frame, one frame of lookahead: it picks what the rule says, and
    every frame on screen in [start, end) when `fps` is None or at least the native rate."""
    rng = random.Random(7)
    for _ in range(100):
        pts_ms = sorted(rng.sample(range(0, 4000, 10), rng.randint(1, 40)))
        start_ms = rng.randint(0, pts_ms[-1])
        end_ms = start_ms + rng.randint(10, 3000)
        native_fps = rng.uniform(5, 20)
        picker = StreamingPicker(fps, start_ms / 1000, end_ms / 1000, native_fps)
        got = []
        for i, p in enumerate(pts_ms):
            if picker.push(p / 1000, pts_ms[i + 1] / 1000 if i + 1 < len(pts_ms) else None):
                got.append(i)
            if picker.done:
                break
        if fps is None or fps >= native_fps:
            first = max((i for i, p in enumerate(pts_ms) if p <= start_ms), default=0)
            expected = [first] + [i for i, p in enumerate(pts_ms) if i > first and p < end_ms]
        else:
            expected = reference_picks(pts_ms, Fraction(str(fps)), start_ms, end_ms)
        assert got == expected, (pts_ms, start_ms, end_ms)


# --------------------------------------------------------------------------------------------
# Constant frame rate file
# --------------------------------------------------------------------------------------------


def test_cfr_metadata(cfr_video, backend):
    with open_video(cfr_video, backend) as video:
        info = video.info
    assert isinstance(info, VideoInfo)
    assert info.backend == backend
    assert info.path == cfr_video
    assert info.duration_s == pytest.approx(8.0, abs=1e-3)
    assert info.native_fps == pytest.approx(10.0, abs=1e-6)
    assert (info.width, info.height) == (160, 120)
    assert info.num_frames == CFR_FRAMES
    assert info.rotation_deg == 0
    assert info.variable_frame_rate is False


@pytest.mark.parametrize("fps", [4.0, 3.0, 1.0])
def test_cfr_sampled_timestamps(cfr_video, backend, fps):
    frames = read_all(cfr_video, backend, fps=fps)
    # Target k/fps s (k/fps < 8) shows frame floor(10 k / fps); fps is a whole number here.
    n_targets = math.ceil(8 * fps)
    expected = sorted({(CFR_FPS * k) // int(fps) for k in range(n_targets)})
    assert [f.index for f in frames] == expected
    assert [f.t_s for f in frames] == pytest.approx([i / CFR_FPS for i in expected], abs=1e-6)


def test_cfr_every_frame_and_window(cfr_video, backend):
    frames = read_all(cfr_video, backend)
    assert [f.index for f in frames] == list(range(CFR_FRAMES))
    assert [f.t_s for f in frames] == pytest.approx([i / 10 for i in range(80)], abs=1e-6)
    window = read_all(cfr_video, backend, fps=2.0, start_s=2.05, end_s=5.0)
    assert [f.t_s for f in window] == pytest.approx([2.0, 2.5, 3.0, 3.5, 4.0, 4.5], abs=1e-6)


def test_cfr_pixels_match_their_timestamps(cfr_video, backend):
    """Each frame is RGB uint8 and looks like the synthetic picture at its own time, not another."""
    references = [make_frame(i / CFR_FPS).astype(np.int16) for i in range(CFR_FRAMES)]
    for frame in read_all(cfr_video, backend, fps=1.5):
        assert frame.rgb.dtype == np.uint8 and frame.rgb.shape == (120, 160, 3)
        errors = [np.abs(frame.rgb - ref).mean() for ref in references]
        assert int(np.argmin(errors)) == frame.index
        assert errors[frame.index] < 6.0  # mp4v compression noise only
        assert np.abs(frame.rgb[:, :, ::-1] - references[frame.index]).mean() > errors[frame.index]


def test_frames_can_be_read_twice(cfr_video, backend):
    with open_video(cfr_video, backend) as video:
        first = [f.index for f in video.frames(fps=2.0)]
        second = [f.index for f in video.frames(fps=2.0)]
    assert first == second == list(range(0, 80, 5))


def test_close_prevents_reading(cfr_video, backend):
    video = open_video(cfr_video, backend)
    video.close()
    video.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        video.frames()


@pytest.mark.parametrize(
    "start_s, end_s",
    [(-1.0, None), (8.0, None), (100.0, None), (3.0, 3.0), (3.0, 2.0), (0.0, 20.0)],
)
def test_range_outside_video_is_source_error(cfr_video, backend, start_s, end_s):
    with open_video(cfr_video, backend) as video:
        with pytest.raises(SourceError) as caught:
            video.frames(fps=1.0, start_s=start_s, end_s=end_s)  # raised before iterating
    message = str(caught.value)
    assert "\n" not in message and str(cfr_video) in message and "outside the video" in message


def test_auto_backend_prefers_decord(cfr_video):
    expected = "decord" if "decord" in available_backends() else "opencv"
    with open_video(cfr_video) as video:
        assert video.info.backend == expected


def test_unknown_backend_is_usage_error(cfr_video):
    with pytest.raises(UsageError, match="backend"):
        open_video(cfr_video, backend="ffmpeg")


# --------------------------------------------------------------------------------------------
# Variable frame rate file
# --------------------------------------------------------------------------------------------


def test_vfr_timestamps_read_back(vfr_video, backend):
    frames = read_all(vfr_video, backend)
    assert [f.index for f in frames] == list(range(len(vf.VFR_PTS_MS)))
    assert [f.t_s for f in frames] == pytest.approx([p / 1000 for p in vf.VFR_PTS_MS], abs=1e-3)
    for frame in frames:
        assert np.abs(frame.rgb.astype(np.int16) - vf.stored_frame(frame.t_s)).mean() < 6.0


def test_vfr_metadata(vfr_video, backend):
    with open_video(vfr_video, backend) as video:
        info = video.info
    assert info.num_frames == len(vf.VFR_PTS_MS)
    # The last frame starts at 1.5 s and lasts one nominal frame (1/30 s) in this muxer's file.
    assert 1.5 < info.duration_s < 1.6
    assert info.native_fps == pytest.approx(info.num_frames / info.duration_s, rel=1e-3)
    assert (info.width, info.height) == vf.SIZE
    if backend == "decord":  # OpenCV cannot see timestamps without decoding
        assert info.variable_frame_rate is True


def test_vfr_sampling_by_timestamp(vfr_video, backend):
    # Targets 0, 250, 500, 750, 1000, 1250 ms; frames on screen then (by hand from VFR_PTS_MS):
    # 0 -> #0 (0), 250 -> #3 (250), 500 -> #5 (270), 750 -> #6 (600), 1000 -> #7, 1250 -> #8 (1033).
    frames = read_all(vfr_video, backend, fps=4.0, end_s=1.4)
    assert [f.index for f in frames] == [0, 3, 5, 6, 7, 8]
    assert [f.t_s for f in frames] == pytest.approx([0.0, 0.25, 0.27, 0.6, 1.0, 1.033], abs=1e-3)
    exact = reference_picks(list(vf.VFR_PTS_MS), 2, 100, 1400)
    assert [f.index for f in read_all(vfr_video, backend, fps=2.0, start_s=0.1, end_s=1.4)] == exact


def test_vfr_above_native_rate_is_every_frame(vfr_video, backend):
    frames = read_all(vfr_video, backend, fps=20.0)  # native average is ~6.5 fps
    assert [f.index for f in frames] == list(range(len(vf.VFR_PTS_MS)))


# --------------------------------------------------------------------------------------------
# Both backends agree
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs", [{}, {"fps": 3.0}, {"fps": 0.5, "start_s": 1.23}, {"fps": 7.0, "end_s": 1.0}]
)
@pytest.mark.parametrize("video_name", ["cfr_video", "vfr_video"])
def test_backends_agree(request, video_name, kwargs):
    if "decord" not in available_backends():
        pytest.skip("decord not installed")
    path = request.getfixturevalue(video_name)
    a = read_all(path, "decord", **kwargs)
    b = read_all(path, "opencv", **kwargs)
    assert [f.index for f in a] == [f.index for f in b]
    assert [f.t_s for f in a] == pytest.approx([f.t_s for f in b], abs=1e-3)
    for fa, fb in zip(a, b):
        assert fa.rgb.shape == fb.rgb.shape
        assert np.abs(fa.rgb.astype(np.int16) - fb.rgb).mean() < 1.5


# --------------------------------------------------------------------------------------------
# Rotation metadata
# --------------------------------------------------------------------------------------------


def upright_reference(stored: np.ndarray, rotation_cw_deg: int) -> np.ndarray:
    """Rotate clockwise by explicit index mapping (independent of np.rot90's sign convention)."""
    h, w = stored.shape[:2]
    if rotation_cw_deg == 90:  # out[y, x] = in[h - 1 - x, y], output is w tall and h wide
        ys, xs = np.mgrid[0:w, 0:h]
        return stored[h - 1 - xs, ys]
    if rotation_cw_deg == 180:
        ys, xs = np.mgrid[0:h, 0:w]
        return stored[h - 1 - ys, w - 1 - xs]
    if rotation_cw_deg == 270:  # out[y, x] = in[x, w - 1 - y]
        ys, xs = np.mgrid[0:w, 0:h]
        return stored[xs, w - 1 - ys]
    return stored


@pytest.mark.parametrize(
    "rotation_cw_deg, marker_corner",
    [(90, "top-right"), (180, "bottom-right"), (270, "bottom-left")],
)
def test_rotated_video_comes_out_upright(tmp_path, backend, rotation_cw_deg, marker_corner):
    pytest.importorskip("av")
    path = vf.write_rotated_video(tmp_path / f"rot{rotation_cw_deg}.mp4", rotation_cw_deg)
    with open_video(path, backend) as video:
        info = video.info
        frames = list(video.frames())
    assert info.rotation_deg == rotation_cw_deg
    w, h = vf.SIZE
    expected_wh = (h, w) if rotation_cw_deg in (90, 270) else (w, h)
    assert (info.width, info.height) == expected_wh
    assert len(frames) == 5

    rgb = frames[0].rgb
    assert rgb.shape == (expected_wh[1], expected_wh[0], 3)
    # The stored top-left red marker must land in the corner a clockwise turn takes it to.
    m = vf.MARKER_PX // 2
    corners = {
        "top-left": rgb[:m, :m],
        "top-right": rgb[:m, -m:],
        "bottom-left": rgb[-m:, :m],
        "bottom-right": rgb[-m:, -m:],
    }
    for name, patch in corners.items():
        red = patch.reshape(-1, 3).mean(axis=0)
        is_red = red[0] > 200 and red[1] < 60 and red[2] < 60
        assert is_red == (name == marker_corner), (name, red)
    reference = upright_reference(vf.stored_frame(0.0, marker=True), rotation_cw_deg)
    assert np.abs(rgb.astype(np.int16) - reference).mean() < 6.0


# --------------------------------------------------------------------------------------------
# Bad inputs: always SourceError, one line, naming the path
# --------------------------------------------------------------------------------------------

BAD_FILES = {
    "missing": (lambda p: p, "not found"),
    "directory": (lambda p: (p.mkdir(), p)[1], "directory"),
    "empty": (vf.write_empty_file, "contains no frames"),
    "text": (vf.write_text_as_mp4, "not a readable video"),
    "zero_frames": (vf.write_zero_frame_video, "contains no frames"),
    "truncated_index_first": (lambda p: vf.write_truncated_video(p, 0.6, True), "truncated"),
    "truncated_index_last": (lambda p: vf.write_truncated_video(p, 0.6, False), "truncated"),
    "corrupted_middle": (vf.write_corrupted_video, "corrupt"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_input_raises_source_error(tmp_path, backend, case):
    pytest.importorskip("av")
    writer, words = BAD_FILES[case]
    path = writer(tmp_path / f"{case}.mp4")
    with pytest.raises(SourceError) as caught:
        # Opening may succeed for damaged files; reading them to the end must not.
        read_all(path, backend)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    assert words in message
    assert caught.value.exit_code == 3


def test_truncated_file_never_returns_silently_short(tmp_path, backend):
    """Whatever part is readable, a truncated file ends in SourceError, not a short clean read."""
    pytest.importorskip("av")
    for fraction in (0.3, 0.9, 0.99):
        path = vf.write_truncated_video(tmp_path / f"t{fraction}.mp4", fraction, moov_first=True)
        with pytest.raises(SourceError, match="truncated"):
            read_all(path, backend, fps=2.0)


def test_truncation_is_caught_by_decoding_too(tmp_path, backend, monkeypatch):
    """Without the MP4 layout check (e.g. other containers), decoding must still catch the cut."""
    pytest.importorskip("av")
    path = vf.write_truncated_video(tmp_path / "t.mp4", 0.6, moov_first=True)
    monkeypatch.setattr(video_checks, "scan_mp4", lambda _path: None)
    with pytest.raises(SourceError, match="truncated or corrupt") as caught:
        read_all(path, backend)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_single_frame_video(tmp_path, backend):
    path = write_synthetic_video(tmp_path / "one.mp4", duration_s=0.1, fps=10.0)
    with open_video(path, backend) as video:
        assert video.info.num_frames == 1
        assert [f.index for f in video.frames(fps=1.0)] == [0]
        assert [f.index for f in video.frames()] == [0]  # a second pass starts from the top


def test_rotation_still_needed_detects_what_the_decoder_did():
    raw = np.zeros((4, 6, 3), np.uint8)
    raw[0, 0] = 255  # asymmetric, so every rotation differs from the original
    for rotation in (90, 180, 270):
        upright = np.rot90(raw, k=-rotation // 90)
        assert _rotation_still_needed(raw, raw, rotation) == rotation  # decoder left it as stored
        assert _rotation_still_needed(upright, raw, rotation) == 0  # decoder already rotated


def test_available_backends():
    names = available_backends()
    assert "opencv" in names
    assert names == [n for n in ("decord", "opencv") if n in names]


# --------------------------------------------------------------------------------------------
# Synthetic video writer
# --------------------------------------------------------------------------------------------


def test_make_frame_is_deterministic_and_animated():
    a = make_frame(1.25, (160, 120), seed=3)
    assert a.shape == (120, 160, 3) and a.dtype == np.uint8
    assert np.array_equal(a, make_frame(1.25, (160, 120), seed=3))
    assert not np.array_equal(a, make_frame(1.25, (160, 120), seed=4))
    assert not np.array_equal(a, make_frame(2.25, (160, 120), seed=3))


def test_make_frame_shapes_appear_and_disappear():
    def colours(t_s):
        pixels = make_frame(t_s, (160, 120), seed=0).reshape(-1, 3)
        return {tuple(c) for c in np.unique(pixels, axis=0)}

    sets = [colours(t / 4) for t in range(32)]
    always, ever = set.intersection(*sets), set.union(*sets)
    assert len(ever - always) >= 1  # some colour comes and goes
    assert all(len(s) >= 2 for s in sets)  # background plus at least one shape, every frame


def test_write_synthetic_video_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        write_synthetic_video(tmp_path / "x.mp4", duration_s=0)
    with pytest.raises(ValueError):
        write_synthetic_video(tmp_path / "x.mp4", size=(161, 120))


def test_tolerance_is_below_any_real_frame_interval():
    assert PTS_TOLERANCE_S < 1 / 1000  # 1000 fps cameras still resolve
