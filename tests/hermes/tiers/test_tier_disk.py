"""Disk level: bounded, checksummed, torn states cut on open, other models' directories refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hermes.errors import UsageError
from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.disk import MANIFEST, SEGMENTS, DiskStore
from hermes.tiers.errors import MemoryDamagedError, MemoryDirError, RecordCorruptError
from hermes.tiers.fingerprint import make_fingerprint
from hermes.tiers.repair import repair

FP = make_fingerprint("tiny-test", "llava_onevision", 2, 1, 8, memory={"dram_dtype": "int8"})


def _rec(rid: int, tokens: int | None = None):
    return synthetic_record(rid, layers=2, heads=1, tokens=tokens or 3 + rid % 7, head_dim=8, embed_dim=8).compress("int8")


def _same(a, b) -> bool:
    def tensors(r):
        return [t for l in r.layers for t in l.tensors().values()] + [r.embedding]

    return a.record_id == b.record_id and all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b)))


def _files_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in (directory / SEGMENTS).iterdir()) + (directory / MANIFEST).stat().st_size


def _write(directory: Path, ids, **kw) -> None:
    with DiskStore(directory, kw.pop("capacity", 1 << 30), FP, **kw) as store:
        for rid in ids:
            store.add(_rec(rid))


def test_disk_bytes_never_exceeded_oldest_dropped_first(tmp_path):
    cap = 120_000
    store = DiskStore(tmp_path, cap, FP, segment_bytes=20_000, record_overhead_bytes=40)
    for rid in range(2000):
        store.add(_rec(rid))
        assert store.disk_bytes <= cap  # after every add (the writer keeps it so at every moment)
        if rid % 20 == 19:  # fsyncs are slow on some disks: look at the files after every 20th
            store.flush()
            assert _files_bytes(tmp_path) + 40 * store.num_records == store.disk_bytes <= cap
            live = store.ids()
            assert live == list(range(live[0], rid + 1))  # what is left is the newest, contiguous
    assert store.num_records > 20 and len(store.segments()) >= 3
    for rid in store.ids()[:3] + store.ids()[-3:]:
        assert _same(store.load(rid), _rec(rid))
    with pytest.raises(KeyError):
        store.load(0)  # dropped long ago
    manifest_lines = (tmp_path / MANIFEST).read_bytes().count(b"\n")
    assert manifest_lines < 3 * store.num_records  # dead lines are compacted away
    store.close()
    reopened = DiskStore(tmp_path, cap, FP)
    assert reopened.ids() == live and not reopened.open_problems and not reopened.open_notes
    assert reopened.next_id == 2000
    reopened.close()


def test_record_larger_than_the_cap_is_a_clear_error(tmp_path):
    store = DiskStore(tmp_path, 3_000, FP)
    store.add(_rec(0, tokens=200))
    with pytest.raises(MemoryDirError, match="record 0 needs .* raise the disk budget"):
        store.flush()
    with pytest.raises(MemoryDirError):
        store.close()


def test_flipped_byte_found_by_verify_and_load(tmp_path):
    _write(tmp_path, range(5))
    entry = [e for e in DiskStore(tmp_path, 1 << 30, FP, readonly=True).entries() if e.record_id == 3][0]
    path = tmp_path / SEGMENTS / entry.segment
    data = bytearray(path.read_bytes())
    data[entry.offset + entry.length - 7] ^= 0x40  # inside record 3's tensor bytes
    path.write_bytes(bytes(data))
    store = DiskStore(tmp_path, 1 << 30, FP)
    report = store.verify()
    assert not report.ok and report.records_checked == 5
    assert len(report.problems) == 1 and "record 3 " in report.problems[0]
    with pytest.raises(RecordCorruptError) as err:
        store.load(3)
    msg = str(err.value)
    assert "record 3 " in msg and "sha256" in msg and "memory verify" in msg and "\n" not in msg
    assert isinstance(err.value, UsageError)  # one line, exit code 2 at the CLI
    assert _same(store.load(4), _rec(4))  # the others are fine
    store.close()


def test_torn_manifest_tail_and_stray_segment_bytes_are_cut(tmp_path):
    _write(tmp_path, range(4))
    seg = sorted((tmp_path / SEGMENTS).iterdir())[-1]
    with open(seg, "ab") as f:
        f.write(os.urandom(1000))  # a record's bytes whose manifest line never came
    with open(tmp_path / MANIFEST, "ab") as f:
        f.write(b'{"op":"add","id":4,"seg":"0000')  # a line cut short by the crash
    readonly = DiskStore(tmp_path, 1 << 30, FP, readonly=True)  # reports, changes nothing
    assert len(readonly.open_notes) == 2 and (tmp_path / MANIFEST).read_bytes().endswith(b'"0000')
    store = DiskStore(tmp_path, 1 << 30, FP)
    assert any("torn tail" in n for n in store.open_notes) and any("bytes after" in n for n in store.open_notes)
    assert not store.open_problems and store.verify().ok
    assert (tmp_path / MANIFEST).read_bytes().endswith(b"}\n")
    store.add(_rec(4))
    store.flush()
    assert all(_same(store.load(i), _rec(i)) for i in range(5))
    store.close()


def test_unterminated_but_valid_last_line_is_torn(tmp_path):
    _write(tmp_path, range(3))
    data = (tmp_path / MANIFEST).read_bytes()
    (tmp_path / MANIFEST).write_bytes(data[:-1])  # the newline is what commits a line
    with DiskStore(tmp_path, 1 << 30, FP) as store:
        assert store.ids() == [0, 1]
        assert store.verify().ok


def test_orphan_dropped_segment_and_unfinished_compaction_are_cleaned(tmp_path):
    _write(tmp_path, range(3))
    (tmp_path / SEGMENTS / "000099.safetensors").write_bytes(b"x" * 100)  # created, never committed
    first = sorted((tmp_path / SEGMENTS).iterdir())[0].name
    with open(tmp_path / MANIFEST, "ab") as f:  # the drop line is durable, the unlink never happened
        f.write(json.dumps({"op": "drop", "seg": first}, separators=(",", ":")).encode() + b"\n")
    (tmp_path / (MANIFEST + ".tmp")).write_bytes(b"half a compaction")
    with DiskStore(tmp_path, 1 << 30, FP) as store:
        assert store.ids() == [] and store.verify().ok
        assert sorted(p.name for p in (tmp_path / SEGMENTS).iterdir()) == []
        assert not (tmp_path / (MANIFEST + ".tmp")).exists()
        store.add(_rec(7))
    with DiskStore(tmp_path, 1 << 30, FP) as store:
        assert store.ids() == [7] and store.next_id == 8


def test_record_whose_bytes_vanished_is_refused_then_repaired_into_quarantine(tmp_path):
    _write(tmp_path, range(3))
    seg = sorted((tmp_path / SEGMENTS).iterdir())[-1]
    entry = DiskStore(tmp_path, 1 << 30, FP, readonly=True).entries()[-1]
    os.truncate(seg, entry.offset + 10)  # storage lost committed bytes: damage, not a torn write
    before = seg.read_bytes()
    with pytest.raises(MemoryDamagedError, match="record 2: its bytes .* missing.*memory repair") as err:
        DiskStore(tmp_path, 1 << 30, FP)
    assert "\n" not in str(err.value) and seg.read_bytes() == before  # refused, nothing cut
    report = repair(tmp_path)
    assert any("record 2" in u for u in report.unfixable) and report.records["disk"] == 2
    with DiskStore(tmp_path, 1 << 30, FP) as store:
        assert store.ids() == [0, 1] and not store.open_problems and store.verify().ok
    kept = list((tmp_path / "quarantine").rglob("*.tail"))  # the 10 stray bytes were moved, not deleted
    assert len(kept) == 1 and kept[0].read_bytes() == before[entry.offset:]


def test_fingerprint_mismatch_is_refused_with_a_clear_message(tmp_path):
    _write(tmp_path, range(2))
    other = make_fingerprint("qwen2-vl-2b", "qwen2_vl", 28, 2, 128, rope="mrope")
    with pytest.raises(MemoryDirError) as err:
        DiskStore(tmp_path, 1 << 30, other)
    msg = str(err.value)
    assert f"memory directory {tmp_path} was made by model 'tiny-test'" in msg
    assert "this run uses model 'qwen2-vl-2b'" in msg and "use another --memory-dir" in msg
    assert "num_layers" in msg and "\n" not in msg
    assert err.value.exit_code == 2
    changed = dict(FP, memory={"dram_dtype": "fp16"})  # same model, other memory settings
    with pytest.raises(MemoryDirError, match="differ in: memory"):
        DiskStore(tmp_path, 1 << 30, changed)
    with DiskStore(tmp_path, 1 << 30, FP) as store:  # and the directory is untouched by the refusals
        assert store.ids() == [0, 1]


def test_foreign_directory_and_second_writer_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("someone else's")
    with pytest.raises(MemoryDirError, match="not a hermes memory directory"):
        DiskStore(tmp_path, 1 << 30, FP)
    fresh = tmp_path / "mem"
    first = DiskStore(fresh, 1 << 30, FP)
    with pytest.raises(MemoryDirError, match=f"in use by process {os.getpid()}"):
        DiskStore(fresh, 1 << 30, FP)
    DiskStore(fresh, 1 << 30, FP, readonly=True)  # reading alongside is allowed
    first.close()
    DiskStore(fresh, 1 << 30, FP).close()  # the lock is released on close


def test_pending_records_read_back_before_commit(tmp_path):
    with DiskStore(tmp_path, 1 << 30, FP) as store:
        rec = _rec(0)
        store.add(rec)
        assert 0 in store and _same(store.load(0), rec)
        with pytest.raises(ValueError, match="already"):
            store.add(rec)


@pytest.mark.parametrize("value, kind", [(0.1 + 1 / 3, "summary"), (float("inf"), "full"),
                                         (-2.5e-12, 'odd "kind"\\é')])
def test_manifest_line_is_the_compact_json_of_its_entry(value, kind):
    # readers (recovery, repair, other languages) parse the line as compact JSON; it must round-trip
    from hermes.tiers.manifest import Entry

    e = Entry(17, "000003.safetensors", 40960, 7312, "ab" * 32, 6144, 12.0, 19.5, 24, 40, value, kind, "int8",
              (5, 4, 5))
    obj = {"op": "add", "id": 17, "seg": "000003.safetensors", "off": 40960, "len": 7312, "sha256": "ab" * 32,
           "nbytes": 6144, "t": [12.0, 19.5], "frames": [24, 40], "value": value, "kind": kind, "storage": "int8",
           "tokens": [5, 4, 5]}
    assert e.line() == (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    assert Entry.from_obj(json.loads(e.line())) == e
    assert e.obj() == obj  # what an S3 manifest object holds


@pytest.mark.parametrize("x", [0.1 + 1 / 3, -0.0, 5e-324, 1e16, 1e300, float("nan"), float("inf"), -float("inf"),
                               0, -7, 10**20, True, np.float64(0.25), "odd \"kind\"\\é\n"])
def test_json_scalar_writes_what_json_dumps_writes(x):
    # the manifest line and the record header format their numbers with it instead of the encoder
    from hermes.tiers.manifest import json_scalar

    assert json_scalar(x) == json.dumps(x)
    assert json_scalar(x) == json.dumps(x)  # the same text on every call


def test_a_commit_group_is_written_whole_and_reads_back(tmp_path):
    # one pwritev per group: every record of a group larger than IOV_MAX buffers lands at its own offset
    records = [_rec(rid) for rid in range(300)]  # ~12 buffers each: several pwritev calls in one group
    with DiskStore(tmp_path / "m", 1 << 30, FP, queue_size=1024) as store:
        for r in records:
            store.add(r)
        store.flush()
        assert store.verify().ok
    with DiskStore(tmp_path / "m", 1 << 30, FP) as store:
        assert store.num_records == 300 and all(_same(store.load(r.record_id), r) for r in records)


def test_a_failed_group_commit_stops_every_later_group(tmp_path, monkeypatch):
    # the writer places groups while the syncer makes them durable: a group that fails to commit
    # (here its fsync: a full disk) is reported, and no group placed after it commits, so what is
    # durable is always a prefix of what was added, and exactly what `on_commit` was told
    import errno

    from hermes.errors import StorageError
    from hermes.tiers import ledger

    monkeypatch.setattr(ledger, "GROUP_BYTES", 1)  # every record is a group of its own
    real_sync, calls = DiskStore._sync_group, []

    def sync_group(self, active, new, group, buffers):
        calls.append([e.record_id for e in group])
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_sync(self, active, new, group, buffers)

    monkeypatch.setattr(DiskStore, "_sync_group", sync_group)
    committed: list[int] = []
    store = DiskStore(tmp_path / "m", 1 << 30, FP, queue_size=64, on_commit=committed.extend)
    with pytest.raises(StorageError, match="No space left"):  # from an add after the failure, or the flush
        for rid in range(20):
            store.add(_rec(rid))
        store.flush()
    with pytest.raises(StorageError):
        store.close()
    assert len(calls) == 4 and committed == [i for ids in calls[:3] for i in ids]  # in hand-off order
    monkeypatch.setattr(DiskStore, "_sync_group", real_sync)
    with DiskStore(tmp_path / "m", 1 << 30, FP) as store:
        assert sorted(store.ids()) == committed
        assert store.verify().ok


def test_a_slow_syncer_holds_back_the_caller_so_uncommitted_records_stay_bounded(tmp_path, monkeypatch):
    # records stay in memory until committed: when fsyncs lag, the writer may run at most two groups
    # ahead of the syncer and the caller at most `queue_size` records ahead of the writer
    import threading
    import time

    from hermes.tiers import ledger

    monkeypatch.setattr(ledger, "GROUP_BYTES", 1)  # every record is a group of its own
    release, real_sync = threading.Event(), DiskStore._sync_group

    def stuck_sync_group(self, *job):
        release.wait(timeout=60)
        return real_sync(self, *job)

    monkeypatch.setattr(DiskStore, "_sync_group", stuck_sync_group)
    store = DiskStore(tmp_path / "m", 1 << 30, FP, queue_size=4)
    adder = threading.Thread(target=lambda: [store.add(_rec(rid)) for rid in range(50)])
    adder.start()
    try:
        deadline = time.monotonic() + 30
        while not (store._sync_queue.full() and store._queue.full()) and time.monotonic() < deadline:
            time.sleep(0.01)
        # the syncer's group, two waiting, the writer's blocked hand-off and the rest of its batch
        # (at most queue_size items), and a full queue
        assert adder.is_alive() and len(store._pending) <= 1 + 2 + 1 + 5 + 4
    finally:
        release.set()
        adder.join()
        store.close()
    with DiskStore(tmp_path / "m", 1 << 30, FP) as store:
        assert sorted(store.ids()) == list(range(50))
