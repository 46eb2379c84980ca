"""Every class of damage to a memory directory: found by verify, never served, never deleted silently,
and a documented way out (`memory repair`, which moves what it replaces into quarantine).

The directory under test holds 12 records on disk in several segments, 3 in host memory's log,
a saved index and a session checkpoint, as a run leaves it.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest
import torch

from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.checkpoint import CHECKPOINTS
from hermes.tiers.commands import verify_command
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.disk import MANIFEST, SEGMENTS
from hermes.tiers.errors import MemoryDamagedError, MemoryDirError
from hermes.tiers.fingerprint import make_fingerprint
from hermes.tiers.index import INDEX, INDEX_META
from hermes.tiers.repair import WAL, repair

FP = make_fingerprint("damage-test", "synthetic", 3, 2, 16, weights="sha256:" + "a" * 64)
DISK, DRAM = 12, 3


def _rec(rid: int):
    return synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=12)


def _open(path, **kw):
    return MemoryDirectory(path, kw.pop("fingerprint", FP), dram_bytes=kw.pop("dram_bytes", 1 << 30),
                           disk_bytes=1 << 30, segment_bytes=5000, **kw)


@pytest.fixture
def made(tmp_path):
    """A directory as a stopped run leaves it; returns its path."""
    path = tmp_path / "mem"
    md = _open(path, dram_bytes=0)
    for rid in range(DISK):
        md.add(_rec(rid))  # DRAM holds nothing: straight to disk
    md.close(spill_dram=False)
    md = _open(path)
    for rid in range(DISK, DISK + DRAM):
        md.add(_rec(rid))  # stays in DRAM: durable in the level-2 log
    md.save_checkpoint("session", {"keys.0": torch.arange(6.0)}, {"frames": 40, "next_position": 900})
    md.close(spill_dram=False)
    return path


def _verify(path) -> tuple[bool, list[str]]:
    md = MemoryDirectory(path, None, 0, 0, readonly=True)
    try:
        return md.verify()
    finally:
        md.close(spill_dram=False)


def _segment_bytes(path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((path / SEGMENTS).iterdir())}


def _quarantined(path) -> list[str]:
    return sorted(p.name for p in (path / "quarantine").rglob("*") if p.is_file())


def test_the_undamaged_directory_verifies_and_holds_both_levels(made):
    ok, messages = _verify(made)
    assert ok, messages
    md = _open(made)
    assert len(md.disk.ids()) == DISK and sorted(md.dram.ids()) == list(range(DISK, DISK + DRAM))
    md.close(spill_dram=False)


@pytest.mark.parametrize("damage", ["cut", "emptied", "junk", "deleted"])
def test_a_damaged_manifest_is_refused_not_cut_and_repair_rebuilds_it(made, damage, capsys):
    manifest = made / MANIFEST
    lines = manifest.read_bytes().splitlines(keepends=True)
    segments = _segment_bytes(made)
    if damage == "cut":
        manifest.write_bytes(b"".join(lines[: len(lines) // 2]))  # at a line boundary: no torn tail
    elif damage == "emptied":
        manifest.write_bytes(b"")
    elif damage == "junk":
        manifest.write_bytes(b"this is not a manifest\n" * 5)
    else:
        manifest.unlink()
    ok, messages = _verify(made)
    assert not ok, messages
    assert verify_command(str(made)) == 1
    with pytest.raises(MemoryDamagedError, match="memory repair") as err:
        _open(made)  # a run with --resume or without: refused, one line, nothing changed
    assert "\n" not in str(err.value)
    assert _segment_bytes(made) == segments  # never cut
    report = repair(made)
    assert report.records["disk"] == DISK  # every record the segments hold is back
    capsys.readouterr()
    assert verify_command(str(made)) == 0, capsys.readouterr()
    md = _open(made)
    assert sorted(md.disk.ids()) == list(range(DISK)) and len(md.dram) == DRAM
    assert all(torch.equal(md.fetch([rid])[0].layers[0].values, md.fetch([rid])[0].layers[0].values)
               for rid in range(DISK))
    md.close(spill_dram=False)
    if damage != "deleted":
        assert MANIFEST in _quarantined(made)  # the damaged manifest is kept, not deleted


def test_a_cut_manifest_whose_segment_tail_looks_torn_is_caught_by_the_checkpoint(made):
    # Cut only the newest segment's lines: on its own that looks like a crash's uncommitted tail,
    # but the checkpoint saw those records committed.
    manifest = made / MANIFEST
    lines = manifest.read_bytes().splitlines(keepends=True)
    last_add = max(i for i, line in enumerate(lines) if b'"op":"add"' in line)
    manifest.write_bytes(b"".join(lines[:last_add]))  # a truncation: that line and any after it
    ok, messages = _verify(made)
    assert not ok and any("a checkpoint saw records up to id" in m for m in messages), messages
    with pytest.raises(MemoryDamagedError, match="memory repair"):
        _open(made)
    repair(made)
    assert _verify(made)[0]
    md = _open(made)
    assert sorted(md.disk.ids()) == list(range(DISK))  # the cut line's record is back, from its segment
    md.close(spill_dram=False)


def test_edited_checkpoint_metadata_is_refused(made):
    info_path = made / CHECKPOINTS / "session.json"
    info = json.loads(info_path.read_text())
    info["meta"]["next_position"] = 5  # would change every later position, and so every answer
    info_path.write_text(json.dumps(info))
    ok, messages = _verify(made)
    assert not ok and any("metadata fails its sha256" in m for m in messages), messages
    md = _open(made)  # the records are fine: the directory opens ...
    with pytest.raises(MemoryDirError, match="metadata fails its sha256.*memory repair"):
        md.load_checkpoint("session")  # ... but the edited state is never resumed from
    md.close(spill_dram=False)
    repair(made)
    assert _verify(made)[0] and "session.json" in _quarantined(made)
    assert not list((made / CHECKPOINTS).glob("*.json"))  # a later run starts afresh


def test_a_corrupt_checkpoint_tensor_file_is_refused_and_repair_moves_it_aside(made):
    tensor_file = next((made / CHECKPOINTS).glob("*.safetensors"))
    data = bytearray(tensor_file.read_bytes())
    data[-3] ^= 0xFF
    tensor_file.write_bytes(bytes(data))
    assert not _verify(made)[0]
    md = _open(made)
    with pytest.raises(MemoryDirError, match="fails its sha256 checksum.*memory repair"):
        md.load_checkpoint("session")
    md.close(spill_dram=False)
    repair(made)
    assert _verify(made)[0] and tensor_file.name in _quarantined(made)


def test_a_foreign_index_with_the_same_ids_is_never_searched(made, tmp_path):
    other = tmp_path / "other"
    md = _open(other, dram_bytes=0)
    for rid in range(DISK):
        rec = _rec(rid)
        rec.embedding = -rec.embedding  # other content behind the same ids
        md.add(rec)
    md.close(spill_dram=False)
    for name in (INDEX, INDEX_META):
        shutil.copy(other / name, made / name)
    ok, messages = _verify(made)
    assert not ok and any("not built from this directory's records" in m for m in messages), messages
    md = _open(made)  # a writable open rebuilds it from the records before any search
    assert md.index_state.startswith("rebuilt (foreign")
    query = _rec(3).embedding
    assert md.search(query, 1)[0][0] == 3  # our record, found by our embedding
    md.close(spill_dram=False)
    assert _verify(made)[0]


def test_a_corrupt_record_among_recalled_ones_is_skipped_with_a_warning(made):
    md = _open(made)
    entry = md.disk.entries()[4]
    seg = made / SEGMENTS / entry.segment
    data = bytearray(seg.read_bytes())
    data[entry.offset + entry.length - 20] ^= 0x01
    seg.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = md.fetch([2, entry.record_id, 6])
    assert [r.record_id for r in records] == [2, 6]  # the question is answered from the others
    assert any(f"record {entry.record_id}" in str(w.message) for w in caught)
    assert md.skipped and not md.verify()[0]
    md.close(spill_dram=False)
    report = repair(made)  # left out of the manifest, its bytes kept in quarantine
    assert report.records["disk"] == DISK - 1 and f"record-{entry.record_id}.safetensors" in _quarantined(made)
    ok, messages = _verify(made)
    assert ok, messages


def test_a_removed_lock_file_does_not_let_a_second_writer_in(made):
    first = _open(made)
    (made / "lock").unlink()  # e.g. a cleanup script
    with pytest.raises(MemoryDirError, match=f"in use by process (None|{os.getpid()}|\\?)|in use by another"):
        _open(made)
    first.close(spill_dram=False)
    second = _open(made)  # released on close
    second.close(spill_dram=False)


def test_a_stale_lock_is_reported_with_its_pid(made):
    (made / "lock").write_text("999999\n")  # a writer that died (SIGKILL leaves its pid behind)
    md = _open(made)
    assert md.disk.stale_lock_pid == 999999
    assert any("left by process 999999" in n for n in md.inspect()["notes"])
    md.close(spill_dram=False)
    assert not (made / "lock").exists()  # a clean close leaves no pid


def test_another_models_weights_with_the_same_shapes_are_refused(made):
    other = dict(FP, weights="sha256:" + "b" * 64)  # same family, layers, heads, head size
    with pytest.raises(MemoryDirError, match="differ in: weights"):
        _open(made, fingerprint=other)
    assert _verify(made)[0]


def test_the_level2_log_is_repaired_too(made):
    wal_manifest = made / WAL / MANIFEST
    wal_manifest.write_bytes(b"")
    assert not _verify(made)[0]
    with pytest.raises(MemoryDamagedError):
        _open(made)
    repair(made)
    md = _open(made)
    assert sorted(md.dram.ids()) == list(range(DISK, DISK + DRAM))
    md.close(spill_dram=False)


def test_weight_files_are_hashed_once_and_again_when_they_change(tmp_path, monkeypatch):
    from hermes.tiers import fingerprint

    monkeypatch.setenv("HERMES_CACHE_DIR", str(tmp_path / "cache"))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x01" * 1000)
    hashed = []
    real = fingerprint._hash_file
    monkeypatch.setattr(fingerprint, "_hash_file", lambda p: hashed.append(p) or real(p))
    first = fingerprint.files_digest([weights])
    assert fingerprint.files_digest([weights]) == first and len(hashed) == 1  # cached by path, size, mtime
    weights.write_bytes(b"\x02" * 1000)  # same size, other weights: a new mtime
    os.utime(weights, ns=(1, 10**18))
    assert fingerprint.files_digest([weights]) != first and len(hashed) == 2
