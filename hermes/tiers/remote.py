"""Level 3 in an object store: `RemoteStore`, the record store of an ``s3://`` memory directory
(docs/ARCHITECTURE.md, Memory, "Level 3 in an object store")."""

from __future__ import annotations

import base64
import json
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from hermes.tiers.batch_queue import BatchQueue
from hermes.tiers.codec import encode_record, scan_segment
from hermes.tiers.disk import VerifyReport
from hermes.tiers.errors import MemoryDirError, RecordCorruptError
from hermes.tiers.files import sha256
from hermes.tiers.fingerprint import FINGERPRINT, compare, normalise
from hermes.tiers.lease import Lease
from hermes.tiers import ledger
from hermes.tiers.ledger import RecordLedger, parse_checked
from hermes.tiers.manifest import Entry
from hermes.tiers.objects import LocalObjects, ObjectStore, PreconditionFailed
from hermes.tiers.records import Record

MANIFEST_PREFIX, SEGMENT_PREFIX = "manifest/", "segments/"
FORMAT = "hermes-memory-objects/1"


def manifest_key(seq: int) -> str:
    return f"{MANIFEST_PREFIX}{seq:012d}.json"


def seal(obj: dict) -> bytes:
    """A manifest object's bytes: the object plus the SHA-256 of its canonical JSON."""
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return json.dumps({**obj, "sha256": sha256(body.encode())}, sort_keys=True, separators=(",", ":")).encode()


def unseal(data: bytes) -> dict | None:
    """The object `seal` made, or None if the bytes do not parse or fail their checksum."""
    try:
        obj = json.loads(data)
        digest = obj.pop("sha256")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    body = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return obj if sha256(body) == digest and obj.get("format") == FORMAT else None


@dataclass
class _Group:
    """A commit group being filled by the writer: its records' bytes, manifest entries and embeddings."""

    segment: str = ""  # its object's key, chosen when the first record comes
    records: list[Record] = field(default_factory=list)
    parts: list = field(default_factory=list)  # the records' safetensors buffers, back to back
    entries: list[dict] = field(default_factory=list)
    embeddings: dict[str, str] = field(default_factory=dict)
    offset: int = 0  # bytes so far


