"""EgoSchema (offline): 3-minute egocentric clips, five options per question.

Source format: egoschema/EgoSchema release files:

* `questions.json`: a JSON array of `{"q_uid", "google_drive_id", "question", "option 0",
  ..., "option 4"}` (some re-distributions key the same objects by `q_uid` instead; both are
  read).
* `subset_answers.json`: `{q_uid: <0-based index>}` for the 500-question public subset. The
  answers to the other ~4,500 questions are withheld (scored only by the official server), so
  those questions load with `answer=None` and metrics count them as unlabelled, not wrong.
* Videos: `videos/<q_uid>.mp4` (lmms-eval also accepts `.MP4`).

`tasks` selects "subset" (only questions with a public answer; the default when
`subset_answers.json` is present) or "full" (all questions, for a submission file).

Prompt: lmms-eval tasks/egoschema/utils.py egoschema_doc_to_text (options "A. ..." one per line,
then the letter instruction). Parser: lmms-eval egoschema_process_results_generation, since late
2024 the MMMU multiple-choice parse; `--parser-variant legacy` is the mid-2024 exact match.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hermes.errors import UsageError

from .. import common
from ..benchmark import LETTER_DIRECTLY, OFFLINE, Benchmark, Prompt, option_index
from ..records import KIND_MC, LETTERS, BenchmarkQuestion, VideoRecord, is_option_index, letter_options

QUESTIONS_CANDIDATES = ("questions.json", "EgoSchema/questions.json")
ANSWERS_CANDIDATES = ("subset_answers.json", "EgoSchema/subset_answers.json")
VIDEO_FOLDERS = ("videos", "good_clips_git", ".")
SELECTIONS = ("subset", "full")
NUM_OPTIONS = 5


def _read(root: Path, tasks, issues: common.DataIssues) -> list[VideoRecord]:
    wanted = common.check_names(common.normalize_tasks(tasks), SELECTIONS, kind="EgoSchema selection")
    questions_path = common.find_file(root, QUESTIONS_CANDIDATES, "EgoSchema questions.json")
    answers_path = common.first_file(root, ANSWERS_CANDIDATES)
    answers = common.read_json(answers_path, expect=dict) if answers_path else {}
    if wanted is None:
        selection = "subset" if answers_path else "full"
    else:
        selection = "full" if "full" in wanted else "subset"
    if selection == "subset" and answers_path is None:
        raise UsageError(f"egoschema: expected {root / ANSWERS_CANDIDATES[0]} for the subset, found nothing")
    entries = common.read_json(questions_path)
    if isinstance(entries, dict):
        entries = [{"q_uid": uid, **entry} for uid, entry in entries.items()]
    finder = common.VideoFinder(root, VIDEO_FOLDERS)
    records = []
    for number, entry in enumerate(entries):
        where = f"{questions_path.name} entry {number}"
        uid = issues.guard(where, lambda: str(common.require(entry, "q_uid", where)))
        if uid is None or (selection == "subset" and uid not in answers):
            continue
        question = issues.guard(f"{where} (q_uid {uid})",
                                lambda: _question(entry, uid, answers.get(uid), where, issues))
        if question is not None:
            records.append(VideoRecord(video_id=uid, video_path=finder.find(f"{uid}.mp4"), duration=None,
                                       questions=[question]))
    return records


load = common.make_loader("egoschema", _read, select=False)  # `tasks` is the selection


def _question(entry: dict, uid: str, answer, where: str, issues: common.DataIssues) -> BenchmarkQuestion:
    """One EgoSchema question; `answer` is the public index or None."""
    options = common.clean_options([common.require(entry, f"option {i}", where) for i in range(NUM_OPTIONS)],
                                   where, issues)
    if answer is not None and not is_option_index(answer, NUM_OPTIONS):
        raise UsageError(f"egoschema: answer for {uid} must be 0-{NUM_OPTIONS - 1}, found {answer!r}")
    return BenchmarkQuestion(question=str(common.require(entry, "question", where)), options=options,
                             answer=None if answer is None else options[answer], gt_index=answer, t_s=None,
                             task="egoschema", raw=entry, qid=f"egoschema-{uid}",
                             meta={"kind": KIND_MC, "groups": ("subset",) if answer is not None else ("full",)})


class EgoSchema(Benchmark):
    """EgoSchema's prompt and lmms-eval's parsers (current and legacy)."""

    parser_variants = ("current", "legacy")

    def prompt(self, question: BenchmarkQuestion, previous: Sequence[BenchmarkQuestion], stage: str) -> Prompt:
        return Prompt(question.question + "\n" + "\n".join(letter_options(question.options)) + "\n" + LETTER_DIRECTLY)

    def parse(self, reply: str, options: Sequence[str], variant: str | None = None) -> int | None:
        """The MMMU parse ("(B)", "B ", "B." anywhere; else, for replies over five words, an option's
        text; several candidates: the one whose last occurrence comes first); the official code guesses
        at random when nothing is found, here that is None. "legacy": the reply equals an option
        ("A. text."), its text, or its letter."""
        return _legacy(reply.strip(), options) if variant == "legacy" else _mmmu(reply, options)


def _legacy(pred: str, options: Sequence[str]) -> int | None:
    """lmms-eval's mid-2024 EgoSchema matching: full "A. text." string, then text, then letter."""
    full = [f"{LETTERS[i]}. {o}" if o.endswith(".") else f"{LETTERS[i]}. {o}." for i, o in enumerate(options)]
    for candidates in (full, [f.split(". ", 1)[1] for f in full]):
        if pred in candidates:
            return candidates.index(pred)
    return next((i for i in range(len(options)) if pred in (LETTERS[i], LETTERS[i] + ".")), None)


def _mmmu(response: str, options: Sequence[str]) -> int | None:
    """lmms-eval's parse_multi_choice_response (after MMMU's eval_utils), step for step."""
    letters = LETTERS[: len(options)]
    for char in (",", ".", "!", "?", ";", ":", "'"):
        response = response.strip(char)
    response = f" {response} "  # spaces avoid partial matches
    candidates = [f"({c})" for c in letters if f"({c})" in response]
    candidates += [f"{c} " for c in letters if f"{c} " in response]
    candidates += [f"{c}." for c in letters if f"{c}." in response]
    by_letter = True
    if not candidates and len(response.split()) > 5:
        candidates = [c for c, text in zip(letters, options) if text.strip().lower() in response.lower()]
        by_letter = False
    if not candidates:
        return None  # the official code picks a letter at random here
    if len(candidates) > 1:
        ends = [response.rfind(c) if by_letter else response.lower().rfind(options[letters.index(c)].strip().lower())
                for c in candidates]
        chosen = candidates[ends.index(min(ends))]
    else:
        chosen = candidates[0]
    return option_index(chosen.replace("(", "").replace(")", "").replace(".", "").strip(), options)


BENCHMARKS = {"egoschema": EgoSchema(load, OFFLINE)}
