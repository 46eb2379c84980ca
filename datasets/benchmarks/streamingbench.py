"""StreamingBench (streaming): real-time, omni-source, sequential QA and proactive output.

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
`<subset>/videos/` (the official README unzips each subset into `data/<subset>/`). `tasks`:
subsets ("real", "omni", "sqa", "proactive") and/or task types ("Object Perception", ...).

Prompts: THUNLP-MT/StreamingBench src/benchmark/StreamingBench.py (PROMPT_TEMPLATE plus
"\n\nThe best option is:"), StreamingBenchSQA.py, StreamingBenchProactive.py. Official protocol
("main" setting): each question answered from a fresh session over the last `CONTEXT_S` seconds.
Scoring (count.py): the reply's first character; proactive output also within ±2 s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import STREAMING, Benchmark, Prompt, option_index
from ..records import (
    KIND_MC,
    KIND_PROACTIVE,
    BenchmarkQuestion,
    VideoRecord,
    letter_options,
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
# The official main setting: seconds of video before the question each answer sees.
CONTEXT_S = 60.0

MC_TEMPLATE = (
    "You are an advanced video question-answering AI assistant. You have been provided with some frames from "
    "the video and a multiple-choice question related to the video. Your task is to carefully analyze the video "
    "and provide the best answer to question, choosing from the four options provided. Respond with only the "
    "letter (A, B, C, or D) of the correct option.\n\nQuestion: {question}\n\nOptions:\n{options}"
    "\n\nThe best option is:"
)
SQA_TEMPLATE = (
    "You are an advanced video question-answering AI assistant. You have been provided with a video and a "
    "multiple-choice question related to the video. Your task is to carefully analyze the video and the provided "
    "context to answer the question, choosing from the four options provided. Respond with only the letter "
    "(A, B, C, or D) of the correct option.\n\n{context}\n\n"
    "Here is the question. Answer it and don't confuse it with the previous conversation.\n"
    "Question: {question}\n\nOptions:\n{options}\n\nThe best option is:"
)
SQA_CONTEXT = (
    "Here are the contextual information related to the video. Please answer the questions based on the "
    "contextual information: "
)
SQA_TURN = (
    "At timestamp {stamp}, the following question and answer occurred: Question: {question}; "
    "Options: {options}; Answer: {answer}; "
)
PROACTIVE_TEMPLATE = (
    "You are an advanced image question-answering AI assistant. You have been provided with images and a "
    "question related to the images. Your task is to carefully analyze the images and provide the answer to the "
    "question. You need to carefully confirm whether the images content meet the conditions of the question, and "
    "then output the correct content.\n\nQuestion: {question}\n\nThe answer is:\n"
)
PROACTIVE_POLL = '{question} Is it the right time to output "{output}"? You can only answer yes or no.'


def _read(root: Path, tasks: str | Iterable[str] | None, issues: common.DataIssues) -> list[VideoRecord]:
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
    return records


load = common.make_loader("streamingbench", _read, known=SUBSET_FILES)


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
        gt_time_s = official_seconds(common.require(entry, "ground_truth_time_stamp", where), where,
                                     "ground_truth_time_stamp", issues)
        return BenchmarkQuestion(question=str(common.require(entry, "question", where)), options=[],
                                 answer=str(common.require(entry, "ground_truth_output", where)), gt_index=None,
                                 t_s=t_s, task=task, raw=entry, qid=qid,
                                 meta={**meta, "kind": KIND_PROACTIVE, "gt_time_s": gt_time_s})
    options = common.clean_options(common.require(entry, "options", where), where, issues, expected=4)
    gt_index = resolve_gt_index(common.require(entry, "answer", where), options)
    if gt_index is None:
        raise UsageError(f"answer {entry['answer']!r} names none of the {len(options)} options in {where}")
    return BenchmarkQuestion(question=str(common.require(entry, "question", where)), options=options,
                             answer=options[gt_index], gt_index=gt_index, t_s=t_s, task=task, raw=entry, qid=qid,
                             meta={**meta, "kind": KIND_MC})


def _shown_options(q: BenchmarkQuestion) -> list[str]:
    """Options as the official script shows them: as written when they start with "A.",
    otherwise (SQA) with "A. " ... added; only the first four either way, since the official
    template has four option slots (`PROMPT_TEMPLATE.format(question, *options)` drops the rest,
    which in the real files are wrapped option texts split into extra items)."""
    raw = [str(o) for o in q.raw.get("options", [])]
    return (raw if raw and raw[0].startswith("A.") else letter_options(q.options))[:4]


class StreamingBench(Benchmark):
    """StreamingBench's prompts (real/omni, SQA with earlier Q&A as context, proactive) and count.py's rules."""

    context_s = CONTEXT_S

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        if question.kind == KIND_PROACTIVE:
            if stage == "poll":
                poll = PROACTIVE_POLL.format(question=question.question, output=question.answer)
                return Prompt(PROACTIVE_TEMPLATE.format(question=poll))
            return Prompt(PROACTIVE_TEMPLATE.format(question=question.question))
        options = "\n".join(_shown_options(question))
        if question.meta.get("subset") != "sqa":
            return Prompt(MC_TEMPLATE.format(question=question.question, options=options))
        context = ""
        for p in (p for p in previous if p.meta.get("subset") == "sqa"):
            context = context or SQA_CONTEXT
            context += SQA_TURN.format(stamp=p.raw.get("time_stamp", ""), question=p.question,
                                       options=", ".join(_shown_options(p)), answer=p.gt_letter)
        return Prompt(SQA_TEMPLATE.format(context=context, question=question.question, options=options))

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """count.py: the reply's first character."""
        return option_index(reply[:1], options)

    def correct(self, reply: str, question: BenchmarkQuestion, variant: str | None = None) -> bool | None:
        """Proactive output: the expected text in the reply (timing: `on_time`); otherwise the first character."""
        if question.kind == KIND_PROACTIVE:
            return question.answer in reply
        return super().correct(reply, question, variant)

    def on_time(self, question: BenchmarkQuestion, answered_at_s: float | None) -> bool:
        """count.py: within PROACTIVE_TOLERANCE_S of the ground-truth time."""
        gt_time = question.meta.get("gt_time_s")
        return (answered_at_s is not None and gt_time is not None
                and abs(answered_at_s - gt_time) <= PROACTIVE_TOLERANCE_S)

    def categories(self, question: BenchmarkQuestion) -> Iterable[str]:
        return (question.meta.get("subset", "other"),)

    def add_metrics(self, summary: dict, labelled, results, key: str) -> None:
        """Proactive output also reports the share answered on time (count.py's time_accuracy); missing
        samples count as late."""
        for task, tally in summary["per_task"].items():
            proactive = [q for q in labelled if q.task == task and q.kind == KIND_PROACTIVE]
            if proactive:
                on_time = sum(1 for q in proactive if results.get(q.qid, {}).get("time_correct"))
                tally["time_accuracy"] = on_time / len(proactive)


BENCHMARKS = {"streamingbench": StreamingBench(load, STREAMING, "streamingbench")}
ALIASES = {"streaming": "streamingbench"}
