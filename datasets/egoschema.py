"""EgoSchema loader (offline): 3-minute egocentric clips, five options per question.

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
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from hermes.errors import UsageError

from . import common
from .records import KIND_MC, BenchmarkQuestion, VideoRecord, is_option_index

QUESTIONS_CANDIDATES = ("questions.json", "EgoSchema/questions.json")
ANSWERS_CANDIDATES = ("subset_answers.json", "EgoSchema/subset_answers.json")
VIDEO_FOLDERS = ("videos", "good_clips_git", ".")
SELECTIONS = ("subset", "full")
NUM_OPTIONS = 5


def load(
    data_root: str | os.PathLike,
    tasks: str | Iterable[str] | None = None,
    limit: int | None = None,
) -> list[VideoRecord]:
    """Load EgoSchema, one VideoRecord per question (each clip has one question).

    Args:
        data_root: Folder holding `questions.json`, optionally `subset_answers.json`, and
            `videos/`.
        tasks: ["subset"] or ["full"]; None means "subset" when answers are present.
        limit: Keep at most this many records.

    Returns:
        The records in `questions.json` order.

    Raises:
        UsageError: Missing questions file, unknown selection, malformed entries, or
            "subset" requested without `subset_answers.json`.
        SourceError: No selected video exists under the data root.
    """
    root = common.check_root(data_root, "egoschema")
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
    issues = common.DataIssues()
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
    return common.finish(records, "egoschema", None, limit, issues=issues)


def _question(entry: dict, uid: str, answer, where: str, issues: common.DataIssues) -> BenchmarkQuestion:
    """One EgoSchema question; `answer` is the public index or None."""
    options = common.clean_options([common.require(entry, f"option {i}", where) for i in range(NUM_OPTIONS)],
                                   where, issues)
    if answer is not None and not is_option_index(answer, NUM_OPTIONS):
        raise UsageError(f"egoschema: answer for {uid} must be 0-{NUM_OPTIONS - 1}, found {answer!r}")
    return BenchmarkQuestion(
        question=str(common.require(entry, "question", where)),
        options=options,
        answer=None if answer is None else options[answer],
        gt_index=answer,
        t_s=None,
        task="egoschema",
        raw=entry,
        qid=f"egoschema-{uid}",
        meta={"kind": KIND_MC, "groups": ("subset",) if answer is not None else ("full",)},
    )
