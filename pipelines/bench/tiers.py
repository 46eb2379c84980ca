"""Timings of levels 2 and 3, behind ``hermes-video bench tiers``.

Three questions, each answered on synthetic records in a temporary directory:

- *Recall*: how long from a question vector to dequantised records in hand (FAISS search + fetch
  from disk + dequantise), with 10^3, 10^4, 10^5 records on disk? Median and p95 over queries;
  each query is a stored record's embedding plus noise, so the result is a real hit. The prefetch
  cache is not used, so this is the disk path (served by the page cache, as on a warm machine).
  Also FAISS alone within the same run: `search` as recall uses it (the exact fp16 prefilter from
  `hermes.tiers.index.PREFILTER_MIN_RECORDS` records on) and one full fp32 scan (``full_scan_*``).
  Populating goes through the real level-3 commit path (DRAM budget 0, every record summarised to
  disk) without level 2's write-ahead log: with nothing in DRAM, the log would write one file per
  record and delete it after the disk commit (~2.5 of the ~3 ms each record took), which is not
  what recall reads.
- *Search*: FAISS search time per query alone, at the same sizes.
- With ``--store s3://...``: commit throughput into the object store vs one plain PUT of the same
  bytes, and recall latency from a reader with a cold (empty) and then warm local cache.
- *Disk write throughput*: records through `DiskStore` (serialise, checksum, append, group fsync,
  manifest) as a fraction of a plain sequential write of the same bytes (one file, one fsync) in
  the same run, on the same filesystem. Above 0.5 means the crash-safety machinery costs less than
  the write itself. Each timed side starts after a full garbage collection (the bench's own records
  would otherwise be walked by one inside whichever side runs then).
- *Checkpoint*: the ingest thread's time for one level-1 checkpoint (a ``write_bytes`` state and
  the index of 10^4 records) when it waits for the save vs when it only takes the snapshot and
  the disk writer does the rest (`MemoryDirectory.save_checkpoint`): ``wait_over_snapshot``.

Synthetic record shape (defaults): 4 layers x 2 KV heads x 16 tokens x head_dim 64, int8, 128-d
embedding: about 23 KB stored, the size of a summarised record of a small model. The throughput
is also measured on full-size records (24 layers x 2 heads x 256 tokens x 64, about 1.6 MB), where
per-record Python overhead no longer dominates.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hermes.markdown import table
from hermes.tiers.codec import to_safetensors
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.disk import DiskStore
from hermes.tiers.index import RecordIndex
from hermes.tiers.records import Record, pack

_FINGERPRINT = {"model": "synthetic", "family": "bench"}


def synthetic_record(record_id: int, *, layers: int = 4, heads: int = 2, tokens: int = 16, head_dim: int = 64,
                     embed_dim: int = 128, axes: int = 1, seed: int = 0) -> Record:
    """A deterministic random record: the same arguments always give the same tensors.

    Layer l holds ``tokens - l % 3`` tokens (layers differ, as in real records); positions follow
    the record id; scores are uniform in [0, 1); counts are 1, or 3 for the first token.

    Args:
        record_id: Id (also seeds the content).
        layers: Layers L.
        heads: KV heads H.
        tokens: Tokens in layer 0.
        head_dim: Head size D.
        embed_dim: Embedding size E.
        axes: Position axes A (1 or 3).
        seed: Extra seed.

    Returns:
        A float32 record (compress it as needed).
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + record_id)
    ns = [max(tokens - l % 3, 1) for l in range(layers)]
    base = record_id * tokens
    pos = [(base + torch.arange(n)).expand(axes, n).clone() for n in ns]
    counts = [torch.cat([torch.tensor([3]), torch.ones(n - 1, dtype=torch.long)]) for n in ns]
    return Record.build(
        record_id, [torch.randn(heads, n, head_dim, generator=g) for n in ns],
        [torch.randn(heads, n, head_dim, generator=g) for n in ns], pos,
        [base + torch.arange(n) for n in ns], [torch.full((n,), record_id, dtype=torch.long) for n in ns],
        [torch.rand(n, generator=g) for n in ns], counts, t_start_s=record_id * 8.0, t_end_s=record_id * 8.0 + 7.5,
        frame_start=record_id * 16, frame_end=record_id * 16 + 16, embedding=torch.randn(embed_dim, generator=g))


