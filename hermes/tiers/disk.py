"""Memory level 3 on a local disk: append-only segment files, crash-safe, bounded in bytes
(docs/ARCHITECTURE.md, Memory, "Level 3's files"); OS errors become a one-line `StorageError` (exit 3)."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hermes.tiers.batch_queue import BatchQueue
from hermes.tiers.codec import encode_record, scan_segment
from hermes.errors import StorageError
from hermes.tiers.errors import MemoryDirError, RecordCorruptError, storage_error
from hermes.tiers.files import (
    fsync_dir,
    lock_directory,
    read_exact,
    sha256,
    write_all,
    write_buffers,
    write_bytes_atomic,
)
from hermes.tiers.fingerprint import check_or_create
from hermes.tiers.manifest import (
    MANIFEST,
    SEGMENTS,
    SUFFIX,
    Entry,
    del_line,
    drop_line,
    header_line,
)
from hermes.tiers import ledger
from hermes.tiers.ledger import RecordLedger, parse_checked
from hermes.tiers.records import Record
from hermes.tiers.recovery import recover

LOCK = "lock"
__all__ = ["MANIFEST", "SEGMENTS", "SUFFIX", "DiskStore", "VerifyReport"]
_COMPACT_MIN_BYTES = 4096  # below this, dead manifest lines are not worth a rewrite
# room kept for one drop line, or the header line `close` may append
_DROP_RESERVE = max(len(drop_line(f"{10**9}{SUFFIX}")), len(header_line(10**15)))


@dataclass
class VerifyReport:
    """Result of `DiskStore.verify`: ``ok`` is False when any record or the manifest is damaged."""

    ok: bool = True
    problems: list[str] = field(default_factory=list)  # damage: checksum, missing bytes, bad lines
    notes: list[str] = field(default_factory=list)  # harmless leftovers of a crash, repaired on open
    records_checked: int = 0
    bytes_checked: int = 0


class _Active:
    """The segment being appended to: name, open descriptor, size, whether its name is durable."""

    def __init__(self, name: str, fd: int, size: int, new: bool) -> None:
        self.name, self.fd, self.size, self.new = name, fd, size, new


class DiskStore(RecordLedger):
    """Append-only record store (docs/ARCHITECTURE.md, Memory, "Level 3's files").

    Args:
        directory: The memory directory (created if missing).
        capacity_bytes: Bound on `disk_bytes`.
        fingerprint: Model/config fingerprint; another's directory is refused. None accepts any (only
            for reading an existing directory).
        segment_bytes: Roll to a new segment past this size; default capacity/16 clamped to
            [64 KiB, 256 MiB], so dropping one segment frees a small share of the budget.
        queue_size: Records the writer may lag behind before `add` blocks.
        readonly: Open without the lock, without repairs and without a writer (inspect/verify).
        prepare: Applied to each record on the writer thread before it is written.
        on_drop: Called on the writer thread with the ids of records that left the disk.
        record_overhead_bytes: Bytes counted per live record beyond its own (the index's share).
        on_commit: Called on the syncer thread with the ids of each group once it is durable.
        min_next_id: How far a checkpoint saw the manifest reach (`hermes.tiers.recovery.recover`).
        min_tail: ``(segment, extent)`` a checkpoint saw committed (`committed_tail`).

    Raises:
        MemoryDirError: Another model's directory, not a memory directory, or in use by another
            process; `MemoryDamagedError` for damage that is not a crash's leftover.
        StorageError: The directory cannot be created, read or written (exit code 3).
    """

    def __init__(self, directory: str | Path, capacity_bytes: int, fingerprint: dict | None, *,
                 segment_bytes: int | None = None, queue_size: int = 32, readonly: bool = False,
                 prepare: Callable[[Record], Record] | None = None,
                 on_drop: Callable[[list[int]], None] | None = None, record_overhead_bytes: int = 0,
                 on_commit: Callable[[list[int]], None] | None = None, min_next_id: int = 0,
                 min_tail: tuple[str, int] | None = None) -> None:
        self.directory = Path(directory)
        self.capacity_bytes = int(capacity_bytes)
        self.segment_bytes = int(segment_bytes or min(max(self.capacity_bytes // 16, 64 << 10), 256 << 20))
        self.readonly = readonly
        self.record_overhead_bytes = int(record_overhead_bytes)
        self._prepare, self._on_drop, self._on_commit = prepare, on_drop, on_commit
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        # groups for the syncer: (segment, new, entries, buffers); two
        # at most, so that the records they hold (pending until committed) stay bounded
        self._sync_queue: queue.Queue = queue.Queue(maxsize=2)
        self.open_problems: list[str] = []  # damage found on open (records lost)
        self.open_notes: list[str] = []  # crash leftovers found (and, unless readonly, repaired) on open
        self.stale_lock_pid: int | None = None  # pid of a writer that died holding the directory
        if readonly:
            if not (self.directory / MANIFEST).exists() and not (self.directory / SEGMENTS).is_dir():
                raise MemoryDirError(f"{self.directory} is not a hermes memory directory (no {MANIFEST})")
        else:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise storage_error(self.directory, "creating the folder", exc) from exc
            self._take_lock()
        try:
            self.fingerprint = check_or_create(self.directory, fingerprint, create=not readonly)
            if not readonly:
                (self.directory / SEGMENTS).mkdir(exist_ok=True)
            self._open_manifest(min_next_id, min_tail)
        except OSError as exc:
            self._release_lock()
            raise storage_error(self.directory, "opening", exc) from exc
        except BaseException:
            self._release_lock()
            raise
        self._pending: dict[int, Record] = {}
        self._group: list[Entry] = []
        self._group_buffers: list = []  # the group's record bytes, back to back from its first entry's offset
        self._group_bytes = 0
        self._uncommitted = 0  # entries written but not yet committed (this group's and the syncer's)
        self._active: _Active | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._queue = BatchQueue(queue_size)
        self._writer: threading.Thread | None = None
        self._syncer: threading.Thread | None = None
        if not readonly:
            self._syncer = threading.Thread(target=self._run_syncer, name=f"hermes-sync-{self.directory.name}",
                                            daemon=True)
            self._syncer.start()
            self._writer = threading.Thread(target=self._run, name=f"hermes-disk-{self.directory.name}", daemon=True)
            self._writer.start()

    # ---- opening ---------------------------------------------------------------------------------

    def _take_lock(self) -> None:
        if not self.directory.is_dir():
            raise StorageError(f"memory directory {self.directory} is not a folder; use another --memory-dir")
        try:
            self._lock_fd, other = lock_directory(self.directory, self.directory / LOCK)
        except OSError as exc:
            raise storage_error(self.directory, "locking", exc) from exc
        if self._lock_fd is None:
            who = f"process {other}" if other is not None else "another process"
            raise MemoryDirError(f"memory directory {self.directory} is in use by {who}; "
                                 "wait for it to finish or use another --memory-dir")
        if other is not None:
            self.stale_lock_pid = other
            self.open_notes.append(f"{LOCK}: left by process {other}, which stopped without closing the "
                                   f"directory (a crash); taken over")

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            try:
                (self.directory / LOCK).unlink(missing_ok=True)  # a clean close leaves no pid behind
            except OSError:
                pass
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _open_manifest(self, min_next_id: int = 0, min_tail: tuple[str, int] | None = None) -> None:
        """Recover the store's state from its files (cutting crash leftovers unless read-only)."""
        fix = not self.readonly
        state = recover(self.directory, fix, min_next_id, min_tail)
        self.open_problems += state.problems
        self.open_notes += state.notes
        self._entries: dict[int, Entry] = state.entries
        self._by_segment = state.by_segment
        self._seg_lines = state.seg_lines  # live manifest-line bytes per segment, for the cap checks
        self._group_lines = 0  # manifest-line bytes of entries written but not yet committed
        self._next_id = self._recorded_next_id = state.next_id  # the latter: what the manifest implies
        self._seg_sizes = state.seg_sizes
        self._seg_total = sum(self._seg_sizes.values())
        self._next_segment = state.next_segment
        self._manifest_size = state.manifest_size
        path = self.directory / MANIFEST
        self._manifest_fd = None
        if not fix:
            return
        if not path.exists():
            self._rewrite_manifest()
            return
        self._manifest_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        if self._dead_manifest_bytes() > max(self._live_manifest_bytes(), _COMPACT_MIN_BYTES):
            self._rewrite_manifest()

    # ---- public: writing -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, stop the writer, release the directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._writer is not None and self._writer.is_alive():
                self._queue.put(("stop", None))
                self._writer.join()
        finally:
            if self._syncer is not None and self._syncer.is_alive():
                self._sync_queue.put(None)  # after the writer's last commit, which waited for it
                self._syncer.join()
            for fd in (self._active.fd if self._active else None, self._manifest_fd):
                if fd is not None:
                    os.close(fd)
            self._active = None
            self._manifest_fd = None
            self._release_lock()
        self._raise_if_failed()

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- public: reading -------------------------------------------------------------------------

    def load(self, record_id: int) -> Record:
        """Read a record back, as stored (compressed), after checking its checksum.

        Raises:
            KeyError: No such record (never stored, or dropped).
            RecordCorruptError: Its bytes are missing, cut short, fail the checksum or do not parse.
        """
        entry = self._lookup(record_id)
        if isinstance(entry, Record):  # queued, not yet committed: as given
            return entry
        path = self.directory / SEGMENTS / entry.segment
        where = f"record {record_id} in {path} (bytes {entry.offset}..{entry.offset + entry.length})"
        hint = f"; run `hermes-video memory verify {self.directory}`"
        try:
            data = read_exact(path, entry.offset, entry.length)
        except FileNotFoundError:
            if record_id not in self._entries:  # dropped while we were reading
                raise KeyError(f"record {record_id} was removed from {self.directory}") from None
            raise RecordCorruptError(f"{where}: segment file is missing{hint}") from None
        if len(data) != entry.length:
            raise RecordCorruptError(f"{where}: cut short, {len(data)} of {entry.length} bytes{hint}")
        if sha256(data) != entry.sha256:
            raise RecordCorruptError(f"{where}: bytes fail their sha256 checksum{hint}")
        return parse_checked(data, record_id, where, hint)

    def committed_tail(self) -> tuple[str, int] | None:
        """``(segment, extent)``: the newest segment holding committed records, and the end of its last one.

        Segments only grow until dropped, so a later manifest naming less of it has lost committed lines
        (`hermes.tiers.recovery.recover`).
        """
        with self._lock:
            if not self._by_segment:
                return None
            name = max(self._by_segment)
            return name, max(self._entries[rid].offset + self._entries[rid].length for rid in self._by_segment[name])

    def scanned_records(self) -> int:
        """Records the segment files hold, read from the files themselves (for `verify`'s counts)."""
        return sum(len(scan_segment(p.read_bytes())[0]) for p in sorted((self.directory / SEGMENTS).glob("*")))

    @property
    def disk_bytes(self) -> int:
        """Segments + manifest + the per-record overhead, now; the cap bounds it at every moment."""
        with self._lock:
            return self._used()

    def segments(self) -> dict[str, dict]:
        """Per segment file: ``{"bytes", "records"}``."""
        with self._lock:
            return {name: {"bytes": size, "records": len(self._by_segment.get(name, ()))}
                    for name, size in sorted(self._seg_sizes.items())}

    def verify(self) -> VerifyReport:
        """Check every committed record's checksum and structure, and the manifest's readability.

        Returns:
            A `VerifyReport`; problems are damage, notes are crash leftovers (cut on open).
        """
        report = VerifyReport(problems=list(self.open_problems), notes=list(self.open_notes))
        for entry in self.entries():
            try:
                self.load(entry.record_id)
            except RecordCorruptError as exc:
                report.problems.append(str(exc))
            except KeyError:
                continue  # dropped meanwhile
            report.records_checked += 1
            report.bytes_checked += entry.length
        on_disk = {p.name for p in (self.directory / SEGMENTS).glob(f"*{SUFFIX}")}
        with self._lock:
            used = set(self._by_segment) | ({self._active.name} if self._active else set())
        for name in sorted(on_disk - used):
            report.notes.append(f"{SEGMENTS}/{name}: no committed record uses it")
        report.ok = not report.problems
        return report

    # ---- writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._queue.take(ledger.BATCH_ITEMS)
            for kind, payload in batch:
                if kind in ("rec", "rm", "call") and self._error is None:
                    try:
                        if kind == "rec":
                            self._write(*payload)
                            if self._group_bytes >= ledger.GROUP_BYTES:
                                self._hand_off()
                        elif kind == "call":
                            self._commit()  # what the job follows is durable before it runs
                            payload()
                        else:
                            self._commit()  # the records' own lines come first
                            self._remove(payload)
                    except BaseException as exc:  # kept and raised to the caller by add/flush/close
                        self._fail(exc)
            # one commit group spans every batch the queue delivers without waiting, up to
            # GROUP_BYTES: one fsync pair per group, not per batch; a flush or stop waits for the syncer
            if self._error is None:
                try:
                    if any(kind != "rec" for kind, _ in batch):
                        self._commit()
                    elif self._queue.empty():
                        self._hand_off()
                except BaseException as exc:
                    self._fail(exc)
            if self._end_batch(batch, lambda: self._append_manifest(header_line(self._next_id))):
                return

    def _write(self, record: Record, prepare: bool) -> None:
        """Place one record's bytes in the active segment (durable only at `_commit`)."""
        stored = self._prepare(record) if self._prepare and prepare else record
        buffers, length = encode_record(stored)
        digest = sha256(*buffers)
        # the entry where the record would land now; with the next segment's name and a 13-digit
        # offset its line is at least as long as wherever a drop or a roll may move it
        next_name, active = f"{self._next_segment:06d}{SUFFIX}", self._active
        entry = Entry.of(stored, active.name if active else next_name, active.size if active else 0, length, digest)
        line_bound = len(entry.line()) - len(entry.segment) - len(str(entry.offset)) + len(next_name) + 13
        need = length + 2 * line_bound + self.record_overhead_bytes  # its line counts twice, see _bound
        if not self._make_room(need):
            with self._lock:
                self._pending.pop(record.record_id, None)
            if self._on_drop:
                self._on_drop([record.record_id])
            raise MemoryDirError(
                f"record {record.record_id} needs {need} bytes on disk but the memory directory "
                f"{self.directory} is capped at {self.capacity_bytes} bytes; raise the disk budget")
        if self._active is None or (self._active.size and self._active.size + length > self.segment_bytes):
            self._roll()
        active = self._active
        if entry.segment != active.name or entry.offset != active.size:  # a roll or a drop moved it
            entry = entry.placed(active.name, active.size, digest)
        # the bytes are written by the syncer, the whole group's in one pwritev (one call, not one per record)
        self._group_buffers += buffers
        with self._lock:
            active.size += length
            self._seg_sizes[active.name] = active.size
            self._seg_total += length
            self._group.append(entry)
            self._group_lines += len(entry.line())
            self._uncommitted += 1
        self._group_bytes += length

    def _remove(self, ids: list[int]) -> None:
        """Forget committed records: drop segments left empty, a ``del`` line for the rest."""
        with self._lock:
            gone = [i for i in ids if i in self._entries]
            segments = {self._entries[i].segment for i in gone}
            whole = [s for s in segments if self._by_segment.get(s, set()) <= set(gone)]
            partial = [i for i in gone if self._entries[i].segment not in whole]
        for name in whole:
            self._drop_segment(name, notify=False)
        if partial:
            self._append_manifest(del_line(partial))
            with self._lock:
                for rid in partial:
                    e = self._entries.pop(rid)
                    self._by_segment[e.segment].discard(rid)
                    self._seg_lines[e.segment] -= len(e.line())

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:  # the first failure is the one to report (the writer's or the syncer's)
            self._error = exc

    def _hand_off(self) -> None:
        """Pass the group (its entries and the buffers holding its bytes) to the syncer."""
        if not self._group:
            return
        active = self._active  # every group entry is in the active segment (rolls commit first)
        self._sync_queue.put((active, active.new, self._group, self._group_buffers))
        active.new = False  # the syncer fsyncs the folder for it
        self._group, self._group_buffers, self._group_bytes = [], [], 0

    def _commit(self) -> None:
        """Hand the group off and wait for the syncer; raise its error if any group failed to commit."""
        self._hand_off()
        self._sync_queue.join()
        if self._error is not None:
            raise self._error

    def _run_syncer(self) -> None:
        while (job := self._sync_queue.get()) is not None:
            try:
                if self._error is None:  # after a failed group, no later group may commit
                    self._sync_group(*job)
            except BaseException as exc:
                self._fail(exc)
            finally:
                self._sync_queue.task_done()
        self._sync_queue.task_done()

    def _sync_group(self, active: _Active, new: bool, group: list[Entry], buffers: list) -> None:
        """Syncer thread: write the group's bytes (one pwritev), fsync its segment (and folder), then
        append and fsync its lines."""
        write_buffers(active.fd, buffers, group[0].offset)
        os.fsync(active.fd)
        if new:
            fsync_dir(self.directory / SEGMENTS)
        lines = b"".join(e.line() for e in group)
        self._write_manifest(lines)
        ids = [e.record_id for e in group]
        with self._lock:  # a group's entries are all in one segment (a roll commits first)
            self._recorded_next_id = max(self._recorded_next_id, max(ids) + 1)
            self._entries.update(zip(ids, group))
            self._by_segment.setdefault(active.name, set()).update(ids)
            self._seg_lines[active.name] = self._seg_lines.get(active.name, 0) + len(lines)
            pending = self._pending
            for rid in ids:
                pending.pop(rid, None)
            self._group_lines -= len(lines)
            self._uncommitted -= len(group)
        if self._on_commit:
            self._on_commit(ids)

    def _roll(self) -> None:
        """Commit, then start a new segment file."""
        self._commit()
        if self._active is not None:
            os.close(self._active.fd)
        name = f"{self._next_segment:06d}{SUFFIX}"
        self._next_segment += 1
        fd = os.open(self.directory / SEGMENTS / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with self._lock:
            self._active = _Active(name, fd, 0, new=True)
            self._seg_sizes[name] = 0

    def _make_room(self, need: int) -> bool:
        """Drop oldest segments (and compact the manifest) until `need` more bytes fit; False if they cannot."""
        while self._bound() + need > self.capacity_bytes:
            self._commit()  # dropping and compacting act on committed records: the syncer's groups first
            dead = self._dead_manifest_bytes()
            if dead and (dead > self._live_manifest_bytes() or not self._by_segment):
                self._rewrite_manifest()  # amortised: only once dead lines outweigh live ones
                continue
            oldest = next(iter(self._by_segment), None)  # segments are kept oldest first
            if oldest is None:
                return False
            self._drop_segment(oldest)
        return True

    def _drop_segment(self, name: str, notify: bool = True) -> None:
        """Remove a whole segment: durable ``drop`` line first, then the file."""
        if self._active is not None and self._active.name == name:
            self._commit()  # queued records in it go too, and their lines must precede the drop
        self._append_manifest(drop_line(name))
        with self._lock:
            ids = sorted(self._by_segment.pop(name, ()))
            for rid in ids:
                del self._entries[rid]
            self._seg_lines.pop(name, None)
            self._seg_total -= self._seg_sizes.pop(name, 0)
            if self._active is not None and self._active.name == name:
                os.close(self._active.fd)
                self._active = None
        # no directory fsync: if a crash undoes the unlink, the file is an orphan (its records are
        # dropped by the durable line above) and the next open deletes it
        os.unlink(self.directory / SEGMENTS / name)
        if self._on_drop and ids and notify:
            self._on_drop(ids)
        if self._dead_manifest_bytes() > max(self._live_manifest_bytes(), _COMPACT_MIN_BYTES):
            self._rewrite_manifest()

    # ---- manifest file ---------------------------------------------------------------------------

    def _append_manifest(self, lines: bytes) -> None:
        """Writer thread: a line that must follow every group handed off (a drop, a del, a header)."""
        self._sync_queue.join()
        self._write_manifest(lines)

    def _write_manifest(self, lines: bytes) -> None:
        write_all(self._manifest_fd, lines)
        os.fsync(self._manifest_fd)
        with self._lock:
            self._manifest_size += len(lines)

    def _rewrite_manifest(self) -> None:
        """Replace the manifest by its live lines only (temp file, fsync, rename, fsync directory)."""
        path = self.directory / MANIFEST
        self._sync_queue.join()  # the syncer appends to the manifest being replaced
        with self._lock:
            body = header_line(self._next_id) + b"".join(e.line() for e in self._entries.values())
            self._recorded_next_id = self._next_id
        write_bytes_atomic(path, body)  # the atomic switch: before the rename the old manifest stands, after it the new
        with self._lock:
            if self._manifest_fd is not None:
                os.close(self._manifest_fd)
            self._manifest_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._manifest_size = len(body)

    def _live_manifest_bytes(self) -> int:
        return len(header_line(self._next_id)) + sum(self._seg_lines.values())

    def _dead_manifest_bytes(self) -> int:
        return max(self._manifest_size - self._live_manifest_bytes(), 0)

    def _used(self) -> int:
        """Bytes on disk now (segments + manifest) plus the per-record overhead."""
        return self._seg_total + self._manifest_size + self.record_overhead_bytes * len(self._entries)

    def _bound(self) -> int:
        """The directory's peak need, checked against the cap before every write: `_used` with queued
        records, their lines, one ``drop`` line and a manifest rewrite's temp file.
        """
        with self._lock:  # the syncer moves entries from uncommitted to committed meanwhile
            live_lines = self._live_manifest_bytes() + self._group_lines
            return (self._used() + self._group_lines + _DROP_RESERVE + live_lines
                    + self.record_overhead_bytes * self._uncommitted)
