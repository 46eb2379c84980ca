"""Live capture: webcams and network streams read by OpenCV/FFmpeg in a reader thread.

docs/ARCHITECTURE.md, Sources. One `LiveSource` owns one reader thread and one ``cv2.VideoCapture``. The thread
decodes as fast as the source delivers, stamps each frame with the capture clock
(``t_s = time.monotonic() - opened_at``), samples to the target fps by timestamp, and hands the
kept frames to the consumer through a bounded queue with a named drop policy:

- ``latest`` (live default): when the queue is full the OLDEST queued frame is dropped (and
  counted), so a slow consumer always gets fresh frames and its lag stays bounded;
- ``fifo`` (files over HTTP): the reader blocks until there is room; nothing is dropped.

A lost stream is reopened with exponential backoff (0.5 s doubling, capped at 5 s) until
``reconnect_timeout_s`` after the loss; success records one `Gap` (frames are never invented to
fill it, and a new resolution is accepted), failure makes iteration raise `SourceError`.
A stall (the stream stays connected but delivers nothing, e.g. a paused RTSP server) is told from
the arrival gaps: a live frame arriving more than ``stall_s`` after the previous one (default: the
larger of 1 s and 4 frame intervals at the source's own rate) records a `Gap` too, and the log
line gives how far the source's own timestamps (PTS) advanced meanwhile. Frames are never
invented to fill a gap, and the sampler restarts after it.
URL credentials never reach messages or logs (`redact_url`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Iterator

import cv2

from hermes.errors import SourceError, UsageError
from hermes.pipelines.frames import Frame, FrameSource, Gap
from hermes.pipelines.sampling import check_fps
from hermes.redact import redact_url

log = logging.getLogger(__name__)

POLICIES = ("latest", "fifo")
FFMPEG_OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
# OpenCV reads FFMPEG_OPTIONS_ENV inside the VideoCapture constructor and the variable is
# process-wide, so captures that set it are opened one at a time.
_ENV_LOCK = threading.Lock()
DROP_WARNING_INTERVAL_S = 10.0  # rate limit of the "consumer too slow" warning


class _Sampler:
    """Keeps frames spaced 1/fps apart by timestamp (not by frame count)."""

    def __init__(self, fps: float | None) -> None:
        self.interval_s = 1.0 / fps if fps else None
        self.next_due_s: float | None = None

    def due(self, t_s: float) -> bool:
        """Whether the frame at `t_s` is kept; advances the schedule when it is."""
        if self.interval_s is None:
            return True
        # A quarter-interval tolerance absorbs capture-clock jitter (a frame at 0.199 s for a
        # 0.2 s slot) that would otherwise skip a whole source frame.
        if self.next_due_s is not None and t_s < self.next_due_s - 0.25 * self.interval_s:
            return False
        on_schedule = self.next_due_s is not None and t_s - self.next_due_s < self.interval_s
        self.next_due_s = (self.next_due_s if on_schedule else t_s) + self.interval_s
        return True

    def reset(self) -> None:
        """Start a new schedule at the next frame (after a gap)."""
        self.next_due_s = None


class LiveSource(FrameSource):
    """A webcam or network stream read in its own thread (see the module docstring)."""

    def __init__(self, target: str | int, *, fps: float | None = None, live: bool = True,
                 policy: str | None = None, maxsize: int | None = None,
                 open_timeout_s: float = 10.0, read_timeout_s: float = 5.0,
                 reconnect_timeout_s: float = 30.0, backoff_initial_s: float = 0.5,
                 backoff_max_s: float = 5.0, rtsp_transport: str = "tcp",
                 analyze_duration_s: float = 1.0, stall_s: float | None = None) -> None:
        """Open the capture (quickly failing if it cannot) and start the reader thread.

        Args:
            target: a webcam index or a stream URL.
            fps: target frames per second, sampled by timestamp; None keeps every frame.
            live: False for a file served over HTTP: PTS timestamps, in order, no reconnect,
                the end of the stream ends iteration.
            policy: ``latest`` or ``fifo``; default ``latest`` when live, else ``fifo``.
            maxsize: queue length; default 2 when live (the consumer is at most about two
                frames behind), else 8.
            open_timeout_s: limit for opening (and each reopening) of a stream.
            read_timeout_s: a stream that delivers nothing for this long counts as lost.
            reconnect_timeout_s: how long after a loss reconnecting is tried before giving up.
            backoff_initial_s: wait after the first failed reconnect attempt; doubles each time.
            backoff_max_s: cap of that wait.
            rtsp_transport: FFmpeg's ``rtsp_transport`` (``tcp`` or ``udp``) for rtsp URLs.
            analyze_duration_s: how much of a stream FFmpeg probes on open; FFmpeg's default
                (5 s) costs about 3 s per (re)connect on a live stream.
            stall_s: an arrival gap longer than this is reported as a `Gap` (a stall); default
                max(1 s, 4 / the source's frame rate).

        Raises:
            SourceError: the capture cannot be opened (refused, unreachable, no such device).
            UsageError: an option value is out of range.
        """
        super().__init__()
        policy = policy or ("latest" if live else "fifo")
        if policy not in POLICIES:
            raise UsageError(
                f"unknown drop policy {policy!r}: expected one of {', '.join(POLICIES)}")
        maxsize = maxsize if maxsize is not None else (2 if live else 8)
        if maxsize < 1:
            raise UsageError(f"maxsize must be at least 1, got {maxsize}")
        check_fps(fps)
        for name, value in (("open_timeout_s", open_timeout_s), ("read_timeout_s", read_timeout_s),
                            ("reconnect_timeout_s", reconnect_timeout_s),
                            ("backoff_initial_s", backoff_initial_s)):
            if value <= 0:
                raise UsageError(f"{name} must be positive, got {value}")

        self.live = live
        self.policy = policy
        self.maxsize = maxsize
        self.fps = fps
        self.open_timeout_s = open_timeout_s
        self.read_timeout_s = read_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = max(backoff_max_s, backoff_initial_s)
        self.rtsp_transport = rtsp_transport
        self.analyze_duration_s = analyze_duration_s
        self.stall_s = stall_s
        self.resolution: tuple[int, int] | None = None  # (width, height) of the last frame
        self._target = target
        self._is_webcam = isinstance(target, int)
        self._sampler = _Sampler(fps)
        self._buffer: deque[tuple[Frame, float]] = deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._finished = False
        self._error: BaseException | None = None
        self._last_drop_warning = float("-inf")

        started = time.monotonic()
        cap = self._open_capture(open_timeout_s)
        if cap is None:
            raise SourceError(f"cannot open {self.name}: {self._open_hint()}")
        self._opened_at = time.monotonic()
        log.info("opened %s in %.1f s", self.describe(), self._opened_at - started)
        self._thread = threading.Thread(target=self._run, args=(cap,), daemon=True,
                                        name="hermes-live-reader")
        self._thread.start()

    # -- opening -------------------------------------------------------------------------------

    def _ffmpeg_options(self) -> str:
        """FFmpeg demuxer options in OpenCV's ``key;value|key;value`` syntax."""
        parts = []
        if str(self._target).lower().startswith(("rtsp://", "rtsps://")):
            parts.append(f"rtsp_transport;{self.rtsp_transport}")
        if self.analyze_duration_s > 0:
            parts.append(f"analyzeduration;{int(self.analyze_duration_s * 1e6)}")
        return "|".join(parts)

    def _open_capture(self, open_timeout_s: float) -> cv2.VideoCapture | None:
        """Open a fresh capture; None when it does not open (the reason is in FFmpeg's log)."""
        try:
            if self._is_webcam:
                # No timeout parameters: backends that do not know them refuse to open.
                cap = cv2.VideoCapture(self._target)
            else:
                params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, max(100, int(open_timeout_s * 1000)),
                          cv2.CAP_PROP_READ_TIMEOUT_MSEC, max(100, int(self.read_timeout_s * 1000))]
                with _ENV_LOCK:
                    user_options = os.environ.get(FFMPEG_OPTIONS_ENV)
                    ours = self._ffmpeg_options()
                    if user_options is None and ours:  # a user's own setting wins
                        os.environ[FFMPEG_OPTIONS_ENV] = ours
                    try:
                        cap = cv2.VideoCapture(str(self._target), cv2.CAP_FFMPEG, params)
                    finally:
                        if user_options is None and ours:
                            os.environ.pop(FFMPEG_OPTIONS_ENV, None)
        except cv2.error:
            return None
        if not cap.isOpened():
            cap.release()
            return None
        return cap

    def _open_hint(self) -> str:
        if self._is_webcam:
            device = Path(f"/dev/video{self._target}")
            if os.name == "posix" and not device.exists():
                return (f"no such camera ({device} does not exist); "
                        f"list cameras with `ls /dev/video*`")
            return ("the camera is missing, busy or not supported; check the index and that no "
                    "other program uses it")
        return (f"connection refused, unreachable or not a video stream (waited up to "
                f"{self.open_timeout_s:g} s); check that the server is running and the URL is "
                f"right")

    # -- reader thread -------------------------------------------------------------------------

    def _run(self, cap: cv2.VideoCapture) -> None:
        """Reader thread body: hands every outcome (end, error) to the consumer via the queue."""
        self._cap: cv2.VideoCapture | None = cap  # touched by this thread only
        error: BaseException | None = None
        try:
            self._read_loop()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer's thread
            error = exc
        finally:
            if self._cap is not None:
                self._cap.release()  # only this thread uses the capture, so it releases it
                self._cap = None
            with self._cond:
                self._finished = True
                self._error = error
                self._cond.notify_all()

    def _read(self, cap: cv2.VideoCapture):
        try:
            return cap.read()
        except cv2.error:  # a corrupt packet or a dead connection: treat as a failed read
            return False, None

    def _read_loop(self) -> None:
        """Read, stamp, sample and queue frames until stopped, ended or lost for good."""
        last_t_s: float | None = None
        last_arrival: float | None = None
        last_pts_s: float | None = None
        index = 0
        while not self._stop.is_set():
            ok, bgr = self._read(self._cap)
            captured_at = time.monotonic()
            if self._stop.is_set():
                break
            gap_start_t_s = None
            if not ok or bgr is None:
                if not self.live:
                    break  # end of a file over HTTP
                gap_start_t_s = last_t_s if last_t_s is not None else captured_at - self._opened_at
                log.warning("lost %s at t=%.1f s; reconnecting for up to %g s", self.name,
                            gap_start_t_s, self.reconnect_timeout_s)
                self._cap.release()
                self._cap = None
                reopened = self._reconnect(captured_at, gap_start_t_s)
                if reopened is None:
                    break  # closed while reconnecting
                self._cap, bgr, captured_at = reopened

            t_s = self._timestamp(self._cap, captured_at, last_t_s, index)
            pts_s = self._cap.get(cv2.CAP_PROP_POS_MSEC) / 1000.0
            if gap_start_t_s is None and self.live and last_arrival is not None \
                    and captured_at - last_arrival > self._stall_limit_s():
                gap_start_t_s = last_t_s
                log.warning("%s stalled: no frame for %.1f s (its own timestamps advanced %.1f s)", self.name,
                            captured_at - last_arrival,
                            pts_s - last_pts_s if last_pts_s is not None and pts_s > 0 else float("nan"))
            last_t_s, last_arrival, last_pts_s = t_s, captured_at, pts_s
            if gap_start_t_s is not None:
                gap = Gap(gap_start_t_s, t_s)
                with self._cond:
                    self.gaps.append(gap)
                    self._stats.gaps += 1
                self._sampler.reset()
                log.warning("%s is back: gap of %.1f s (t=%.1f..%.1f s)", self.name,
                            gap.duration_s, gap.start_t_s, gap.end_t_s)
            height, width = bgr.shape[:2]
            if self.resolution != (width, height):
                if self.resolution is not None:
                    log.info("%s changed resolution %dx%d -> %dx%d", self.name,
                             *self.resolution, width, height)
                self.resolution = (width, height)
            with self._cond:
                self._stats.frames_read += 1
            if self._sampler.due(t_s):
                # Frames in between were read (and counted) but are not converted or queued.
                self._put(Frame(t_s, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), index), captured_at)
            index += 1

    def _stall_limit_s(self) -> float:
        if self.stall_s is not None:
            return self.stall_s
        fps = self._cap.get(cv2.CAP_PROP_FPS) if self._cap is not None else 0.0
        return max(1.0, 4.0 / fps) if fps and fps > 0 and fps < 1000 else 1.0

    def _timestamp(self, cap: cv2.VideoCapture, captured_at: float, last_t_s: float | None,
                   index: int) -> float:
        """Capture clock for live sources, PTS for files; always strictly increasing."""
        if self.live:
            t_s = captured_at - self._opened_at
        else:
            t_s = cap.get(cv2.CAP_PROP_POS_MSEC) / 1000.0
            if last_t_s is not None and t_s <= last_t_s:  # some streams report no PTS
                t_s = index / (cap.get(cv2.CAP_PROP_FPS) or 25.0)
        if last_t_s is not None and t_s <= last_t_s:
            t_s = last_t_s + 1e-6  # frames FFmpeg buffered while probing arrive in one burst
        return t_s

    def _reconnect(self, lost_at: float, lost_t_s: float):
        """Reopen with backoff until a frame is read, or raise after the deadline.

        Returns:
            ``(capture, first_bgr_frame, captured_at)``, or None if the source was closed.

        Raises:
            SourceError: no frame could be read within `reconnect_timeout_s` of the loss.
        """
        deadline = lost_at + self.reconnect_timeout_s
        delay_s = self.backoff_initial_s
        attempts = 0
        while not self._stop.is_set():
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            attempts += 1
            cap = self._open_capture(min(self.open_timeout_s, remaining_s))
            if cap is not None:
                ok, bgr = self._read(cap)
                if ok and bgr is not None:
                    with self._cond:
                        self._stats.reconnects += 1
                    log.info("reconnected to %s after %d attempt(s)", self.name, attempts)
                    return cap, bgr, time.monotonic()
                cap.release()
            log.debug("reconnect attempt %d to %s failed", attempts, self.name)
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            if self._stop.wait(min(delay_s, remaining_s)):
                return None
            delay_s = min(delay_s * 2, self.backoff_max_s)
        if self._stop.is_set():
            return None
        message = (f"lost {self.name} at t={lost_t_s:.1f} s and could not reconnect within "
                   f"{self.reconnect_timeout_s:g} s ({attempts} attempts); check that the stream "
                   f"is running, or raise reconnect_timeout_s")
        raise SourceError(message)  # not logged too: the consumer reports it (the CLI's one error line)

    def _put(self, frame: Frame, captured_at: float) -> None:
        with self._cond:
            if self.policy == "latest":
                while len(self._buffer) >= self.maxsize:
                    self._buffer.popleft()  # the oldest goes: the consumer wants fresh frames
                    self._stats.frames_dropped += 1
                    self._warn_dropping()
            else:
                while len(self._buffer) >= self.maxsize and not self._stop.is_set():
                    self._cond.wait(0.1)  # fifo: wait for the consumer, lose nothing
                if self._stop.is_set():
                    return
            self._buffer.append((frame, captured_at))
            self._stats.frames_sampled += 1
            self._cond.notify_all()

    def _warn_dropping(self) -> None:
        """Say (at most every DROP_WARNING_INTERVAL_S) that the consumer cannot keep up."""
        now = time.monotonic()
        if now - self._last_drop_warning >= DROP_WARNING_INTERVAL_S:
            self._last_drop_warning = now
            log.warning("consumer of %s is slower than the source: %d frames dropped so far, "
                        "lag %.2f s", self.name, self._stats.frames_dropped, self._stats.lag_s)

    # -- consumer side -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Frame]:
        return self

    def __next__(self) -> Frame:
        """Take the next queued frame, waiting for one.

        Raises:
            StopIteration: the source ended or was closed.
            SourceError: the stream was lost and did not come back in time.
        """
        with self._cond:
            while not self._buffer:
                if self._error is not None:
                    raise self._error
                if self._finished or self._stop.is_set():
                    raise StopIteration
                self._cond.wait(0.25)
            frame, captured_at = self._buffer.popleft()
            self._cond.notify_all()  # a fifo reader may be waiting for room
            lag_s = time.monotonic() - captured_at
            self._stats.frames_taken += 1
            self._stats.lag_s = lag_s
            self._stats.max_lag_s = max(self._stats.max_lag_s, lag_s)
        return frame

    def request_stop(self) -> None:
        """Make iteration end soon (safe from a signal handler: it only sets an event)."""
        self._stop.set()

    def now_s(self) -> float | None:
        """Seconds since the stream opened: the clock frames are stamped with (live only)."""
        return time.monotonic() - self._opened_at if self.live else None

    def close(self) -> None:
        """Stop the reader thread and release the capture (waits up to the read timeout)."""
        self._stop.set()
        with self._cond:
            self._buffer.clear()
            self._cond.notify_all()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.read_timeout_s + 1.0)

    @property
    def name(self) -> str:
        """What the source is, without credentials (``live stream rtsp://***@host/x``)."""
        if self._is_webcam:
            return f"webcam {self._target}"
        kind = "live stream" if self.live else "video over HTTP"
        return f"{kind} {redact_url(self._target)}"

    def describe(self) -> str:
        fps = f"{self.fps:g} fps" if self.fps else "all frames"
        size = f", {self.resolution[0]}x{self.resolution[1]}" if self.resolution else ""
        return f"{self.name} ({fps}, {self.policy} queue of {self.maxsize}{size})"
