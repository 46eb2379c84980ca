"""OVO-Bench loader (streaming): backward tracing, real-time perception, forward responding.

Source format: `ovo_bench_new.json` from JoeLeelyf/OVO-Bench (also vendored, split by category,
in lmms-eval `lmms_eval/tasks/ovobench/ovobench_data/*/data.json`). A flat JSON array; one
entry per query, with `id`, `task`, `video` (relative to the source-video folder, official
default `data/src_videos`):

* backward (EPM, ASI, HLD) and real-time (STU, OJR, ATR, ACR, OCR, FPD) entries carry
  `question`, `options`, `gt` (0-based index of the correct option), `realtime` (seconds,
  int or float) and `answer`. The official scorer uses `gt` only; `answer` sometimes
  paraphrases the option (ACR: "He is inflating the tire with the tool." for option
  "He is inflating a tire."), so it is kept in `raw` and never used as the reference.
* forward entries carry `test_info`, a list of probes each with its own `realtime`:
  REC (`activity`; probe `count`), SSR (probe `step` and `type`: 1 = performing it now),
  CRR (`question`; probe `type`: 1 = enough evidence so far). Probes are not sorted in the
  file (SSR lists them step by step); each probe becomes one question at its own time.

All entries on one source video form one stream; questions are ordered by time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from hermes.errors import UsageError

from . import common
from .records import (
    KIND_COUNT,
    KIND_MC,
    KIND_YESNO,
    BenchmarkQuestion,
    VideoRecord,
    is_option_index,
    parse_timestamp,
)

BACKWARD_TASKS = ("EPM", "ASI", "HLD")
REALTIME_TASKS = ("STU", "OJR", "ATR", "ACR", "OCR", "FPD")
FORWARD_TASKS = ("REC", "SSR", "CRR")
CATEGORIES = {"backward": BACKWARD_TASKS, "realtime": REALTIME_TASKS, "forward": FORWARD_TASKS}
CATEGORY_OF = {task: cat for cat, tasks in CATEGORIES.items() for task in tasks}

# Yes/No probes are scored against these option texts; index = the probe's `type`.
YES_NO = ["No", "Yes"]

ANNOTATION_CANDIDATES = ("ovo_bench_new.json", "data/ovo_bench_new.json")
VIDEO_FOLDERS = ("src_videos", "data/src_videos", "videos", ".")


def load(
    data_root: str | os.PathLike,
    tasks: str | Iterable[str] | None = None,
    limit: int | None = None,
) -> list[VideoRecord]:
    """Load OVO-Bench as one stream per source video.

    Args:
        data_root: Folder holding `ovo_bench_new.json` (or `data/ovo_bench_new.json`) and the
            source videos under `src_videos/` (the official `--video_dir`).
        tasks: Task codes ("EPM", "REC", ...) or categories ("backward", "realtime",
            "forward") to keep; None keeps all.
        limit: Keep at most this many videos.

    Returns:
        One VideoRecord per source video, questions sorted by time.

    Raises:
        UsageError: Missing or malformed annotation file, unknown task names.
        SourceError: No selected video exists under the data root.
    """
    root = common.check_root(data_root, "ovo-bench")
    known = [*CATEGORY_OF, *CATEGORIES]
    common.check_names(common.normalize_tasks(tasks), known)
    path = common.find_file(root, ANNOTATION_CANDIDATES, "OVO-Bench annotations ovo_bench_new.json")
    entries = common.read_json(path, expect=list)
    by_video: dict[str, list[BenchmarkQuestion]] = {}
    issues = common.DataIssues()
    for number, entry in enumerate(entries):
        where = f"{path.name} entry {number} (id {entry.get('id') if isinstance(entry, dict) else None})"
        built = issues.guard(where, lambda: (str(common.require(entry, "video", where)),
                                             _questions(entry, where, issues)))
        if built is not None:
            by_video.setdefault(built[0], []).extend(built[1])
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    records = [
        VideoRecord(video_id=video, video_path=finder.find(video), duration=None, questions=questions)
        for video, questions in by_video.items()
    ]
    return common.finish(records, "ovo-bench", tasks, limit, known, issues=issues)


def _questions(entry: dict, where: str, issues: common.DataIssues) -> list[BenchmarkQuestion]:
    """Turn one annotation entry into its question(s): one, or one per forward probe."""
    task = str(common.require(entry, "task", where))
    if task not in CATEGORY_OF:
        raise UsageError(f"unknown OVO-Bench task {task!r} in {where}; expected one of {', '.join(CATEGORY_OF)}")
    qid = f"ovo-{entry.get('id', where)}"
    meta = {"groups": (CATEGORY_OF[task],)}
    if task in FORWARD_TASKS:
        probes = common.require(entry, "test_info", where)
        if not isinstance(probes, list) or not probes:
            raise UsageError(f"expected a non-empty 'test_info' list in {where}")
        return [_probe(entry, task, probe, i, f"{qid}-{i}", meta, where) for i, probe in enumerate(probes)]
    options = common.clean_options(common.require(entry, "options", where), where, issues)
    gt = common.require(entry, "gt", where)
    if not is_option_index(gt, len(options)):
        raise UsageError(f"expected 'gt' to index one of {len(options)} options in {where}, found {gt!r}")
    return [
        BenchmarkQuestion(
            question=str(common.require(entry, "question", where)),
            options=options,
            # The official scorer trusts `gt`; `answer` may paraphrase the option.
            answer=options[gt],
            gt_index=gt,
            t_s=parse_timestamp(common.require(entry, "realtime", where)),
            task=task,
            raw=entry,
            qid=qid,
            meta={**meta, "kind": KIND_MC},
        )
    ]


def _probe(entry: dict, task: str, probe: dict, index: int, qid: str, meta: dict, where: str) -> BenchmarkQuestion:
    """One forward-task probe as a question asked at the probe's `realtime`."""
    where = f"{where} test_info[{index}]"
    t_s = parse_timestamp(common.require(probe, "realtime", where))
    meta = {**meta, "probe": index}
    if task == "REC":
        activity = str(common.require(entry, "activity", where))
        count = common.require(probe, "count", where)
        return BenchmarkQuestion(
            # The official prompt builds this question from the activity.
            question=f"How many times did they {activity}?",
            options=[],
            answer=str(count),
            gt_index=None,
            t_s=t_s,
            task=task,
            raw=entry,
            qid=qid,
            meta={**meta, "kind": KIND_COUNT},
        )
    kind = common.require(probe, "type", where)
    if kind not in (0, 1) or isinstance(kind, bool):
        raise UsageError(f"expected 'type' 0 or 1 in {where}, found {kind!r}")
    text = common.require(probe, "step", where) if task == "SSR" else common.require(entry, "question", where)
    return BenchmarkQuestion(
        question=str(text),
        options=list(YES_NO),
        answer=YES_NO[kind],
        gt_index=kind,
        t_s=t_s,
        task=task,
        raw=entry,
        qid=qid,
        meta={**meta, "kind": KIND_YESNO},
    )
