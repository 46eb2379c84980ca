"""Reading records before they are asked for, so that a recall does not wait on the disk: a worker fills a
small LRU cache, and a newer candidate list cancels loads not yet started for ids no longer wanted, so a
burst of questions queues no backlog of stale reads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

from hermes.tiers.records import Record


class Prefetcher:
    """Background loader with an LRU cache of records, bounded in bytes. Thread-safe.

    Args:
        load: Reads one record by id (e.g. `DiskStore.load`); may raise.
        capacity_bytes: Most bytes (`Record.nbytes`) kept in the cache.
        workers: Loader threads (1 keeps reads sequential, which disks prefer).
    """

    def __init__(self, load: Callable[[int], Record], capacity_bytes: int = 64 << 20, workers: int = 1) -> None:
        self._load = load
        self.capacity_bytes = int(capacity_bytes)
        self._cache: OrderedDict[int, Record] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._inflight: dict[int, Future] = {}
        self._invalid: set[int] = set()  # ids invalidated while their load was in flight
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="hermes-prefetch")
        self._closed = False
        self.hits = self.waited = self.misses = self.loaded = self.errors = self.cancelled = 0

    def prefetch(self, ids: Iterable[int]) -> int:
        """Schedule loads of these ids (in that order), cancelling stale queued loads; returns how many new
        loads were scheduled (ids already cached or in flight are skipped).
        """
        wanted = list(dict.fromkeys(ids))
        scheduled = 0
        with self._lock:
            if self._closed:
                return 0
            keep = set(wanted)
            for rid, fut in list(self._inflight.items()):
                if rid not in keep and fut.cancel():  # only loads not yet started can be cancelled
                    self._inflight.pop(rid, None)  # (the cancel already ran `_done`, which may have)
                    self.cancelled += 1
            for rid in wanted:
                if rid in self._cache:
                    self._cache.move_to_end(rid)  # wanted again: keep it longer
                elif rid not in self._inflight:
                    self._invalid.discard(rid)
                    fut = self._pool.submit(self._load, rid)
                    self._inflight[rid] = fut
                    fut.add_done_callback(lambda f, rid=rid: self._done(rid, f))
                    scheduled += 1
        return scheduled

    def _done(self, rid: int, fut: Future) -> None:
        with self._lock:
            if self._inflight.get(rid) is fut:
                del self._inflight[rid]
            try:
                record = fut.result()
            except CancelledError:
                return
            except Exception:  # a bad record: the caller's own read will raise the real error
                self.errors += 1
                return
            self.loaded += 1
            if rid in self._invalid or self._closed:
                self._invalid.discard(rid)
                return
            self._put(rid, record)

    def _put(self, rid: int, record: Record) -> None:
        size = record.nbytes()
        if size > self.capacity_bytes:
            return
        old = self._cache.pop(rid, None)
        if old is not None:
            self._bytes -= old.nbytes()
        self._cache[rid] = record
        self._bytes += size
        while self._bytes > self.capacity_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._bytes -= evicted.nbytes()

    def get(self, record_id: int, wait: bool = True) -> Record | None:
        """The cached record (stored form), or None on a miss (not prefetched, evicted, or its load failed).

        Args:
            wait: If its load is in flight, wait for it (counted as a hit that waited).
        """
        with self._lock:
            record = self._cache.get(record_id)
            if record is not None:
                self._cache.move_to_end(record_id)
                self.hits += 1
                return record
            fut = self._inflight.get(record_id) if wait else None
        if fut is not None:
            try:
                record = fut.result()
            except (CancelledError, Exception):
                record = None
            if record is not None:
                with self._lock:
                    self.waited += 1
                return record
        with self._lock:
            self.misses += 1
        return None

    def invalidate(self, ids: Iterable[int]) -> None:
        """Forget records (the disk dropped them): cached copies and loads in flight."""
        with self._lock:
            for rid in ids:
                old = self._cache.pop(rid, None)
                if old is not None:
                    self._bytes -= old.nbytes()
                if rid in self._inflight:
                    self._invalid.add(rid)

    def stats(self) -> dict:
        """``{hits, waited, misses, loaded, errors, cancelled, records, bytes, inflight}``."""
        with self._lock:
            return {"hits": self.hits, "waited": self.waited, "misses": self.misses, "loaded": self.loaded,
                    "errors": self.errors, "cancelled": self.cancelled, "records": len(self._cache),
                    "bytes": self._bytes, "inflight": len(self._inflight)}

    def close(self) -> None:
        """Cancel queued loads and stop the worker (waits for the load running now)."""
        with self._lock:
            self._closed = True
            for fut in self._inflight.values():
                fut.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
