"""Questions as a user gives them to `run`: `--ask`/`--at` pairs, a JSONL questions file, `--ask-every`.

Checked before torch is imported: a bad time, file or key is a one-line `UsageError` naming the flag
or the file's line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.errors import UsageError, check_keys

# The keys a questions-file line may carry; anything else is a typo (did-you-mean) rather than ignored.
QUESTION_KEYS = ("question", "at_s", "options", "id")


@dataclass(frozen=True)
class Question:
    """A question to ask at `at_s` seconds into the stream (None: when asked live, at the end of a file).

    `options` are multiple-choice options (lettered A, B, ... in the prompt); `id` is the asker's own
    (a questions file's, printed beside the answer; the session ignores it).
    """

    text: str
    at_s: float | None = None
    options: tuple[str, ...] = ()
    id: Any = None


def finite_seconds(text: str, flag: str, *, positive: bool) -> float:
    """A flag's value in seconds, refused unless it is a finite number (and > 0 when `positive`)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} expects a number of seconds, found {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        want = "a positive" if positive else "a non-negative"
        raise UsageError(f"{flag} expects {want} number of seconds, found {text!r}")
    return value


def questions_from_args(asked: list[tuple[str, str | None]]) -> list[Question]:
    """The `--ask`/`--at` pairs as questions, `--at` checked as seconds from the start."""
    return [Question(text, None if at is None else finite_seconds(at, "--at", positive=False))
            for text, at in asked]


def read_questions_file(path: str) -> list[Question]:
    """Questions from a JSONL file: one `{"question", "at_s"?, "options"?, "id"?}` object per line.

    Raises:
        UsageError: a missing, unreadable or non-UTF-8 file, or a line that is not such an object
            (naming the line; an unknown key gets a did-you-mean).
    """
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"--questions expects a JSONL file, found a directory: {path}")
    if not file.is_file():
        raise UsageError(f"questions file not found: {path}")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = file.read_bytes()[: exc.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: not UTF-8 text; save the file as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read questions file {path}: {exc.strerror}") from None
    questions = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg}); expected "
                             f'{{"question": "...", "at_s": 12.0, "options": [...]}}') from None
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            raise UsageError(f'{where}: expected an object with a "question" string')
        check_keys(item, QUESTION_KEYS, "a line", where=where)
        if not item["question"].strip():
            raise UsageError(f'{where}: "question" is empty')
        at_s = item.get("at_s")
        if at_s is not None and (isinstance(at_s, bool) or not isinstance(at_s, (int, float))
                                 or not math.isfinite(at_s) or at_s < 0):
            raise UsageError(f'{where}: "at_s" must be a number of seconds >= 0, found {at_s!r}')
        options = item.get("options") or []
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise UsageError(f'{where}: "options" must be a list of strings')
        if len(options) > 10:
            raise UsageError(f'{where}: at most 10 "options" (lettered A-J), found {len(options)}')
        questions.append(Question(item["question"], None if at_s is None else float(at_s), tuple(options),
                                       item.get("id")))
    if not questions:
        raise UsageError(f"questions file {path} holds no questions")
    return questions


def in_answer_order(questions: list[Question]) -> list[Question]:
    """The order a stream answers in: timed questions by time (stable), then those asked at the end."""
    timed = sorted((q for q in questions if q.at_s is not None), key=lambda q: q.at_s)
    return timed + [q for q in questions if q.at_s is None]


def check_times(questions: list[Question], duration_s: float | None) -> None:
    """Reject question times after the end of the video."""
    for q in questions:
        if q.at_s is not None and duration_s is not None and q.at_s > duration_s + 1e-6:
            raise UsageError(f"question time {q.at_s:g}s is past the end of the video ({duration_s:.2f}s)")


def expand_every(questions: list[Question], every_s: float, duration_s: float) -> list[Question]:
    """`--ask-every S` on a recording: each untimed question at S, 2S, ... up to the end, as timed questions."""
    repeated = [q for q in questions if q.at_s is None]
    times = [k * every_s for k in range(1, int(duration_s / every_s + 1e-9) + 1)]
    timed = [dataclasses.replace(q, at_s=t) for t in times for q in repeated]
    return [q for q in questions if q.at_s is not None] + timed

