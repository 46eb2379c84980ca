"""The open streams, and admission: a new stream is refused (503) rather than run out of memory.

A stream's estimate is its working cache at its largest, (budget + position_reserve) tokens x layers
x keys and values x KV heads x head size x bytes (`full`: the model's whole position range), against
the capacity measured when the model loaded. With `--memory-root`, stream NAME lives in ROOT/NAME and
resumes from it when created again under that name.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import threading
from pathlib import Path
from typing import Any, Callable

from hermes.errors import HermesError, UsageError, check_keys
from hermes.pipelines.serve.security import Allowlist
from hermes.pipelines.serve.settings import ServeSettings
from hermes.pipelines.serve.stream import Stream

log = logging.getLogger(__name__)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
STREAM_KEYS = ("source", "memory", "fps", "name")
MAX_FPS = 30.0


class Full(HermesError):
    """No room for another stream (HTTP 503 with Retry-After)."""


class Conflict(HermesError):
    """A stream of that name is already open (HTTP 409)."""


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


def holds_session(directory: str | Path) -> bool:
    """Whether a memory directory holds a session checkpoint to resume."""
    from hermes.pipelines.persistence import CHECKPOINT
    from hermes.tiers.checkpoint import list_checkpoints

    path = Path(directory)
    return path.is_dir() and any(c.get("name") == CHECKPOINT for c in list_checkpoints(path))


class Registry:
    """Creates, lists and deletes streams; `capacity_bytes` is what admission may hand out (None: measured
    now), `resolve_config(memory)` the server's configuration with a stream's memory preset."""

    def __init__(self, settings: ServeSettings, scheduler, resolve_config: Callable[[str | None], Any],
                 capacity_bytes: int | None = None) -> None:
        self.settings = settings
        self.scheduler = scheduler
        self.allowlist = Allowlist(settings.allow_source)
        self.resolve_config = resolve_config
        self.capacity_bytes = capacity_bytes if capacity_bytes is not None else \
            measure_capacity_bytes(scheduler.model)
        self.refused = 0  # admissions refused (503)
        self._streams: dict[str, Stream] = {}
        self._reserved: dict[str, int] = {}  # id -> estimated bytes, from admission until deletion
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

    def create(self, body: Any) -> Stream:
        """Admit, open and start a stream from a `POST /v1/streams` body.

        Raises:
            UsageError: a bad body, memory preset or fps (422); Forbidden: a source outside the
            allowlist (403); SourceError: a source that cannot be opened (422); Conflict: the name is
            open (409); Full: no room (503).
        """
        from hermes.pipelines.interactive import check_live_memory
        from hermes.pipelines.run import check_source_spec
        from hermes.pipelines.sources import open_source

        source_spec, memory, fps, name = self._check_body(body)
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
        source = None
        try:
            memory_dir, resume = self._memory_dir(stream_id)
            if source_spec is not None:
                source = open_source(source_spec, fps=cfg.stream.fps)
            stream = Stream(stream_id, cfg, source_spec, memory_dir,
                            max_pending=2 * cfg.stream.live_chunk_frames, max_push_fps=self.settings.max_push_fps)
            resumed_t_s = self.scheduler.open(stream, resume).result()
            stream.start(source, self.scheduler.wake, resumed_t_s)
        except BaseException:
            if source is not None:
                source.close()
            with self._lock:
                self._reserved.pop(stream_id, None)
            raise
        self._streams[stream_id] = stream
        if resumed_t_s is not None:
            log.info("stream %s resumed %d frames from %s", stream_id, stream.resumed_frames, memory_dir)
        return stream

    def _memory_dir(self, name: str) -> tuple[str | None, bool]:
        """The stream's memory directory under --memory-root and whether it holds a session to resume."""
        if self.settings.memory_root is None:
            return None, False
        path = Path(self.settings.memory_root) / name
        return str(path), holds_session(path)

    def delete(self, stream_id: str) -> Stream | None:
        """Close a stream (its memory directory is checkpointed and kept); None if there is none."""
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return None
        try:
            self.scheduler.close(stream).result(timeout=120)
        finally:
            with self._lock:
                self._reserved.pop(stream_id, None)
        return stream
