"""Exactly once: an eviction replayed after a crash and a resume is stored once, on every level, and a
directory that holds one twice (written by an older version) fails `memory verify` until `memory repair`
moves the copy to quarantine.

A record's identity is its eviction (frame span, position epoch, frames encoded when it ran:
`hermes.tiers.records.identity`), not its id: a resumed stream gives the replayed eviction a new id.
"""

from __future__ import annotations

import json

import pytest

from hermes.cli import main
from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.fingerprint import make_fingerprint
from hermes.tiers.records import identity
from hermes.tiers.repair import WAL, repair

FP = make_fingerprint("once-test", "synthetic", 3, 2, 16, weights="sha256:" + "b" * 64)


def _eviction(rid: int, frames_seen: int, epoch: int = 0, seed: int = 0):
    """The record of the eviction that ran when `frames_seen` frames were encoded (content seeded by it)."""
    rec = synthetic_record(frames_seen, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=12, seed=seed)
    rec.record_id = rid
    rec.frames_seen, rec.epoch = frames_seen, epoch
    return rec


def _open(path, dram_bytes):
    return MemoryDirectory(path, FP, dram_bytes=dram_bytes, disk_bytes=1 << 30, segment_bytes=5000)


def _held(path) -> list[tuple]:
    """The identities of every record a read-only open finds, in both stores (an id in both counted once)."""
    md = MemoryDirectory(path, None, 0, 0, readonly=True)
    try:
        ids = sorted(set(md.disk.ids()) | set(md.wal.ids() if md.wal is not None else ()))
        return sorted(identity(md._load_any(rid)) for rid in ids)
    finally:
        md.close(spill_dram=False)


@pytest.mark.parametrize("level", ["disk", "dram_log"])
def test_a_replayed_eviction_is_stored_once_whatever_its_new_id(tmp_path, level):
    # dram_bytes 0: every record goes straight to level 3; a large budget keeps them in level 2's log
    dram_bytes = 0 if level == "disk" else 1 << 30
    path = tmp_path / "mem"
    md = _open(path, dram_bytes)
    for n, frames_seen in enumerate((8, 16, 24)):
        assert md.add(_eviction(n, frames_seen)) == n
    md.close(spill_dram=False)  # the stop; the resumed stream re-encodes frames 17..24 and evicts again
    md = _open(path, dram_bytes)
    replayed = _eviction(md.new_record_id(), 24)
    assert md.add(replayed) == 2  # held under the first copy's id
    assert md.add(_eviction(md.new_record_id(), 24, epoch=1)) != 2  # after a compaction: another eviction
    md.close(spill_dram=False)
    held = _held(path)
    assert len(held) == len(set(held)) == 4, held


def _plant_duplicate(path):
    """A directory holding the eviction at frame 16 twice, ids 1 and 3 (written as an older version did)."""
    md = _open(path, 0)
    for n, frames_seen in enumerate((8, 16, 24)):
        md.add(_eviction(n, frames_seen))
    md.close(spill_dram=False)
    md = _open(path, 0)
    md._held_copy = lambda record: None  # the old code's add: no identity check
    md.add(_eviction(3, 16))
    md.close(spill_dram=False)


def test_verify_names_a_duplicate_and_repair_quarantines_the_copy(tmp_path, capsys):
    path = tmp_path / "mem"
    _plant_duplicate(path)
    capsys.readouterr()
    assert main(["memory", "verify", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["duplicates"] == [[1, 3]]
    assert report["repair"] == f"hermes-video memory repair {path}"
    assert main(["memory", "verify", str(path)]) == 1
    assert "records 1, 3: one eviction stored 2 times" in capsys.readouterr().out
    report = repair(path)
    assert any("record 3: a second copy of record 1" in line for line in report.actions), report.actions
    assert report.records["disk"] == 3
    quarantined = [p.name for p in (path / "quarantine").rglob("*") if p.is_file()]
    assert "duplicate-3.safetensors" in quarantined  # kept, not deleted
    capsys.readouterr()
    assert main(["memory", "verify", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["duplicates"] == [] and report["repair"] is None
    md = _open(path, 0)
    assert sorted(md.disk.ids()) == [0, 1, 2]
    md.close(spill_dram=False)


def test_a_duplicate_across_the_log_and_level3_is_found_and_the_log_copy_quarantined(tmp_path, capsys):
    path = tmp_path / "mem"
    md = _open(path, 0)
    md.add(_eviction(0, 8))
    md.close(spill_dram=False)
    md = _open(path, 1 << 30)
    md._held_copy = lambda record: None
    md.add(_eviction(1, 8))  # stays in DRAM: durable in the log only
    md.close(spill_dram=False)
    capsys.readouterr()
    assert main(["memory", "verify", str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["duplicates"] == [[0, 1]]
    report = repair(path)
    assert any(line.startswith(f"{WAL}/record 1: a second copy of record 0") for line in report.actions)
    assert report.records == {"disk": 1, "dram": 0}
    capsys.readouterr()
    assert main(["memory", "verify", str(path)]) == 0


def test_a_replayed_eviction_is_stored_once_in_an_object_store(tmp_path, aws_env):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    from hermes.tiers.remote_level import RemoteOptions

    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket="mem")
        remote = RemoteOptions(cache_dir=str(tmp_path / "cache"))
        for dram_bytes in (0, 1 << 30):  # level 3, then level 2's log in the store
            url = f"s3://mem/once-{dram_bytes}"
            md = MemoryDirectory(url, FP, dram_bytes, 1 << 30, remote=remote)
            for n, frames_seen in enumerate((8, 16)):
                md.add(_eviction(n, frames_seen))
            md.close(spill_dram=False)
            md = MemoryDirectory(url, FP, dram_bytes, 1 << 30, remote=remote)
            assert md.add(_eviction(md.new_record_id(), 16)) == 1
            md.close(spill_dram=False)
            reader = MemoryDirectory(url, None, 0, 0, readonly=True, remote=RemoteOptions(cache_dir=str(tmp_path / "r")))
            assert reader.duplicates() == [] and len(set(reader.disk.ids()) | set(reader.wal.ids())) == 2
            reader.close(spill_dram=False)
