"""The open streams, and admission: a new stream is refused (503) rather than run out of memory.

A stream's estimate is its working cache at its largest, (budget + position_reserve) tokens x layers
x keys and values x KV heads x head size x bytes (`full`: the model's whole position range), against
the capacity measured when the model loaded. With `--memory-root` (a folder or ``s3://bucket/prefix``),
stream NAME lives in ROOT/NAME and its spec in the stream table (`table.StreamTable`), which this
registry owns: a restarted server adopts every saved stream again (docs/ARCHITECTURE.md, Serving).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from hermes.errors import HermesError, UsageError, check_keys
from hermes.pipelines.serve.events import Watch, check_watch
from hermes.pipelines.serve.security import Allowlist
from hermes.pipelines.serve.settings import ServeSettings
from hermes.pipelines.serve.stream import Stream
from hermes.pipelines.serve.table import StreamTable
from hermes.redact import redact_url

log = logging.getLogger(__name__)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
STREAM_KEYS = ("source", "memory", "fps", "name")
MAX_FPS = 30.0
RETRY_MARGIN_S = 0.5  # an adoption refused by a lease is tried again this long after the lease expires


class Full(HermesError):
    """No room for another stream (HTTP 503 with Retry-After)."""


class Conflict(HermesError):
    """A stream of that name is already open (HTTP 409)."""


class NotFound(HermesError):
    """No such stream (HTTP 404)."""


class NotAdopted(HermesError):
    """A saved stream that could not be opened again (HTTP 503); `retry_after_s`: seconds until it is tried
    again (None: it is not)."""

    def __init__(self, message: str, retry_in_s: float | None = None) -> None:
        super().__init__(message)
        self._retry_at = None if retry_in_s is None else time.monotonic() + retry_in_s

    @property
    def retry_after_s(self) -> float | None:
        return None if self._retry_at is None else max(self._retry_at - time.monotonic(), 0.0)


def cache_bytes_estimate(model, cfg) -> int:
    """Bytes the stream's working cache reaches at its largest (see the module docstring)."""
    import torch

    text = model.text_config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = text.num_hidden_layers * 2 * heads * head_dim * torch.empty((), dtype=model.dtype).element_size()
    tokens = model.max_position_embeddings if cfg.memory.policy == "full" else cfg.memory.budget
    return (tokens + cfg.memory.position_reserve) * per_token


def measure_capacity_bytes(model) -> int:
    """Memory streams may take: 90% of free CUDA memory, or half the available host memory on CPU."""
    import torch

    if model.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(model.device)
        return int(free * 0.9)
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.5)


def holds_session(directory: str | Path, s3=None) -> bool:
    """Whether a memory directory (a folder or ``s3://bucket/prefix``, reached with `s3`, an `S3Settings`)
    holds a session checkpoint to resume.

    Raises:
        StorageError: the object store cannot be read.
    """
    from hermes.pipelines.persistence import CHECKPOINT
    from hermes.tiers.checkpoint import CHECKPOINTS, list_checkpoints
    from hermes.tiers.s3 import S3Location, S3Objects, parse_location

    location = parse_location(directory)
    if isinstance(location, S3Location):
        return S3Objects(location, s3).get(f"{CHECKPOINTS}/{CHECKPOINT}.json") is not None
    return location.is_dir() and any(c.get("name") == CHECKPOINT for c in list_checkpoints(location))


