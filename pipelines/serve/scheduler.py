"""The model worker: one thread runs the model for every stream (one model, many sessions).

Every use of the model and of a session happens on this thread, so a session has one owner and the
model is never entered twice. Between any two pieces of work the worker picks, in order:

1. a job: opening or closing a session, or a question (a question is stamped with its stream's
   clock when it arrives, so it waits at most for the chunk being encoded, then its own stream's
   frames before that moment, then it is answered);
2. a watch that has fallen due (asked at its due time, from the frames before it);
3. the next chunk, round-robin over the streams: a stream is ready when a whole chunk
   (`stream.live_chunk_frames`) waits, or any frame waits on a stream that will get no more. Each
   stream has at most one chunk in flight, since there is one worker.

Frames at or after a watch's due time stay waiting until the watch has been asked, so a watch sees
exactly the frames before its moment whatever the load.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from hermes.errors import HermesError, UsageError
from hermes.pipelines.asked import Question
from hermes.pipelines.serve.stream import Stream

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # how often an idle worker looks at the streams' clocks (watches fall due by time)


class Scheduler:
    """The model worker thread (see the module docstring)."""

    def __init__(self, model) -> None:
        self.model = model
        self.busy_s = 0.0  # seconds spent in the model (chunks and answers)
        self.chunks = 0
        self.answers = 0
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Callable[[], Any], Future]] = deque()
        self._streams: list[Stream] = []  # round-robin order
        self._next = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="hermes-serve-model")
        self._thread.start()

    # ---- called from request threads ---------------------------------------------------------------

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run `fn` on the worker before any further chunk; its result or exception comes in the Future."""
        future: Future = Future()
        with self._cond:
            if self._stopping:
                future.set_exception(HermesError("the server is shutting down"))
                return future
            self._jobs.append((fn, future))
            self._cond.notify_all()
        return future

    def wake(self) -> None:
        """Frames arrived somewhere: look again."""
        with self._cond:
            self._cond.notify_all()

    def open(self, stream: Stream, resume: bool) -> Future:
        """Build `stream`'s session on the worker; the Future gives the last frame time resumed (or None)."""
        from hermes.pipelines.session import StreamingSession

        def build():
            cfg = stream.cfg
            stream.session = StreamingSession(self.model, cfg.memory, (), chunk_frames=cfg.stream.live_chunk_frames,
                                              max_new_tokens=cfg.model.max_new_tokens,
                                              memory_dir=stream.memory_dir, resume=resume)
            stream.resumed_frames = len(stream.session.encoded_t_s)
            stream.counters.frames_encoded = stream.resumed_frames
            stream.memory = stream.session.memory_stats()
            with self._cond:
                self._streams.append(stream)
            return stream.session.encoded_t_s[-1] if stream.session.encoded_t_s else None

        return self.call(build)

    def close(self, stream: Stream) -> Future:
        """Stop `stream`'s source, then close its session on the worker (a last checkpoint)."""
        stream.stop_feeding()

        def close():
            with self._cond:
                if stream in self._streams:
                    self._streams.remove(stream)
            if stream.session is not None:
                session, stream.session = stream.session, None
                session.close()
            if stream.status != "error":
                stream.status = "closed"

        return self.call(close)

    def ask(self, stream: Stream, question: Question, *, max_new_tokens: int | None = None,
            recall: bool | None = None, on_text: Callable[[str], None] | None = None,
            at_s: float | None = None) -> Future:
        """Stamp `question` with the stream's clock now (or `at_s`, no later) and queue it; the Future gives
        the `Answer` (or the `UsageError` of an `at_s` before frames already encoded).

        Raises:
            UsageError: `at_s` after the stream's clock (frames not received yet).
        """
        started = time.monotonic()
        with self._cond:  # stamped and queued at once: no chunk of frames after the stamp slips in first
            now_s = stream.clock_s()
            if at_s is not None and at_s > now_s:
                raise UsageError(f'"at" {at_s:g}s is after stream {stream.id}\'s clock ({now_s:g}s): ask about '
                                 f"frames already received")
            at = now_s if at_s is None else at_s
            stream.mark_question(at)
            return self.call(lambda: self._answer(stream, question, at, max_new_tokens, recall, on_text,
                                                  started, exact=at_s is not None))

    def add_watch(self, stream: Stream, watch) -> None:
        """Start asking `watch` on `stream` (its first moment is `watch.due_s`)."""
        with self._cond:
            stream.watches.append(watch)
            self._cond.notify_all()

    def shutdown(self) -> None:
        """Close every stream (checkpoints), then stop the worker."""
        for stream in list(self._streams):
            try:
                self.close(stream).result(timeout=60)
            except Exception as exc:  # noqa: BLE001 - one stream's failure must not keep the others open
                log.warning("closing stream %s: %s", stream.id, exc)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    @property
    def queued(self) -> int:
        return len(self._jobs)

    @property
    def alive(self) -> bool:
        """Whether the worker thread runs (/healthz)."""
        return self._thread.is_alive()

    # ---- the worker --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                work = None
                while work is None:
                    if self._jobs:
                        fn, future = self._jobs.popleft()
                        work = (fn, future)
                        break
                    if self._stopping:
                        return
                    work = self._due_watch() or self._next_chunk()
                    if work is None:
                        self._cond.wait(IDLE_WAIT_S)
            fn, future = work if isinstance(work, tuple) else (work, None)
            start = time.perf_counter()
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller; the worker lives on
                if future is not None:
                    future.set_exception(exc)
                else:
                    log.warning("serve worker: %s", exc)
            else:
                if future is not None:
                    future.set_result(result)
            finally:
                self.busy_s += time.perf_counter() - start

    def _live(self) -> list[Stream]:
        return [s for s in self._streams if s.session is not None and s.status in ("running", "ended")]

    def _due_watch(self) -> Callable[[], None] | None:
        for stream in self._live():
            for watch in stream.watches:
                if stream.clock_s() >= watch.due_s:
                    due_s = watch.due_s
                    watch.due_s += watch.every_s
                    return lambda s=stream, w=watch, t=due_s: self._ask_watch(s, w, t)
        return None

    def _next_chunk(self) -> Callable[[], None] | None:
        streams = self._live()
        for k in range(len(streams)):
            stream = streams[(self._next + k) % len(streams)]
            limit_s = min((w.due_s for w in stream.watches), default=math.inf)
            waiting = stream.ready_frames(limit_s)
            chunk = stream.cfg.stream.live_chunk_frames
            if waiting >= chunk or (waiting and not stream.feeding):
                self._next = (self._next + k + 1) % len(streams)
                frames = stream.frames_before(limit_s, chunk)
                return lambda s=stream, f=frames: self._encode(s, f)
        return None

    def _encode(self, stream: Stream, frames) -> None:
        session = stream.session
        if session is None or not frames:
            return
        before = session.cache.num_tokens
        try:
            session.ingest(frames)
        except Exception as exc:  # noqa: BLE001 - this stream stops; the others go on
            stream.fail(f"encoding failed: {exc}")
            raise
        stream.counters.evicted_tokens += max(before + self.model.tokens_per_frame * len(frames)
                                              - session.cache.num_tokens, 0)
        stream.counters.chunks += 1
        stream.counters.frames_encoded = len(session.encoded_t_s)
        stream.memory = session.memory_stats()
        self.chunks += 1

    def _catch_up(self, stream: Stream, at_s: float) -> None:
        """Encode the stream's waiting frames before `at_s`, a chunk at a time."""
        chunk = stream.cfg.stream.live_chunk_frames
        while frames := stream.frames_before(at_s, chunk):
            self._encode(stream, frames)

    def _answer(self, stream: Stream, question: Question, at_s: float, max_new_tokens: int | None,
                recall: bool | None, on_text, started: float, exact: bool = False):
        from hermes.pipelines.run import check_prompts

        session = stream.session
        if session is None:
            raise HermesError(f"stream {stream.id} is closed")
        cfg = stream.cfg
        check_prompts(self.model, cfg, [question])
        self._catch_up(stream, at_s)
        if not exact and session.encoded_t_s and at_s <= session.encoded_t_s[-1]:
            at_s = session.encoded_t_s[-1] + 1e-6  # a watch that fell due while a question was answered
        session.max_new_tokens = max_new_tokens or cfg.model.max_new_tokens
        session.recall = cfg.memory.recall if recall is None else recall
        try:
            answer = session.ask(question.text, question.options, at=at_s, on_text=on_text)
        finally:
            session.max_new_tokens, session.recall = cfg.model.max_new_tokens, cfg.memory.recall
        stream.counters.questions += 1
        stream.counters.latencies_ms.append((time.monotonic() - started) * 1e3)
        del stream.counters.latencies_ms[:-1000]
        if answer.recall:
            stream.counters.recall_records += answer.recall.get("records", 0)
        stream.memory = answer.memory
        self.answers += 1
        return answer

    def _ask_watch(self, stream: Stream, watch, due_s: float) -> None:
        answer = self._answer(stream, Question(watch.question), due_s, None, None, None, time.monotonic())
        watch.answers += 1
        if answer.answer != watch.last_answer:
            watch.changes += 1
            stream.events.emit("watch", watch_id=watch.id, question=watch.question, answer=answer.answer,
                               previous=watch.last_answer, at_s=answer.at_s, frames_seen=answer.frames_seen)
            watch.last_answer = answer.answer
