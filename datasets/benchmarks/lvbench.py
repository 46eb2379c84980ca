"""LVBench (offline): extreme-long videos (about an hour and more) from YouTube.

Source format: THUDM/LVBench `data/video_info.meta.jsonl` (Hugging Face `THUDM/LVBench`),
scored by `lvbench/metrics/compute_accuracy.py`. One JSON object per line and video:

    {"key": "<YouTube id>", "type": "cartoon", "video_info": {"duration_minutes": ...},
     "qa": [{"uid": "55",
             "question": "What year appears ...?\\n(A) 1636\\n(B) 1366\\n(C) 1363\\n(D) 1633",
             "answer": "D",
             "question_type": ["key information retrieval"],
             "time_reference": "00:15-00:19"}]}

Odd cases: the options are inline in the question text, one "(A) ..." line each (split off
here); `question_type` is a list, and the official scorer counts a question toward *every*
type it lists, so all of them are group labels (`meta["question_types"]`); `time_reference`
is a "MM:SS-MM:SS" span (parsed to seconds in `meta["time_reference_s"]`). Videos are
`videos/<key>.mp4` (the official download script's output).

Junk in the real file: some `time_reference` spans end before they start ("116:50-108:00") or
read "08:17-None". The field is metadata (the official scorer never reads it), so such a
question is kept with `time_reference_s` None and the value flagged, never fatal. `tasks`:
question types ("key information retrieval", ...); a question matches when any of its types is
requested.

The repository publishes no prompt: the question with its inline "(A) ..." options exactly as
distributed, plus the letter instruction lmms-eval's LongVideoBench uses (not an official LVBench
text). Parser: answer_util.polish_answer. Metric: per question type, each type a question lists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import LETTER_DIRECTLY, OFFLINE, Benchmark, Prompt, option_index
from ..records import KIND_MC, LETTERS, BenchmarkQuestion, VideoRecord, parse_span, resolve_gt_index

ANNOTATION_CANDIDATES = ("video_info.meta.jsonl", "data/video_info.meta.jsonl", "LVBench/video_info.meta.jsonl")
VIDEO_FOLDERS = ("videos", "scripts/videos", "all_videos", ".")

_INLINE_OPTION = re.compile(r"^\s*\(([A-Z])\)\s*(.*)$")


def split_inline_options(text: str) -> tuple[str, list[str]]:
    """Split a question that lists its options inline, one per line ("(A) ...\\n(B) ...").

    Args:
        text: Question text with options on the following lines.

    Returns:
        (question, options): the lines before the first option, and the option texts.

    Raises:
        UsageError: If no "(A)" line is found or the letters are out of order.
    """
    lines = str(text).split("\n")
    first = next((i for i, line in enumerate(lines) if _INLINE_OPTION.match(line)), None)
    if first is None:
        raise UsageError(f"expected options as '(A) ...' lines in the question, found {text!r}")
    options: list[str] = []
    for line in lines[first:]:
        match = _INLINE_OPTION.match(line)
        if match:
            if match.group(1) != LETTERS[len(options)]:
                raise UsageError(f"expected option ({LETTERS[len(options)]}) in {text!r}")
            options.append(match.group(2).strip())
        elif line.strip() and options:
            # A wrapped option: the continuation belongs to the previous option.
            options[-1] = f"{options[-1]} {line.strip()}"
    return "\n".join(lines[:first]).strip(), options




def _read(root: Path, tasks, issues: common.DataIssues) -> list[VideoRecord]:
    path = common.find_file(root, ANNOTATION_CANDIDATES, "LVBench video_info.meta.jsonl")
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    records = []
    for number, video in enumerate(common.read_jsonl(path)):
        where = f"{path.name} line {number + 1}"
        entry = issues.guard(where, lambda: (str(common.require(video, "key", where)),
                                             common.require(video, "qa", where)))
        if entry is None:
            continue
        key, qas = entry
        minutes = common.optional_number((video.get("video_info") or {}).get("duration_minutes"))
        questions = [issues.guard(f"{where} (key {key}) qa {i} uid {qa.get('uid') if isinstance(qa, dict) else None}",
                                  lambda qa=qa, i=i: _question(qa, key, f"{where} qa {i}", issues))
                     for i, qa in enumerate(qas)]
        records.append(
            VideoRecord(
                video_id=key,
                video_path=finder.find(f"{key}.mp4"),
                duration=None if minutes is None else minutes * 60,
                questions=[q for q in questions if q is not None],
            )
        )
    return [r for r in records if r.questions]


load = common.make_loader("lvbench", _read)


def _question(qa: dict, key: str, where: str, issues: common.DataIssues) -> BenchmarkQuestion:
    """One LVBench question, options split out of its text."""
    question, options = split_inline_options(str(common.require(qa, "question", where)))
    gt_index = resolve_gt_index(common.require(qa, "answer", where), options)
    if gt_index is None:
        raise UsageError(f"lvbench: answer {qa['answer']!r} names none of the {len(options)} options in {where}")
    common.clean_options(options, where, issues, expected=4)
    types = common.require(qa, "question_type", where)
    types = [types] if isinstance(types, str) else [str(t) for t in types]
    if not types:
        raise UsageError(f"lvbench: expected at least one question_type in {where}")
    meta = {"kind": KIND_MC, "groups": tuple(types[1:]), "question_types": types}
    if qa.get("time_reference"):
        meta["time_reference_s"] = issues.metadata(f"{where} uid {qa.get('uid')}", "time_reference",
                                                   qa["time_reference"], parse_span)
    return BenchmarkQuestion(question=question, options=options, answer=options[gt_index], gt_index=gt_index, t_s=None,
                             task=types[0], raw=qa, qid=f"lvbench-{qa.get('uid', key)}", meta=meta)


class LvBench(Benchmark):
    """LVBench's prompt, polish_answer and per-type accuracy."""

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        return Prompt(str(question.raw.get("question", question.question)) + "\n" + LETTER_DIRECTLY)

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """polish_answer: text before the first ")", after a "(", first word, first character."""
        answer = reply.strip().split(")")[0].strip()
        if "(" in answer:
            answer = answer.split("(")[1].strip()
        return option_index(answer.split(" ")[0][:1], options)

    def categories(self, question: BenchmarkQuestion) -> Iterable[str]:
        """compute_accuracy.py: a question counts toward every type it lists."""
        return question.meta.get("question_types", (question.task,))


BENCHMARKS = {"lvbench": LvBench(load, OFFLINE, "lvbench")}
