"""A persistent memory directory: levels 2 and 3, the index and checkpoints behind one object
(docs/ARCHITECTURE.md, Memory: "Persistence and durability", "Exactly once")."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from hermes.tiers import checkpoint
from hermes.tiers.disk import LOCK, DiskStore
from hermes.tiers.dram import DramStore
from hermes.tiers.errors import MemoryDirError, RecordCorruptError, storage_error
from hermes.tiers.index import INDEX_META, normalise, open_index
from hermes.tiers.files import read_exact, read_pid, write_bytes_atomic
from hermes.tiers.manifest import SEGMENTS, SUFFIX, WAL
from hermes.tiers.meaning import meaning_problem
from hermes.tiers.recovery import Quarantine, quarantined_files
from hermes.tiers.prefetch import Prefetcher
from hermes.tiers.remote import RemoteStore
from hermes.tiers.remote_level import RemoteLevel, RemoteOptions
from hermes.tiers.s3 import S3Location, parse_location
from hermes.tiers.records import Record, compress, default_embedding, identity


def checkpoint_claims(path: Path) -> dict[str, Any]:
    """The furthest reach of each store's manifest over all checkpoints: ``disk_next_id``, ``dram_next_id``
    and ``disk_tail``, ``dram_tail`` (``(segment, extent)``, `DiskStore.committed_tail`).
    """
    out: dict[str, Any] = {}
    for info_path in sorted((path / checkpoint.CHECKPOINTS).glob("*.json")):
        claims = ((checkpoint.read_info(info_path) or {}).get("meta") or {}).get("store")
        if isinstance(claims, dict):  # a damaged checkpoint is reported by its own checksum check
            for key in ("disk_next_id", "dram_next_id"):
                if isinstance(claims.get(key), int):
                    out[key] = max(out.get(key, 0), claims[key])
            for key in ("disk_tail", "dram_tail"):
                tail = claims.get(key)
                if (isinstance(tail, list) and len(tail) == 2 and isinstance(tail[0], str)
                        and isinstance(tail[1], int)):
                    out[key] = max(out.get(key, tuple(tail)), tuple(tail))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


SPOT_CHECK_RECORDS = 8  # level-3 records whose meaning a writable open checks (the log's are all checked)


class _WriterJob:
    """A save queued on a store's writer thread: set when it ends, with its error if it failed."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class MemoryDirectory:
    """DRAM + disk + FAISS index + checkpoints in one directory. Thread-safe for one writer.

    Args:
        path: The directory (created if missing), or ``s3://bucket/prefix`` (`hermes.tiers.remote_level`);
            ``self.path`` is then the local folder for the cache, the index and checkpoint copies.
        fingerprint: `hermes.tiers.fingerprint.make_fingerprint`; another's directory is refused. None
            only with ``readonly=True``.
        dram_bytes: DRAM budget for stored records.
        disk_bytes: Disk budget for records, manifest and index.
        dram_dtype, disk_dtype: Storage form on each level ("int8" or "fp16").
        summarise_fn: Applied to each record leaving DRAM before it is written; None keeps it whole.
        pin_memory: Page-lock DRAM copies when CUDA is available.
        segment_bytes: Disk segment size (default: see `DiskStore`).
        prefetch_bytes: Prefetch cache budget.
        fetch_readers: Threads that read one `fetch`'s disk records at once (their preads overlap); 1
            reads them in turn on the caller's thread.
        readonly: Inspect, verify or follow only: no writes, no repairs, no lock (no lease).
        durable_dram: Keep level 2's write-ahead log (off only for a throw-away directory).
        remote: For an ``s3://`` path, `RemoteOptions`; None takes the defaults.

    Raises:
        MemoryDirError: Another model's directory, not a memory directory, or in use.
    """

    def __init__(self, path: str | Path, fingerprint: dict | None, dram_bytes: int, disk_bytes: int, *,
                 dram_dtype: str = "int8", disk_dtype: str = "int8",
                 summarise_fn: Callable[[Record], Record] | None = None, pin_memory: bool = True,
                 segment_bytes: int | None = None, prefetch_bytes: int = 64 << 20, readonly: bool = False,
                 durable_dram: bool = True, remote: RemoteOptions | None = None, fetch_readers: int = 4) -> None:
        if fingerprint is None and not readonly:
            raise ValueError("a fingerprint is required to open a memory directory for writing")
        self.location = parse_location(path)  # an S3Location, or the local folder itself
        self.readonly = readonly
        self.disk_dtype = disk_dtype
        self.summarise_fn = summarise_fn
        self.dram_dtype = dram_dtype
        self.wal: DiskStore | RemoteStore | None = None
        self.remote: RemoteLevel | None = None
        if isinstance(self.location, S3Location):
            self.remote = RemoteLevel(self.location, remote or RemoteOptions(), readonly)
            self.path = self.remote.cache_dir  # index, checkpoints (copies of the store's) and cache live here
            self.disk = self.remote.open_store("", disk_bytes, fingerprint, prepare=self._prepare,
                                               on_drop=self._on_drop, on_commit=self._on_disk_commit)
        else:
            self.path = self.location
            claims = checkpoint_claims(self.path)  # checked by each store before it cuts anything
            self.disk = DiskStore(self.path, disk_bytes, fingerprint, segment_bytes=segment_bytes, readonly=readonly,
                                  prepare=self._prepare, on_drop=self._on_drop, on_commit=self._on_disk_commit,
                                  min_next_id=claims.get("disk_next_id", 0), min_tail=claims.get("disk_tail"))
        self.skipped: list[str] = []  # corrupt records left out of an answer, with why
        try:
            if self.remote is not None:
                if (durable_dram and not readonly) or self.remote.has_store(WAL):
                    self.wal = self.remote.open_store(WAL, 1 << 62, self.disk.fingerprint)
            elif (durable_dram and not readonly) or (self.path / WAL).is_dir():
                # one record per log segment, so a record leaving DRAM frees its file at once
                # read-only: the log's own fingerprint copy is taken as it is, for `verify` to compare
                self.wal = DiskStore(self.path / WAL, 1 << 62, None if readonly else self.disk.fingerprint,
                                     segment_bytes=1,
                                     readonly=readonly, min_next_id=claims.get("dram_next_id", 0),
                                     min_tail=claims.get("dram_tail"))
            self.checkpoint_notes = [] if readonly else [f"checkpoints/{n}: left by an interrupted save; deleted"
                                                         for n in checkpoint.clean(self.path)]
            self.store_problems = [f"{WAL}/: {p}" for p in self.wal.open_problems] if self.wal is not None else []
            self.index, self.index_state, self.index_problems = open_index(
                self.path, self.disk.ids(), self._embedding_from_disk, persist=not readonly, binding=self._binding)
        except OSError as exc:
            self._close_stores()
            raise storage_error(self.path, "opening", exc) from exc
        except BaseException:
            self._close_stores()
            raise
        self._account_index()
        self.dram = DramStore(dram_bytes, dram_dtype, pin_memory, spill=self._spill)
        self.prefetcher = Prefetcher(self._load, prefetch_bytes)
        self._readers = ThreadPoolExecutor(fetch_readers, "hermes-fetch") if fetch_readers > 1 else None
        self._lock = threading.RLock()
        self._checkpoint_job: _WriterJob | None = None  # the checkpoint save in flight on the disk writer
        self.fetched = {"dram": 0, "prefetch": 0, "disk": 0}
        self._meaning_checked: set[int] = set()  # records checked once, on open or by a recall (`hermes.tiers.meaning`)
        self._follows_log = self.remote is not None and readonly and self.wal is not None
        if self._follows_log:
            self._follow(self.wal.ids(), [])  # a follower recalls the writer's level 2 from its log
        if self.wal is not None and not readonly:
            try:
                self._replay_wal()
            except BaseException:  # nobody gets this object to close: release the locks and threads here
                self.prefetcher.close()
                self._close_stores()
                raise

    def _close_stores(self) -> None:
        """Close level 2's log, level 3, then the remote lease, each even when one before it failed (each
        store releases its lock, so that a process can open the directory again); a failure is raised after."""
        with contextlib.ExitStack() as closing:  # callbacks run last-in first
            if self.remote is not None:
                closing.callback(self.remote.release)
            for store in (self.disk, self.wal):
                if store is not None:
                    closing.callback(store.close)

    def _replay_wal(self) -> None:
        """Load the log's records back into DRAM (after a crash or a close that kept them)."""
        both = [rid for rid in self.wal.ids() if rid in self.disk]
        self.wal.remove(both)  # committed to disk before the crash: the disk copy stands
        for entry in self.wal.entries():
            if entry.record_id in both:
                continue
            self.disk.note_id(entry.record_id)
            try:
                record = self.wal.load(entry.record_id)
            except RecordCorruptError as exc:  # verify reports it; it stays in the log, never served
                self.skipped.append(str(exc))
                continue
            problem = meaning_problem(record, self.disk.fingerprint)
            if problem is not None:  # a resume never replays a record that means something else
                self._quarantine(entry.record_id, problem)
                continue
            with self._lock:
                self.dram.add(record)  # over the budget, the least valuable move on to disk as usual
        for rid in self.disk.ids()[-SPOT_CHECK_RECORDS:]:  # a sample of level 3: the newest, most likely recalled
            self._meaning_checked.add(rid)  # a recall need not check it again
            held = self._load_or_error(rid)
            problem = meaning_problem(held, self.disk.fingerprint) if isinstance(held, Record) else None
            if problem is not None:
                self._quarantine(rid, problem)

    def _quarantine(self, rid: int, reason: str) -> None:
        """Never serve a record that failed its meaning check again: leave it out of the index, note it in
        `skipped` and, in a writable local directory, move its bytes to ``quarantine/`` (an object store's
        objects are immutable: there it is only left out).
        """
        warnings.warn(f"{reason}; quarantined, never served", stacklevel=3)
        self.skipped.append(reason)
        self._on_drop([rid])
        if self.readonly:
            return
        for label, store in (("", self.disk), (f"{WAL}-", self.wal)):
            if not isinstance(store, DiskStore):
                continue
            entry = next((e for e in store.entries() if e.record_id == rid), None)
            if entry is None:
                continue
            copy = store.directory / f"meaning-{rid}{SUFFIX}"
            try:
                write_bytes_atomic(copy, read_exact(store.directory / SEGMENTS / entry.segment, entry.offset,
                                                    entry.length))
                Quarantine(self.path).move(copy, label)
            except OSError as exc:
                raise storage_error(self.path, f"quarantining record {rid}", exc) from exc
            store.remove([rid])

    def _binding(self, ids: list[int]) -> str:
        """Digest of the records behind `ids`: their ids and the checksums of their bytes."""
        sums = {e.record_id: e.sha256 for e in self.disk.entries()}
        h = hashlib.sha256()
        for rid in sorted(ids):
            h.update(f"{rid}:{sums.get(rid, '-')}\n".encode())
        return h.hexdigest()

    # ---- wiring between the levels (callbacks) -------------------------------------------------

    def _prepare(self, record: Record) -> Record:
        """Writer thread: summarise and compress a record leaving DRAM."""
        out = self.summarise_fn(record) if self.summarise_fn is not None else record
        return compress(out, self.disk_dtype)

    def _spill(self, record: Record) -> None:
        """Caller's thread: DRAM evicted `record`; queue it for disk and index it."""
        self.disk.add(record)
        self.index.add([record.record_id], record.embedding.reshape(1, -1))
        self._account_index()

    def _on_disk_commit(self, ids: list[int]) -> None:
        """Level 3's commit thread: these records are durable, so their copies leave the level-2 log."""
        if self.wal is not None:
            self.wal.remove(ids)

    def _on_drop(self, ids: list[int]) -> None:
        """Writer thread: the disk dropped records; forget them in the index and the prefetch cache."""
        self.index.remove(ids)
        self.prefetcher.invalidate(ids)

    def _embedding_from_disk(self, record_id: int) -> torch.Tensor | None:
        return self.disk.embedding(record_id)

    def _account_index(self) -> None:
        # each record costs the disk budget its index row: E float32 plus an int64 id
        if self.index.dim:
            self.disk.record_overhead_bytes = 4 * self.index.dim + 8

    # ---- writing ---------------------------------------------------------------------------------

    def new_record_id(self) -> int:
        """A fresh record id, larger than any this directory has held (also across restarts)."""
        return self.disk.reserve_id()

    def add(self, record: Record) -> int:
        """Keep a record in DRAM, moving the least valuable records to disk if DRAM is full.

        Exactly once: a record of an eviction already held (same `identity`, any id, any level) is not
        stored again.

        Args:
            record: Any form, K/V on any device; gets `default_embedding` if it has none. Not modified.

        Returns:
            The id the record is held under: its own, or the held copy's.

        Raises:
            ValueError: Duplicate id, or an embedding size other than the directory's.
            MemoryDirError: Read-only directory, or an earlier disk write failed.
        """
        if self.readonly:
            raise MemoryDirError(f"memory directory {self.path} is open read-only")
        if record.embedding is None:
            record = dataclasses.replace(record, embedding=default_embedding(record))
        dim = self.index.dim or (self.dram.embeddings()[1].shape[1] if len(self.dram) else None)
        if dim is not None and record.embedding.numel() != dim:
            raise ValueError(f"record {record.record_id} has a {record.embedding.numel()}-d embedding; "
                             f"this memory directory holds {dim}-d ones")
        if record.record_id in self.dram or record.record_id in self.disk:
            raise ValueError(f"record {record.record_id} is already in {self.path}")
        held = self._held_copy(record)
        if held is not None:
            return held
        self.disk.note_id(record.record_id)
        if self.wal is not None:
            # level 2's write-ahead log, written on the log's thread; queued before DRAM can pass the
            # record on to disk, so the log's removal (after the disk commit) always comes after it
            record = compress(record, self.dram_dtype)
            self.wal.add(record, prepare=False)
        with self._lock:  # a record DRAM evicts is on its way to disk before fetch can look for it
            self.dram.add(record)
        return record.record_id

    def _held_copy(self, record: Record) -> int | None:
        """The id of a held record (any level, committed or queued) of the same eviction as `record`, or None.
        """
        key = identity(record)
        if key is None:
            return None
        with self._lock:
            for rid in self.dram.ids():
                held = self.dram.peek(rid)
                if held is not None and identity(held) == key:
                    return rid
        for rid in self._same_span(key[0], key[1]):
            held = self._load_any(rid)
            if isinstance(held, Record) and identity(held) == key:
                return rid
        return None

    def _same_span(self, frame_start: int, frame_end: int) -> list[int]:
        """Ids held by level 3 or the level-2 log (committed or queued) over exactly this frame span."""
        out: list[int] = []
        for store in (self.disk, self.wal):
            if store is None:
                continue
            out += [e.record_id for e in store.entries() if (e.frame_start, e.frame_end) == (frame_start, frame_end)]
            for rid in store.pending_ids():
                try:
                    queued = store.load(rid)  # as given: no read
                except (KeyError, RecordCorruptError):
                    continue
                if (queued.frame_start, queued.frame_end) == (frame_start, frame_end):
                    out.append(rid)
        return list(dict.fromkeys(out))

    def _load_any(self, rid: int) -> Record | RecordCorruptError | None:
        """A record from level 3, else the level-2 log; the damage found in it; None if neither holds it."""
        for store in (self.disk, self.wal):
            if store is not None and rid in store:
                try:
                    return store.load(rid)
                except RecordCorruptError as exc:
                    return exc
                except KeyError:
                    continue
        return None

    def duplicates(self) -> list[list[int]]:
        """Groups of held ids stored for one eviction (`identity`), sorted: the first is kept, the rest are
        what `memory repair` quarantines. One id in both level 3 and the log is one record.
        """
        spans: dict[tuple[int, int], set[int]] = {}
        for store in (self.disk, self.wal):
            for e in store.entries() if store is not None else ():
                spans.setdefault((e.frame_start, e.frame_end), set()).add(e.record_id)
        groups: dict[tuple, list[int]] = {}
        for ids in spans.values():
            if len(ids) < 2:
                continue
            for rid in sorted(ids):
                held = self._load_any(rid)
                key = identity(held) if isinstance(held, Record) else None
                if key is not None:
                    groups.setdefault(key, []).append(rid)
        return sorted(ids for ids in groups.values() if len(ids) > 1)

    def barrier(self) -> None:
        """Wait until every record added so far is durable (in the level-2 log or on disk).

        Raises:
            StorageError, MemoryDirError: A write failed.
        """
        if self.wal is not None:
            self.wal.flush()
        self.disk._raise_if_failed()
        job = self._checkpoint_job
        if job is not None and job.done.is_set():
            self.wait_checkpoint()  # done: raises its error, if any

    def drain(self) -> None:
        """Move DRAM's records to disk whole (no summary), commit them, and save the index."""
        if self.readonly:
            return
        for record in self.dram.drain():
            self.disk.add(record, prepare=False)  # no summary: a restart should lose nothing
            self.index.add([record.record_id], record.embedding.reshape(1, -1))
        self.flush()

    def flush(self) -> None:
        """Wait until every record is committed (log and disk, and the log's removals), save the index."""
        self.disk.flush()
        if self.wal is not None:
            self.wal.flush()  # after the disk: its commits queue the log's removals
        self.wait_checkpoint()  # ran on the disk writer before the flush above returned
        if not self.readonly:
            self._save_index()

    def _save_index(self, exclude: Iterable[int] = ()) -> None:
        try:
            self.index.save(self.path, self._binding, exclude)
        except OSError as exc:
            raise storage_error(self.path, "saving the index", exc) from exc

    def close(self, spill_dram: bool = True) -> None:
        """Write DRAM's records to disk whole (if `spill_dram`), flush, save the index, release all."""
        try:
            if spill_dram:
                self.drain()
            elif not self.readonly:
                self.flush()
        finally:
            self.prefetcher.close()
            if self._readers is not None:
                self._readers.shutdown()
            self._close_stores()

    def __enter__(self) -> MemoryDirectory:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- recall ----------------------------------------------------------------------------------

    def refresh(self) -> int:
        """Read-only remote: take in the records the writer committed since the last look; returns how many.
        """
        if not self.readonly or self.remote is None:
            return 0
        added, removed = self.disk.refresh()
        if self.wal is not None:  # level 2's log: what the writer holds in DRAM is recalled from it
            more, gone = self.wal.refresh()
            added, removed = added + more, removed + gone
        return self._follow(added, removed)

    def _follow(self, added: list[int], removed: list[int]) -> int:
        gone = [rid for rid in removed if not self._holds(rid)]
        if gone:
            self._on_drop(gone)
        have = set(self.index.ids().tolist())
        vectors = [(rid, self._store_of(rid).embedding(rid)) for rid in dict.fromkeys(added) if rid not in have
                   and self._holds(rid)]
        vectors = [(rid, v) for rid, v in vectors if v is not None]
        if vectors:
            self.index.add([rid for rid, _ in vectors], torch.stack([v.reshape(-1) for _, v in vectors]))
        return len(vectors)

    def _holds(self, rid: int) -> bool:
        return rid in self.disk or (self._follows_log and rid in self.wal)

    def _store_of(self, rid: int) -> DiskStore | RemoteStore:
        return self.disk if rid in self.disk or not self._follows_log else self.wal

    def _load(self, rid: int) -> Record:
        return self._store_of(rid).load(rid)

    def search(self, vector: torch.Tensor, k: int) -> list[tuple[int, float]]:
        """The `k` records (DRAM or disk, after a read-only `refresh`) most similar (cosine) to `vector`.

        Returns:
            ``[(record_id, similarity)]``, best first.
        """
        self.refresh()
        results = self.index.search(vector, k)
        ids, mat = self.dram.embeddings()
        if len(ids):
            q = torch.from_numpy(normalise(vector)[0])  # (E,)
            sims = torch.from_numpy(normalise(mat)) @ q  # (n,)
            top = torch.topk(sims, min(k, len(ids)))
            results += [(int(ids[i]), float(s)) for s, i in zip(top.values, top.indices)]
        return sorted(results, key=lambda r: -r[1])[:k]

    def prefetch(self, ids: Iterable[int]) -> int:
        """Start loading the given disk records in the background; returns how many were scheduled."""
        return self.prefetcher.prefetch([i for i in ids if i not in self.dram])

    def fetch(self, ids: Sequence[int], device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
              non_blocking: bool = True, dequantize: bool = True) -> list[Record]:
        """Dequantised records, in the order asked, K/V on `device`: from DRAM, the prefetch cache or disk.

        With ``dequantize=False`` the records as stored (int8 codes, on the host), the directory's own
        objects where they are in DRAM: to be read, never changed.

        A disk record that fails its checksum is left out with a warning (noted in `skipped`); one that fails
        its meaning check (`hermes.tiers.meaning`, once per process) is left out and quarantined.

        Raises:
            KeyError: An id this directory does not hold.
        """
        found: list[tuple[Record, str] | None] = []  # None: to be read from disk
        for rid in ids:
            with self._lock:
                stored = self.dram.peek(rid)
                if stored is None and not self._holds(rid):
                    raise KeyError(f"record {rid} is not in memory directory {self.path}")
            if stored is not None:
                found.append((stored, "dram"))
                continue
            try:
                stored = self.prefetcher.get(rid)
            except RecordCorruptError as exc:
                stored = exc
            found.append(None if stored is None else (stored, "prefetch"))
        on_disk = [rid for rid, f in zip(ids, found) if f is None]
        read = iter(self._readers.map(self._load_or_error, on_disk) if self._readers is not None and len(on_disk) > 1
                    else map(self._load_or_error, on_disk))
        out = []
        for rid, f in zip(ids, found):
            stored, source = f if f is not None else (next(read), "disk")
            if isinstance(stored, RecordCorruptError):  # one damaged record must not fail the question
                warnings.warn(f"{stored}; left out of this answer", stacklevel=2)
                self.skipped.append(str(stored))
                continue
            # once per record and process: the check rotates its last layer, as making its embedding did
            if source != "dram" and rid not in self._meaning_checked:
                self._meaning_checked.add(rid)
                problem = meaning_problem(stored, self.disk.fingerprint)
                if problem is not None:  # a valid checksum over keys that mean something else: never spliced
                    self._quarantine(rid, problem)
                    continue
            self.fetched[source] += 1
            out.append(stored.dequantize(device, dtype, non_blocking=non_blocking) if dequantize else stored)
        return out

    def _load_or_error(self, rid: int) -> Record | RecordCorruptError:
        """A disk record, or the damage found in it (returned: the caller reports it in order)."""
        try:
            return self._load(rid)
        except RecordCorruptError as exc:
            return exc

    # ---- checkpoints -----------------------------------------------------------------------------

    def save_checkpoint(self, name: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                        wait: bool = True) -> None:
        """Save tensors + metadata atomically under `name`, and the index, on the disk writer's thread.

        This thread only snapshots the tensors; the writer saves once every record queued before is
        committed and records each store's reach in ``meta["store"]`` (docs/ARCHITECTURE.md, Memory). A
        second save waits for the first; a crash before it lands leaves the previous checkpoint whole.

        Args:
            name: Letters, digits, '_' and '-'.
            tensors: Tensors by name (any device); later changes to them do not reach the checkpoint.
            meta: JSON-able metadata.
            wait: Return only once durable (False: `wait_checkpoint`, `barrier` and `flush` wait for it).

        Raises:
            MemoryDirError, StorageError: Read-only directory, or this or the previous save failed.
            ValueError: Bad name, or metadata that is not JSON-able.
        """
        if self.readonly:
            raise MemoryDirError(f"memory directory {self.path} is open read-only")
        checkpoint.check_name(name)
        self.wait_checkpoint()
        host, meta_copy = checkpoint.snapshot(tensors, meta)
        job = _WriterJob()

        def save() -> None:  # on the disk writer's thread
            try:
                if self.wal is not None:
                    self.wal.flush()  # its records and removals queued before this save are durable
                self._save_index(exclude=self.disk.pending_ids())  # those ingest queued meanwhile
                claims = {"disk_next_id": self.disk.recorded_next_id, "disk_records": self.disk.num_records,
                          "dram_next_id": self.wal.recorded_next_id if self.wal is not None else 0,
                          "dram_records": self.wal.num_records if self.wal is not None else 0}
                for key, store in (("disk_tail", self.disk), ("dram_tail", self.wal)):
                    tail = store.committed_tail() if isinstance(store, DiskStore) else None
                    if tail is not None:
                        claims[key] = list(tail)
                try:
                    checkpoint.save_checkpoint(self.path, name, host, {**meta_copy, "store": claims})
                except OSError as exc:
                    raise storage_error(self.path, f"saving checkpoint {name!r}", exc) from exc
                if self.remote is not None:
                    self.remote.upload_checkpoint(name)
            except BaseException as exc:  # raised to the caller by wait_checkpoint
                job.error = exc
            finally:
                job.done.set()

        self._checkpoint_job = job
        self.disk.call_on_writer(save)
        if wait:
            self.wait_checkpoint()

    def wait_checkpoint(self) -> None:
        """Wait until the checkpoint save in flight (if any) is durable; raise its error if it failed."""
        job, self._checkpoint_job = self._checkpoint_job, None
        if job is None:
            return
        while not job.done.wait(0.5):
            self.disk._raise_if_failed()  # a writer that failed before reaching the job never runs it
        if job.error is not None:
            raise job.error

    def load_checkpoint(self, name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, meta)`` saved under `name`; KeyError if none, MemoryDirError if damaged."""
        tensors, meta = checkpoint.load_checkpoint(self.path, name)
        meta = dict(meta)
        meta.pop("store", None)  # ours (see save_checkpoint), not the caller's
        return tensors, meta

    def evictions_since_checkpoints(self) -> list[int]:
        """The `Record.frames_seen` of every eviction's record perhaps stored after the checkpoints were
        saved: ids at or past the checkpoints' furthest manifest reach (ids are reserved in order). Damaged
        records are left out.
        """
        claims = checkpoint_claims(self.path)
        first = max(claims.get("disk_next_id", 0), claims.get("dram_next_id", 0))
        with self._lock:
            held = sorted(rid for rid in {*self.dram.ids(), *self.disk.ids()} if rid >= first)
        out = []
        for rid in held:
            stored = self.dram.peek(rid)
            stored = stored if stored is not None else self._load_or_error(rid)
            if isinstance(stored, Record) and stored.frames_seen is not None:
                out.append(stored.frames_seen)
        return out

    def checkpoints(self) -> list[dict[str, Any]]:
        return checkpoint.list_checkpoints(self.path)

    # ---- reporting -------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """``{dram_bytes, dram_records, disk_bytes, disk_records, index_records, fetched, prefetch}``."""
        return {"dram_bytes": self.dram.nbytes, "dram_records": len(self.dram), "disk_bytes": self.disk.disk_bytes,
                "disk_records": self.disk.num_records, "index_records": len(self.index),
                "fetched": dict(self.fetched), "prefetch": self.prefetcher.stats()}

    def inspect(self, max_records: int | None = None) -> dict[str, Any]:
        """What the directory holds, as a resume will see it.

        Args:
            max_records: List at most this many records (the newest); None lists all.

        Returns:
            A JSON-able dict: ``records`` (level 3's and the log's, each with its ``level``), ``dram``
            (level 2, or for a directory nobody has open what a resume loads from the log), ``resume``
            (whether a resume is pending, from which checkpoint, what it replays), segments, index,
            checkpoints, problems and notes.
        """
        entries = self.disk.entries()
        on_disk = {e.record_id for e in entries}
        logged = [e for e in (self.wal.entries() if self.wal is not None else ()) if e.record_id not in on_disk]
        listed = sorted([dict(e.summary(), level="disk") for e in entries]
                        + [dict(e.summary(), level="dram_log") for e in logged], key=lambda r: r["id"])
        shown = listed if max_records is None else listed[len(listed) - max_records:] if max_records else []
        spans = [(e.t_start_s, e.t_end_s) for e in entries + logged]
        if self.readonly:  # nothing is in this process's DRAM: what a resume puts there is the log
            dram = {"records": len(logged), "bytes": sum(e.nbytes for e in logged), "from": "dram_log"}
        else:
            dram = self.dram.stats()
        return {
            "path": str(self.location), "fingerprint": self.disk.fingerprint,
            "stream_id": self.remote.stream_id if self.remote is not None else None,  # the store's marker
            "disk": {"records": len(entries), "bytes": self.disk.disk_bytes, "capacity_bytes": self.disk.capacity_bytes,
                     "segments": self.disk.segments()},
            "dram": dram,
            "records_total": len(listed),
            "time_span_s": [min(a for a, _ in spans), max(b for _, b in spans)] if spans else None,
            "records": shown,
            "index": {"state": self.index_state, "records": len(self.index), "dim": self.index.dim,
                      "saved": (self.path / INDEX_META).exists()},
            "checkpoints": self.checkpoints(),
            "dram_log": {"records": self.wal.num_records if self.wal is not None else 0,
                         "replayed_on_resume": len(logged)},
            "resume": self._resume_state(len(logged)),
            "problems": self.disk.open_problems + self.index_problems + self.store_problems,
            "notes": self.disk.open_notes + self.checkpoint_notes + [f"in quarantine: {f}" for f in
                                                                     quarantined_files(self.path)],
        }

    def _resume_state(self, replayed: int) -> dict[str, Any]:
        """``{"pending", "stopped", "checkpoint", "frames", "replays_dram_log"}`` for `inspect`.

        ``stopped``: "running" (a live lock holder), "crash" (a dead one's pid left), else "closed". A
        resume is pending with a session checkpoint and a crash or records in the log to replay.
        """
        stopped = "closed"
        if self.remote is None:
            pid = read_pid(self.path / LOCK)
            stopped = "closed" if pid is None else "running" if _alive(pid) else "crash"
        infos = [checkpoint.read_info(p) or {} for p in sorted((self.path / checkpoint.CHECKPOINTS).glob("*.json"))]
        newest = max(infos, key=lambda info: info.get("created_unix") or 0, default=None)
        frames = ((newest or {}).get("meta") or {}).get("frames")
        return {"pending": newest is not None and (stopped == "crash" or replayed > 0), "stopped": stopped,
                "checkpoint": (newest or {}).get("name"), "frames": frames, "replays_dram_log": replayed}

    def counts(self) -> dict[str, Any]:
        """Records per source of truth: each store's manifest, its segments, the index, the checkpoints."""
        def scanned(store: DiskStore | RemoteStore | None) -> int:
            return store.scanned_records() if store is not None else 0

        out: dict[str, Any] = {"disk_manifest": self.disk.num_records, "disk_segments": scanned(self.disk),
                               "dram_log_manifest": self.wal.num_records if self.wal is not None else 0,
                               "dram_log_segments": scanned(self.wal), "index": len(self.index)}
        for path in sorted((self.path / checkpoint.CHECKPOINTS).glob("*.json")):
            claims = ((checkpoint.read_info(path) or {}).get("meta") or {}).get("store") or {}
            if isinstance(claims, dict) and claims:
                out[f"checkpoint {path.stem}"] = {"disk": claims.get("disk_records"),
                                                  "dram_log": claims.get("dram_records")}
        return out

    def verify_report(self) -> dict[str, Any]:
        """Check every checksum and every source of truth against the others.

        Returns:
            ``{"ok", "problems", "duplicates", "disagreements", "counts", "notes"}``; ``ok`` is False when
            any of the three lists is not empty. ``problems``: damage in one source; ``duplicates``: as
            `duplicates`; ``disagreements``: one source against another; ``counts``: as `counts`;
            ``notes``: harmless (crash leftovers cut on the next open, quarantine).
        """
        report = self.disk.verify()
        problems = list(report.problems)
        disagreements = list(self.index_problems)
        notes = list(report.notes) + self.checkpoint_notes
        if self.wal is not None:
            wal_report = self.wal.verify()
            problems += [f"{WAL}/: {p}" for p in wal_report.problems]
            notes += [f"{WAL}/: {n}" for n in wal_report.notes]
        on_disk = {rid for rid in set(self.disk.ids()) | set(self.wal.ids() if self.wal is not None else ())
                   if self._holds(rid)}
        indexed = set(self.index.ids().tolist())
        if indexed != on_disk:
            disagreements.append(f"index holds {len(indexed - on_disk)} ids the manifest lacks and lacks "
                                 f"{len(on_disk - indexed)} of its records")
        problems += checkpoint.verify_checkpoints(self.path)
        counts = self.counts()
        if (counts["disk_segments"] < counts["disk_manifest"]
                or counts["dram_log_segments"] < counts["dram_log_manifest"]):
            disagreements.append(f"the segments hold fewer readable records than the manifests name: {counts}")
        if self.wal is not None and self.wal.fingerprint != self.disk.fingerprint:
            differ = sorted(k for k in set(self.wal.fingerprint) | set(self.disk.fingerprint)
                            if self.wal.fingerprint.get(k) != self.disk.fingerprint.get(k))
            disagreements.append(f"fingerprint.json and {WAL}/fingerprint.json disagree (in: {', '.join(differ)}): "
                                 f"one was replaced")
        # an object store's index is derived by each reader from the manifests (none is stored): only a local
        # directory whose checkpoints were saved beside an index has lost something when it is missing
        if (self.remote is None and self.readonly and self.index_state == "rebuilt (missing)"
                and checkpoint_claims(self.path)):
            disagreements.append("the index is missing, but the checkpoints were saved with it (it was deleted)")
        if self.index_state not in ("loaded", "empty"):  # on open it did not match the manifest
            notes.append(f"index {self.index_state} on open" + (" (in memory only: read-only)" if self.readonly else ""))
        notes += [f"in quarantine (kept, never served): {f}" for f in quarantined_files(self.path)]
        for store in (self.disk, self.wal):
            for entry in store.entries() if store is not None else ():
                held = self._load_any(entry.record_id)
                problem = meaning_problem(held, self.disk.fingerprint) if isinstance(held, Record) else None
                if problem is not None:
                    problems.append(problem)
        duplicates = self.duplicates()
        return {"ok": not (problems or duplicates or disagreements), "problems": problems, "duplicates": duplicates,
                "disagreements": disagreements, "counts": counts, "notes": notes}

    def verify(self) -> tuple[bool, list[str]]:
        """`verify_report` as ``(ok, messages)``: one line per finding, the counts, then ``"note: "`` lines.
        """
        report = self.verify_report()
        lines = report["problems"] + [
            f"records {', '.join(map(str, ids))}: one eviction stored {len(ids)} times; the copies after record "
            f"{ids[0]} are duplicates" for ids in report["duplicates"]] + report["disagreements"]
        summary = "records: " + ", ".join(f"{k} {v}" for k, v in report["counts"].items())
        return report["ok"], lines + [summary] + [f"note: {n}" for n in report["notes"]]
