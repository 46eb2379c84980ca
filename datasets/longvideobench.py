"""LongVideoBench loader (offline): referring-reasoning questions over videos up to an hour.

Source format: longvideobench/LongVideoBench `lvb_val.json` (the Hugging Face dataset
`longvideobench/LongVideoBench`; read the same way by lmms-eval `tasks/longvideobench`). A
JSON array of questions with `id`, `video_id`, `video_path` (file name under `videos/`),
`question`, `candidates` (3 to 5 of them: the option count is not fixed), `correct_choice`
(0-based index), `duration` (seconds), `duration_group` (15 / 60 / 600 / 3600),
`question_category` (e.g. "S2E", "T3O"), plus subtitle fields kept in `raw`. The test split
(`lvb_test_wo_gt.json`) has no `correct_choice`; it loads with `answer=None`.

Questions on the same video form one record; `task` is the question category and the
duration group is a group label ("600"), so `tasks=["3600"]` selects the hour-long videos.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from hermes.errors import UsageError

from . import common
from .records import KIND_MC, BenchmarkQuestion, VideoRecord, normalize_options, resolve_gt_index

ANNOTATION_CANDIDATES = ("lvb_val.json", "LongVideoBench/lvb_val.json", "lvb_test_wo_gt.json")
VIDEO_FOLDERS = ("videos", "LongVideoBench/videos", ".")
DURATION_GROUPS = ("15", "60", "600", "3600")


def load(
    data_root: str | os.PathLike,
    tasks: str | Iterable[str] | None = None,
    limit: int | None = None,
) -> list[VideoRecord]:
    """Load LongVideoBench (validation split), one VideoRecord per video.

    Args:
        data_root: Folder holding `lvb_val.json` and `videos/`.
        tasks: Question categories ("S2E", ...) and/or duration groups ("15", "60", "600",
            "3600") to keep.
        limit: Keep at most this many videos.

    Returns:
        The records in file order.

    Raises:
        UsageError: Missing annotation file, malformed entries, unknown task names.
        SourceError: No selected video exists under the data root.
    """
    root = common.check_root(data_root, "longvideobench")
    path = common.find_file(root, ANNOTATION_CANDIDATES, "LongVideoBench lvb_val.json")
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    by_video: dict[str, list[BenchmarkQuestion]] = {}
    paths: dict[str, str] = {}
    durations: dict[str, float | None] = {}
    issues = common.DataIssues()
    for number, item in enumerate(common.read_json(path, expect=list)):
        where = f"{path.name} item {number} (id {item.get('id') if isinstance(item, dict) else None})"
        built = issues.guard(where, lambda: (str(common.require(item, "video_id", where)),
                                             str(common.require(item, "video_path", where)), _question(item, where)))
        if built is None:
            continue
        video_id, video_path, question = built
        paths.setdefault(video_id, video_path)
        durations.setdefault(video_id, common.optional_number(item.get("duration")))
        by_video.setdefault(video_id, []).append(question)
    records = [
        VideoRecord(video_id=v, video_path=finder.find(paths[v]), duration=durations[v], questions=qs)
        for v, qs in by_video.items()
    ]
    return common.finish(records, "longvideobench", tasks, limit, known=DURATION_GROUPS, issues=issues)


def _question(item: dict, where: str) -> BenchmarkQuestion:
    """One LongVideoBench question in unified form."""
    options = normalize_options(common.require(item, "candidates", where))
    if not options:
        raise UsageError(f"longvideobench: expected candidates in {where}, found none")
    gt_index = None
    if "correct_choice" in item:
        gt_index = resolve_gt_index(item["correct_choice"], options)
        if gt_index is None:
            raise UsageError(
                f"longvideobench: correct_choice {item['correct_choice']!r} is out of range "
                f"for {len(options)} candidates in {where}"
            )
    group = str(item.get("duration_group", ""))
    return BenchmarkQuestion(
        question=str(common.require(item, "question", where)),
        options=options,
        answer=None if gt_index is None else options[gt_index],
        gt_index=gt_index,
        t_s=None,
        task=str(common.require(item, "question_category", where)),
        raw=item,
        qid=f"lvb-{item.get('id', where)}",
        meta={"kind": KIND_MC, "groups": (group,) if group else (), "duration_group": group},
    )
