"""Objects by key: the small interface level 3 needs from a store of immutable blobs, with `LocalObjects`
(a folder: the bounded read-through cache, and a store for tests); the other implementation is
`hermes.tiers.s3.S3Objects`."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

from hermes.tiers.files import fsync_dir, write_bytes_atomic


class PreconditionFailed(Exception):
    """A create-only put met an existing key, or a compare-and-swap met another ETag."""


class ObjectStore:
    """Blobs by ``/``-separated keys: get, ranged get, create-only or compare-and-swap put, listing after
    a key (S3 ``StartAfter``), delete.
    """

    name: str  # where the objects live, for messages (credentials never in it)

    def get(self, key: str) -> tuple[bytes, str] | None:
        raise NotImplementedError

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of an object; FileNotFoundError if it is missing."""
        raise NotImplementedError

    def put(self, key: str, data: bytes, *, create_only: bool = False, if_match: str | None = None) -> str:
        """Store `data` under `key`; returns its ETag.

        Raises:
            PreconditionFailed: ``create_only`` and the key exists (S3 ``If-None-Match: *``), or
                `if_match` and the object's ETag is another (S3 ``If-Match``).
        """
        raise NotImplementedError

    def keys(self, prefix: str, after: str = "") -> list[str]:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError


def etag_of(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class LocalObjects(ObjectStore):
    """Objects as files under `root` (atomic writes; create-only and compare-and-swap under a lock).

    Args:
        root: The folder (created if missing).
        capacity_bytes: When set, a bounded cache: past it, the least recently used objects are
            deleted (they are copies; the truth is elsewhere). None keeps everything.
    """

    def __init__(self, root: str | Path, capacity_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.name = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._used: OrderedDict[str, int] = OrderedDict()  # bounded caches only: key -> bytes, oldest use first
        if capacity_bytes is not None:
            for path in sorted(self.root.rglob("*"), key=lambda p: p.stat().st_mtime if p.is_file() else 0):
                if path.is_file() and not path.name.startswith("."):
                    self._used[path.relative_to(self.root).as_posix()] = path.stat().st_size
        self._total = sum(self._used.values())

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"object key {key!r} leaves {self.root}")
        return self.root / key

    def _touch(self, key: str, size: int | None) -> None:
        if self.capacity_bytes is None:
            return
        with self._lock:
            if size is None:
                if key in self._used:
                    self._used.move_to_end(key)
                return
            self._total += size - self._used.get(key, 0)
            self._used[key] = size
            self._used.move_to_end(key)
            while self._total > self.capacity_bytes and len(self._used) > 1:
                old, old_size = self._used.popitem(last=False)
                self._total -= old_size
                self._path(old).unlink(missing_ok=True)

    def get(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        self._touch(key, None)
        return data, etag_of(data)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        with open(self._path(key), "rb") as f:
            data = os.pread(f.fileno(), length, offset)
        self._touch(key, None)
        return data

    def put(self, key: str, data: bytes, *, create_only: bool = False, if_match: str | None = None) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if create_only or if_match is not None:
            # another process may race us for the same key: the folder's flock makes check-and-write one step
            fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._check(path, create_only, if_match)
                write_bytes_atomic(path, data)
            finally:
                os.close(fd)
        else:
            write_bytes_atomic(path, data)
        self._touch(key, len(data))
        return etag_of(data)

    @staticmethod
    def _check(path: Path, create_only: bool, if_match: str | None) -> None:
        exists = path.exists()
        if create_only and exists:
            raise PreconditionFailed(f"{path} exists")
        if if_match is not None and (not exists or etag_of(path.read_bytes()) != if_match):
            raise PreconditionFailed(f"{path} changed")

    def keys(self, prefix: str, after: str = "") -> list[str]:
        folder = self._path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        if not folder.is_dir():
            return []
        found = (p.relative_to(self.root).as_posix() for p in folder.rglob("*") if p.is_file()
                 and not p.name.startswith("."))
        return sorted(k for k in found if k.startswith(prefix) and k > after)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        with self._lock:
            self._total -= self._used.pop(key, 0)
        if path.parent.exists():
            fsync_dir(path.parent)