class RemoteStore(RecordLedger):
    """Records in an object store, with `hermes.tiers.disk.DiskStore`'s interface.

    Args:
        objects: The store's objects (the stream's prefix, or its ``dram/`` child).
        cache: Bounded local copies of segment objects.
        capacity_bytes: Bound on the live segment objects' bytes plus `record_overhead_bytes` each.
        lease: The writer's lease (taken by the caller); None opens read-only.
        fingerprint, queue_size, prepare, on_drop, on_commit, record_overhead_bytes: as for `DiskStore`.

    Raises:
        MemoryDirError: Another model's stream, or (read-only) no stream there.
        StorageError: The store cannot be reached (exit code 3).
    """

    def __init__(self, objects: ObjectStore, cache: LocalObjects, capacity_bytes: int, fingerprint: dict | None, *,
                 lease: Lease | None = None, queue_size: int = 32,
                 prepare: Callable[[Record], Record] | None = None,
                 on_drop: Callable[[list[int]], None] | None = None, record_overhead_bytes: int = 0,
                 on_commit: Callable[[list[int]], None] | None = None) -> None:
        self.objects, self.cache, self.lease = objects, cache, lease
        self.directory = objects.name  # for messages, as DiskStore's
        self.capacity_bytes = int(capacity_bytes)
        self.readonly = lease is None
        self.record_overhead_bytes = int(record_overhead_bytes)
        self._prepare, self._on_drop, self._on_commit = prepare, on_drop, on_commit
        self._lock = threading.RLock()
        self.open_problems: list[str] = []
        self.open_notes: list[str] = []
        self._entries: dict[int, Entry] = {}
        self._groups: dict[str, set[int]] = {}  # segment key -> live ids, oldest first
        self._group_bytes: dict[str, int] = {}
        self._embeddings: dict[int, np.ndarray] = {}
        self._pending: dict[int, Record] = {}
        self._epoch = 0  # the highest epoch seen in the manifest so far
        self._seq = 0  # the next manifest sequence number
        self._last_key = ""
        self._next_id = self._recorded_next_id = 0
        self.fingerprint = self._check_fingerprint(fingerprint)
        self.refresh()
        self._error: BaseException | None = None
        self._closed = False
        self._queue = BatchQueue(queue_size)
        self._writer: threading.Thread | None = None
        if lease is not None:
            for attempt in range(3):  # fences a stale writer (docs/ARCHITECTURE.md); one may commit meanwhile
                try:
                    self._put_manifest({"op": "epoch"})
                    break
                except MemoryDirError:
                    if attempt == 2:
                        raise
                    self.refresh()  # take in what it committed, then mark the next number
            self._writer = threading.Thread(target=self._run, name="hermes-remote-writer", daemon=True)
            self._writer.start()

    def _check_fingerprint(self, fingerprint: dict | None) -> dict:
        got = self.objects.get(FINGERPRINT)
        if got is None:
            if self.readonly or fingerprint is None:
                raise MemoryDirError(f"{self.objects.name} is not a hermes memory directory (no {FINGERPRINT}); "
                                     f"expected what `hermes-video run ... --memory-dir s3://...` writes")
            try:
                self.objects.put(FINGERPRINT, json.dumps(normalise(fingerprint), indent=1).encode(), create_only=True)
                return normalise(fingerprint)
            except PreconditionFailed:  # another writer made it at the same moment: compare with theirs
                got = self.objects.get(FINGERPRINT)
        try:
            stored = json.loads(got[0])
        except ValueError as exc:
            raise MemoryDirError(f"{self.objects.name}/{FINGERPRINT} is unreadable ({exc}); use another "
                                 f"--memory-dir") from exc
        return compare(self.objects.name, stored, fingerprint)

    # ---- the manifest ----------------------------------------------------------------------------

    def refresh(self) -> tuple[list[int], list[int]]:
        """Apply manifest objects written since the last one seen; returns ``(added ids, removed ids)``."""
        added, removed = [], []
        for key in self.objects.keys(MANIFEST_PREFIX, after=self._last_key):
            got = self.objects.get(key)
            obj = unseal(got[0]) if got is not None else None
            with self._lock:
                self._last_key = key
                self._seq = max(self._seq, _seq_of(key) + 1)
                if obj is None:
                    self.open_problems.append(f"{key}: fails its checksum or does not parse; skipped (its records "
                                              f"are not served)")
                    continue
                if int(obj.get("epoch", 0)) < self._epoch:
                    self.open_notes.append(f"{key}: written by a fenced writer (epoch {obj.get('epoch')} < "
                                           f"{self._epoch}); ignored")
                    continue
                self._epoch = int(obj.get("epoch", 0))
                self._apply(obj, added, removed)
        return added, removed

    def _apply(self, obj: dict, added: list[int], removed: list[int]) -> None:
        self._recorded_next_id = max(self._recorded_next_id, int(obj.get("next_id", 0)))
        self._next_id = max(self._next_id, self._recorded_next_id)
        if obj["op"] == "add":
            segment = obj["segment"]
            ids = set()
            for line in obj["entries"]:
                entry = Entry.from_obj(line)
                self._entries[entry.record_id] = entry
                ids.add(entry.record_id)
                added.append(entry.record_id)
                vec = obj.get("embeddings", {}).get(str(entry.record_id))
                if vec is not None:
                    self._embeddings[entry.record_id] = np.frombuffer(base64.b64decode(vec), dtype=np.float32)
            self._groups[segment] = ids
            self._group_bytes[segment] = int(obj.get("bytes", 0))
        elif obj["op"] == "del":
            for rid in obj["ids"]:
                entry = self._entries.pop(int(rid), None)
                self._embeddings.pop(int(rid), None)
                if entry is not None:
                    removed.append(entry.record_id)
                    self._groups.get(entry.segment, set()).discard(entry.record_id)
            for segment in [s for s, ids in self._groups.items() if not ids]:
                del self._groups[segment]
                self._group_bytes.pop(segment, None)

    def _put_manifest(self, obj: dict) -> None:
        """Commit one manifest object at the next sequence number, create-only, after the lease check.

        Raises:
            MemoryDirError: The lease is lost, or another writer took this sequence number.
        """
        self.lease.check()
        with self._lock:
            seq = self._seq
            full = {**obj, "format": FORMAT, "seq": seq, "epoch": self.lease.epoch, "next_id": self._next_id}
        try:
            self.objects.put(manifest_key(seq), seal(full), create_only=True)
        except PreconditionFailed:
            raise MemoryDirError(f"memory directory {self.objects.name}: another writer committed manifest {seq} "
                                 f"first; this writer is refused (records it committed before are kept)") from None
        with self._lock:
            self._seq, self._last_key, self._epoch = seq + 1, manifest_key(seq), self.lease.epoch
            self._apply(full, [], [])

    # ---- public: writing (the DiskStore interface) -----------------------------------------------

    def close(self) -> None:
        """Flush and stop the writer (the caller releases the lease). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None and self._writer.is_alive():
            self._queue.put(("stop", None))
            self._writer.join()
        self._raise_if_failed()

    # ---- public: reading -------------------------------------------------------------------------

    def load(self, record_id: int) -> Record:
        """A record as stored, after checking its checksum (see `DiskStore.load`)."""
        entry = self._lookup(record_id)
        if isinstance(entry, Record):  # queued, not yet committed: as given
            return entry
        where = f"record {record_id} in {self.objects.name}/{entry.segment} (bytes {entry.offset}.." \
                f"{entry.offset + entry.length})"
        hint = f"; run `hermes-video memory verify {self.objects.name.split(' at ')[0]}`"
        data = None
        for source in ("cache", "store"):
            data = self._read(entry, source)
            if data is not None and len(data) == entry.length and sha256(data) == entry.sha256:
                break
        else:
            if data is None:
                if record_id not in self._entries:
                    raise KeyError(f"record {record_id} was removed from {self.objects.name}")
                raise RecordCorruptError(f"{where}: segment object is missing{hint}")
            raise RecordCorruptError(f"{where}: bytes fail their sha256 checksum{hint}")
        return parse_checked(data, record_id, where, hint)

    def _read(self, entry: Entry, source: str) -> bytes | None:
        """A record's bytes from the local cache or (a ranged get) from the store, None if missing."""
        key = f"{entry.segment}.{entry.offset}"  # one cached copy per record, not per group
        if source == "cache":
            got = self.cache.get(key)
            return got[0] if got is not None else None
        try:
            data = self.objects.get_range(entry.segment, entry.offset, entry.length)
        except FileNotFoundError:
            return None
        if len(data) == entry.length and sha256(data) == entry.sha256:
            self.cache.put(key, data)
        return data

    def embedding(self, record_id: int) -> torch.Tensor | None:
        """A record's embedding, from its manifest object (no record read), else from the record."""
        with self._lock:
            vec = self._embeddings.get(record_id)
        if vec is not None:
            return torch.from_numpy(vec.copy())
        return super().embedding(record_id)

    @property
    def disk_bytes(self) -> int:
        with self._lock:
            return sum(self._group_bytes.values()) + self.record_overhead_bytes * len(self._entries)

    def segments(self) -> dict[str, dict]:
        with self._lock:
            return {name: {"bytes": self._group_bytes.get(name, 0), "records": len(ids)}
                    for name, ids in self._groups.items()}

    def scanned_records(self) -> int:
        """Records the segment objects hold, read from the objects themselves (for `verify`'s counts)."""
        total = 0
        for name in self.segments():
            got = self.objects.get(name)
            total += len(scan_segment(got[0])[0]) if got is not None else 0
        return total

    def verify(self) -> VerifyReport:
        """Check every committed record against its checksum, from the store (not the cache)."""
        report = VerifyReport(problems=list(self.open_problems), notes=list(self.open_notes))
        for entry in self.entries():
            data = self._read(entry, "store")
            if data is None:
                report.problems.append(f"record {entry.record_id}: segment object {entry.segment} is missing")
            elif len(data) != entry.length or sha256(data) != entry.sha256:
                report.problems.append(f"record {entry.record_id} in {self.objects.name}/{entry.segment}: bytes fail "
                                       f"their sha256 checksum (never served)")
            report.records_checked += 1
            report.bytes_checked += entry.length
        with self._lock:
            used = set(self._groups)
        for key in self.objects.keys(SEGMENT_PREFIX):
            if key not in used:
                report.notes.append(f"{key}: no committed record uses it (a writer stopped before its commit)")
        report.ok = not report.problems
        return report

    # ---- writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        group = _Group()  # records taken from the queue, encoded, not yet committed
        while True:
            try:
                batch = self._queue.take(ledger.BATCH_ITEMS, timeout=max(self.lease.ttl_s / 3, 0.05))
            except queue.Empty:  # idle: keep the lease alive between commits
                if self._error is None:
                    try:
                        self.lease.check()
                    except BaseException as exc:
                        self._error = exc
                continue
            for kind, payload in batch:
                if kind not in ("rec", "rm", "call") or self._error is not None:
                    continue
                try:
                    if kind == "rec":
                        record, prepare = payload
                        self._encode(group, self._prepare(record) if self._prepare and prepare else record)
                        if group.offset >= min(ledger.OBJECT_GROUP_BYTES, max(1, self.capacity_bytes // 4)):
                            group = self._commit(group)
                    elif kind == "call":
                        group = self._commit(group)  # what the job follows is durable before it runs
                        payload()
                    else:
                        group = self._commit(group)  # the records' own commit comes first
                        self._remove(payload)
                except BaseException as exc:  # kept and raised to the caller by add/flush/close
                    self._error = exc
            # one group spans every batch the queue delivers while this writer encodes (two PUTs per
            # group, not per batch of `queue_size` records), up to OBJECT_GROUP_BYTES; a flush or stop commits
            if self._error is None and (self._queue.empty() or any(kind != "rec" for kind, _ in batch)):
                try:
                    group = self._commit(group)
                except BaseException as exc:
                    self._error = exc
            if self._error is not None:
                group = _Group()  # never committed: its records stay readable as pending
            if self._end_batch(batch, lambda: self._put_manifest({"op": "header"})):
                return

    def _encode(self, group: _Group, record: Record) -> None:
        """Add one record's bytes, entry and embedding to the open group (its segment named at the first)."""
        if not group.segment:
            with self._lock:
                group.segment = f"{SEGMENT_PREFIX}{self._seq:012d}.{self.lease.epoch}.{uuid.uuid4().hex[:8]}.seg"
        buffers, length = encode_record(record)
        group.entries.append(Entry.of(record, group.segment, group.offset, length, sha256(*buffers)).obj())
        group.parts += buffers  # they view the record's tensors: `records` keeps it alive until the join
        group.records.append(record)
        group.offset += length
        if record.embedding is not None:
            vec = record.embedding.detach().to("cpu", torch.float32).contiguous().numpy()
            group.embeddings[str(record.record_id)] = base64.b64encode(vec.tobytes()).decode()

    def _commit(self, group: _Group) -> _Group:
        """One segment object for the group, then its create-only manifest object; returns a new group."""
        if not group.records:
            return group
        data = b"".join(group.parts)  # bytes.join takes the memoryviews as they are
        ids = [r.record_id for r in group.records]
        self._make_room(len(data) + self.record_overhead_bytes * len(ids), ids)
        self.objects.put(group.segment, data)
        self._put_manifest({"op": "add", "segment": group.segment, "bytes": len(data), "entries": group.entries,
                            "embeddings": group.embeddings})
        with self._lock:
            for rid in ids:
                self._pending.pop(rid, None)
        if self._on_commit:
            self._on_commit(ids)
        return _Group()

    def _make_room(self, need: int, ids: list[int]) -> None:
        """Drop the oldest commit groups whole until `need` more bytes fit under the capacity."""
        while self.disk_bytes + need > self.capacity_bytes:
            with self._lock:
                oldest = next(iter(self._groups), None)
            if oldest is None:
                with self._lock:
                    for rid in ids:
                        self._pending.pop(rid, None)
                if self._on_drop:
                    self._on_drop(ids)
                raise MemoryDirError(f"a commit group of {need} bytes does not fit memory directory "
                                     f"{self.objects.name}, capped at {self.capacity_bytes} bytes; raise the disk "
                                     f"budget")
            self._remove(sorted(self._groups[oldest]), notify=True)

    def _remove(self, ids: list[int], notify: bool = False) -> None:
        with self._lock:
            gone = [i for i in ids if i in self._entries]
            segments = {self._entries[i].segment for i in gone}
        if not gone:
            return
        self._put_manifest({"op": "del", "ids": gone})
        with self._lock:
            emptied = [s for s in segments if s not in self._groups]
        for segment in emptied:  # after the durable del: a crash in between leaves an unused object
            self.objects.delete(segment)
        if notify and self._on_drop:
            self._on_drop(gone)


def _seq_of(key: str) -> int:
    try:
        return int(key[len(MANIFEST_PREFIX):].split(".", 1)[0])
    except ValueError:
        return -1
