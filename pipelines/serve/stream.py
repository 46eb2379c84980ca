"""One served stream: where its frames come from, the frames waiting for the model, and its clock.

A live source keeps its own reader and drop policy and a pump thread moves its frames here; a file is
played back in real time; a push client POSTs frames and waits for room (`PUSH_WAIT_S`, then 503)
instead of losing them. A question asked now is stamped with `clock_s` and answered from the frames
before it. The session belongs to the scheduler's thread; others read only the snapshots it leaves.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hermes.errors import HermesError, UsageError
from hermes.pipelines.frames import Frame
from hermes.pipelines.serve.events import EventLog, Watch
from hermes.redact import redact_url

PUSH_WAIT_S = 30.0  # how long a pushed frame waits for room before the client is told to retry
REPLICA_NODE = socket.gethostname()  # the node streams run on, in their JSON; an engine may set its own id


class Behind(HermesError):
    """The model is too far behind a push stream to take another frame now (HTTP 503)."""


class TooManyFrames(HermesError):
    """A push client over the frames-per-second limit (HTTP 429)."""


@dataclass
class StreamCounters:
    """What a stream has done; read by /metrics and GET /v1/streams/{id}."""

    frames_received: int = 0  # frames that reached `pending` (pushed or from the source)
    frames_dropped: int = 0  # frames dropped from `pending` because the model fell behind
    frames_encoded: int = 0  # over the memory's whole life, resumed frames included (JSON: also frames_seen)
    chunks: int = 0
    questions: int = 0
    evicted_tokens: int = 0  # visual tokens level 1 let go (to levels 2/3, or forgotten)
    recall_records: int = 0  # records brought back by recall, over all answers
    latencies_ms: list[float] = field(default_factory=list)  # question latency: request to answer


class Stream:
    """A served stream (see the module docstring).

    Args:
        stream_id: the name the client gave (its memory directory's name) or a generated one.
        source: the source as the client gave it (None: a push stream).
        max_pending: frames kept waiting for the model before the oldest is dropped.
        opened_from: the stream table's spec less its watches (`hermes.pipelines.serve.table`).
    """

    def __init__(self, stream_id: str, cfg, source: str | None, memory_dir: str | None, *,
                 max_pending: int, max_push_fps: float = 30.0, opened_from: dict[str, Any] | None = None) -> None:
        self.id = stream_id
        self.opened_from = opened_from or {}
        self.cfg = cfg
        self.source_spec = source
        self.memory_dir = memory_dir
        self.max_pending = max_pending
        self.events = EventLog()
        self.counters = StreamCounters()
        self.watches: list[Watch] = []
        self.status = "starting"  # then running, ended, error or closed
        self.error: str | None = None
        self.session = None  # the scheduler's worker thread owns it
        self.memory: dict[str, int] = {}  # the worker's snapshot of session.memory_stats()
        self.resumed_frames = 0  # frames the memory directory already held when the stream opened
        self.created_at = time.time()
        self._pending: deque[Frame] = deque()
        self._lock = threading.Condition()
        self._latest: Frame | None = None
        self._source = None
        self._pump: threading.Thread | None = None
        self._offset_s = 0.0  # a resumed stream's clock continues after its saved frames
        self._started = time.monotonic()
        self._last_t_s: float | None = None
        self._min_next_t_s = 0.0  # a pushed frame must come after the last question's moment
        self._push_times: deque[float] = deque()
        self._max_push_fps = max_push_fps
        self._wake = lambda: None  # set by the scheduler: frames arrived
        self._closing = threading.Event()

    # ---- feeding -----------------------------------------------------------------------------------

    @property
    def push(self) -> bool:
        return self.source_spec is None

    def start(self, source, wake, resumed_t_s: float | None) -> None:
        """Begin feeding: `source` is an open `FrameSource` (None for push); `wake` tells the scheduler
        that frames arrived; `resumed_t_s` is the last frame time the memory already holds (or None)."""
        self._wake = wake
        self._source = source
        if resumed_t_s is not None:
            self._offset_s = resumed_t_s + 1e-3 if (source is None or source.live) else 0.0
            self._last_t_s = resumed_t_s
            self._min_next_t_s = resumed_t_s + 1e-6
        self._started = time.monotonic()
        if source is not None and not source.live and resumed_t_s is not None:
            self._started -= resumed_t_s  # a recording resumes playing where its memory ends
        self.status = "running"
        if source is not None:
            self._pump = threading.Thread(target=self._run_pump, args=(resumed_t_s,), daemon=True,
                                          name=f"hermes-serve-pump-{self.id}")
            self._pump.start()

    def _run_pump(self, resumed_t_s: float | None) -> None:
        source = self._source
        seen_gaps, seen_reconnects = 0, 0
        try:
            for frame in source:
                if self._closing.is_set():
                    return
                if source.live:
                    frame = Frame(frame.t_s + self._offset_s, frame.rgb, frame.index)
                elif resumed_t_s is not None and frame.t_s <= resumed_t_s:
                    continue  # a file played again after a restart: already in memory
                else:  # a recording plays in real time
                    while frame.t_s > self.clock_s() and not self._closing.wait(min(0.05, frame.t_s - self.clock_s())):
                        pass
                self._add(frame)
                stats = source.stats
                if len(source.gaps) > seen_gaps:
                    for gap in source.gaps[seen_gaps:]:
                        self.events.emit("gap", start_t_s=gap.start_t_s + self._offset_s,
                                         end_t_s=gap.end_t_s + self._offset_s, duration_s=gap.duration_s)
                    seen_gaps = len(source.gaps)
                if stats.reconnects > seen_reconnects:
                    seen_reconnects = stats.reconnects
                    self.events.emit("reconnect", reconnects=seen_reconnects)
            if not self._closing.is_set():
                self.status = "ended"
                self.events.emit("ended", frames_received=self.counters.frames_received)
        except HermesError as exc:
            self.fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - a decoder crash ends this stream, not the server
            self.fail(f"{type(exc).__name__}: {exc}")
        finally:
            self._wake()

    def push_frame(self, rgb: np.ndarray, t_s: float | None) -> float:
        """Add a client's frame; returns the time it was stamped with.

        Raises:
            UsageError: a time that does not come after the last frame and the last question.
            TooManyFrames: over `max_push_fps` in the last second.
        """
        now = time.monotonic()
        with self._lock:
            while self._push_times and now - self._push_times[0] > 1.0:
                self._push_times.popleft()
            if len(self._push_times) >= self._max_push_fps:
                raise TooManyFrames(f"more than {self._max_push_fps:g} frames in one second on stream {self.id}")
            self._push_times.append(now)
            floor = self._push_floor_s()
            if t_s is None:  # the arrival clock, but never before a frame the client stamped itself
                t_s = max(now - self._started + self._offset_s, floor)
            if t_s < floor:
                raise UsageError(f"frame time {t_s:g}s does not come after this stream's last frame or "
                                 f"question ({floor:g}s); frames must arrive in time order")
            self._last_t_s = t_s  # claimed now: a concurrent push must come after it
        self._add(Frame(t_s, rgb, self.counters.frames_received), wait_s=PUSH_WAIT_S)
        return t_s

    def _add(self, frame: Frame, wait_s: float = 0.0) -> None:
        """Queue `frame`; with `wait_s`, wait that long for room instead of dropping the oldest."""
        with self._lock:
            if wait_s and not self._lock.wait_for(lambda: len(self._pending) < self.max_pending
                                                  or self._closing.is_set(), timeout=wait_s):
                raise Behind(f"the model is {len(self._pending)} frames behind stream {self.id}; retry later")
            self._pending.append(frame)
            self._last_t_s = frame.t_s
            self._latest = frame
            self.counters.frames_received += 1
            dropped = 0
            while len(self._pending) > self.max_pending:
                self._pending.popleft()  # the oldest: memory stays current when the model falls behind
                dropped += 1
            self.counters.frames_dropped += dropped
        if dropped:
            self.events.emit_drop(self.counters.frames_dropped)
        self._wake()

    # ---- what the scheduler takes ------------------------------------------------------------------

    def clock_s(self) -> float:
        """The moment a question asked now is stamped with (see the module docstring)."""
        source = self._source
        if source is not None and source.live:
            return source.now_s() + self._offset_s
        if source is not None:  # a recording in real time
            return time.monotonic() - self._started
        with self._lock:  # push: after every frame received so far
            return self._push_floor_s()

    def _push_floor_s(self) -> float:
        """The earliest time the next pushed frame may take (after the last frame and question); lock held."""
        return max(self._min_next_t_s, self._last_t_s + 1e-6 if self._last_t_s is not None else 0.0)

    def mark_question(self, at_s: float) -> None:
        """A question was stamped `at_s`: later pushed frames must not come before it."""
        with self._lock:
            self._min_next_t_s = max(self._min_next_t_s, at_s)

    def frames_before(self, limit_s: float, max_frames: int | None = None) -> list[Frame]:
        """Take up to `max_frames` waiting frames with ``t_s < limit_s`` (oldest first)."""
        taken: list[Frame] = []
        with self._lock:
            while self._pending and self._pending[0].t_s < limit_s and (max_frames is None or len(taken) < max_frames):
                taken.append(self._pending.popleft())
            if taken:
                self._lock.notify_all()  # a push client may be waiting for room
        return taken

    def ready_frames(self, limit_s: float) -> int:
        """How many waiting frames come before `limit_s`."""
        with self._lock:
            return sum(1 for f in self._pending if f.t_s < limit_s)

    @property
    def feeding(self) -> bool:
        """Whether more frames may still arrive (a running source, or any push stream)."""
        return self.status == "running" and (self.push or (self._pump is not None and self._pump.is_alive()))

    def latest_frame(self) -> Frame | None:
        with self._lock:
            return self._latest

    # ---- ending ------------------------------------------------------------------------------------

    def fail(self, message: str) -> None:
        """Stop the stream with an error (shown to clients without credentials)."""
        self.error = redact_url(message) if "://" in message else message
        self.status = "error"
        self.events.emit("error", message=self.error)

    def stop_feeding(self) -> None:
        """Stop the pump and release the source (the session is closed by the scheduler)."""
        self._closing.set()
        with self._lock:
            self._lock.notify_all()
        source, self._source = self._source, None
        if source is not None:
            if hasattr(source, "request_stop"):
                source.request_stop()  # a live source's wait for frames ends at once
            source.close()
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join(timeout=10)

    def to_json(self) -> dict[str, Any]:
        c = self.counters
        return {"id": self.id, "name": self.id, "source": "push" if self.push else redact_url(self.source_spec),
                "status": self.status, "error": self.error, "memory_policy": self.cfg.memory.policy,
                "fps": self.cfg.stream.fps, "memory_dir": self.memory_dir is not None,
                "resumed_frames": self.resumed_frames, "frames_seen": c.frames_encoded,
                "frames_received": c.frames_received,
                "frames_dropped": c.frames_dropped, "frames_encoded": c.frames_encoded, "chunks": c.chunks,
                "questions": c.questions, "watches": [w.to_json() for w in self.watches],
                "clock_s": round(self.clock_s(), 3), "replica": {"node": REPLICA_NODE, "pid": os.getpid()}}
