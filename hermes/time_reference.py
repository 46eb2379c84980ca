"""When a question is about: the words of an English question that point at a time of the stream.

Recall under `memory.recall_gate: question` (`hermes.lower.LowerLevels.recall`) reads them instead of a
similarity threshold (docs/ARCHITECTURE.md, Memory, "Recall"): a question about the present recalls
nothing, one about the start brings back the earliest records (what first happened first), "N minutes
ago" the records of that moment, "just before / after X" the records around where X was found, and any
other question is gated by similarity as `above_frames` gates it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_UNIT_S = {"second": 1.0, "sec": 1.0, "s": 1.0, "minute": 60.0, "min": 60.0, "m": 60.0, "hour": 3600.0, "h": 3600.0}
_AGO = re.compile(r"\b(\d+(?:\.\d+)?)\s*(hours?|h|minutes?|mins?|m|seconds?|secs?|s)\s+ago\b")
_AROUND = re.compile(r"\b(?:just |right |immediately |shortly )?(before|after)\s+(?:the |a |an )?([^?.!,;]+)")
# ordinals count from the start of the stream ("the second object"); "at first" is how a story starts
_START = re.compile(r"\b(first|second|third|earliest|at the (?:start|beginning)|in the beginning|initially|"
                    r"to begin with|started?)\b")
_PRESENT = re.compile(r"\b(now|currently|right now|at the moment|at present|at this moment|on screen|"
                      r"is (?:happening|visible|shown))\b")


@dataclass(frozen=True)
class TimeReference:
    """What a question says about when.

    Attributes:
        kind: "present", "start", "before" / "after" (X: `subject`), "ago" (`seconds_ago`), or "none".
        subject: the words naming X ("red circle"), for "before" / "after".
        seconds_ago: how long before the question, for "ago".
    """

    kind: Literal["present", "start", "before", "after", "ago", "none"]
    subject: str = ""
    seconds_ago: float = 0.0


def time_reference(question: str) -> TimeReference:
    """The time `question` points at; a more specific reference wins ("ago", then "before / after X",
    then the start, then the present).

    Args:
        question: the bare question (not a benchmark's whole prompt with its options).

    Returns:
        The `TimeReference` ("none" when the words name no time).
    """
    text = " ".join(question.lower().split())
    ago = _AGO.search(text)
    if ago:
        unit = ago.group(2).rstrip("s") or "s"
        return TimeReference("ago", seconds_ago=float(ago.group(1)) * _UNIT_S.get(unit, 1.0))
    around = _AROUND.search(text)
    if around:
        return TimeReference(around.group(1), subject=around.group(2).strip())  # type: ignore[arg-type]
    if _START.search(text):
        return TimeReference("start")
    if _PRESENT.search(text):
        return TimeReference("present")
    return TimeReference("none")
