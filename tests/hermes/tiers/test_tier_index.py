"""FAISS index: a planted record is found, the saved index is checked and rebuilt or repaired from disk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.index import INDEX, INDEX_META, RecordIndex

FP = {"model": "index-test", "family": "synthetic"}


def test_planted_embedding_is_top1_among_1000_random():
    g = torch.Generator().manual_seed(3)
    vectors = torch.randn(1000, 64, generator=g)
    index = RecordIndex(64)
    index.add(range(1000, 2000), vectors)
    planted = 1437
    query = vectors[planted - 1000] + 0.3 * torch.randn(64, generator=g)  # near it, not equal
    hits = index.search(query * 5.0, 5)  # scale must not matter: cosine similarity
    assert hits[0][0] == planted and hits[0][1] > 0.9 > hits[1][1]
    assert len(hits) == 5 and [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    index.remove([planted])
    assert planted not in [i for i, _ in index.search(query, 5)] and len(index) == 999


def test_replacing_an_id_keeps_one_vector():
    index = RecordIndex(4)
    index.add([7], torch.tensor([[1.0, 0, 0, 0]]))
    index.add([7], torch.tensor([[0, 1.0, 0, 0]]))
    assert len(index) == 1 and index.search(torch.tensor([0, 1.0, 0, 0]), 3) == [(7, pytest.approx(1.0))]


def test_save_load_round_trip_checks_the_checksum(tmp_path):
    index = RecordIndex(8)
    index.add([1, 2, 3], torch.eye(8)[:3])
    index.save(tmp_path)
    back = RecordIndex.load(tmp_path)
    assert back.ids().tolist() == [1, 2, 3] and back.search(torch.eye(8)[2], 1)[0][0] == 3
    data = bytearray((tmp_path / INDEX).read_bytes())
    data[-5] ^= 0xFF
    (tmp_path / INDEX).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        RecordIndex.load(tmp_path)  # FAISS never parses bytes that fail the checksum


def _filled(path, n=60):
    md = MemoryDirectory(path, FP, dram_bytes=0, disk_bytes=1 << 30)  # everything goes to disk
    for rid in range(n):
        md.add(synthetic_record(rid, layers=2, tokens=4, head_dim=8, embed_dim=16))
    md.close()


@pytest.mark.parametrize("damage", ["deleted", "corrupted", "stale"])
def test_index_is_rebuilt_or_repaired_from_the_segments(tmp_path, damage):
    _filled(tmp_path)
    if damage == "deleted":
        (tmp_path / INDEX).unlink()
    elif damage == "corrupted":
        (tmp_path / INDEX).write_bytes(b"\x00" * 64)
    else:  # ids differ from the manifest: one missing, one that the disk does not hold
        stale = RecordIndex.load(tmp_path)
        stale.remove([10])
        stale.add([999], np.ones((1, 16), dtype=np.float32))
        stale.save(tmp_path, MemoryDirectory(tmp_path, None, 0, 0, readonly=True)._binding)
    md = MemoryDirectory(tmp_path, FP, dram_bytes=0, disk_bytes=1 << 30)
    # a stale index (ids the disk no longer holds) cannot have its content binding checked: rebuilt
    expected = {"deleted": "rebuilt (missing)", "stale": "rebuilt (stale"}.get(damage, "rebuilt (unreadable")
    assert md.index_state.startswith(expected)
    assert sorted(md.index.ids().tolist()) == list(range(60))
    for rid in (0, 10, 59):
        query = synthetic_record(rid, layers=2, tokens=4, head_dim=8, embed_dim=16).embedding
        assert md.search(query, 3)[0][0] == rid
    ok, messages = md.verify()
    assert ok, messages
    md.close()
    again = MemoryDirectory(tmp_path, FP, dram_bytes=0, disk_bytes=1 << 30)  # and it was saved repaired
    assert again.index_state == "loaded" and (tmp_path / INDEX_META).exists()
    again.close()


def test_an_index_saved_before_records_were_dropped_is_rebuilt_not_called_foreign(tmp_path):
    # A crash after an eviction dropped records from disk and before the next index save leaves an index
    # that names records that are gone: an ordinary crash, not damage.
    import shutil

    _filled(tmp_path)
    saved = tmp_path / "saved"
    saved.mkdir()
    for name in (INDEX, INDEX_META):
        shutil.copy(tmp_path / name, saved / name)
    md = MemoryDirectory(tmp_path, FP, dram_bytes=0, disk_bytes=1 << 30)
    md.disk.remove([5, 6])
    md.close()
    for name in (INDEX, INDEX_META):  # the index as it was before the records went
        shutil.copy(saved / name, tmp_path / name)
    ro = MemoryDirectory(tmp_path, None, 0, 0, readonly=True)
    ok, messages = ro.verify()
    ro.close(spill_dram=False)
    assert ok and not any("not built from" in m for m in messages), messages
    md = MemoryDirectory(tmp_path, FP, dram_bytes=0, disk_bytes=1 << 30)
    assert md.index_state.startswith("rebuilt (stale: 2 of its records are gone)")
    assert sorted(md.index.ids().tolist()) == [i for i in range(60) if i not in (5, 6)]
    md.close()


def _exact_pairs(index: RecordIndex, query: torch.Tensor, k: int) -> list[tuple[int, float]]:
    return index.search(query, k, exhaustive=True)


@pytest.mark.parametrize("dim", [16, 96])
def test_fp16_prefilter_returns_what_a_full_scan_returns(dim):
    # clustered vectors (scores crowd together, as content vectors of one video do), removals and
    # re-adds (rows compact in both copies), queries near a record and at random
    g = torch.Generator().manual_seed(11)
    centre = torch.randn(dim, generator=g)
    index = RecordIndex(dim, prefilter_min_records=1)
    index.add(range(3000), centre + 0.4 * torch.randn(3000, dim, generator=g))
    index.search(centre, 1)  # builds the fp16 copy; what follows must keep it in step
    index.remove(range(500, 900))
    index.add(range(100, 200), centre + 0.4 * torch.randn(100, dim, generator=g))  # replaces
    index.add(range(5000, 5300), torch.randn(300, dim, generator=g))
    assert index._fp16.ntotal == len(index) == 3000 - 400 + 300
    for trial in range(40):
        query = centre + 0.4 * torch.randn(dim, generator=g) if trial % 2 else torch.randn(dim, generator=g)
        for k in (1, 4, 50):
            assert index.search(query, k) == _exact_pairs(index, query, k)


def test_fp16_prefilter_keeps_a_full_scans_choice_among_exact_ties():
    # duplicated embeddings tie exactly; which duplicates come back, and in which order, must not change
    g = torch.Generator().manual_seed(5)
    distinct = torch.randn(200, 32, generator=g)
    vectors = torch.cat([distinct, distinct[:50].repeat(4, 1), torch.zeros(20, 32)])  # 4 more copies, zero rows
    index = RecordIndex(32, prefilter_min_records=1)
    index.add(torch.randperm(vectors.shape[0], generator=g).tolist(), vectors)
    for q in list(distinct[:10]) + [torch.zeros(32)] + list(torch.randn(10, 32, generator=g)):
        for k in (1, 3, 7):
            assert index.search(q, k) == _exact_pairs(index, q, k)


def test_fp16_prefilter_is_used_only_from_its_threshold_on():
    index = RecordIndex(8, prefilter_min_records=100)
    index.add(range(99), torch.randn(99, 8))
    index.search(torch.randn(8), 3)
    assert index._fp16 is None  # a small index is one fp32 scan, with no second copy
    index.add([99], torch.randn(1, 8))
    index.search(torch.randn(8), 3)
    assert index._fp16 is not None and index._fp16.ntotal == 100
