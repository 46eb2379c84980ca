"""OVO-Bench (streaming): backward tracing, real-time perception, forward responding.

Source format: `ovo_bench_new.json` from JoeLeelyf/OVO-Bench (also vendored, split by category,
in lmms-eval `lmms_eval/tasks/ovobench/ovobench_data/*/data.json`), directly in the data root or
under `data/`; videos under `src_videos/` (the official `--video_dir`). A flat JSON array; one
entry per query, with `id`, `task`, `video` (relative to the source-video folder):

* backward (EPM, ASI, HLD) and real-time (STU, OJR, ATR, ACR, OCR, FPD) entries carry
  `question`, `options`, `gt` (0-based index of the correct option), `realtime` (seconds,
  int or float) and `answer`. The official scorer uses `gt` only; `answer` sometimes
  paraphrases the option (ACR: "He is inflating the tire with the tool." for option
  "He is inflating a tire."), so it is kept in `raw` and never used as the reference.
* forward entries carry `test_info`, a list of probes each with its own `realtime`:
  REC (`activity`; probe `count`), SSR (probe `step` and `type`: 1 = performing it now),
  CRR (`question`; probe `type`: 1 = enough evidence so far). Probes are not sorted in the
  file (SSR lists them step by step); each probe becomes one question at its own time.

All entries on one source video form one stream; questions are ordered by time. `tasks`: task
codes ("EPM", "REC", ...) or categories ("backward", "realtime", "forward").

Prompts: JoeLeelyf/OVO-Bench constant.py (BR/REC/SSR/CRR_PROMPT_TEMPLATE), used by
utils/OVOBench.py build_prompt; also lmms-eval tasks/ovobench/constant.py. Trailing spaces are
the originals'. Scoring: OVOBenchScore credits a reply that *contains* the correct letter; a
category (backward / realtime / forward) is the mean of its tasks, overall the mean of categories.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import STREAMING, Benchmark, Prompt, mean
from ..records import (
    KIND_COUNT,
    KIND_MC,
    KIND_YESNO,
    LETTERS,
    BenchmarkQuestion,
    VideoRecord,
    is_option_index,
    letter_options,
    parse_timestamp,
)

BACKWARD_TASKS = ("EPM", "ASI", "HLD")
REALTIME_TASKS = ("STU", "OJR", "ATR", "ACR", "OCR", "FPD")
FORWARD_TASKS = ("REC", "SSR", "CRR")
CATEGORIES = {"backward": BACKWARD_TASKS, "realtime": REALTIME_TASKS, "forward": FORWARD_TASKS}
CATEGORY_OF = {task: cat for cat, tasks in CATEGORIES.items() for task in tasks}
KNOWN = (*CATEGORY_OF, *CATEGORIES)

# Yes/No probes are scored against these option texts; index = the probe's `type`.
YES_NO = ["No", "Yes"]

ANNOTATION_CANDIDATES = ("ovo_bench_new.json", "data/ovo_bench_new.json")
VIDEO_FOLDERS = ("src_videos", "data/src_videos", "videos", ".")

MC_TEMPLATE = (
    "\nQuestion: {question}\nOptions:\n{options}\n\n"
    "Respond only with the letter corresponding to your chosen option (e.g., A, B, C). \n"
    "Do not include any additional text or explanation in your response.\n"
)
REC_TEMPLATE = (
    "\nYou're watching a video in which people may perform a certain type of action repetively. \n"
    "The person performing this kind of action are referred to as 'they' in the following statement.\n"
    "You're task is to count how many times have different people in the video perform this kind of action in total.\n"
    "One complete motion counts as one. \n"
    "Now, answer the following question: {question}\n"
    "Provide your answer as a single number (e.g., 0, 1, 2, 3\u2026) indicating the total count.\n"
    "Do not include any additional text or explanation in your response.\n"
)
SSR_TEMPLATE = (
    "\nYou're watching a tutorial video which contain a sequential of steps. \n"
    "The following is one step from the whole procedures: \n{question}\n"
    "Your task is to determine if the man or woman in the video is currently performing this step.\n"
    "Answer only with \u201cYes\u201d or \u201cNo\u201d.\n"
    "Do not include any additional text or explanation in your response.\n"
)
CRR_TEMPLATE = (
    "\nYou're responsible of answering questions based on the video content. \n"
    "The following question are relevant to the latest frames, i.e. the end of the video.\n{question}\n"
    "Decide whether existing visual content, especially latest frames, i.e. frames that near the end of the "
    "video, provide enough information for answering the question.\n"
    "Answer only with \u201cYes\u201d or \u201cNo\u201d.\n"
    "Do not include any additional text or explanation in your response.\n"
)


def _read(root: Path, tasks: str | Iterable[str] | None, issues: common.DataIssues) -> list[VideoRecord]:
    common.check_names(common.normalize_tasks(tasks), KNOWN)
    path = common.find_file(root, ANNOTATION_CANDIDATES, "OVO-Bench annotations ovo_bench_new.json")
    by_video: dict[str, list[BenchmarkQuestion]] = {}
    for number, entry in enumerate(common.read_json(path, expect=list)):
        where = f"{path.name} entry {number} (id {entry.get('id') if isinstance(entry, dict) else None})"
        built = issues.guard(where, lambda: (str(common.require(entry, "video", where)),
                                             _questions(entry, where, issues)))
        if built is not None:
            by_video.setdefault(built[0], []).extend(built[1])
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    return [VideoRecord(video_id=video, video_path=finder.find(video), duration=None, questions=questions)
            for video, questions in by_video.items()]


load = common.make_loader("ovo-bench", _read, known=KNOWN)


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
    # The official scorer trusts `gt`; `answer` may paraphrase the option.
    t_s = parse_timestamp(common.require(entry, "realtime", where))
    return [BenchmarkQuestion(question=str(common.require(entry, "question", where)), options=options,
                              answer=options[gt], gt_index=gt, t_s=t_s, task=task, raw=entry, qid=qid,
                              meta={**meta, "kind": KIND_MC})]


def _probe(entry: dict, task: str, probe: dict, index: int, qid: str, meta: dict, where: str) -> BenchmarkQuestion:
    """One forward-task probe as a question asked at the probe's `realtime`."""
    where = f"{where} test_info[{index}]"
    t_s = parse_timestamp(common.require(probe, "realtime", where))
    meta = {**meta, "probe": index}
    if task == "REC":
        activity = str(common.require(entry, "activity", where))
        count = common.require(probe, "count", where)
        # The official prompt builds this question from the activity.
        return BenchmarkQuestion(question=f"How many times did they {activity}?", options=[], answer=str(count),
                                 gt_index=None, t_s=t_s, task=task, raw=entry, qid=qid,
                                 meta={**meta, "kind": KIND_COUNT})
    kind = common.require(probe, "type", where)
    if kind not in (0, 1) or isinstance(kind, bool):
        raise UsageError(f"expected 'type' 0 or 1 in {where}, found {kind!r}")
    text = common.require(probe, "step", where) if task == "SSR" else common.require(entry, "question", where)
    return BenchmarkQuestion(question=str(text), options=list(YES_NO), answer=YES_NO[kind], gt_index=kind, t_s=t_s,
                             task=task, raw=entry, qid=qid, meta={**meta, "kind": KIND_YESNO})


