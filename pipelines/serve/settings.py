"""`ServeSettings`: how `serve` listens and what it admits (the model, memory and stream stay in
`HermesConfig`); `check_settings` refuses a bad one in one line (exit 2) before anything heavy loads."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from hermes.errors import UsageError

API_KEY_ENV = "HERMES_API_KEY"
MIN_KEY_CHARS = 16  # a shorter bearer key is guessable; refused rather than trusted


@dataclass(frozen=True)
class ServeSettings:
    """How the server listens and what it admits."""

    host: str = "127.0.0.1"  # loopback by default; any other bind needs an API key
    port: int = 8000
    api_key: str | None = None  # bearer key every endpoint asks for (None: no auth, loopback only)
    max_streams: int = 4  # streams open at once; one more is a 503 with Retry-After
    memory_root: str | None = None  # a folder or s3://bucket/prefix: stream NAME's memory is memory_root/NAME
    allow_source: tuple[str, ...] = ()  # source patterns clients may name (push is always allowed)
    max_request_bytes: int = 8 * 2**20  # largest request body (a pushed frame), bytes
    max_push_fps: float = 30.0  # frames per second a push client may send per stream
    retry_after_s: int = 5  # what a 503 tells the client to wait


def is_loopback(host: str) -> bool:
    """Whether `host` binds to loopback only (127.0.0.0/8, ::1 or the name localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def memory_root_problem(memory_root: str) -> str | None:
    """Why streams cannot keep memory under `memory_root`, a folder or ``s3://bucket/prefix`` (None: they
    can, as far as can be told without the store: `StreamTable.problem` asks it); `/readyz` asks again."""
    if "://" in memory_root:
        from hermes.tiers.s3 import parse_location  # not at the top: hermes.tiers loads torch

        try:
            parse_location(memory_root, flag="")
        except UsageError as exc:
            return str(exc).strip()
        if importlib.util.find_spec("boto3") is None:
            return f"{memory_root} needs boto3: pip install 'hermes-video[s3]'"
        return None
    root = Path(memory_root)
    if root.exists() and not root.is_dir():
        return f"expects a directory, found a file: {memory_root}"
    parent = root if root.exists() else next((p for p in root.parents if p.exists()), Path("."))
    return None if os.access(parent, os.W_OK) else f"needs a writable folder: {parent} is not writable"


def check_settings(settings: ServeSettings) -> ServeSettings:
    """Refuse settings the server cannot or must not start with.

    Returns:
        The settings, with the API key taken from `HERMES_API_KEY` when none was given.

    Raises:
        UsageError: a port out of range, a non-loopback bind without an API key, a short key, a memory
            root that is a file or cannot be created, a bad allowlist pattern or limit.
    """
    from dataclasses import replace

    from hermes.pipelines.serve.security import Allowlist

    key = settings.api_key if settings.api_key is not None else os.environ.get(API_KEY_ENV) or None
    settings = replace(settings, api_key=key)
    if not 1 <= settings.port <= 65535:
        raise UsageError(f"--port expects a TCP port 1-65535, found {settings.port}")
    if not settings.host.strip():
        raise UsageError("--host is empty: give an address to bind, e.g. 127.0.0.1")
    if key is not None and len(key) < MIN_KEY_CHARS:
        raise UsageError(f"the API key is {len(key)} characters; use at least {MIN_KEY_CHARS} "
                         f"(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(24))'`)")
    if not is_loopback(settings.host) and key is None:
        raise UsageError(f"--host {settings.host} listens beyond this machine: give --api-key KEY or set "
                         f"{API_KEY_ENV} (or bind 127.0.0.1)")
    if settings.max_streams < 1:
        raise UsageError(f"--max-streams expects at least 1, found {settings.max_streams}")
    if settings.max_request_bytes < 1024:
        raise UsageError(f"--max-request-bytes expects at least 1024, found {settings.max_request_bytes}")
    if not settings.max_push_fps > 0:
        raise UsageError(f"--max-push-fps expects a positive number, found {settings.max_push_fps}")
    if settings.memory_root is not None and (problem := memory_root_problem(settings.memory_root)):
        raise UsageError(f"--memory-root {problem}")
    Allowlist(settings.allow_source)  # raises on a bad pattern
    return settings
