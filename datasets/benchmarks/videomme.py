"""Video-MME (offline): 900 videos in three duration buckets, three questions each.

Source format: the Hugging Face dataset `lmms-lab/Video-MME`: `videomme/test-*.parquet` (needs
`pyarrow`, or its `videomme.json[l]` export), a row per question with `videoID` (names the file),
`question_id`, `duration` (short/medium/long), `task_type`, `question`, `options` ("A. ...") and
`answer` (a letter). Videos are `data/<videoID>.mp4`, some `.MP4` or `.mkv` (lmms-eval's
`videomme_doc_to_visual` tries those in turn). `tasks`: task types and/or duration buckets.

Prompt: the Video-MME README evaluation prompt (frames only); the same text as lmms-eval
tasks/videomme/utils.py with post_prompt "The best answer is:". Parser: eval_your_results.py
extract_characters_regex. Metric: per task and duration bucket, and `leaderboard`, the numbers
that script prints and the leaderboard lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import OFFLINE, Benchmark, Prompt, letter_after_prefixes
from ..metrics import tally
from ..records import KIND_MC, BenchmarkQuestion, VideoRecord, letter_options, resolve_gt_index

DURATIONS = ("short", "medium", "long")
PARQUET_GLOBS = ("videomme/test-*.parquet", "test-*.parquet", "videomme/*.parquet", "*.parquet")
JSON_CANDIDATES = ("videomme.jsonl", "videomme.json", "videomme/videomme.jsonl", "videomme/videomme.json")
VIDEO_FOLDERS = ("data", "videos", ".")

TEMPLATE = (
    "Select the best answer to the following multiple-choice question based on the video. Respond with only "
    "the letter (A, B, C, or D) of the correct option.\n{question}\n{options}\nThe best answer is:"
)
# extract_characters_regex (BradyFU/Video-MME, now MME-Benchmarks/Video-MME,
# evaluation/eval_your_results.py). Two commas are missing in the official list, so Python joins
# "The best option is" + "The correct option is" and "Best answer:" + "Best option:" into
# single strings that never occur: a reply "Best option: C" is read as B (from "Best"). The
# list is kept exactly so, because published Video-MME numbers were computed with it.
PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
)


def _read(root: Path, tasks, issues: common.DataIssues) -> list[VideoRecord]:
    rows = _read_rows(root)
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    by_video: dict[str, list[BenchmarkQuestion]] = {}
    for number, row in enumerate(rows):
        where = f"Video-MME row {number} (question_id {row.get('question_id') if isinstance(row, dict) else None})"
        built = issues.guard(where, lambda: (str(common.require(row, "videoID", where)), _question(row, where, issues)))
        if built is not None:
            by_video.setdefault(built[0], []).append(built[1])
    return [VideoRecord(video_id=video, video_path=finder.find(f"{video}.mp4"), duration=None, questions=questions)
            for video, questions in by_video.items()]


load = common.make_loader("videomme", _read, known=DURATIONS)


def _read_rows(root: Path) -> list[dict]:
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
    """The rows of a parquet file as dicts, list columns as Python lists.

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
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def _question(row: dict, where: str, issues: common.DataIssues) -> BenchmarkQuestion:
    options = common.clean_options(common.require(row, "options", where), where, issues, expected=4)
    gt_index = resolve_gt_index(common.require(row, "answer", where), options)
    if gt_index is None:
        raise UsageError(f"videomme: answer {row['answer']!r} names none of the options in {where}")
    duration = str(common.require(row, "duration", where))
    if duration not in DURATIONS:
        raise UsageError(f"videomme: expected duration short/medium/long in {where}, found {duration!r}")
    return BenchmarkQuestion(question=str(common.require(row, "question", where)), options=options,
                             answer=options[gt_index], gt_index=gt_index, t_s=None,
                             task=str(common.require(row, "task_type", where)), raw=row,
                             qid=f"videomme-{row.get('question_id', where)}",
                             meta={"kind": KIND_MC, "groups": (duration,), "duration": duration,
                                   "domain": row.get("domain")})


class VideoMme(Benchmark):
    """Video-MME's prompt, parser and leaderboard."""

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        """The README prompt, options as "A. ..." lines."""
        return Prompt(TEMPLATE.format(question=question.question, options="\n".join(letter_options(question.options))))

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """Answer prefixes removed (see PREFIXES for the official list's quirk), then the first capital A-D."""
        return letter_after_prefixes(reply, options, PREFIXES, "ABCD")

    def categories(self, question: BenchmarkQuestion) -> Iterable[str]:
        return (question.meta.get("duration", "other"),)

    def add_metrics(self, summary: dict, labelled: Sequence[BenchmarkQuestion], results: Mapping[str, Mapping],
                    key: str) -> None:
        """`leaderboard`, as eval_your_results.py scores it: correct / replies with an extracted letter (None
        where none had one; the script prints 0.0), "overall" its "entire dataset" line, and "per_duration"."""
        parsed = "parsed_official" if key == "official" else "parsed_strict"

        def extracted(qs: Sequence[BenchmarkQuestion]) -> dict:
            counts = tally([q for q in qs if results.get(q.qid, {}).get(parsed) is not None], results, key)
            return {"extracted": counts["expected"], "correct": counts["correct"], "accuracy": counts["accuracy"]}

        buckets: dict[str, list[BenchmarkQuestion]] = {d: [] for d in DURATIONS}  # the script's order
        for q in labelled:
            buckets.setdefault(q.meta.get("duration", "other"), []).append(q)
        entire = extracted(labelled)
        summary["leaderboard"] = {"overall": entire["accuracy"], "extracted": entire["extracted"],
                                  "correct": entire["correct"],
                                  "per_duration": {bucket: extracted(qs) for bucket, qs in buckets.items() if qs}}
        summary["official_definition"] = "leaderboard"


BENCHMARKS = {"videomme": VideoMme(load, OFFLINE, "videomme")}
