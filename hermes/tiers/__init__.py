"""Memory levels 2 and 3 (docs/ARCHITECTURE.md, Memory): records of evicted tokens in host memory (`dram`),
on disk (`disk`, `manifest`, `recovery`, `repair`, `codec`, `files`) or in an object store (`remote`,
`remote_level`, `lease`, `objects`, `s3`), found again through a FAISS index (`index`, `prefetch`), all
behind `directory.MemoryDirectory` with `checkpoint`s of level 1; `fingerprint` and `meaning` refuse
another model's records. Nothing here knows the model or the level-1 cache."""

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
