"""RVS-Ego / RVS-Movie (streaming, open-ended), as released with ReKV.

Source format: the annotation files of the Hugging Face dataset `Becomebright/RVS` used by
Becomebright/ReKV (`video_qa/rekv_stream_vqa.py`, `run_eval.py`): `ego/ego4d_oe.json` and
`movie/movienet_oe.json`. Each is a JSON array of videos:

    {"video_id": ..., "video_path": ..., "duration": <seconds>,
     "conversations": [{"question", "answer", "start_time", "end_time"}, ...]}

A question refers to the span [start_time, end_time] and is asked once `end_time` has been
streamed (ReKV encodes `int(end_time * fps)` frames, then asks). Answers are free text, scored
by an LLM judge (ReKV `eval/eval_open_ended.py`), so there are no options.

RVS-Movie ships its MovieNet videos as pre-decoded `.npy` arrays, one frame per second
(shape (T, H, W, 3), uint8; T equals `duration`). `load_npy_frames` reads them with
`allow_pickle=False`: a frame array never needs pickled objects, and refusing them means a
tampered file cannot run code.

The data root holds `ego/ego4d_oe.json` and/or `movie/movienet_oe.json` (also accepted directly
in the root or under `rvs/`) and the videos they name; `tasks`: "ego" and/or "movie". The
prompt is the question as it is (ReKV video_qa/rekv_stream_vqa.py); replies are scored by the
judge (`metrics`, "judge").
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hermes.errors import SourceError, UsageError

from .. import common
from ..benchmark import STREAMING, Benchmark, Prompt
from ..records import KIND_OPEN, BenchmarkQuestion, VideoRecord, parse_timestamp

SUBSETS = {
    "ego": ("ego/ego4d_oe.json", "ego4d_oe.json", "rvs/ego/ego4d_oe.json"),
    "movie": ("movie/movienet_oe.json", "movienet_oe.json", "rvs/movie/movienet_oe.json"),
}
# `.npy` frame arrays hold one frame per second of video.
NPY_FPS = 1.0


def _read(root: Path, tasks, issues: common.DataIssues, subset: str | None = None) -> list[VideoRecord]:
    """Every file present, or only `subset`'s ("ego" or "movie": the registry's rvs-ego and rvs-movie)."""
    names = [subset] if subset else list(SUBSETS)
    paths = {name: common.first_file(root, SUBSETS[name]) for name in names}
    if subset is not None and paths[subset] is None:
        common.find_file(root, SUBSETS[subset], f"RVS-{subset.capitalize()} annotations")
    paths = {name: path for name, path in paths.items() if path is not None}
    if not paths:
        raise UsageError(f"rvs: expected {SUBSETS['ego'][0]} or {SUBSETS['movie'][0]} under {root}, found neither")
    records = []
    for name, path in paths.items():
        finder = common.VideoFinder(root, (str(path.parent.relative_to(root)), f"{name}/videos", "videos", "."))
        for number, video in enumerate(common.read_json(path, expect=list)):
            where = f"{path.name} entry {number}"
            record = issues.guard(where, lambda: _record(video, name, finder, where, issues))
            if record is not None and record.questions:
                records.append(record)
    return records


load = common.make_loader("rvs", _read, known=SUBSETS)


def _record(video: dict, subset: str, finder: common.VideoFinder, where: str,
            issues: common.DataIssues) -> VideoRecord:
    """One RVS video with its conversations as questions."""
    video_id = str(common.require(video, "video_id", where))
    found = finder.find(str(common.require(video, "video_path", where)))
    duration = video.get("duration")
    duration = None if duration is None else issues.metadata(where, "duration", duration, parse_timestamp)
    questions = []
    for i, turn in enumerate(common.require(video, "conversations", where)):
        turn_where = f"{where} (video {video_id}) conversation {i}"
        question = issues.guard(turn_where, lambda: _turn(turn, subset, video_id, i, turn_where, issues))
        if question is not None:
            questions.append(question)
    is_npy = found is not None and found.suffix.casefold() == ".npy"
    return VideoRecord(video_id=video_id, video_path=found, duration=duration, questions=questions,
                       frame_fps=NPY_FPS if is_npy else None)


def _turn(turn: dict, subset: str, video_id: str, i: int, turn_where: str,
          issues: common.DataIssues) -> BenchmarkQuestion:
    """One RVS conversation turn: asked at its `end_time` (needed), once the span it refers to has been
    streamed; `start_time` is metadata."""
    end = parse_timestamp(common.require(turn, "end_time", turn_where))
    start = issues.metadata(turn_where, "start_time", turn.get("start_time"), parse_timestamp)
    return BenchmarkQuestion(question=str(common.require(turn, "question", turn_where)), options=[],
                             answer=str(common.require(turn, "answer", turn_where)), gt_index=None, t_s=end,
                             task=subset, raw=turn, qid=f"rvs-{subset}-{video_id}-{i}",
                             meta={"kind": KIND_OPEN, "start_s": start})


def load_npy_frames(path: str | os.PathLike) -> np.ndarray:
    """Open an RVS `.npy` frame array without reading it all into memory.

    Args:
        path: A `.npy` file of shape (T, H, W, 3), dtype uint8, one frame per second.

    Returns:
        A read-only memory-mapped array.

    Raises:
        SourceError: If the file is missing, holds pickled objects, or is not (T, H, W, 3) uint8.
    """
    path = Path(path)
    try:
        # allow_pickle=False: a frame array never needs objects, and pickles can run code.
        frames = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise SourceError(f"frame array {path} does not exist; download the RVS videos") from None
    except ValueError as exc:
        raise SourceError(f"refusing {path}: it needs pickle to load ({exc}); expected a plain uint8 array") from None
    except OSError as exc:
        raise SourceError(f"cannot read frame array {path}: {exc}") from None
    if not isinstance(frames, np.ndarray) or frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        shape = getattr(frames, "shape", None)
        dtype = getattr(frames, "dtype", None)
        raise SourceError(f"expected {path} to hold (T, H, W, 3) uint8 frames, found shape {shape} dtype {dtype}")
    return frames


class Rvs(Benchmark):
    """RVS: ReKV sends the open-ended question as it is; a judge scores the reply."""

    family = "rvs"

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        return Prompt(question.question)


BENCHMARKS = {
    f"rvs-{subset}": Rvs(common.make_loader(f"rvs-{subset}", functools.partial(_read, subset=subset), known=SUBSETS),
                         STREAMING, "judge")
    for subset in SUBSETS
}
ALIASES = {"rvsego": "rvs-ego", "rvsmovie": "rvs-movie"}
