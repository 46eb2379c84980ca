"""Finding records for a question: an exact FAISS cosine index over record embeddings, derived from the
records (docs/ARCHITECTURE.md, Memory, "The index")."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import faiss
import numpy as np
import torch

from hermes.tiers.files import sha256, write_bytes_atomic, write_json_atomic

INDEX, INDEX_META = "index.faiss", "index.json"
INDEX_FORMAT = "hermes-index/1"
# below this many records one fp32 scan is cheaper than the fp16 prefilter's two stages (0.09 ms at 10^4 x 128)
PREFILTER_MIN_RECORDS = 16384
_PREFILTER_EXTRA = 32  # fp16 results asked beyond top_k, so that one scan usually settles the candidates


def normalise(vectors: np.ndarray | torch.Tensor) -> np.ndarray:
    """``(n, E)`` float32 rows scaled to unit L2 norm (zero rows stay zero), C-contiguous."""
    x = vectors.detach().to("cpu", torch.float32).numpy() if isinstance(vectors, torch.Tensor) else vectors
    x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.where(norms > 0, norms, 1.0), dtype=np.float32)


class RecordIndex:
    """Exact cosine-similarity search over record embeddings, by record id. Thread-safe.

    Args:
        dim: Embedding size E; None to take it from the first vectors added.
        search_threads: OpenMP threads for one query. 1 by default: a parallel region waits for its
            slowest thread, which on a busy machine (the model on the other cores) costs more than it saves.
        prefilter_min_records: From this many records on, search scans the exact fp16 prefilter first;
            an exact equivalence, not an option of the memory config.
    """

    def __init__(self, dim: int | None = None, search_threads: int = 1,
                 prefilter_min_records: int = PREFILTER_MIN_RECORDS) -> None:
        self.dim = dim
        self.search_threads = search_threads
        self.prefilter_min_records = prefilter_min_records
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim)) if dim else None
        self._ids: set[int] = set()  # mirror of the index's ids: membership without a FAISS scan
        # derived, never saved: row i holds row i of the fp32 index in fp16 (built at the first search
        # that needs it, then kept in step by add/remove); its largest row error bounds its score error
        self._fp16: faiss.IndexScalarQuantizer | None = None
        self._fp16_error = 0.0  # max over rows added of ||x - fp16(x)||_2 (never lowered by removals)
        self.binding: str | None = None  # as loaded from index.json
        self._lock = threading.RLock()

    def __len__(self) -> int:
        with self._lock:
            return self._index.ntotal if self._index is not None else 0

    def ids(self) -> np.ndarray:
        """(n,) int64 ids held, in insertion order."""
        with self._lock:
            if self._index is None:
                return np.zeros(0, dtype=np.int64)
            return faiss.vector_to_array(self._index.id_map).astype(np.int64)

    def add(self, ids: Iterable[int], vectors: np.ndarray | torch.Tensor) -> None:
        """Add (or replace) the vectors of records.

        Args:
            ids: n record ids.
            vectors: (n, E) embeddings (any scale; normalised here).

        Raises:
            ValueError: Counts disagree or E differs from the index's dimension.
        """
        ids_arr = np.asarray(list(ids), dtype=np.int64)
        x = normalise(vectors)
        if x.shape[0] != ids_arr.shape[0]:
            raise ValueError(f"{ids_arr.shape[0]} ids but {x.shape[0]} vectors")
        if not ids_arr.size:
            return
        with self._lock:
            if self._index is None:
                self.dim = int(x.shape[1])
                self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
            if x.shape[1] != self.dim:
                raise ValueError(f"embedding size {x.shape[1]} differs from the index's {self.dim}")
            present = [i for i in ids_arr.tolist() if i in self._ids]
            if present:  # replacing: an IDMap would otherwise keep both (and removal scans the index)
                self.remove(present)
            self._index.add_with_ids(x, ids_arr)
            self._ids.update(ids_arr.tolist())
            if self._fp16 is not None:
                self._fp16_add(x)

    def remove(self, ids: Iterable[int]) -> int:
        """Remove records' vectors; returns how many were there."""
        with self._lock:
            ids_arr = np.asarray([i for i in ids if i in self._ids], dtype=np.int64)
            if self._index is None or not ids_arr.size:
                return 0
            self._ids.difference_update(ids_arr.tolist())
            if self._fp16 is not None:  # the same rows, so that row i stays row i of both (both compact in order)
                rows = np.flatnonzero(np.isin(faiss.vector_to_array(self._index.id_map), ids_arr))
                self._fp16.remove_ids(rows.astype(np.int64))
            return int(self._index.remove_ids(ids_arr))

    def search(self, query: np.ndarray | torch.Tensor, top_k: int, exhaustive: bool = False
               ) -> list[tuple[int, float]]:
        """The `top_k` records most similar to `query`, ``[(record_id, cosine similarity)]`` best first.

        Args:
            query: (E,) vector (any scale).
            top_k: How many results at most.
            exhaustive: One full fp32 scan, never the fp16 prefilter (the reference it is tested against).
        """
        with self._lock:
            if self._index is None or self._index.ntotal == 0 or top_k <= 0:
                return []
            q = normalise(query)
            if q.shape[1] != self.dim:
                raise ValueError(f"query size {q.shape[1]} differs from the index's {self.dim}")
            k = min(top_k, self._index.ntotal)
            before = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(self.search_threads)  # OpenMP: affects the calling thread only
            try:
                found = None
                if not exhaustive and self._index.ntotal >= self.prefilter_min_records:
                    found = self._search_fp16_prefilter(q, k)
                if found is None:
                    scores, ids = self._index.search(q, k)
                    found = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
            finally:
                faiss.omp_set_num_threads(before)
        return found

    # ---- the exact fp16 prefilter (docs/ARCHITECTURE.md) --------------------------------------------

    def _rows_fp32(self) -> np.ndarray:
        """(N, E) view of the fp32 index's rows, in scan order (no copy)."""
        flat = faiss.downcast_index(self._index.index)
        return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * self.dim).reshape(flat.ntotal, self.dim)

    def _fp16_add(self, x: np.ndarray) -> None:
        codes = self._fp16.sa_encode(x)
        self._fp16.add_sa_codes(codes)
        residual = np.linalg.norm(x.astype(np.float64) - self._fp16.sa_decode(codes).astype(np.float64), axis=1)
        self._fp16_error = max(self._fp16_error, float(residual.max(initial=0.0)))

    def _search_fp16_prefilter(self, q: np.ndarray, k: int) -> list[tuple[int, float]] | None:
        """The exact top `k` for a (1, E) normalised query, or None where one fp32 scan is cheaper."""
        if self._fp16 is None:
            self._fp16 = faiss.IndexScalarQuantizer(self.dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
            self._fp16_add(self._rows_fp32())
        n = self._fp16.ntotal
        q_norm = float(np.linalg.norm(q.astype(np.float64)))
        # |fp16 score - fp32 score| <= ||q|| ||x - fp16(x)|| + the fp32 rounding of both dot products
        # (each below E * 2^-24 * ||q|| ||x||, with ||x|| <= 1 + the row error); doubled for margin
        eps = q_norm * (self._fp16_error * (1 + 1e-6) + 4 * self.dim * 2.0 ** -24 * (1 + self._fp16_error))
        want = k + _PREFILTER_EXTRA
        while True:
            want = min(want, n)
            approx, rows = self._fp16.search(q, want)
            approx, rows = approx[0], rows[0]
            floor = approx[k - 1] - 2 * eps  # no true top-k row scores below this in fp16
            if want == n or approx[want - 1] < floor:  # rows not returned score at most approx[want - 1]
                break
            if want >= n // 8:  # near-ties everywhere: the candidates would cost as much as a full scan
                return None
            want *= 8
        candidates = np.sort(rows[approx >= floor])  # (c,) rows, in scan order
        # the candidates' fp32 rows scanned by the same kernel and heap as a full scan: bit-identical
        # scores, and the same rows among exact ties (a full scan's choice among ties depends only
        # on the order of the rows scoring at least the k-th score, and every such row is here)
        subset = faiss.IndexFlatIP(self.dim)
        subset.add(np.ascontiguousarray(self._rows_fp32()[candidates]))
        scores, picked = subset.search(q, k)
        id_map = self._index.id_map
        return [(int(id_map.at(int(candidates[j]))), float(s)) for j, s in zip(picked[0], scores[0])]

    # ---- persistence ----------------------------------------------------------------------------

    def save(self, directory: Path, binding: Callable[[list[int]], str] | None = None,
             exclude: Iterable[int] = ()) -> None:
        """Write ``index.faiss`` and ``index.json`` atomically (each: temp, fsync, rename).

        Args:
            binding: Maps the held ids to the digest of their records' content (checked on open).
            exclude: Ids left out of the saved copy (records not yet committed: a saved index naming
                records a crash then loses would be rebuilt whole on open).
        """
        with self._lock:
            index, ids = self._index, self.ids()
            left_out = np.asarray([i for i in exclude if i in self._ids], dtype=np.int64)
            if index is not None and left_out.size:
                index = faiss.clone_index(index)  # the live index keeps them
                index.remove_ids(left_out)
                ids = faiss.vector_to_array(index.id_map).astype(np.int64)
            data = faiss.serialize_index(index).tobytes() if index is not None else b""
            meta = {"format": INDEX_FORMAT, "dim": self.dim, "count": int(ids.size), "sha256": sha256(data),
                    "binding": binding(ids.tolist()) if binding is not None else None}
        write_bytes_atomic(directory / INDEX, data)
        write_json_atomic(directory / INDEX_META, meta)

    @classmethod
    def load(cls, directory: Path) -> RecordIndex:
        """Read a saved index after checking its checksum.

        Raises:
            FileNotFoundError: No saved index.
            ValueError: Checksum, format or dimension mismatch (the index must be rebuilt).
        """
        meta = json.loads((directory / INDEX_META).read_text())
        data = (directory / INDEX).read_bytes()
        if meta.get("format") != INDEX_FORMAT or sha256(data) != meta.get("sha256"):
            raise ValueError(f"{INDEX} fails its checksum or format check")
        out = cls(meta.get("dim"))
        if data:
            index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
            if not isinstance(index, faiss.IndexIDMap2) or index.d != meta["dim"] or index.ntotal != meta["count"]:
                raise ValueError(f"{INDEX} holds another kind, size or count of index than {INDEX_META} says")
            out._index = index
            out._ids = set(out.ids().tolist())
        out.binding = meta.get("binding")
        return out


def open_index(directory: Path, live_ids: Iterable[int], embedding_of: Callable[[int], torch.Tensor | None],
               persist: bool = True, binding: Callable[[list[int]], str] | None = None
               ) -> tuple[RecordIndex, str, list[str]]:
    """Load the saved index and bring it in line with the manifest's live records.

    Args:
        live_ids: Ids the manifest says are on disk.
        embedding_of: Reads a record's embedding (None if the record cannot be read).
        persist: Save the index again if it had to be rebuilt or repaired.
        binding: Digest of the records' content for a list of ids (`RecordIndex.save`).

    Returns:
        ``(index, state, problems)``: state is "loaded", "repaired (+a -r)", "rebuilt (reason)"
        or "empty"; problems name records whose embedding could not be read, and a foreign index.
    """
    live = list(live_ids)
    problems: list[str] = []
    try:
        index, state = RecordIndex.load(directory), "loaded"
    except FileNotFoundError:
        index, state = RecordIndex(), "rebuilt (missing)" if live else "empty"
    except (ValueError, RuntimeError, KeyError, json.JSONDecodeError) as exc:  # RuntimeError: FAISS parse
        index, state = RecordIndex(), f"rebuilt (unreadable: {exc})"
    saved = index.ids().tolist() if state == "loaded" else []
    if binding is not None and saved and not set(saved) <= set(live):
        # records were dropped after the index was saved (a crash before the next save): their content is
        # gone, so its binding cannot be checked, and an index that cannot be checked is never searched
        index, state = RecordIndex(), f"rebuilt (stale: {len(set(saved) - set(live))} of its records are gone)"
    elif binding is not None and saved and index.binding != binding(saved):
        problems.append(f"{INDEX} was not built from this directory's records (its binding to their content "
                        f"does not match); it is never searched: rebuilt from the records")
        index, state = RecordIndex(), "rebuilt (foreign: not built from these records)"
    have = set(index.ids().tolist())
    extra = have - set(live)
    missing = [rid for rid in live if rid not in have]
    index.remove(extra)
    read = {rid: embedding_of(rid) for rid in missing}
    if index.dim is not None and any(e is not None and e.numel() != index.dim for e in read.values()):
        # the saved index was built for other embeddings: start over from every record
        index, state, extra, missing = RecordIndex(), "rebuilt (embedding size changed)", set(), live
        read = {rid: read[rid] if rid in read else embedding_of(rid) for rid in live}
    dim = index.dim or next((e.numel() for e in read.values() if e is not None), None)
    ok = {rid: e.reshape(-1) for rid, e in read.items() if e is not None and e.numel() == dim}
    problems.extend(f"record {rid}: embedding unreadable or of another size; left out of the index"
                    for rid in read if rid not in ok)
    if ok:
        index.add(list(ok), torch.stack(list(ok.values())))  # one batch: each add call scans the index
    added = len(ok)
    if state == "loaded" and (extra or missing):
        state = f"repaired (+{added} -{len(extra)})"
    if persist and state != "loaded":
        index.save(directory, binding)
    return index, state, problems
