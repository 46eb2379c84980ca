"""Shared fixtures for the pipeline tests: synthetic video files written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from video_fixtures import VFR_PTS_MS, write_vfr_video

from hermes.pipelines.synthetic import write_synthetic_video
from hermes.pipelines.video import available_backends

HAS_DECORD = "decord" in available_backends()


@pytest.fixture
def one_cpu_thread():
    """One torch thread for the test, the previous count after: bench tests check rows and plumbing, not
    speed, and OpenMP oversubscription on a shared 2-core machine slows the tiny models' matmuls 50x or more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Every reader test runs once per backend; decord has no wheels off x86_64, so it may be missing.
BACKEND_PARAMS = [
    pytest.param("decord", marks=pytest.mark.skipif(not HAS_DECORD, reason="decord not installed")),
    "opencv",
]


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def cfr_video(tmp_path_factory) -> Path:
    """8 s at 10 fps, 160x120, written with OpenCV (the demo's writer)."""
    return write_synthetic_video(
        tmp_path_factory.mktemp("cfr") / "cfr.mp4", duration_s=8.0, fps=10.0, size=(160, 120)
    )


@pytest.fixture(scope="session")
def vfr_video(tmp_path_factory) -> Path:
    """A variable-frame-rate mp4 with PTS `VFR_PTS_MS` (needs PyAV)."""
    pytest.importorskip("av")
    return write_vfr_video(tmp_path_factory.mktemp("vfr") / "vfr.mp4", VFR_PTS_MS)