class OvoBench(Benchmark):
    """OVO-Bench's prompts, OVOBenchScore's verdicts and its macro average."""

    inclusive_ceil = True

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        """MC options as "A. x; B. y;" on one line; REC, SSR and CRR probes their own templates."""
        templates = {KIND_COUNT: REC_TEMPLATE, KIND_YESNO: SSR_TEMPLATE if question.task == "SSR" else CRR_TEMPLATE}
        if question.kind in templates:
            return Prompt(templates[question.kind].format(question=question.question))
        return Prompt(MC_TEMPLATE.format(question=question.question,
                                         options="; ".join(letter_options(question.options)) + ";"))

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """Yes/no probes: "Y"/"N", else the first of "Yes"/"No" found; otherwise the first option letter seen."""
        if list(options) == YES_NO:
            if reply in ("N", "Y"):
                return "NY".index(reply)
            found = [(reply.find(w), i) for i, w in enumerate(options) if w in reply]
        else:
            found = [(reply.find(LETTERS[i]), i) for i in range(len(options)) if LETTERS[i] in reply]
        return min(found)[1] if found else None

    def correct(self, reply: str, question: BenchmarkQuestion, variant: str | None = None) -> bool | None:
        """REC: every digit in the reply, joined, spells the count; yes/no: "Y"/"N" or the word in the
        reply; multiple choice: the reply contains the correct letter."""
        if question.kind == KIND_COUNT:
            return "".join(re.findall(r"\d+", reply)) == question.answer
        if question.kind == KIND_YESNO:
            return reply == question.answer[0] or question.answer in reply
        return None if question.gt_index is None else question.gt_letter in reply

    def categories(self, question: BenchmarkQuestion) -> Iterable[str]:
        return (CATEGORY_OF.get(question.task, "other"),)

    def add_metrics(self, summary: dict, labelled, results, key: str) -> None:
        """A category is the mean of its tasks' accuracies; overall the mean of categories."""
        for category, tally in summary["per_category"].items():
            tasks = [t for t in summary["per_task"] if CATEGORY_OF.get(t, "other") == category]
            tally["accuracy"] = mean(summary["per_task"][t]["accuracy"] for t in tasks)
            tally["tasks"] = sorted(tasks)
        summary["overall"] = mean(c["accuracy"] for c in summary["per_category"].values())


BENCHMARKS = {"ovo-bench": OvoBench(load, STREAMING, "ovo")}
ALIASES = {"ovo": "ovo-bench"}
