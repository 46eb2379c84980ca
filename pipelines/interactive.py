"""Live runs: frames keep coming while questions are typed or scheduled (docs/ARCHITECTURE.md, Interfaces).

`run_live` feeds a session from a camera or stream, or a recording played back in real time, and
answers typed (`QuestionInbox`), one-off (`--at`) and periodic (`--ask-every`) questions on the
stream's clock, each from exactly the frames captured before it was stamped.
"""

from __future__ import annotations

import dataclasses
import heapq
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TextIO

from hermes.errors import UsageError
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import Answer, Question, StreamingSession, stop_on_signals


def check_live_memory(memory_cfg, live: bool, explicit: bool):
    """The memory config a live source runs with: never unbounded (`full`, which would fail at the
    model's position limit minutes in, is refused when chosen and replaced by `hermes` with a note
    when merely the default), checkpointed at `memory.live_checkpoint_every`. Called before the
    model loads.

    Args:
        memory_cfg: the resolved memory config.
        live: whether the source is live (a camera or stream).
        explicit: whether the user chose the memory (``--memory``, ``--config``, ``--set memory.*``).

    Returns:
        The memory config to use.

    Raises:
        UsageError: `full` chosen explicitly for a live source.
    """
    if live:  # its frames cannot be read again on --resume: checkpoint level 1 at the live rate
        memory_cfg = dataclasses.replace(memory_cfg, checkpoint_every=memory_cfg.live_checkpoint_every)
    if not live or memory_cfg.policy != "full":
        return memory_cfg
    if explicit:
        raise UsageError("--memory full keeps every frame and a live stream never ends, so it would fail at the "
                         "model's position limit; choose a bounded preset such as --memory hermes-4k")
    print(f"note: a live stream needs a bounded memory; using policy hermes with a budget of "
          f"{memory_cfg.budget} tokens per layer (choose another with --memory)", file=sys.stderr, flush=True)
    return dataclasses.replace(memory_cfg, policy="hermes")


class QuestionInbox:
    """Lines typed on `stream`, each stamped by `clock()` when it arrives; read on a daemon thread.

    Args:
        stream: where questions are typed (stdin, a pipe, a pseudo-terminal).
        clock: the stream clock in seconds (the same clock frames are stamped with).
    """

    def __init__(self, stream: TextIO, clock: Callable[[], float]) -> None:
        self._queue: queue.Queue[Question] = queue.Queue()
        self.closed = threading.Event()
        self._clock = clock
        self._thread = threading.Thread(target=self._read, args=(stream,), name="hermes-inbox", daemon=True)
        self._thread.start()

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            text = line.strip()
            if text:
                self._queue.put(Question(text, self._clock()))
        self.closed.set()

    def take(self) -> list[Question]:
        """Every question typed since the last call, in the order typed."""
        taken = []
        while True:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                return taken


@dataclass(order=True)
class _Due:
    at_s: float
    seq: int
    question: Question = field(compare=False)


class QuestionSchedule:
    """Questions ordered by stream time: one-off, periodic and typed ones in one queue."""

    def __init__(self, timed: Iterable[Question] = (), every_s: float | None = None,
                 every: Iterable[Question] = ()) -> None:
        """
        Args:
            timed: one-off questions, each at its `at_s`.
            every_s: period of the `every` questions, in stream seconds (None: none).
            every: questions asked every `every_s` (their `at_s` is ignored; text, options and id kept).
        """
        self._heap: list[_Due] = []
        self._seq = 0
        self._every_s = every_s
        self._every = list(every)
        for q in timed:
            self.add(q)
        if every_s:
            self._add_period(1)

    def add(self, question: Question) -> None:
        heapq.heappush(self._heap, _Due(question.at_s, self._seq, question))
        self._seq += 1

    def _add_period(self, k: int) -> None:
        for question in self._every:
            self.add(dataclasses.replace(question, at_s=k * self._every_s))
        # a sentinel with no text marks where the next period is scheduled
        self.add(Question("", k * self._every_s))

    def pop_due(self, t_s: float) -> list[Question]:
        """Questions stamped at or before `t_s`, in time order."""
        due = []
        while self._heap and self._heap[0].at_s <= t_s:
            question = heapq.heappop(self._heap).question
            if question.text:
                due.append(question)
            else:
                self._add_period(round(question.at_s / self._every_s) + 1)
        return due

    def exhausted(self) -> bool:
        """Whether every question has been asked (periodic ones never run out)."""
        return not self._heap  # a periodic schedule always holds its next period's sentinel

    def pending(self) -> list[Question]:
        """Questions still waiting (periodic ones only up to the next period)."""
        return [d.question for d in sorted(self._heap) if d.question.text]


