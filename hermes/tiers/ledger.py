"""What a record store keeps about its records, whatever holds their bytes: `RecordLedger`, the shared half
of `hermes.tiers.disk.DiskStore` and `hermes.tiers.remote.RemoteStore`."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from hermes.errors import StorageError
from hermes.tiers.codec import from_safetensors
from hermes.tiers.errors import MemoryDirError, RecordCorruptError, storage_error
from hermes.tiers.manifest import Entry
from hermes.tiers.records import Record

# a commit group closes at this size even while more records are queued: on disk small enough that
# the syncer flushes one group while the writer encodes the next and large enough that fsyncs stay
# few (this machine's ext4: 16 MiB in groups of 4 MiB cost 1.25 x the fsync time of one group)
GROUP_BYTES = 4 << 20
# in an object store, where each group costs two PUTs and a lease check whatever its size: 32 MiB of
# ~23 KB records into SeaweedFS on loopback reached 0.39-0.42 of one plain PUT in groups of 4 MiB,
# 0.50-0.53 in 8 and 0.55-0.59 in 16 (`bench_store_write`, alternated twice)
OBJECT_GROUP_BYTES = 16 << 20
BATCH_ITEMS = 256  # the most queue items a writer takes at once


def parse_checked(data: bytes, record_id: int, where: str, hint: str) -> Record:
    """The record in bytes whose checksum already held; `RecordCorruptError` if they are not record `record_id`."""
    try:
        record = from_safetensors(data)
    except ValueError as exc:
        raise RecordCorruptError(f"{where}: checksum matches but the bytes are no record ({exc}){hint}") from exc
    if record.record_id != record_id:
        raise RecordCorruptError(f"{where}: holds record {record.record_id} instead{hint}")
    return record


class RecordLedger:
    """The shared half of a record store: committed entries, queued records, ids and the writer's queue.

    Subclasses set ``_entries``, ``_pending``, ``_next_id``, ``_recorded_next_id``, ``_queue``,
    ``_error``, ``directory``, ``readonly``, ``_closed``, ``_writer`` and ``_lock``, write and commit bytes
    their own way, and implement ``load``.
    """

    def load(self, record_id: int) -> Record:
        raise NotImplementedError

    def _lookup(self, record_id: int) -> Entry | Record:
        """A committed record's entry, else the queued record itself; KeyError if neither."""
        with self._lock:
            entry = self._entries.get(record_id)
            pending = self._pending.get(record_id)
        if entry is not None:
            return entry
        if pending is not None:
            return pending
        raise KeyError(f"record {record_id} is not in memory directory {self.directory}")

    # ---- writing ---------------------------------------------------------------------------------

    def add(self, record: Record, prepare: bool = True) -> None:
        """Queue a record for writing; it is committed (durable) once `flush` returns.

        The record must not be modified afterwards. Until committed, `load` returns it as given.

        Args:
            prepare: Pass it through the store's `prepare` function (False: write it as given).

        Raises:
            MemoryDirError: The store is read-only or closed, or an earlier write failed.
            ValueError: A record with this id is already stored or queued.
        """
        self._raise_if_failed()
        if self.readonly or self._closed:
            raise MemoryDirError(f"memory directory {self.directory} is {'read-only' if self.readonly else 'closed'}")
        with self._lock:
            if record.record_id in self._entries or record.record_id in self._pending:
                raise ValueError(f"record {record.record_id} is already stored")
            self._pending[record.record_id] = record
            self._next_id = max(self._next_id, record.record_id + 1)
        self._queue.put(("rec", (record, prepare)))

    def remove(self, ids: list[int]) -> None:
        """Queue the removal of records (ids not held are ignored), after everything queued before it, so a
        record added and then removed is never left behind; durable once `flush` returns.
        """
        self._raise_if_failed()
        if ids and not self.readonly:
            self._queue.put(("rm", list(ids)))

    def call_on_writer(self, job: Callable[[], None]) -> None:
        """Run `job` on the writer thread once everything queued before it is committed (checkpoints and
        index saves must follow the records they claim); its exceptions are its own.

        Raises:
            MemoryDirError: The store is read-only or closed, or an earlier write failed.
        """
        self._raise_if_failed()
        if self.readonly or self._closed or self._writer is None:
            why = "read-only" if self.readonly else "closed"
            raise MemoryDirError(f"memory directory {self.directory} has no writer ({why})")
        self._queue.put(("call", job))

    def flush(self) -> None:
        """Wait until every record added so far is committed.

        Raises:
            MemoryDirError: A write failed (disk full, I/O error, record larger than the capacity).
        """
        if self._writer is not None and self._writer.is_alive():
            done = threading.Event()
            self._queue.put(("flush", done))
            done.wait()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            if isinstance(err, (MemoryDirError, StorageError)):
                raise err
            if isinstance(err, OSError):
                raise storage_error(self.directory, "writing", err) from err
            raise MemoryDirError(f"writing to memory directory {self.directory} failed: {err}") from err

    # ---- the writer thread's batches -------------------------------------------------------------

    def _end_batch(self, batch: list, write_header: Callable[[], None]) -> bool:
        """Wake a written batch's flushes; on a stop, make the id counter durable (ids handed out but never
        stored must not come back after a restart). True: stop.
        """
        for kind, payload in batch:
            if kind == "flush":
                payload.set()
        if not any(kind == "stop" for kind, _ in batch):
            return False
        if self._error is None and self._next_id > self._recorded_next_id:
            try:
                write_header()
            except BaseException as exc:  # raised to the caller by close
                self._error = exc
        return True

    # ---- reading ---------------------------------------------------------------------------------

    def embedding(self, record_id: int) -> torch.Tensor | None:
        """A record's embedding (read from its bytes), or None if it is gone or damaged."""
        try:
            return self.load(record_id).embedding
        except (KeyError, MemoryDirError):
            return None

    def entries(self) -> list[Entry]:
        """Committed records' manifest entries, oldest first."""
        with self._lock:
            return list(self._entries.values())

    def ids(self) -> list[int]:
        """Ids of committed and queued records."""
        with self._lock:
            return list(self._entries) + [i for i in self._pending if i not in self._entries]

    def pending_ids(self) -> list[int]:
        """Ids of records queued but not yet committed."""
        with self._lock:
            return [i for i in self._pending if i not in self._entries]

    def __contains__(self, record_id: int) -> bool:
        with self._lock:
            return record_id in self._entries or record_id in self._pending

    @property
    def next_id(self) -> int:
        """One more than the largest record id this directory has ever held, been given or handed out."""
        return self._next_id

    def note_id(self, record_id: int) -> None:
        """Record that `record_id` is in use elsewhere (e.g. in DRAM), so it is never handed out."""
        with self._lock:
            self._next_id = max(self._next_id, record_id + 1)

    def reserve_id(self) -> int:
        """A fresh record id; ids are never handed out twice, across restarts too (saved on close)."""
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            return rid

    @property
    def recorded_next_id(self) -> int:
        """One more than the largest id the manifest's durable lines name (what a restart will see)."""
        return self._recorded_next_id

    @property
    def num_records(self) -> int:
        """Committed records."""
        return len(self._entries)