def _quantiles(ms: list[float]) -> tuple[float, float]:
    ordered = sorted(ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def bench_recall(n_records: int, *, top_k: int = 4, queries: int = 50, directory: str | Path | None = None,
                 seed: int = 0, **shape) -> dict:
    """Recall latency (search + fetch from disk + dequantise) with `n_records` records on disk.

    Returns:
        ``{"bench": "recall", "records", "top_k", "median_ms", "p95_ms", "search_median_ms",
        "search_p95_ms", "full_scan_median_ms", "full_scan_p95_ms", "populate_s"}``.
    """
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        start = time.perf_counter()
        # DRAM budget 0: every record goes straight to disk, as the oldest records of a long stream do
        # (no level-2 log: see the module docstring)
        md = MemoryDirectory(Path(tmp) / "mem", _FINGERPRINT, dram_bytes=0, disk_bytes=1 << 40,
                             prefetch_bytes=0, segment_bytes=64 << 20, durable_dram=False)
        try:
            for rid in range(n_records):
                md.add(synthetic_record(rid, seed=seed, **shape).compress("int8"))
            md.flush()
            populate_s = time.perf_counter() - start
            g = torch.Generator().manual_seed(seed + 1)
            targets = torch.randint(0, n_records, (queries,), generator=g).tolist()
            total, search, full_scan = [], [], []
            for rid in targets:
                q = synthetic_record(rid, seed=seed, **shape).embedding
                q = q + 0.1 * q.norm() / q.numel() ** 0.5 * torch.randn(q.shape, generator=g)
                t0 = time.perf_counter()
                hits = md.search(q, top_k)
                t1 = time.perf_counter()
                records = md.fetch([h[0] for h in hits])
                t2 = time.perf_counter()
                assert records and records[0].record_id == rid, "recall missed the planted record"
                total.append((t2 - t0) * 1e3)
                search.append((t1 - t0) * 1e3)
                t3 = time.perf_counter()
                md.index.search(q, top_k, exhaustive=True)
                full_scan.append((time.perf_counter() - t3) * 1e3)
        finally:
            md.close()
    med, p95 = _quantiles(total)
    smed, sp95 = _quantiles(search)
    fmed, fp95 = _quantiles(full_scan)
    return {"bench": "recall", "records": n_records, "top_k": top_k, "median_ms": round(med, 3),
            "p95_ms": round(p95, 3), "search_median_ms": round(smed, 3), "search_p95_ms": round(sp95, 3),
            "full_scan_median_ms": round(fmed, 3), "full_scan_p95_ms": round(fp95, 3),
            "populate_s": round(populate_s, 2)}


def bench_search(n_records: int, *, embed_dim: int = 128, top_k: int = 4, queries: int = 200, seed: int = 0) -> dict:
    """FAISS search time per query over `n_records` random embeddings (no disk): as recall searches, and
    by one full fp32 scan (``full_scan_*``), alternated query by query."""
    g = torch.Generator().manual_seed(seed)
    index = RecordIndex(embed_dim)
    index.add(range(n_records), torch.randn(n_records, embed_dim, generator=g))
    qs = torch.randn(queries, embed_dim, generator=g)
    ms, full_ms = [], []
    for q in qs:  # as recall searches, then one full fp32 scan, alternated
        t0 = time.perf_counter()
        index.search(q, top_k)
        t1 = time.perf_counter()
        index.search(q, top_k, exhaustive=True)
        ms.append((t1 - t0) * 1e3)
        full_ms.append((time.perf_counter() - t1) * 1e3)
    med, p95 = _quantiles(ms)
    fmed, fp95 = _quantiles(full_ms)
    return {"bench": "search", "records": n_records, "top_k": top_k, "median_ms": round(med, 4),
            "p95_ms": round(p95, 4), "full_scan_median_ms": round(fmed, 4), "full_scan_p95_ms": round(fp95, 4)}


def _collect_before_timing() -> None:
    """A full collection now, so that none lands inside the timed side that follows.

    The write benches hold their records (made before any timing, ~40 tracked objects each) for the
    whole run; the generation-2 collection that their allocations trip would otherwise land in
    whichever side runs then, on this machine 67-73 ms of a 150-230 ms store trial. After one, the
    timed side's own allocations stay below the next one's threshold (timeit turns collection off)."""
    gc.collect()


def bench_disk_write(total_bytes: int = 64 << 20, *, repeats: int = 3, directory: str | Path | None = None,
                     seed: int = 0, **shape) -> dict:
    """Write throughput of `DiskStore` relative to a plain sequential write of the same bytes.

    The two alternate `repeats` times (filesystem caches make single runs noisy); the row reports
    medians, and the ratio is the median of the paired ratios.

    Returns:
        ``{"bench": "disk_write", "records", "bytes", "store_mb_s", "plain_mb_s", "ratio"}``.
    """
    # packed, as records leaving DRAM are (`DramStore` keeps them so)
    probe = len(to_safetensors(synthetic_record(0, seed=seed, **shape).compress("int8")))
    n = max(1, total_bytes // probe)
    records = [pack(synthetic_record(i, seed=seed, **shape).compress("int8")) for i in range(n)]
    blobs = [to_safetensors(r) for r in records]
    mb = sum(len(b) for b in blobs) / 2**20
    plain, store, ratios = [], [], []
    for trial in range(repeats):
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            # plain: the same serialised bytes, one file, sequential writes, one fsync at the end
            _collect_before_timing()
            t0 = time.perf_counter()
            with open(Path(tmp) / "plain.bin", "wb") as f:
                for b in blobs:
                    f.write(b)
                f.flush()
                os.fsync(f.fileno())
            plain_s = time.perf_counter() - t0
            # store: serialise + sha256 + append + group fsync + manifest, on the writer thread
            _collect_before_timing()
            t0 = time.perf_counter()
            with DiskStore(Path(tmp) / "store", 1 << 40, _FINGERPRINT, segment_bytes=256 << 20) as disk:
                for r in records:
                    disk.add(r)
                disk.flush()
                store_s = time.perf_counter() - t0
        plain.append(mb / plain_s)
        store.append(mb / store_s)
        ratios.append(plain_s / store_s)
    return {"bench": "disk_write", "records": n, "bytes": int(mb * 2**20), "store_mb_s": round(statistics.median(store), 1),
            "plain_mb_s": round(statistics.median(plain), 1), "ratio": round(statistics.median(ratios), 3)}


def bench_checkpoint(state_bytes: int = 64 << 20, *, records: int = 10000, repeats: int = 3,
                     directory: str | Path | None = None, seed: int = 0) -> dict:
    """The ingest thread's time for one level-1 checkpoint: saved in place (the caller waits while the
    writer serialises, checksums and fsyncs it and saves the index) vs snapshot and go on (the writer
    does the rest while the caller works), alternated `repeats` times in one directory.

    Args:
        state_bytes: Size of the level-1 state (fp32 tensors of 28 layers' keys and values).
        records: Records in the index saved with it (embeddings only: the save's cost).

    Returns:
        ``{"bench": "checkpoint", "state_bytes", "index_records", "wait_ms", "snapshot_ms", "wait_over_snapshot"}``:
        medians, and the median of the paired ratios wait_ms / snapshot_ms (how many times less ingest time).
    """
    g = torch.Generator().manual_seed(seed)
    per_tensor = max(1, state_bytes // 4 // 56)
    state = {f"cache.layers.{l}.{kv}": torch.randn(per_tensor, generator=g)
             for l in range(28) for kv in ("keys", "values")}
    waited, snapped, ratios = [], [], []
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        md = MemoryDirectory(Path(tmp) / "mem", _FINGERPRINT, dram_bytes=0, disk_bytes=1 << 40, prefetch_bytes=0)
        try:
            md.index.add(range(records), torch.randn(records, 128, generator=g))
            for trial in range(repeats):
                t0 = time.perf_counter()
                md.save_checkpoint("session", state, {"trial": trial})
                wait_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                md.save_checkpoint("session", state, {"trial": trial}, wait=False)
                snap_s = time.perf_counter() - t0
                md.wait_checkpoint()  # outside the timing: the ingest thread would be encoding now
                waited.append(wait_s * 1e3)
                snapped.append(snap_s * 1e3)
                ratios.append(wait_s / snap_s)
        finally:
            md.close(spill_dram=False)
    return {"bench": "checkpoint", "state_bytes": sum(t.nbytes for t in state.values()), "index_records": records,
            "wait_ms": round(statistics.median(waited), 2), "snapshot_ms": round(statistics.median(snapped), 2),
            "wait_over_snapshot": round(statistics.median(ratios), 2)}


def bench_store_write(store: str, total_bytes: int = 16 << 20, *, repeats: int = 3, seed: int = 0,
                      settings=None, **shape) -> dict:
    """Commit throughput into an object store (``s3://bucket/prefix``) relative to one plain PUT of the
    same bytes, paired and alternated as `bench_disk_write`; each trial writes under a fresh prefix.

    Returns:
        ``{"bench": "store_write", "records", "bytes", "store_mb_s", "plain_mb_s", "ratio"}``.
    """
    from hermes.tiers.lease import Lease
    from hermes.tiers.objects import LocalObjects
    from hermes.tiers.remote import RemoteStore
    from hermes.tiers.s3 import S3Objects, parse_location

    location = parse_location(store)
    probe = len(to_safetensors(synthetic_record(0, seed=seed, **shape).compress("int8")))
    n = max(1, total_bytes // probe)
    records = [pack(synthetic_record(i, seed=seed, **shape).compress("int8")) for i in range(n)]
    blob = b"".join(to_safetensors(r) for r in records)
    mb = len(blob) / 2**20
    plain, stored, ratios = [], [], []
    for trial in range(repeats):
        objects = S3Objects(location.child(f"bench-{time.time_ns()}"), settings)
        _collect_before_timing()
        t0 = time.perf_counter()
        objects.put("plain.bin", blob)
        plain_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            _collect_before_timing()
            t0 = time.perf_counter()
            lease = Lease(objects, 60)
            lease.acquire()
            remote = RemoteStore(objects, LocalObjects(tmp), 1 << 40, _FINGERPRINT, lease=lease)
            for r in records:
                remote.add(r)
            remote.flush()
            store_s = time.perf_counter() - t0
            remote.close()
            lease.release()
        plain.append(mb / plain_s)
        stored.append(mb / store_s)
        ratios.append(plain_s / store_s)
    return {"bench": "store_write", "records": n, "bytes": len(blob), "store_mb_s": round(statistics.median(stored), 1),
            "plain_mb_s": round(statistics.median(plain), 1), "ratio": round(statistics.median(ratios), 3)}


def bench_store_recall(store: str, n_records: int, *, top_k: int = 4, queries: int = 50, seed: int = 0,
                       settings=None, **shape) -> dict:
    """Recall latency from an object store: a writer commits `n_records`, then a reader with an empty
    local cache answers `queries` (cold: every record read from the store), then the same queries
    again (warm: from its cache).

    Returns:
        ``{"bench": "store_recall", "records", "cold_median_ms", "cold_p95_ms", "warm_median_ms",
        "warm_p95_ms", "populate_s"}``.
    """
    from hermes.tiers.remote_level import RemoteOptions
    from hermes.tiers.s3 import S3Settings, parse_location

    url = str(parse_location(store).child(f"bench-recall-{time.time_ns()}"))
    with tempfile.TemporaryDirectory() as tmp:
        options = RemoteOptions(settings or S3Settings(), str(Path(tmp) / "writer"))
        start = time.perf_counter()
        md = MemoryDirectory(url, _FINGERPRINT, dram_bytes=0, disk_bytes=1 << 40, prefetch_bytes=0, remote=options,
                             durable_dram=False)
        for rid in range(n_records):
            md.add(synthetic_record(rid, seed=seed, **shape).compress("int8"))
        md.close()
        populate_s = time.perf_counter() - start
        reader = MemoryDirectory(url, None, 0, 0, readonly=True, prefetch_bytes=0,
                                 remote=RemoteOptions(options.settings, str(Path(tmp) / "reader")))
        g = torch.Generator().manual_seed(seed + 1)
        targets = torch.randint(0, n_records, (queries,), generator=g).tolist()
        vectors = []
        for rid in targets:
            q = synthetic_record(rid, seed=seed, **shape).embedding
            vectors.append((rid, q + 0.1 * q.norm() / q.numel() ** 0.5 * torch.randn(q.shape, generator=g)))
        timings = {}
        try:
            for phase in ("cold", "warm"):
                ms = []
                for rid, q in vectors:
                    t0 = time.perf_counter()
                    records = reader.fetch([h[0] for h in reader.search(q, top_k)])
                    ms.append((time.perf_counter() - t0) * 1e3)
                    assert records and records[0].record_id == rid, "recall missed the planted record"
                timings[phase] = _quantiles(ms)
        finally:
            reader.close(spill_dram=False)
    return {"bench": "store_recall", "records": n_records, "top_k": top_k,
            "cold_median_ms": round(timings["cold"][0], 3), "cold_p95_ms": round(timings["cold"][1], 3),
            "warm_median_ms": round(timings["warm"][0], 3), "warm_p95_ms": round(timings["warm"][1], 3),
            "populate_s": round(populate_s, 2)}


FULL_RECORD = {"layers": 24, "heads": 2, "tokens": 256, "head_dim": 64}  # ~1.6 MB int8: a chunk's evicted tokens


def run(sizes: tuple[int, ...] = (1000, 10000), *, write_bytes: int = 64 << 20, directory: str | Path | None = None,
        store: str | None = None, **shape) -> tuple[list[dict], str]:
    """Every tier benchmark; returns the rows and a markdown table of them.

    Args:
        sizes: Record counts for the recall and search rows (add 100000 by hand: a few minutes, ~2.4 GB).
        write_bytes: Bytes written by each throughput row.
        directory: Where temporary directories go (default: the system's temp dir).
        store: An object store (``s3://bucket/prefix``, reached as `hermes.tiers.s3` says): instead of
            the local rows, commit throughput vs a plain PUT and recall cold/warm at `sizes` there.
        **shape: Passed to `synthetic_record` for the recall rows and the first throughput row
            (layers, heads, tokens, head_dim, embed_dim); the second throughput row writes full
            records (`FULL_RECORD`).
    """
    rows = []
    if store is not None:
        rows.append(bench_store_write(store, write_bytes, **shape))
        rows += [bench_store_recall(store, n, **shape) for n in sizes]
        return rows, markdown(rows)
    for n in sizes:
        rows.append(bench_recall(n, directory=directory, **shape))
        rows.append(bench_search(n, embed_dim=shape.get("embed_dim", 128)))
    for name, kw in (("summary-size", shape), ("full-size", FULL_RECORD)):
        rows.append({**bench_disk_write(write_bytes, directory=directory, **kw), "records_of": name})
    rows.append(bench_checkpoint(write_bytes, directory=directory))
    return rows, markdown(rows)


def markdown(rows: list[dict]) -> str:
    """A markdown table: one line per row, the union of the rows' keys as columns."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return table(cols, [[r.get(c, "") for c in cols] for r in rows])