class Registry:
    """Creates, lists, deletes and adopts streams; `capacity_bytes` is what admission may hand out (None:
    measured now), `resolve_config(memory)` the server's configuration with a stream's memory preset."""

    def __init__(self, settings: ServeSettings, scheduler, resolve_config: Callable[[str | None], Any],
                 capacity_bytes: int | None = None) -> None:
        from hermes.tiers.remote_level import remote_options

        self.settings = settings
        self.scheduler = scheduler
        self.allowlist = Allowlist(settings.allow_source)
        self.resolve_config = resolve_config
        self.capacity_bytes = capacity_bytes if capacity_bytes is not None else \
            measure_capacity_bytes(scheduler.model)
        self.refused = 0  # admissions refused (503)
        self.s3 = remote_options(resolve_config(None).memory).settings  # how an s3:// root is reached
        self.table = StreamTable(settings.memory_root, self.s3) if settings.memory_root is not None else None
        self.unadopted: dict[str, NotAdopted] = {}  # saved streams that could not be opened again, and why
        self._streams: dict[str, Stream] = {}
        self._reserved: dict[str, int] = {}  # id -> estimated bytes, from admission until deletion
        self._retries: dict[str, threading.Timer] = {}  # adoptions tried again once a lease expires
        self._closed = False
        self._lock = threading.Lock()

    def get(self, stream_id: str) -> Stream | None:
        return self._streams.get(stream_id)

    def all(self) -> list[Stream]:
        return list(self._streams.values())

    @property
    def reserved_bytes(self) -> int:
        return sum(self._reserved.values())

    def _check_body(self, body: Any) -> tuple[str | None, str | None, float | None, str | None]:
        if not isinstance(body, dict):
            raise UsageError('expected a JSON object: {"source": "rtsp://..." or "push", "memory"?, "fps"?, "name"?}')
        check_keys(body, STREAM_KEYS, "a stream")
        source, memory, fps, name = (body.get(k) for k in STREAM_KEYS)
        if not isinstance(source, str) or not source.strip():
            raise UsageError('"source" must be a source URL or path, or "push"')
        if memory is not None and not isinstance(memory, str):
            raise UsageError('"memory" must be a memory preset name')
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float))
                                or not 0 < fps <= MAX_FPS):
            raise UsageError(f'"fps" must be a number of frames per second in (0, {MAX_FPS:g}], found {fps!r}')
        if name is not None and (not isinstance(name, str) or not NAME_RE.match(name)):
            raise UsageError('"name" must be 1-64 letters, digits, ".", "_" or "-", starting with a letter or digit')
        return (None if source == "push" else source), memory, fps, name

    def create(self, body: Any, watches: Sequence[dict] = ()) -> Stream:
        """Admit, open and start a stream from a `POST /v1/streams` body (the one place streams open), with
        `watches` (`check_watch` bodies) asked from the start; with a memory root its spec is saved.

        Raises:
            UsageError: a bad body, watch, memory preset or fps (422); Forbidden: a source outside the
            allowlist (403); SourceError: a source that cannot be opened (422); Conflict: the name is
            open (409); Full: no room (503); LeaseHeld: another process writes the stream's memory (503);
            StorageError: the memory root's store failed (503).
        """
        from hermes.pipelines.interactive import check_live_memory
        from hermes.pipelines.run import check_source_spec
        from hermes.pipelines.sources import open_source

        source_spec, memory, fps, name = self._check_body(body)
        standing = [check_watch(w) for w in watches]
        cfg = self.resolve_config(memory)
        if fps is not None:
            cfg.stream = dataclasses.replace(cfg.stream, fps=float(fps))
        # every served stream is live: bounded memory, checkpointed every chunk (at most the chunk in flight lost)
        cfg.memory = check_live_memory(cfg.memory, True, memory is not None)
        if source_spec is not None:
            self.allowlist.check(source_spec)
            check_source_spec(source_spec)
        stream_id = name or f"s-{secrets.token_hex(4)}"
        estimate = cache_bytes_estimate(self.scheduler.model, cfg)
        with self._lock:
            if stream_id in self._reserved:
                raise Conflict(f"a stream named {stream_id!r} is already open; DELETE it first or choose another name")
            if len(self._reserved) >= self.settings.max_streams:
                self.refused += 1
                raise Full(f"{len(self._reserved)} streams are open, the most this server takes (--max-streams)")
            if self.reserved_bytes + estimate > self.capacity_bytes:
                self.refused += 1
                raise Full(f"not enough device memory for another stream: it needs about {estimate / 2**20:.0f} MiB, "
                           f"{(self.capacity_bytes - self.reserved_bytes) / 2**20:.0f} MiB are left")
            self._reserved[stream_id] = estimate
        source = stream = None
        try:
            memory_dir, resume = self._memory_dir(stream_id)
            if source_spec is not None:
                source = open_source(source_spec, fps=cfg.stream.fps)
            stream = Stream(stream_id, cfg, source_spec, memory_dir,
                            max_pending=2 * cfg.stream.live_chunk_frames, max_push_fps=self.settings.max_push_fps,
                            opened_from={"source": body["source"], "memory": memory, "fps": fps, "name": stream_id})
            resumed_t_s = self.scheduler.open(stream, resume).result()
            stream.start(source, self.scheduler.wake, resumed_t_s)
            source = None  # the stream's now: closed with it
            for question, every_s in standing:
                self.scheduler.add_watch(stream, Watch(question, every_s, due_s=stream.clock_s() + every_s))
            self._save(stream)
        except BaseException:
            if source is not None:
                source.close()
            if stream is not None and stream.session is not None:
                self.scheduler.close(stream).result(timeout=120)
            with self._lock:
                self._reserved.pop(stream_id, None)
            raise
        self._streams[stream_id] = stream
        self.unadopted.pop(stream_id, None)
        if resumed_t_s is not None:
            log.info("stream %s resumed %d frames from %s", stream_id, stream.resumed_frames, memory_dir)
        return stream

    def _memory_dir(self, name: str) -> tuple[str | None, bool]:
        """The stream's memory directory under --memory-root and whether it holds a session to resume."""
        root = self.settings.memory_root
        if root is None:
            return None, False
        path = f"{root.rstrip('/')}/{name}" if "://" in root else str(Path(root) / name)
        return path, holds_session(path, self.s3)

    def _save(self, stream: Stream) -> None:
        """Write `stream`'s spec to the table (with a memory root): how it was opened, and its watches."""
        if self.table is not None:
            self.table.put(stream.id, {**stream.opened_from, "watches": [w.spec() for w in stream.watches]})

    def add_watch(self, stream: Stream, question: str, every_s: float) -> Watch:
        """Start asking `question` every `every_s` stream seconds on `stream`, and save it with the stream."""
        watch = Watch(question, every_s, due_s=stream.clock_s() + every_s)
        self.scheduler.add_watch(stream, watch)
        self._save(stream)
        return watch

    def delete(self, stream_id: str) -> Stream | None:
        """Close a stream and forget it (it is not adopted again; its memory directory is checkpointed and
        kept); a saved stream that was not adopted is forgotten. None if there is no open stream."""
        stream = self._streams.get(stream_id)
        if stream is None and stream_id not in self.unadopted:
            return None
        if self.table is not None:
            self.table.remove(stream_id)  # first: a crash while closing must not bring it back
        self.unadopted.pop(stream_id, None)
        if (retry := self._retries.pop(stream_id, None)) is not None:
            retry.cancel()
        return self._close(stream_id)

    def _close(self, stream_id: str) -> Stream | None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return None
        try:
            self.scheduler.close(stream).result(timeout=120)
        finally:
            with self._lock:
                self._reserved.pop(stream_id, None)
        return stream

    def close(self) -> None:
        """Close every stream, keeping their specs (a restarted server adopts them); stop retrying adoptions."""
        self._closed = True
        for timer in list(self._retries.values()):
            timer.cancel()
        for stream in self.all():
            try:
                self._close(stream.id)
            except Exception as exc:  # noqa: BLE001 - close the rest
                log.warning("closing %s: %s", stream.id, exc)

    # ---- adoption ----------------------------------------------------------------------------------

    def adopt(self, name: str) -> Stream:
        """Open stream `name` again from its saved spec: its memory resumes (a file continues from its
        checkpoint, a live source reconnects, a push stream takes frames again) and its watches come back.

        Raises:
            NotFound: no spec is saved under `name` (or the server has no memory root).
            DamagedSpec: the saved spec is not one (it is kept).
            HermesError: as `create`.
        """
        spec = self.table.get(name) if self.table is not None else None
        if spec is None:
            raise NotFound(f"no saved stream {name!r} to adopt")
        return self.create({k: spec[k] for k in STREAM_KEYS}, watches=spec["watches"])

    def adopt_all(self) -> dict[str, str]:
        """Adopt every saved stream that is not open (once the model is loaded).

        Returns:
            name -> "ok" or the one-line reason it was not adopted (it stays saved, is listed with status
            "error", and is tried again when another process's lease on its memory expires).
        """
        if self.table is None:
            return {}
        try:
            names = self.table.names()
        except HermesError as exc:
            log.warning("stream table: %s", exc)  # /readyz reports it
            return {}
        return {name: self._adopt_or_note(name) for name in names if name not in self._streams}

    def _adopt_or_note(self, name: str) -> str:
        """Adopt `name`; on failure note why (credentials hidden), and retry once a lease will have expired."""
        if self._closed:
            return "the server is shutting down"
        if name in self._streams:
            return "ok"
        try:
            self.adopt(name)
            log.info("adopted stream %s", name)
            return "ok"
        except Exception as exc:  # noqa: BLE001 - one stream's failure must not keep the others closed
            message = " ".join(redact_url(str(exc)).split()) or type(exc).__name__
            retry_s = getattr(exc, "retry_after_s", None)
            if retry_s is not None:
                message += f"; this server tries again in {retry_s + RETRY_MARGIN_S:.0f} s"
            self.unadopted[name] = NotAdopted(f"stream {name!r} is saved but could not be opened again: {message}",
                                              retry_s)
            log.warning("stream %s not adopted: %s", name, message)
            if retry_s is not None and not self._closed:
                timer = threading.Timer(retry_s + RETRY_MARGIN_S, self._adopt_or_note, (name,))
                timer.daemon = True
                self._retries[name] = timer
                timer.start()
            return message