def run_live(session: StreamingSession, frames: Iterable[Frame], *, clock: Callable[[], float], pace: bool,
             schedule: QuestionSchedule, inbox: QuestionInbox | None,
             on_answer: Callable[[Answer, Question], None],
             chunk_frames: int = 4, to_end: bool = False) -> str:
    """Stream `frames` into `session`, answering questions as they fall due.

    Args:
        session: a session with no source of its own (frames are pushed here).
        frames: the source, in time order.
        clock: the stream clock in seconds: the live source's own, or for a recording the wall
            clock since playback started.
        pace: play a recording back in real time (wait until `clock()` reaches each frame's
            t_s), so that typed questions meet the video as a viewer would.
        schedule: one-off and periodic questions.
        inbox: typed questions, or None.
        on_answer: called with every answer as it is produced, and the question it answers (whose `id`
            is the asker's: two questions with the same text stay apart).
        chunk_frames: frames per chunk; small for live input so memory stays current.
        to_end: keep streaming once the last question is answered, until the source ends (a stream
            with no question at all, only building a memory, always does).

    Returns:
        Why the run ended: "end of source", "input closed", "questions answered" or "interrupted".
        Every pending question is answered first. A signal only sets a flag
        (`hermes.pipelines.session.stop_on_signals`) honoured between chunks, so a chunk is never
        cut and the session can checkpoint.
    """
    buffer: list[Frame] = []

    def answer(due: list[Question]) -> None:
        nonlocal buffer
        for question in due:
            ready = [f for f in buffer if f.t_s < question.at_s]
            buffer = buffer[len(ready):]
            session.ingest(ready)
            on_answer(session.ask(question.text, question.options, at=question.at_s), question)

    resumed_at = session.encoded_t_s[-1] if session.encoded_t_s else None  # frames up to here are in memory

    def collect(t_s: float) -> None:
        if inbox is not None:
            for question in inbox.take():
                schedule.add(question)
        answer([q for q in schedule.pop_due(t_s) if resumed_at is None or q.at_s > resumed_at])

    # only timed questions can run out: typed input and periodic questions always have more to come
    can_run_out = not to_end and inbox is None and not schedule.exhausted()
    reason = "end of source"
    with stop_on_signals(session, frames):
        try:
            for frame in frames:
                if resumed_at is not None and frame.t_s <= resumed_at:
                    continue  # a recording played again after --resume: already encoded
                if pace and frame.t_s > clock():
                    time.sleep(frame.t_s - clock())
                if session.stop_requested:
                    reason = "interrupted"
                    break
                collect(frame.t_s)
                if can_run_out and schedule.exhausted():
                    reason = "questions answered"
                    break
                buffer.append(frame)
                if len(buffer) >= chunk_frames:
                    session.ingest(buffer)
                    buffer = []
                if session.stop_requested:
                    reason = "interrupted"
                    break
                if inbox is not None and inbox.closed.is_set():
                    reason = "input closed"
                    break
            else:
                if session.stop_requested:
                    reason = "interrupted"
        except KeyboardInterrupt:  # a second Ctrl-C: the session may be mid-chunk (then broken)
            reason = "interrupted"
            if session.broken:
                raise
        now = max(clock(), buffer[-1].t_s + 1e-6 if buffer else 0.0)
        collect(now)
        session.ingest(buffer)
    return reason
