"""Durable file primitives: whole writes, atomic replacement, directory fsync, exact reads, the lock. Crash
safety rests on fsync of a file (its data), fsync of its folder (a new name) and an atomic ``rename``."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """The one folder every hermes-video cache lives under (weights digests, S3 read-through caches):
    ``HERMES_CACHE_DIR``, else ``$XDG_CACHE_HOME/hermes-video``, else ``~/.cache/hermes-video``.
    """
    explicit = os.environ.get("HERMES_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hermes-video"


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write every byte (``os.write`` may write fewer), at `offset` if given (pwrite), else appended."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset) if offset is not None else os.write(fd, view)
        view = view[n:]
        if offset is not None:
            offset += n


def write_buffers(fd: int, buffers: list, offset: int) -> None:
    """Write buffers back to back at `offset` with ``pwritev`` (no joined copy), finishing short writes."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    first = 0  # views before it are written (an index: popping the list's front is quadratic in a group)
    while first < len(views):
        n = os.pwritev(fd, views[first:first + 512], offset)  # stay well under IOV_MAX
        offset += n
        while first < len(views) and n >= len(views[first]):
            n -= len(views[first])
            first += 1
        if n:
            views[first] = views[first][n:]


def read_exact(path: Path, offset: int, length: int) -> bytes:
    """Read `length` bytes at `offset`; fewer are returned only if the file is shorter."""
    with open(path, "rb", buffering=0) as f:
        chunks, got = [], 0
        while got < length:
            chunk = os.pread(f.fileno(), length - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `path` so that a crash leaves the old file or the new one: temp, fsync, rename, fsync folder."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    """`write_bytes_atomic` of pretty, key-sorted JSON."""
    write_bytes_atomic(path, (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode())


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(*buffers: bytes | memoryview) -> str:
    """Hex SHA-256 of the buffers' bytes, back to back."""
    h = hashlib.sha256()
    for b in buffers:
        h.update(b)
    return h.hexdigest()


def lock_directory(directory: Path, pid_file: Path) -> tuple[int | None, int | None]:
    """Take an exclusive ``flock`` on the directory itself without waiting, and record our pid.

    On the folder's inode, not a file in it, so replacing the pid file cannot let a second writer in;
    the kernel releases it when the process dies (even by SIGKILL).

    Args:
        directory: The folder to lock (must exist).
        pid_file: Where the holder's pid is written (for messages only).

    Returns:
        ``(descriptor, stale_pid)`` when taken (closing the descriptor releases it; stale_pid: a
        previous holder's pid left in `pid_file`, or None); ``(None, holder_pid)`` when held elsewhere.
    """
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, read_pid(pid_file)
    previous = read_pid(pid_file)
    try:
        write_bytes_atomic(pid_file, f"{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd, previous if previous not in (None, os.getpid()) else None


def read_pid(pid_file: Path) -> int | None:
    """The pid written in a lock's pid file, or None if there is none or it is unreadable."""
    try:
        text = pid_file.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
