"""Memory level 2: records kept compressed in host memory under a byte budget, least valuable out first.

Records are page-locked when CUDA is there, so `get`'s int8 codes cross the bus without blocking and
are dequantised on the device. Thread-safe: the recall path reads while ingest adds.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections.abc import Callable

import torch

from hermes.tiers.records import STORAGES, Record, compress, pack


class DramStore:
    """Compressed records in host memory, bounded by bytes, least valuable out first.

    Args:
        capacity_bytes: Most bytes of stored records (`Record.nbytes` of the compressed form).
        dtype: Storage form of K/V: "int8" (default) or "fp16" ("fp32" is accepted, lossless).
        pin_memory: Page-lock the host copies when CUDA is available.
        spill: Optional callback receiving each record that leaves; then `add` returns [].

    Raises:
        ValueError: Negative capacity or unknown dtype.
    """

    def __init__(self, capacity_bytes: int, dtype: str = "int8", pin_memory: bool = True,
                 spill: Callable[[Record], None] | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if dtype not in STORAGES:
            raise ValueError(f"DRAM dtype must be one of {STORAGES}, got {dtype!r}")
        self.capacity_bytes = int(capacity_bytes)
        self.dtype = dtype
        self.pin = bool(pin_memory) and torch.cuda.is_available()
        self.spill = spill
        self._records: dict[int, Record] = {}
        # (value, add sequence, record_id); an entry whose sequence is no longer the record's is stale
        self._heap: list[tuple[float, int, int]] = []
        self._seq: dict[int, int] = {}
        self._counter = itertools.count()
        self._bytes = 0
        self._evictions = 0
        self._lock = threading.RLock()
        self._embeddings: tuple[torch.Tensor, torch.Tensor] | None = None  # cached (ids, (n, E) matrix)

    # ---- writing ------------------------------------------------------------------------------

    def add(self, record: Record) -> list[Record]:
        """Store a record (compressed, on the host); make room by evicting the least valuable.

        Args:
            record: A record in any form, its K/V on any device. Not modified.

        Returns:
            The records that left (lowest `Record.value` first, the older on a tie), unless a `spill`
            callback took them. A record larger than the whole capacity leaves at once.

        Raises:
            ValueError: A record with the same id is already stored.
        """
        stored = self._to_host(compress(record, self.dtype))
        size = stored.nbytes()
        with self._lock:
            if stored.record_id in self._records:
                raise ValueError(f"record {stored.record_id} is already in DRAM")
            self._records[stored.record_id] = stored
            key = stored.value if math.isfinite(stored.value) else -math.inf  # NaN never blocks the heap
            seq = next(self._counter)
            self._seq[stored.record_id] = seq
            heapq.heappush(self._heap, (key, seq, stored.record_id))
            self._bytes += size
            self._embeddings = None
            out = []
            while self._bytes > self.capacity_bytes:
                out.append(self._pop_least())
        if self.spill is not None:
            for rec in out:
                self.spill(rec)
            return []
        return out

    def pop(self, record_id: int) -> Record | None:
        """Remove and return a record (stored form), or None if absent."""
        with self._lock:
            rec = self._records.pop(record_id, None)
            if rec is not None:
                del self._seq[record_id]
                self._bytes -= rec.nbytes()
                self._embeddings = None
            return rec  # its heap entry goes stale and is skipped later

    def drain(self) -> list[Record]:
        """Remove and return every record, least valuable first (e.g. to write them all to disk)."""
        with self._lock:
            out = []
            while self._records:
                out.append(self._pop_least())
            return out

    def _pop_least(self) -> Record:
        while True:
            _, seq, rid = heapq.heappop(self._heap)
            if self._seq.get(rid) == seq:
                rec = self._records.pop(rid)
                del self._seq[rid]
                self._bytes -= rec.nbytes()
                self._evictions += 1
                self._embeddings = None
                return rec

    def _to_host(self, record: Record) -> Record:
        """Copy to host memory, one buffer per field (`pack`), K/V page-locked if configured."""
        return pack(record, pin_memory=self.pin)

    # ---- reading -------------------------------------------------------------------------------

    def get(self, record_id: int, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
            non_blocking: bool = True) -> Record | None:
        """A dequantised copy of a record, K/V on `device` (dtype: default the record's original), or None.

        Args:
            non_blocking: Asynchronous host-to-device copies (effective from pinned memory).
        """
        with self._lock:
            rec = self._records.get(record_id)
        if rec is None:
            return None
        return rec.dequantize(device, dtype, non_blocking=non_blocking)

    def peek(self, record_id: int) -> Record | None:
        """The stored (compressed, host) record itself, or None; do not modify it."""
        with self._lock:
            return self._records.get(record_id)

    def embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids (n,) int64, vectors (n, E) float32)`` of the stored records that have an embedding."""
        with self._lock:
            if self._embeddings is None:
                recs = [r for r in self._records.values() if r.embedding is not None]
                ids = torch.tensor([r.record_id for r in recs], dtype=torch.long)
                mat = torch.stack([r.embedding for r in recs]) if recs else torch.zeros(0, 0)
                self._embeddings = (ids, mat)
            return self._embeddings

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._records)

    def __contains__(self, record_id: int) -> bool:
        with self._lock:
            return record_id in self._records

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored records (never above `capacity_bytes` after an `add`)."""
        return self._bytes

    def stats(self) -> dict:
        """``{records, bytes, capacity_bytes, evictions, dtype, pinned}``."""
        with self._lock:
            return {"records": len(self._records), "bytes": self._bytes, "capacity_bytes": self.capacity_bytes,
                    "evictions": self._evictions, "dtype": self.dtype, "pinned": self.pin}
