"""`Frame`, the unit every source yields; `FrameSource`, the interface every source offers; `ReadAhead`,
which decodes a file's frames on a reader thread ahead of the model (docs/ARCHITECTURE.md, Sources)."""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Frame:
    """One decoded frame.

    Attributes:
        t_s: presentation time in seconds from the start of the source (PTS for files, capture
            clock for live sources).
        rgb: (H, W, 3) uint8 RGB pixels, already rotated upright.
        index: position of the frame in the source's own decoding order (0-based).
    """

    t_s: float
    rgb: np.ndarray
    index: int


READ_AHEAD_FRAMES = 16  # one chunk: about 100 MB of 1080p RGB at most


class ReadAhead:
    """Iterates `frames` on a reader thread, at most `max_frames` ahead of the consumer.

    An error the reader raises is raised in the consumer after the frames decoded before it.

    Args:
        frames: the iterator to read (used by the reader thread only, once iteration starts).
        max_frames: frames held at most.
    """

    _DONE = object()

    def __init__(self, frames: Iterator[Frame], max_frames: int = READ_AHEAD_FRAMES) -> None:
        self._frames = frames
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, max_frames))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        try:
            for frame in self._frames:
                if not self._put(frame):
                    return
            self._put(self._DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Frame]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._read, name="hermes-frame-reader", daemon=True)
            self._thread.start()
        while not self._stop.is_set():  # closed: the reader puts nothing more, so waiting would never end
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the reader thread and wait for it, so its decoder can be released afterwards."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass(frozen=True)
class Gap:
    """A span of a live source without frames (the stream was lost, then came back).

    Attributes:
        start_t_s: timestamp of the last frame before the loss.
        end_t_s: timestamp of the first frame after the reconnect.
    """

    start_t_s: float
    end_t_s: float

    @property
    def duration_s(self) -> float:
        """Length of the gap in seconds."""
        return self.end_t_s - self.start_t_s


@dataclass
class SourceStats:
    """Counters of one source; `FrameSource.stats` hands out a consistent copy.

    Attributes:
        frames_read: frames decoded from the source (sampled or not).
        frames_sampled: frames kept by the target-fps sampler and queued for the consumer.
        frames_dropped: sampled frames discarded because the consumer was too slow.
        frames_taken: frames handed to the consumer.
        gaps: spans without frames (one per successful reconnect or detected stall).
        reconnects: successful reconnects.
        lag_s: capture-to-consumer delay of the last frame taken.
        max_lag_s: the largest such delay so far.
    """

    frames_read: int = 0
    frames_sampled: int = 0
    frames_dropped: int = 0
    frames_taken: int = 0
    gaps: int = 0
    reconnects: int = 0
    lag_s: float = 0.0
    max_lag_s: float = 0.0


class FrameSource(ABC):
    """What every source offers; iterate it to get `Frame`s in time order."""

    #: True for webcams and network streams (capture-clock timestamps, frames may be dropped).
    live: bool = False

    def __init__(self) -> None:
        self._stats = SourceStats()
        self.gaps: list[Gap] = []

    @abstractmethod
    def __iter__(self) -> Iterator[Frame]:
        """Yield frames in time order until the source ends or is closed."""

    @property
    def stats(self) -> SourceStats:
        """A snapshot of the counters (a copy: it does not change under the caller)."""
        return replace(self._stats)

    @abstractmethod
    def close(self) -> None:
        """Release the source; safe to call twice."""

    @abstractmethod
    def describe(self) -> str:
        """One line saying what this source is, without credentials."""

    def now_s(self) -> float | None:
        """The current time on a live source's clock; None where the consumer sets the pace (files)."""
        return None

    def __enter__(self) -> "FrameSource":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        # repr() ends up in tracebacks and debug logs: it must not show credentials either.
        return f"<{type(self).__name__} {self.describe()}>"
