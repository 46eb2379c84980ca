"""Video-MME loader (offline): 900 videos in three duration buckets, three questions each.

Source format: the Hugging Face dataset `lmms-lab/Video-MME` (MME-Benchmarks/Video-MME):
`videomme/test-00000-of-00001.parquet` with one row per question and the columns `video_id`
("001"), `duration` ("short" / "medium" / "long"), `domain`, `sub_category`, `url`, `videoID`
(the YouTube id that names the file), `question_id` ("001-1"), `task_type`, `question`,
`options` (["A. ...", "B. ...", "C. ...", "D. ..."]) and `answer` (a letter). Videos are
`data/<videoID>.mp4` -- except that the archive holds some as `.MP4` or `.mkv` (lmms-eval's
`videomme_doc_to_visual` tries those in turn); they are found here by stem, any case.

Reading parquet needs `pyarrow` (or `pandas` with a parquet engine); it is imported only when
a parquet file is read. The same rows exported as JSON / JSON lines (what `datasets`'
`to_json` writes: `videomme.json` or `videomme.jsonl`) are read without it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hermes.errors import UsageError

from . import common
from .records import KIND_MC, BenchmarkQuestion, VideoRecord, resolve_gt_index

DURATIONS = ("short", "medium", "long")
PARQUET_GLOBS = ("videomme/test-*.parquet", "test-*.parquet", "videomme/*.parquet", "*.parquet")
JSON_CANDIDATES = ("videomme.jsonl", "videomme.json", "videomme/videomme.jsonl", "videomme/videomme.json")
VIDEO_FOLDERS = ("data", "videos", ".")


def load(
    data_root: str | os.PathLike,
    tasks: str | Iterable[str] | None = None,
    limit: int | None = None,
) -> list[VideoRecord]:
    """Load Video-MME, one VideoRecord per video (three questions each).

    Args:
        data_root: The Video-MME folder, holding the parquet (or a JSON export) and `data/`.
        tasks: Task types ("Counting Problem", ...) and/or duration buckets ("short",
            "medium", "long") to keep.
        limit: Keep at most this many videos.

    Returns:
        The records in file order.

    Raises:
        UsageError: No annotation file, no parquet reader installed, malformed rows,
            unknown task names.
        SourceError: No selected video exists under the data root.
    """
    root = common.check_root(data_root, "videomme")
    rows = _read_rows(root)
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    by_video: dict[str, list[BenchmarkQuestion]] = {}
    issues = common.DataIssues()
    for number, row in enumerate(rows):
        where = f"Video-MME row {number} (question_id {row.get('question_id') if isinstance(row, dict) else None})"
        built = issues.guard(where, lambda: (str(common.require(row, "videoID", where)), _question(row, where, issues)))
        if built is not None:
            by_video.setdefault(built[0], []).append(built[1])
    records = [
        VideoRecord(video_id=video, video_path=finder.find(f"{video}.mp4"), duration=None, questions=questions)
        for video, questions in by_video.items()
    ]
    return common.finish(records, "videomme", tasks, limit, known=DURATIONS, issues=issues)


def _read_rows(root: Path) -> list[dict]:
    """The question rows, from the parquet file or a JSON/JSON-lines export of it."""
    for pattern in PARQUET_GLOBS:
        found = sorted(root.glob(pattern))
        if found:
            return [row for path in found for row in read_parquet(path)]
    path = common.first_file(root, JSON_CANDIDATES)
    if path is not None:
        return common.read_jsonl(path) if path.suffix == ".jsonl" else common.read_json(path, expect=list)
    raise UsageError(
        f"videomme: expected {root / PARQUET_GLOBS[0]} (or videomme.jsonl), found nothing; "
        "download lmms-lab/Video-MME into --data-root"
    )


def read_parquet(path: Path) -> list[dict]:
    """Read a parquet file into a list of row dicts.

    Args:
        path: The parquet file.

    Returns:
        One dict per row, list columns as Python lists.

    Raises:
        UsageError: If neither pyarrow nor pandas can read parquet here, or the file is bad.
    """
    try:
        import pyarrow.parquet as pq  # imported lazily: only Video-MME's parquet needs it
    except ImportError:
        pq = None
    try:
        if pq is not None:
            return pq.read_table(path).to_pylist()
        try:
            import pandas as pd
        except ImportError:
            raise UsageError(
                f"reading {path.name} needs pyarrow; install it (pip install pyarrow) "
                "or supply the rows as videomme.jsonl"
            ) from None
        frame = pd.read_parquet(path)
        return [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
    except UsageError:
        raise
    except ImportError as exc:
        # pandas without a parquet engine raises ImportError from read_parquet.
        raise UsageError(f"reading {path.name} needs pyarrow ({exc}); pip install pyarrow") from None
    except Exception as exc:  # noqa: BLE001 - any reader failure means an unreadable file
        raise UsageError(f"cannot read {path}: {exc}") from None


def _plain(value):
    """numpy arrays in pandas cells (the `options` column) as plain lists."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def _question(row: dict, where: str, issues: common.DataIssues) -> BenchmarkQuestion:
    """One Video-MME row in unified form."""
    options = common.clean_options(common.require(row, "options", where), where, issues, expected=4)
    gt_index = resolve_gt_index(common.require(row, "answer", where), options)
    if gt_index is None:
        raise UsageError(f"videomme: answer {row['answer']!r} names none of the options in {where}")
    duration = str(common.require(row, "duration", where))
    if duration not in DURATIONS:
        raise UsageError(f"videomme: expected duration short/medium/long in {where}, found {duration!r}")
    return BenchmarkQuestion(
        question=str(common.require(row, "question", where)),
        options=options,
        answer=options[gt_index],
        gt_index=gt_index,
        t_s=None,
        task=str(common.require(row, "task_type", where)),
        raw=row,
        qid=f"videomme-{row.get('question_id', where)}",
        meta={"kind": KIND_MC, "groups": (duration,), "duration": duration, "domain": row.get("domain")},
    )
