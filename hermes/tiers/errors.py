"""Errors of a persistent memory directory, each one line naming the directory and the fix: usage errors
(exit 2), or a `StorageError` (exit 3, `storage_error`) for what the operating system refuses."""

from __future__ import annotations

import errno
import os

from hermes.errors import StorageError, UsageError


class MemoryDirError(UsageError):
    """A memory directory that cannot be used: another model's, in use, not ours, or too small."""


class RecordCorruptError(MemoryDirError):
    """A record whose stored bytes fail their checksum (or are cut short); names the record."""


class MemoryDamagedError(MemoryDirError):
    """Damage that is not a crash's torn tail: a writable open refuses it and names ``memory repair``."""


_STORAGE_HINTS = {errno.ENOSPC: "the disk is full; free space or point --memory-dir elsewhere",
                  errno.EDQUOT: "the disk quota is exhausted; free space or point --memory-dir elsewhere",
                  errno.EROFS: "the file system is read-only; use a writable --memory-dir",
                  errno.EACCES: "permission denied; use a --memory-dir you can write",
                  errno.EPERM: "permission denied; use a --memory-dir you can write",
                  errno.ENOTDIR: "a file stands where a folder belongs; use another --memory-dir",
                  errno.EISDIR: "a folder stands where a file belongs; use another --memory-dir",
                  errno.EEXIST: "a file stands where a folder belongs; use another --memory-dir"}


def storage_error(directory: os.PathLike | str, what: str, exc: OSError) -> StorageError:
    """A one-line `StorageError` (exit 3) for an OS error met while `what` in a memory directory."""
    hint = _STORAGE_HINTS.get(exc.errno, "check the disk and the folder's permissions")
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return StorageError(f"memory directory {directory}: {what} failed: {os.strerror(exc.errno or 0)}{where}; "
                        f"{hint}; records committed before this are kept")
