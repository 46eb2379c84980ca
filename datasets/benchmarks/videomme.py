"""Video-MME (offline): 900 videos in three duration buckets, three questions each.

Source format: the Hugging Face dataset `lmms-lab/Video-MME` (MME-Benchmarks/Video-MME):
`videomme/test-00000-of-00001.parquet` with one row per question and the columns `video_id`
("001"), `duration` ("short" / "medium" / "long"), `domain`, `sub_category`, `url`, `videoID`
(the YouTube id that names the file), `question_id` ("001-1"), `task_type`, `question`,
`options` (["A. ...", "B. ...", "C. ...", "D. ..."]) and `answer` (a letter). Videos are
`data/<videoID>.mp4` -- except that the archive holds some as `.MP4` or `.mkv` (lmms-eval's
`videomme_doc_to_visual` tries those in turn); they are found here by stem, any case.

Reading parquet needs `pyarrow` (or `pandas` with a parquet engine); it is imported only when
a parquet file is read. The same rows exported as JSON / JSON lines (what `datasets`'
`to_json` writes: `videomme.json` or `videomme.jsonl`) are read without it. `tasks`: task types
("Counting Problem", ...) and/or duration buckets ("short", "medium", "long").

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
        """`leaderboard`: as eval_your_results.py scores it, only replies with an extracted letter count.

        {"overall", "extracted", "correct", "per_duration": {bucket: {"extracted", "correct", "accuracy"}}}:
        accuracies are correct / extracted, None where no reply had a letter (the script prints 0.0
        there); "overall" is the script's "entire dataset" line, over every selected bucket.
        """
        parsed = "parsed_official" if key == "official" else "parsed_strict"

        def tally(qs: Sequence[BenchmarkQuestion]) -> dict:
            extracted = [results[q.qid] for q in qs if q.qid in results and results[q.qid].get(parsed) is not None]
            correct = sum(1 for r in extracted if r.get(key))
            return {"extracted": len(extracted), "correct": correct,
                    "accuracy": correct / len(extracted) if extracted else None}

        buckets: dict[str, list[BenchmarkQuestion]] = {d: [] for d in DURATIONS}  # the script's order
        for q in labelled:
            buckets.setdefault(q.meta.get("duration", "other"), []).append(q)
        entire = tally(labelled)
        summary["leaderboard"] = {"overall": entire["accuracy"], "extracted": entire["extracted"],
                                  "correct": entire["correct"],
                                  "per_duration": {bucket: tally(qs) for bucket, qs in buckets.items() if qs}}
        summary["official_definition"] = "leaderboard"


BENCHMARKS = {"videomme": VideoMme(load, OFFLINE, "videomme")}
