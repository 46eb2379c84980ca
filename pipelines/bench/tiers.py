"""`hermes-video bench tiers`: levels 2 and 3 timed on synthetic records in a temporary directory.

- *recall*: a question vector to dequantised records in hand (search, fetch from disk, dequantise) with
  10^3, 10^4, 10^5 records on disk; median and p95 over queries, each a stored record's embedding plus
  noise (a real hit). No prefetch cache: the disk path, served by the page cache. Populated through the
  real level-3 commit path (DRAM budget 0) without level 2's log, which would write and delete one file
  per record, not what recall reads. FAISS alone in the same run: as recall searches (the exact fp16
  prefilter from `hermes.tiers.index.PREFILTER_MIN_RECORDS` records on) and one full fp32 scan;
- *search*: FAISS alone, per query, at the same sizes;
- *disk write*: records through `DiskStore` (serialise, checksum, append, group fsync, manifest) as a
  fraction of one plain sequential write of the same bytes, alternated; above 0.5 the crash-safety
  machinery costs less than the write itself. On ~23 KB records (4 layers x 2 KV heads x 16 tokens x 64,
  int8, 128-d embedding: a small model's summarised record) and ~1.6 MB ones (24 layers x 256 tokens);
- *checkpoint*: the ingest thread's time for one level-1 checkpoint when it waits for the save vs when
  it only takes the snapshot (`MemoryDirectory.save_checkpoint`): ``wait_over_snapshot``;
- with ``--store s3://...``: commit throughput into the object store vs one plain PUT, and recall from
  a reader whose local cache starts empty (cold), then holds the records (warm).
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hermes.pipelines.bench.common import rows_table
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


def _timed_s(fn) -> float:
    """Seconds `fn()` takes, after a full collection: the write benches hold their records (~40 tracked
    objects each) for the whole run, and the generation-2 collection their allocations trip would otherwise
    land inside whichever side runs then (67-73 ms of a 150-230 ms store trial on this machine)."""
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _queries(n_records: int, queries: int, seed: int, shape: dict) -> list[tuple[int, torch.Tensor]]:
    """`queries` (record id, a stored record's embedding plus noise): each search has one real hit."""
    g = torch.Generator().manual_seed(seed + 1)
    out = []
    for rid in torch.randint(0, n_records, (queries,), generator=g).tolist():
        q = synthetic_record(rid, seed=seed, **shape).embedding
        out.append((rid, q + 0.1 * q.norm() / q.numel() ** 0.5 * torch.randn(q.shape, generator=g)))
    return out


def _timed_recall(store, queries: list[tuple[int, torch.Tensor]], top_k: int) -> tuple[list[float], list[float]]:
    """Per query: (search + fetch ms, search ms); raises if a recall misses its planted record."""
    total, search = [], []
    for rid, q in queries:
        t0 = time.perf_counter()
        hits = store.search(q, top_k)
        t1 = time.perf_counter()
        records = store.fetch([h[0] for h in hits])
        total.append((time.perf_counter() - t0) * 1e3)
        search.append((t1 - t0) * 1e3)
        assert records and records[0].record_id == rid, "recall missed the planted record"
    return total, search


def _populated(location: str, n_records: int, seed: int, shape: dict, **options) -> tuple[MemoryDirectory, float]:
    """A new memory directory at `location` holding `n_records` synthetic records committed through the real
    level-3 path (DRAM budget 0, as the oldest records of a long stream), flushed; and the seconds it took."""
    start = time.perf_counter()
    md = MemoryDirectory(location, _FINGERPRINT, dram_bytes=0, disk_bytes=1 << 40, prefetch_bytes=0,
                         durable_dram=False, **options)
    for rid in range(n_records):
        md.add(synthetic_record(rid, seed=seed, **shape).compress("int8"))
    md.flush()
    return md, time.perf_counter() - start


def bench_recall(n_records: int, *, top_k: int = 4, queries: int = 50, directory: str | Path | None = None,
                 seed: int = 0, **shape) -> dict:
    """Recall latency (search + fetch from disk + dequantise) with `n_records` records on disk.

    Returns:
        ``{"bench": "recall", "records", "top_k", "median_ms", "p95_ms", "search_median_ms",
        "search_p95_ms", "full_scan_median_ms", "full_scan_p95_ms", "populate_s"}``.
    """
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        md, populate_s = _populated(str(Path(tmp) / "mem"), n_records, seed, shape, segment_bytes=64 << 20)
        try:
            planted = _queries(n_records, queries, seed, shape)
            total, search = _timed_recall(md, planted, top_k)
            full_scan = []
            for _, q in planted:
                t0 = time.perf_counter()
                md.index.search(q, top_k, exhaustive=True)
                full_scan.append((time.perf_counter() - t0) * 1e3)
        finally:
            md.close()
    row = {"bench": "recall", "records": n_records, "top_k": top_k}
    for name, ms in (("", total), ("search_", search), ("full_scan_", full_scan)):
        med, p95 = _quantiles(ms)
        row.update({f"{name}median_ms": round(med, 3), f"{name}p95_ms": round(p95, 3)})
    return {**row, "populate_s": round(populate_s, 2)}


def bench_search(n_records: int, *, embed_dim: int = 128, top_k: int = 4, queries: int = 200, seed: int = 0) -> dict:
    """FAISS search time per query over `n_records` random embeddings (no disk): as recall searches, and
    by one full fp32 scan (``full_scan_*``), alternated query by query."""
    g = torch.Generator().manual_seed(seed)
    index = RecordIndex(embed_dim)
    index.add(range(n_records), torch.randn(n_records, embed_dim, generator=g))
    ms, full_ms = [], []
    for q in torch.randn(queries, embed_dim, generator=g):  # as recall searches, then one full fp32 scan
        t0 = time.perf_counter()
        index.search(q, top_k)
        t1 = time.perf_counter()
        index.search(q, top_k, exhaustive=True)
        ms.append((t1 - t0) * 1e3)
        full_ms.append((time.perf_counter() - t1) * 1e3)
    (med, p95), (fmed, fp95) = _quantiles(ms), _quantiles(full_ms)
    return {"bench": "search", "records": n_records, "top_k": top_k, "median_ms": round(med, 4),
            "p95_ms": round(p95, 4), "full_scan_median_ms": round(fmed, 4), "full_scan_p95_ms": round(fp95, 4)}


def _paired_write(bench: str, total_bytes: int, repeats: int, seed: int, shape: dict, trial) -> dict:
    """`total_bytes` of packed synthetic records (as records leaving DRAM are) written `repeats` times by
    `trial(blobs, records)`, which returns (plain seconds, store seconds): medians, and the median of the
    paired ratios plain / store."""
    probe = len(to_safetensors(synthetic_record(0, seed=seed, **shape).compress("int8")))
    records = [pack(synthetic_record(i, seed=seed, **shape).compress("int8"))
               for i in range(max(1, total_bytes // probe))]
    blobs = [to_safetensors(r) for r in records]
    mb = sum(len(b) for b in blobs) / 2**20
    times = [trial(blobs, records) for _ in range(repeats)]
    return {"bench": bench, "records": len(records), "bytes": int(mb * 2**20),
            "store_mb_s": round(statistics.median(mb / t for _, t in times), 1),
            "plain_mb_s": round(statistics.median(mb / p for p, _ in times), 1),
            "ratio": round(statistics.median(p / t for p, t in times), 3)}


def bench_disk_write(total_bytes: int = 64 << 20, *, repeats: int = 3, directory: str | Path | None = None,
                     seed: int = 0, **shape) -> dict:
    """Write throughput of `DiskStore` relative to a plain sequential write (one file, one fsync) of the same
    bytes, alternated `repeats` times (filesystem caches make single runs noisy).

    Returns:
        ``{"bench": "disk_write", "records", "bytes", "store_mb_s", "plain_mb_s", "ratio"}``.
    """
    def trial(blobs, records):
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            def plain():
                with open(Path(tmp) / "plain.bin", "wb") as f:
                    for b in blobs:
                        f.write(b)
                    f.flush()
                    os.fsync(f.fileno())

            def store():  # serialise + sha256 + append + group fsync + manifest, on the writer thread
                with DiskStore(Path(tmp) / "store", 1 << 40, _FINGERPRINT, segment_bytes=256 << 20) as disk:
                    for r in records:
                        disk.add(r)
                    disk.flush()

            return _timed_s(plain), _timed_s(store)

    return _paired_write("disk_write", total_bytes, repeats, seed, shape, trial)


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

    def trial(blobs, records):
        objects, blob = S3Objects(location.child(f"bench-{time.time_ns()}"), settings), b"".join(blobs)
        plain_s = _timed_s(lambda: objects.put("plain.bin", blob))
        opened = []
        with tempfile.TemporaryDirectory() as tmp:
            def commit():
                opened.append(Lease(objects, 60))
                opened[0].acquire()
                opened.append(RemoteStore(objects, LocalObjects(tmp), 1 << 40, _FINGERPRINT, lease=opened[0]))
                for r in records:
                    opened[1].add(r)
                opened[1].flush()

            store_s = _timed_s(commit)
            opened[1].close()
            opened[0].release()
        return plain_s, store_s

    return _paired_write("store_write", total_bytes, repeats, seed, shape, trial)


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
    settings = settings or S3Settings()
    row = {"bench": "store_recall", "records": n_records, "top_k": top_k}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        writer, _ = _populated(url, n_records, seed, shape, remote=RemoteOptions(settings, str(Path(tmp) / "writer")))
        writer.close()
        populate_s = time.perf_counter() - start
        reader = MemoryDirectory(url, None, 0, 0, readonly=True, prefetch_bytes=0,
                                 remote=RemoteOptions(settings, str(Path(tmp) / "reader")))
        planted = _queries(n_records, queries, seed, shape)
        try:
            for phase in ("cold", "warm"):
                med, p95 = _quantiles(_timed_recall(reader, planted, top_k)[0])
                row.update({f"{phase}_median_ms": round(med, 3), f"{phase}_p95_ms": round(p95, 3)})
        finally:
            reader.close(spill_dram=False)
    return {**row, "populate_s": round(populate_s, 2)}


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
    if store is not None:
        rows = [bench_store_write(store, write_bytes, **shape)] + [bench_store_recall(store, n, **shape) for n in sizes]
        return rows, rows_table(rows)
    rows = []
    for n in sizes:
        rows += [bench_recall(n, directory=directory, **shape), bench_search(n, embed_dim=shape.get("embed_dim", 128))]
    for name, kw in (("summary-size", shape), ("full-size", FULL_RECORD)):
        rows.append({**bench_disk_write(write_bytes, directory=directory, **kw), "records_of": name})
    rows.append(bench_checkpoint(write_bytes, directory=directory))
    return rows, rows_table(rows)
