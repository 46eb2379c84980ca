"""MLVU dev set (offline): long videos, seven multiple-choice and two generation tasks.

Source format: JUNJIE99/MLVU (`videochat2/choice_bench.py`, `open_bench.py`) over the
Hugging Face dataset `MLVU/MVLU`: one JSON array per task, `json/<n>_<task>.json`, of
`{"video", "duration", "question", "candidates", "answer", "question_type"}` where `answer`
is the correct candidate's *text*. Videos live in `video/<n>_<task>/<video>`: the folder is
the JSON file's stem, and the same file name occurs in several folders (with different
content), so a video is always looked up in its own task's folder first.

Odd cases handled: a few items list the correct text twice among the candidates; the
official template (`choice_bench.py` `qa_template`: a loop over the candidates without a
break) takes the *last* match as gold, and so does this loader, flagging the question
(`meta["ambiguous_gold"]` and the load summary). The generation tasks (8_sub_scene, 9_summary) have no
candidates; they load as open-ended questions only when asked for by name, since the
standard M-Avg score covers the seven multiple-choice tasks. `tasks`: task names ("plotQA",
"count", ... or "summary") or file stems ("1_plotQA"); None keeps the seven multiple-choice tasks
present.

Prompt: choice_bench.py (MVBench's qa_template and "Best Option: (" answer prompt). Parser:
check_ans. Metric: per task, overall micro, and M-Avg (the mean of the task accuracies).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import OFFLINE, Benchmark, Prompt, best_option_prompt, mean, option_index
from ..records import KIND_MC, KIND_OPEN, BenchmarkQuestion, VideoRecord, resolve_gt_index

MC_TASKS = {
    "plotQA": "1_plotQA",
    "needle": "2_needle",
    "ego": "3_ego",
    "count": "4_count",
    "order": "5_order",
    "anomaly_reco": "6_anomaly_reco",
    "topic_reasoning": "7_topic_reasoning",
}
GENERATION_TASKS = {"sub_scene": "8_sub_scene", "summary": "9_summary"}
ALL_TASKS = {**MC_TASKS, **GENERATION_TASKS}
# File stems ("1_plotQA") are accepted as task names too.
TASK_BY_STEM = {stem: name for name, stem in ALL_TASKS.items()}
JSON_FOLDERS = ("json", "MLVU/json")
TASK_FILES = {name: tuple(f"{folder}/{stem}.json" for folder in JSON_FOLDERS) for name, stem in ALL_TASKS.items()}
VIDEO_FOLDERS = ("video", "MLVU/video")

SYSTEM = (
    "Carefully watch this video and pay attention to every detail. Based on your observations, select the best "
    "option that accurately addresses the question.\n"
)
ANSWER_PREFIX = "Best Option: ("  # capital O and a space, unlike MVBench's


def _read(root: Path, tasks, issues: common.DataIssues) -> list[VideoRecord]:
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    records: list[VideoRecord] = []
    for name, path in common.task_files(root, "mlvu", tasks, TASK_FILES, TASK_BY_STEM, default=MC_TASKS):
        stem = ALL_TASKS[name]
        folders = [root / f / stem for f in VIDEO_FOLDERS]
        by_video: dict[str, list[BenchmarkQuestion]] = {}
        items = common.read_json(path, expect=list)
        for number, item in enumerate(items):
            where = f"{path.name} item {number}"
            built = issues.guard(where, lambda: (str(common.require(item, "video", where)),
                                                 _question(item, name, f"mlvu-{stem}-{number}", where, issues)))
            if built is not None:
                by_video.setdefault(built[0], []).append(built[1])
        for video, questions in by_video.items():
            records.append(
                VideoRecord(
                    video_id=f"{stem}/{video}",
                    video_path=finder.find(video, extra_folders=folders),
                    duration=common.optional_number(questions[0].raw.get("duration")),
                    questions=questions,
                )
            )
    if not records:
        raise UsageError(f"mlvu: expected task files like {root / 'json' / '1_plotQA.json'}, found none")
    return records


load = common.make_loader("mlvu", _read, select=False)


def _question(item: dict, task: str, qid: str, where: str, issues: common.DataIssues) -> BenchmarkQuestion:
    """One MLVU item; multiple choice when it has candidates, open-ended otherwise."""
    question = str(common.require(item, "question", where))
    answer = common.require(item, "answer", where)
    if task in GENERATION_TASKS or not item.get("candidates"):
        return BenchmarkQuestion(question, [], str(answer), None, None, task, item, qid, {"kind": KIND_OPEN})
    options = common.clean_options(item["candidates"], where, issues)
    # The official template compares the raw candidate with the answer in a loop without a
    # break: the last equal candidate is gold.
    raw = [str(c) for c in item["candidates"]]
    matches = [i for i, c in enumerate(raw) if c == str(answer)]
    gt_index = matches[-1] if matches and len(raw) == len(options) else resolve_gt_index(answer, options,
                                                                                        prefer_text=True)
    meta = {"kind": KIND_MC, "ambiguous_gold": len(matches) > 1}
    if len(matches) > 1:
        issues.flag(where, "candidates", answer, f"the answer is listed {len(matches)} times; the last is gold, "
                                                 "as the official template takes it")
    if gt_index is None:
        # Scoring needs a reference: excluded from the denominator, with the reason.
        raise UsageError(f"mlvu: answer {answer!r} is none of the candidates in {where}")
    return BenchmarkQuestion(question=question, options=options,
                             answer=options[gt_index], gt_index=gt_index, t_s=None,
                             task=task, raw=item, qid=qid, meta=meta)


class Mlvu(Benchmark):
    """MLVU's prompt, check_ans and M-Avg."""

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        return best_option_prompt(question, SYSTEM, ANSWER_PREFIX)

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """check_ans: the character just before the reply's first ")" ("B) cat" and "(B) cat" -> B);
        without a ")" the whole reply must be the letter (the reply is not stripped)."""
        return option_index(reply[reply.index(")") - 1: reply.index(")")] if ")" in reply else reply, options)

    def add_metrics(self, summary: dict, labelled, results, key: str) -> None:
        summary["m_avg"] = mean(t["accuracy"] for t in summary["per_task"].values())


BENCHMARKS = {"mlvu": Mlvu(load, OFFLINE, "mlvu")}
ALIASES = {"mlvudev": "mlvu"}
