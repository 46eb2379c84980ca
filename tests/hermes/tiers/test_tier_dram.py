"""DRAM level: never over its byte budget, least valuable records leave first, copies are independent."""

from __future__ import annotations

import random

import pytest
import torch

from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.dram import DramStore


def _record(rid: int, rng: random.Random):
    rec = synthetic_record(rid, layers=2, heads=1, tokens=rng.randint(2, 24), head_dim=8, embed_dim=8)
    rec.value = rng.random()
    return rec


def test_dram_bytes_never_exceeded_and_least_valuable_leave_first():
    rng = random.Random(7)
    cap = 60_000
    dram = DramStore(cap, pin_memory=False)
    kept: dict[int, float] = {}
    left = 0
    for rid in range(2000):
        rec = _record(rid, rng)
        kept[rid] = rec.value
        out = dram.add(rec)
        assert dram.nbytes <= cap  # after every add
        assert dram.nbytes == sum(dram.peek(i).nbytes() for i in dram.ids())
        for gone in out:
            del kept[gone.record_id]
            left += 1
            # every record that left was worth no more than any that stayed
            assert gone.value <= min(kept.values(), default=float("inf"))
        assert sorted(kept) == dram.ids()
    assert left > 1000 and len(dram) > 10
    assert dram.stats()["evictions"] == left


def test_spill_callback_receives_what_leaves():
    spilled = []
    rng = random.Random(0)
    dram = DramStore(20_000, spill=spilled.append, pin_memory=False)
    for rid in range(100):
        assert dram.add(_record(rid, rng)) == []
    assert spilled and {r.record_id for r in spilled}.isdisjoint(dram.ids())
    assert len(spilled) + len(dram) == 100
    assert all(r.storage == "int8" for r in spilled)  # they leave compressed


def test_record_larger_than_capacity_leaves_at_once():
    dram = DramStore(100, pin_memory=False)
    rec = synthetic_record(0)
    out = dram.add(rec)
    assert [r.record_id for r in out] == [0] and len(dram) == 0 and dram.nbytes == 0


def test_get_returns_an_independent_copy_and_duplicates_are_refused():
    dram = DramStore(1 << 20, dtype="fp32", pin_memory=False)
    dram.add(synthetic_record(1))
    first = dram.get(1)
    first.layers[0].keys.zero_()
    second = dram.get(1)
    assert not torch.equal(second.layers[0].keys, first.layers[0].keys)
    assert dram.get(99) is None
    with pytest.raises(ValueError, match="already"):
        dram.add(synthetic_record(1))
    assert dram.pop(1) is not None and dram.nbytes == 0 and dram.pop(1) is None


def test_embeddings_matrix_follows_contents():
    dram = DramStore(1 << 20, pin_memory=False)
    for rid in (3, 5):
        dram.add(synthetic_record(rid, embed_dim=4))
    ids, mat = dram.embeddings()
    assert sorted(ids.tolist()) == [3, 5] and mat.shape == (2, 4)
    dram.pop(3)
    ids, mat = dram.embeddings()
    assert ids.tolist() == [5] and torch.equal(mat[0], synthetic_record(5, embed_dim=4).embedding)
