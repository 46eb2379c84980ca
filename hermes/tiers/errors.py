"""Errors of a persistent memory directory, each one line that names the directory and the fix.

They derive from `hermes.errors.UsageError` (exit code 2): every one of them is fixed by the user
choosing another ``--memory-dir``, freeing the one in use, or repairing a damaged one
(``hermes-video memory repair DIR``). A directory the operating system will not let us use (disk
full, read-only, a file where a folder belongs) is a `hermes.errors.StorageError` (exit code 3),
made by `storage_error`.
"""

from __future__ import annotations

import errno
import os

from hermes.errors import StorageError, UsageError


class MemoryDirError(UsageError):
    """A memory directory that cannot be used: another model's, in use, not ours, or too small."""


class RecordCorruptError(MemoryDirError):
    """A record whose stored bytes fail their checksum (or are cut short); names the record."""


class MemoryDamagedError(MemoryDirError):
    """Damage that is not a crash's torn tail (a manifest shorter than its segments, a missing file):
    a writable open refuses instead of cutting, and names ``hermes-video memory repair``."""


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
