"""Memory levels 2 and 3 (docs/ARCHITECTURE.md, Memory): host memory (DRAM), disk segments with a FAISS index, recall.

Level 1 (the working cache on the device) evicts tokens; the ones worth keeping become a `Record`
(one chunk's evicted tokens, every layer, with scores and original positions). This package keeps
records below level 1 and finds them again:

- `records`: the `Record` itself and its compressed forms (int8 per-channel, fp16, fp32);
- `codec`: a record's bytes on disk (one safetensors file per record, written without copies);
- `dram`: `DramStore`, records in host memory under a byte budget, least valuable moved out first;
- `summarise`: `summarise`, a record shrunk to a few anchor tokens plus a count-weighted mean;
- `disk`: `DiskStore`, append-only segments plus a JSON-lines manifest (`manifest`), crash-safe,
  with `recovery` cutting what a crash leaves (into quarantine) and refusing damage, and `files`
  the durable-write primitives and the directory lock;
- `repair`: ``memory repair``, rebuilding manifests from the self-describing segment records;
- `commands`: the bodies of ``memory inspect | verify | repair``;
- `fingerprint`: which model (and weights, and KV layout) made a memory directory; another's is refused;
- `meaning`: restored records checked against that layout and their own embeddings (not only bytes);
- `index`: `RecordIndex`, a FAISS inner-product index over record embeddings, derived from disk;
- `prefetch`: `Prefetcher`, loads likely-needed records from disk on a worker thread;
- `checkpoint`: named, atomic tensor + JSON checkpoints (level 1 and session state);
- `directory`: `MemoryDirectory`, all of the above behind one object, with level 2 made durable by a
  write-ahead log (a second `DiskStore`);
- `ledger`: `RecordLedger`, the bookkeeping both level-3 stores share (ids, queued records, batches);
- `objects`: the small object-store interface, with `LocalObjects` (a folder; the bounded cache);
- `s3`: ``s3://bucket/prefix`` parsed once, and `S3Objects` (boto3: create-only and If-Match puts);
- `remote`: `RemoteStore`, level 3 (and level 2's log) as immutable objects in an S3 store;
- `lease`: the writer's lease on a stream in an object store (compare-and-swap, epochs that fence);
- `remote_level`: a stream's connection, lease, local cache folder and checkpoints in the store;

Everything works on plain tensors; nothing here knows the model or the level-1 cache.
"""

from hermes.tiers.errors import MemoryDirError, RecordCorruptError
from hermes.tiers.records import LayerTokens, Record, compress, default_embedding

__all__ = [
    "LayerTokens",
    "MemoryDirError",
    "Record",
    "RecordCorruptError",
    "compress",
    "default_embedding",
]
