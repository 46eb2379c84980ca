"""LongVideoBench (offline): referring-reasoning questions over videos up to an hour.

Source format: longvideobench/LongVideoBench `lvb_val.json` (the Hugging Face dataset
`longvideobench/LongVideoBench`; read the same way by lmms-eval `tasks/longvideobench`). A
JSON array of questions with `id`, `video_id`, `video_path` (file name under `videos/`),
`question`, `candidates` (3 to 5 of them: the option count is not fixed), `correct_choice`
(0-based index), `duration` (seconds), `duration_group` (15 / 60 / 600 / 3600),
`question_category` (e.g. "S2E", "T3O"), plus subtitle fields kept in `raw`. The test split
(`lvb_test_wo_gt.json`) has no `correct_choice`; it loads with `answer=None`.

Questions on the same video form one record; `task` is the question category and the
duration group is a group label ("600"), so `tasks=["3600"]` selects the hour-long videos.

Prompt: lmms-eval tasks/longvideobench/utils.py longvideobench_doc_to_text with
longvideobench_val_v.yaml post_prompt. Parser: its parse_multi_choice_response. Metric: per
question category and per duration group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import LETTER_DIRECTLY, OFFLINE, Benchmark, Prompt, letter_after_prefixes
from ..records import KIND_MC, BenchmarkQuestion, VideoRecord, letter_options, normalize_options, resolve_gt_index

ANNOTATION_CANDIDATES = ("lvb_val.json", "LongVideoBench/lvb_val.json", "lvb_test_wo_gt.json")
VIDEO_FOLDERS = ("videos", "LongVideoBench/videos", ".")
DURATION_GROUPS = ("15", "60", "600", "3600")
PREFIXES = (
    "The best answer is", "The correct answer is", "The answer is", "The answer",
    "The best option is", "The correct option is", "Best answer:", "Best option:",
)


def _read(root: Path, tasks, issues: common.DataIssues) -> list[VideoRecord]:
    path = common.find_file(root, ANNOTATION_CANDIDATES, "LongVideoBench lvb_val.json")
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    by_video: dict[str, list[BenchmarkQuestion]] = {}
    paths: dict[str, str] = {}
    durations: dict[str, float | None] = {}
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
    return [VideoRecord(video_id=v, video_path=finder.find(paths[v]), duration=durations[v], questions=qs)
            for v, qs in by_video.items()]


load = common.make_loader("longvideobench", _read, known=DURATION_GROUPS)


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
    return BenchmarkQuestion(question=str(common.require(item, "question", where)), options=options,
                             answer=None if gt_index is None else options[gt_index], gt_index=gt_index, t_s=None,
                             task=str(common.require(item, "question_category", where)), raw=item,
                             qid=f"lvb-{item.get('id', where)}",
                             meta={"kind": KIND_MC, "groups": (group,) if group else (), "duration_group": group})


class LongVideoBench(Benchmark):
    """LongVideoBench's prompt, parser and per-duration-group accuracy."""

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        """The question, "A. ..." lines, then the letter instruction and its newline."""
        return Prompt(question.question + "\n" + "\n".join(letter_options(question.options)) + "\n"
                      + LETTER_DIRECTLY + "\n")

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """Answer prefixes removed, then the first capital A-E; the official code guesses at random when
        nothing is found, here that is None (counted wrong)."""
        return letter_after_prefixes(reply, options, PREFIXES, "ABCDE")

    def categories(self, question: BenchmarkQuestion) -> Iterable[str]:
        return (question.meta.get("duration_group", "other"),)


BENCHMARKS = {"longvideobench": LongVideoBench(load, OFFLINE, "longvideobench")}
ALIASES = {"lvb": "longvideobench"}
