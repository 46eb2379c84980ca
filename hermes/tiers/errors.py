"""Errors of a persistent memory directory, each one line that names the directory and the fix.

They derive from `hermes.errors.UsageError` (exit code 2): every one of them is fixed by the user
choosing another ``--memory-dir``, freeing the one in use, or repairing / deleting a damaged one.
"""

from __future__ import annotations

from hermes.errors import UsageError


class MemoryDirError(UsageError):
    """A memory directory that cannot be used: another model's, in use, not ours, or too small."""


class RecordCorruptError(MemoryDirError):
    """A record whose stored bytes fail their checksum (or are cut short); names the record."""
