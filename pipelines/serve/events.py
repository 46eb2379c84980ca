"""A stream's numbered events (`EventLog`, read by SSE, resumed by ``Last-Event-ID``) and its standing
questions (`Watch`, whose answer changes become events); the event kinds: README.md, "Serving"."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hermes.errors import UsageError

_watch_ids = itertools.count(1)


@dataclass
class Watch:
    """A standing question; `due_s` is the next stream time it is asked at."""

    question: str
    every_s: float
    due_s: float
    id: str = field(default_factory=lambda: f"w{next(_watch_ids)}")
    last_answer: str | None = None
    answers: int = 0  # times asked
    changes: int = 0  # times the answer changed (events emitted)

    def spec(self) -> dict[str, Any]:
        """The watch as the stream table saves it (watches take no options yet: always empty)."""
        return {"question": self.question, "options": [], "every_s": self.every_s}

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "every_s": self.every_s, "next_at_s": self.due_s,
                "last_answer": self.last_answer, "answers": self.answers, "changes": self.changes}


def check_watch(body: dict) -> tuple[str, float]:
    """The `(question, every_s)` of a watch request.

    Raises:
        UsageError: a missing question or a period that is not a positive number of seconds.
    """
    question = body.get("question")
    every_s = body.get("every_s")
    if not isinstance(question, str) or not question.strip():
        raise UsageError('a watch needs "question": a non-empty string')
    if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) or not every_s > 0 or every_s > 86400:
        raise UsageError(f'a watch needs "every_s": seconds between 0 and 86400, found {every_s!r}')
    return question, float(every_s)


class EventLog:
    """The numbered events of one stream; appended by any thread, read by SSE clients."""

    keep = 1000  # events kept for reconnecting clients

    def __init__(self) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=self.keep)
        self._seq = 0
        self._lock = threading.Lock()
        self._last_drop_event = float("-inf")

    def emit(self, kind: str, **data: Any) -> dict[str, Any]:
        """Append one event (``{"seq", "type", "time", ...data}``) and return it."""
        with self._lock:
            self._seq += 1
            event = {"seq": self._seq, "type": kind, "time": time.time(), **data}
            self._events.append(event)
            return event

    def emit_drop(self, dropped_total: int) -> None:
        """A ``drop`` event, at most one a second (a slow model drops frames continuously)."""
        now = time.monotonic()
        if now - self._last_drop_event >= 1.0:
            self._last_drop_event = now
            self.emit("drop", frames_dropped=dropped_total)

    def since(self, seq: int) -> list[dict[str, Any]]:
        """Events numbered after `seq`, oldest first."""
        with self._lock:
            return [e for e in self._events if e["seq"] > seq]
