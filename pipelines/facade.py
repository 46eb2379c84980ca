"""`hermes.open(source, model=..., memory=..., **overrides)`: a recording and a model as one session, in one line.

    with hermes.open("video.mp4", model="micro-llava-onevision", memory="hermes-4k") as session:
        print(session.ask("What is moving?", at=12.0).answer)

Everything a bad argument can be told by (the configuration, the model's name, the source's path) is
checked before torch is imported, and fails with the project's own one-line errors, as `run` does;
this module imports nothing heavy at import time, so `import hermes` stays light.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import TYPE_CHECKING, Any

from hermes.errors import ConfigError, UsageError, did_you_mean

if TYPE_CHECKING:
    from hermes.pipelines.session import StreamingSession

log = logging.getLogger(__name__)


def override_items(overrides: dict[str, Any]) -> list[str]:
    """Keyword overrides as `section.key=value` items (`budget=2048` -> `memory.budget=2048`).

    A keyword is a field of exactly one of the model, memory and stream sections (`hermes.config`);
    the model's name and the memory preset have arguments of their own.

    Raises:
        ConfigError: an unknown keyword (with a did-you-mean), or a value that is not JSON-like.
    """
    from hermes.config import SECTIONS

    sections = {f.name: section for section, cls in SECTIONS.items() for f in dataclasses.fields(cls) if f.name != "name"}
    items = []
    for key, value in overrides.items():
        if key not in sections:
            raise ConfigError(f"unknown setting {key!r}{did_you_mean(key, sections)}; hermes.open takes the keys "
                              f"of hermes/config.py's model, memory and stream sections (e.g. budget=2048, fps=1.0)")
        try:
            text = json.dumps(value)  # YAML reads JSON: the value arrives as given, a string stays a string
        except TypeError:
            raise ConfigError(f"{key}: expected a number, string, bool or list, found {type(value).__name__}") from None
        items.append(f"{sections[key]}.{key}={text}")
    return items


def open_session(source: str | os.PathLike, model: str = "auto", memory: str | None = None,
                 **overrides: Any) -> StreamingSession:
    """Open a recording, load a model and return a `StreamingSession` streaming that recording.

    Questions are asked as on any session (`ask(question, options=..., at=seconds)` encodes the
    frames before `at`, then answers); use it as a context manager, or call `close()`, so the
    video is released.

    Args:
        source: a video file, an image folder, or an http(s) URL of a video file (live cameras and
            streams: `hermes-video run` or `serve`).
        model: a model preset, hub id, local directory or builtin id (`micro-llava-onevision`,
            `tiny-llava-onevision`); "auto" picks one for the device.
        memory: a memory preset (`hermes-4k`, `full`, `sliding`, ...); None: the model's bounded one.
        **overrides: settings of `hermes/config.py` by field name, e.g. `budget=2048`, `fps=1.0`,
            `max_new_tokens=16`, `device="cpu"`.

    Returns:
        The session, its memory empty, at the start of the recording.

    Raises:
        ConfigError: an unknown memory preset or setting, or a value out of range.
        ModelError: an unknown model, or one that cannot be loaded.
        SourceError: a missing or unreadable video.
        UsageError: a live source, or a memory that cannot hold the video.
    """
    from hermes.config import build_config
    from hermes.model_registry import resolve_source
    from hermes.pipelines.run import check_capacity, check_source_spec, source_options
    from hermes.pipelines.sources import is_live, open_source  # OpenCV, not torch
    from hermes.redact import redact_url

    if not isinstance(model, str) or not model:
        raise ConfigError(f"model: expected a model name, found {model!r}")
    if memory is not None and not isinstance(memory, str):
        raise ConfigError(f"memory: expected a memory preset name, found {memory!r}")
    items = override_items(overrides)
    spec = os.fspath(source) if isinstance(source, os.PathLike) else source
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = str(spec)  # a webcam index: refused below as live, with the others
    if not isinstance(spec, str):
        raise UsageError(f"source: expected a path or URL of a recording, found {source!r}")
    cfg = build_config(model=model, memory=memory, overrides=items, default_memory=True)
    resolve_source(cfg.model.name, cfg.model.hub_id)
    check_source_spec(spec)
    if is_live(spec):  # refused before a camera or stream is opened
        raise UsageError(f"hermes.open reads recordings; {redact_url(spec)} is a live source: use `hermes-video "
                         f"run` or `serve` (README: Live cameras and streams)")

    from hermes.models.loading import load_model  # the heavy part: torch, transformers
    from hermes.pipelines.session import StreamingSession

    frames = open_source(spec, fps=cfg.stream.fps, **source_options(cfg, spec))
    try:
        info = getattr(frames, "info", None)
        adapter = load_model(cfg.model)
        note = check_capacity(adapter, cfg, info.duration_s if info is not None else None, live=False)
        if note:
            log.warning(note)
        return StreamingSession(adapter, cfg.memory, frames, chunk_frames=cfg.stream.chunk_frames,
                                max_new_tokens=cfg.model.max_new_tokens, on_close=frames.close)
    except BaseException:
        frames.close()
        raise
