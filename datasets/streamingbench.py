"""StreamingBench loader (streaming): real-time, omni-source, sequential QA and proactive output.

Source format: THUNLP-MT/StreamingBench `src/data/questions_{real,omni,sqa,proactive}.json`
(read by `src/benchmark/StreamingBench*.py`, scored by the stats script `count.py`):

* `questions_real.json`, `questions_omni.json`, `questions_proactive.json`: a JSON array of
  segments `{"time": "[0:00:00 - 0:01:00]", "questions": [...], "video_categories",
  "video_path": "./videos/sample_2_....mp4"}`. The same video appears in several segments;
  all its questions form one stream.
* `questions_sqa.json`: an array of *videos*, each an array of such segments (the official
  SQA eval iterates `for video_data in data: for subset in video_data`). SQA options carry no
  letters ("Wang chuqin.", "2."); the official prompt adds "A. " ... "D. ".
* A question has `task_type`, `question`, `time_stamp` ("00:03:10"; also "3:10" / "MM:SS"),
  `answer` (a letter) and `options` ("A. ...", sometimes "A.text" without a space). Proactive
  questions have no options; they carry `ground_truth_time_stamp` and `ground_truth_output`,
  and are scored correct when the model speaks within 2 s of that time (see metrics.py).

Junk in the real files: a few time stamps are irregular ("00:12450", "00:00:8"); the official
scripts read every field as a count of its unit (`sum(int(x) * 60 ** i)`), so "00:12450" is
12,450 s, and so does this loader (flagging the value). `questions_omni.json` has empty or
padded candidates and 5-7 options in a few questions: kept as given, flagged.

Videos are looked up relative to the data root, then in `videos/`, `<subset>/` and
`<subset>/videos/` (the official README unzips each subset into `data/<subset>/`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hermes.errors import UsageError

from . import common
from .records import (
    KIND_MC,
    KIND_PROACTIVE,
    BenchmarkQuestion,
    VideoRecord,
    parse_timestamp,
    resolve_gt_index,
)

SUBSET_FILES = {
    "real": "questions_real.json",
    "omni": "questions_omni.json",
    "sqa": "questions_sqa.json",
    "proactive": "questions_proactive.json",
}
ANNOTATION_FOLDERS = (".", "src/data", "data")
VIDEO_FOLDERS = (".", "videos")

# The proactive rule of the official count.py: answered within this many seconds of the
# ground-truth time.
PROACTIVE_TOLERANCE_S = 2.0


def load(
    data_root: str | os.PathLike,
    tasks: str | Iterable[str] | None = None,
    limit: int | None = None,
) -> list[VideoRecord]:
    """Load StreamingBench as one stream per video.

    Args:
        data_root: Folder holding the `questions_*.json` files (directly, or under
            `src/data/` or `data/`) and the videos.
        tasks: Subsets ("real", "omni", "sqa", "proactive") and/or task types
            ("Object Perception", "Sequential Question Answering", ...) to keep.
        limit: Keep at most this many videos.

    Returns:
        One VideoRecord per video, questions sorted by time.

    Raises:
        UsageError: No annotation file found, malformed entries, unknown task names.
        SourceError: No selected video exists under the data root.
    """
    root = common.check_root(data_root, "streamingbench")
    wanted = common.normalize_tasks(tasks)
    # Read only the subset files asked for when the selection names subsets alone.
    subsets = [s for s in SUBSET_FILES if wanted is None or not set(wanted) <= set(SUBSET_FILES) or s in wanted]
    files = {s: common.first_file(root, [f"{f}/{SUBSET_FILES[s]}" for f in ANNOTATION_FOLDERS]) for s in subsets}
    files = {s: p for s, p in files.items() if p is not None}
    if not files:
        expected = ", ".join(SUBSET_FILES[s] for s in subsets)
        raise UsageError(f"streamingbench: expected {expected} under {root}, found none; download the annotations")
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    records: list[VideoRecord] = []
    issues = common.DataIssues()
    for subset, path in files.items():
        by_video: dict[str, list[BenchmarkQuestion]] = {}
        seen: dict[str, int] = {}  # questions of each video read so far, excluded ones included
        for number, segment in enumerate(_segments(path, subset)):
            where = f"{path.name} segment {number}"
            entry = issues.guard(where, lambda: (str(common.require(segment, "video_path", where)),
                                                 common.require(segment, "questions", where)))
            if entry is None:
                continue
            video, entries = entry
            questions = by_video.setdefault(video, [])
            stem = Path(video).stem
            for i, item in enumerate(entries):
                # a qid counts every question of its video in file order, so that an excluded
                # question never renames the ones after it
                qid = f"sb-{subset}-{stem}-{seen.get(video, 0)}"
                seen[video] = seen.get(video, 0) + 1
                q_where = f"{where} question {i} (video {stem})"
                built = issues.guard(q_where, lambda: _question(item, subset, qid, q_where, issues))
                if built is not None:
                    questions.append(built)
        for video, questions in by_video.items():
            if not questions:
                continue
            found = finder.find(video, extra_folders=(root / subset, root / subset / "videos"))
            records.append(VideoRecord(video_id=Path(video).stem, video_path=found, duration=None, questions=questions))
    return common.finish(records, "streamingbench", tasks, limit, known=SUBSET_FILES, issues=issues)


def _segments(path: Path, subset: str) -> list[dict]:
    """The segments of one file; SQA's per-video arrays are flattened in order."""
    data = common.read_json(path, expect=list)
    if subset != "sqa":
        return data
    segments = []
    for item in data:
        segments.extend(item if isinstance(item, list) else [item])
    return segments


def official_seconds(value, where: str, field_name: str, issues: common.DataIssues) -> float:
    """A StreamingBench time stamp read as the official scripts read it; irregular ones flagged."""
    try:
        return parse_timestamp(value)
    except UsageError:
        seconds = parse_timestamp(value, carry=True)  # still an error when not numbers at all
        issues.flag(where, field_name, value, f"irregular time stamp read as {seconds:g} s, as the official scripts do")
        return seconds


def _question(entry: dict, subset: str, qid: str, where: str, issues: common.DataIssues) -> BenchmarkQuestion:
    """One StreamingBench question in unified form."""
    task = str(common.require(entry, "task_type", where))
    t_s = official_seconds(common.require(entry, "time_stamp", where), where, "time_stamp", issues)
    meta = {"groups": (subset,), "subset": subset}
    if subset == "proactive":
        return BenchmarkQuestion(
            question=str(common.require(entry, "question", where)),
            options=[],
            answer=str(common.require(entry, "ground_truth_output", where)),
            gt_index=None,
            t_s=t_s,
            task=task,
            raw=entry,
            qid=qid,
            meta={
                **meta,
                "kind": KIND_PROACTIVE,
                "gt_time_s": official_seconds(common.require(entry, "ground_truth_time_stamp", where), where,
                                              "ground_truth_time_stamp", issues),
            },
        )
    options = common.clean_options(common.require(entry, "options", where), where, issues, expected=4)
    gt_index = resolve_gt_index(common.require(entry, "answer", where), options)
    if gt_index is None:
        raise UsageError(f"answer {entry['answer']!r} names none of the {len(options)} options in {where}")
    return BenchmarkQuestion(
        question=str(common.require(entry, "question", where)),
        options=options,
        answer=options[gt_index],
        gt_index=gt_index,
        t_s=t_s,
        task=task,
        raw=entry,
        qid=qid,
        meta={**meta, "kind": KIND_MC},
    )
