"""MemoryDirectory: DRAM -> summarise -> disk, search and fetch across levels, checkpoints, inspect/verify."""

from __future__ import annotations

import functools
import json
import threading
import time

import pytest
import torch

from hermes.rope import RotarySpec
from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.checkpoint import CHECKPOINTS
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.disk import SEGMENTS
from hermes.tiers.errors import MemoryDirError
from hermes.tiers.prefetch import Prefetcher
from hermes.tiers.summarise import summarise

FP = {"model": "dir-test", "family": "synthetic", "num_layers": 3}
SPEC = RotarySpec(head_dim=16)


def _rec(rid, value=None):
    rec = synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=12)
    rec.value = float(rid % 5) if value is None else value
    return rec


def _open(path, dram_bytes=40_000, **kw):
    return MemoryDirectory(path, FP, dram_bytes=dram_bytes, disk_bytes=kw.pop("disk_bytes", 1 << 30),
                           summarise_fn=functools.partial(summarise, anchors_per_layer=2, spec=SPEC), **kw)


def test_records_flow_dram_to_summarised_disk_and_come_back(tmp_path):
    md = _open(tmp_path)
    for rid in range(40):
        md.add(_rec(rid))
        stats = md.stats()
        assert stats["dram_bytes"] <= 40_000
    md.flush()
    stats = md.stats()
    assert stats["dram_records"] + stats["disk_records"] == 40 and stats["disk_records"] > 10
    in_dram, on_disk = md.dram.ids(), [e.record_id for e in md.disk.entries()]
    # least valuable left DRAM: nothing on disk is worth more than what stayed
    assert max(_rec(i).value for i in on_disk) <= min(_rec(i).value for i in in_dram)
    disk_rec, dram_rec = md.fetch([on_disk[0], in_dram[0]])
    assert disk_rec.kind == "summary" and disk_rec.num_tokens() == [3, 3, 3]  # 2 anchors + mean
    assert dram_rec.kind == "full" and dram_rec.num_tokens() == _rec(in_dram[0]).num_tokens()
    assert disk_rec.layers[0].keys.dtype == torch.float32 and md.fetched == {"dram": 1, "prefetch": 0, "disk": 1}
    # search sees both levels
    for rid in (on_disk[1], in_dram[1]):
        assert md.search(_rec(rid).embedding, 2)[0][0] == rid
    with pytest.raises(KeyError):
        md.fetch([12345])
    assert md.new_record_id() == 40
    md.close()  # DRAM is written to disk whole
    again = _open(tmp_path)
    assert sorted(again.disk.ids()) == list(range(40)) and len(again.dram) == 0
    assert again.fetch([in_dram[0]])[0].kind == "full" and again.new_record_id() == 41
    again.close()


def test_prefetch_serves_fetch_without_reading_the_disk(tmp_path):
    md = _open(tmp_path, dram_bytes=0)
    for rid in range(10):
        md.add(_rec(rid))
    md.flush()
    assert md.prefetch([2, 3]) == 2
    deadline = time.monotonic() + 5
    while md.prefetcher.stats()["records"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    md.fetch([2, 3, 4])
    assert md.fetched == {"dram": 0, "prefetch": 2, "disk": 1}
    assert md.prefetcher.stats()["hits"] == 2 and md.prefetcher.stats()["misses"] == 1
    md.close()


def test_prefetcher_waits_for_loads_in_flight_and_forgets_invalidated():
    gate = threading.Event()
    loads = []

    def slow_load(rid):
        gate.wait(5)
        loads.append(rid)
        return _rec(rid)

    pf = Prefetcher(slow_load, capacity_bytes=1 << 20)
    pf.prefetch([1, 2, 3])
    pf.prefetch([3])  # a newer candidate list: queued loads of 2 (and maybe 1) are cancelled
    gate.set()
    assert pf.get(3).record_id == 3 and pf.stats()["waited"] + pf.stats()["hits"] == 1
    assert 2 not in loads and pf.stats()["cancelled"] >= 1
    pf.invalidate([3])
    assert pf.get(3, wait=False) is None and pf.stats()["misses"] == 1
    pf.close()


def test_checkpoints_are_atomic_checked_and_replaced(tmp_path):
    md = _open(tmp_path)
    keys = torch.randn(2, 3, 4)
    md.save_checkpoint("level1", {"keys": keys, "view": keys[0], "ids": torch.arange(5)}, {"next_position": 17})
    tensors, meta = md.load_checkpoint("level1")
    assert torch.equal(tensors["keys"], keys) and torch.equal(tensors["view"], keys[0]) and meta == {"next_position": 17}
    md.save_checkpoint("level1", {"keys": keys * 2}, {"next_position": 18})
    folder = tmp_path / CHECKPOINTS
    assert len(list(folder.glob("level1.*.safetensors"))) == 1  # the old file is gone
    assert md.load_checkpoint("level1")[1] == {"next_position": 18}
    with pytest.raises(KeyError):
        md.load_checkpoint("session")
    with pytest.raises(ValueError, match="name"):
        md.save_checkpoint("../escape", {}, {})
    # a crash between writing the tensors and the JSON: the old checkpoint stands, the stray file goes
    (folder / "level1.deadbeefdeadbeef.safetensors").write_bytes(b"new tensors, never committed")
    (folder / "level1.json.tmp").write_text("{")
    path = folder / json.loads((folder / "level1.json").read_text())["file"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(MemoryDirError, match="level1.*sha256"):
        md.load_checkpoint("level1")
    ok, messages = md.verify()
    assert not ok and any("level1" in m for m in messages)
    md.close()
    again = _open(tmp_path)
    assert not (folder / "level1.deadbeefdeadbeef.safetensors").exists() and not (folder / "level1.json.tmp").exists()
    again.close()



def test_checkpoints_of_ever_new_sizes_leave_nothing_behind_in_the_process(tmp_path):
    """A stream's checkpoint grows by its frame times at every save; safetensors' own writer made a ctypes
    array type for each new byte length, kept by ctypes for the process's life (5.6 KB each, `bench day`)."""
    import ctypes
    import gc

    def array_types() -> int:
        gc.collect()
        return sum(isinstance(o, type) and issubclass(o, ctypes.Array) for o in gc.get_objects())

    md = _open(tmp_path)
    md.save_checkpoint("session", {"t": torch.zeros(1, dtype=torch.float64)}, {"frames": 1})
    before = array_types()
    for n in range(2, 52):
        times = torch.arange(n, dtype=torch.float64)
        md.save_checkpoint("session", {"t": times, "keys": torch.randn(2, n).to(torch.bfloat16)}, {"frames": n})
    assert array_types() == before
    tensors, meta = md.load_checkpoint("session")
    assert torch.equal(tensors["t"], times) and tensors["keys"].dtype == torch.bfloat16 and meta == {"frames": 51}
    md.close()

def test_inspect_and_verify(tmp_path):
    md = _open(tmp_path, dram_bytes=0)
    for rid in range(6):
        md.add(_rec(rid))
    md.save_checkpoint("session", {"x": torch.zeros(2)}, {"frames": 12})
    md.flush()
    info = md.inspect()
    assert info["disk"]["records"] == 6 and info["time_span_s"] == [0.0, 5 * 8.0 + 7.5]
    assert [r["id"] for r in info["records"]] == list(range(6)) and info["records"][0]["kind"] == "summary"
    assert info["index"]["records"] == 6 and info["index"]["dim"] == 12
    assert info["checkpoints"][0]["name"] == "session" and info["fingerprint"] == FP
    assert json.dumps(info)  # JSON-able, for `memory inspect --json`
    ok, messages = md.verify()  # every source of truth agrees: 6 records in manifest, segments, index, checkpoint
    assert ok and messages == ["records: disk_manifest 6, disk_segments 6, dram_log_manifest 0, dram_log_segments 0, "
                               "index 6, checkpoint session {'disk': 6, 'dram_log': 0}"]
    entry = md.disk.entries()[2]
    seg = tmp_path / SEGMENTS / entry.segment
    data = bytearray(seg.read_bytes())
    data[entry.offset + entry.length // 2] ^= 0x10
    seg.write_bytes(bytes(data))
    ok, messages = md.verify()
    assert not ok and len(messages) == 2 and f"record {entry.record_id} " in messages[0]
    assert messages[1].startswith("records: ")
    md.close()
    readonly = MemoryDirectory(tmp_path, None, 0, 1 << 30, readonly=True)  # `memory verify DIR`
    ok, messages = readonly.verify()
    assert not ok and f"record {entry.record_id} " in messages[0]
    with pytest.raises(MemoryDirError, match="read-only"):
        readonly.add(_rec(99))
    readonly.close()


def test_disk_budget_bounds_records_and_index(tmp_path):
    md = _open(tmp_path, dram_bytes=5_000, disk_bytes=60_000, segment_bytes=8_000)
    for rid in range(300):
        md.add(_rec(rid))
        assert md.stats()["dram_bytes"] <= 5_000 and md.stats()["disk_bytes"] <= 60_000
    md.flush()
    stats = md.stats()
    assert stats["disk_bytes"] <= 60_000 and 0 < stats["disk_records"] < 300
    assert sorted(md.index.ids().tolist()) == sorted(md.disk.ids())  # dropped records left the index
    assert md.verify()[0]
    md.close()


def _block_writer(md):
    """Hold the disk writer thread until the returned event is set (a slow disk, made to order)."""
    release, started = threading.Event(), threading.Event()
    md.disk.call_on_writer(lambda: (started.set(), release.wait(30)))
    assert started.wait(30)
    return release


def test_checkpoint_and_index_save_run_on_the_writer_thread_from_a_snapshot(tmp_path, monkeypatch):
    from hermes.tiers import checkpoint as ckpt
    from hermes.tiers.index import RecordIndex

    threads = {"checkpoint": [], "index": []}
    real_save, real_index_save = ckpt.save_checkpoint, RecordIndex.save
    monkeypatch.setattr(ckpt, "save_checkpoint", lambda *a, **k: (
        threads["checkpoint"].append(threading.current_thread().name), real_save(*a, **k))[1])
    monkeypatch.setattr(RecordIndex, "save", lambda self, *a, **k: (
        threads["index"].append(threading.current_thread().name), real_index_save(self, *a, **k))[1])
    md = _open(tmp_path, dram_bytes=0)
    threads["index"].clear()  # opening saves a new directory's empty index, on the opening thread
    for rid in range(4):
        md.add(_rec(rid))
    md.save_checkpoint("session", {"x": torch.zeros(3)}, {"frames": 1})
    assert threads["checkpoint"] == [md.disk._writer.name] and threads["index"] == [md.disk._writer.name]
    assert md.load_checkpoint("session")[1] == {"frames": 1}
    # the writer is busy: the caller queues the next checkpoint and goes on, the previous one stands
    release = _block_writer(md)
    level1 = torch.ones(3)
    md.save_checkpoint("session", {"x": level1}, {"frames": 2}, wait=False)
    level1.mul_(7)  # the caller's state moves on; the checkpoint holds the snapshot
    md.add(_rec(4))  # ingest continues while the checkpoint waits for the writer
    tensors, meta = md.load_checkpoint("session")
    assert meta == {"frames": 1} and torch.equal(tensors["x"], torch.zeros(3))
    assert len(threads["checkpoint"]) == 1
    release.set()
    md.wait_checkpoint()
    tensors, meta = md.load_checkpoint("session")
    assert meta == {"frames": 2} and torch.equal(tensors["x"], torch.ones(3))
    assert threads["checkpoint"] == [md.disk._writer.name] * 2
    # what it claims was committed before it was written: the 4 records added before, not the 5th
    claims = json.loads((tmp_path / CHECKPOINTS / "session.json").read_text())["meta"]["store"]
    assert claims["disk_records"] == 4
    # and so does the index saved with it (a record a crash could still lose would force a rebuild on open)
    assert json.loads((tmp_path / "index.json").read_text())["count"] == 4 and len(md.index) == 5
    md.close()
    again = _open(tmp_path, dram_bytes=0)
    assert again.index_state == "loaded" and len(again.index) == 5
    again.close()


def test_a_failed_background_checkpoint_is_reported_and_the_previous_stands(tmp_path, monkeypatch):
    from hermes.tiers import checkpoint as ckpt

    md = _open(tmp_path)
    md.save_checkpoint("session", {"x": torch.zeros(2)}, {"frames": 1})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_checkpoint", disk_full)
    md.save_checkpoint("session", {"x": torch.ones(2)}, {"frames": 2}, wait=False)
    with pytest.raises(Exception, match="No space left"):
        md.wait_checkpoint()
    assert md.load_checkpoint("session")[1] == {"frames": 1}
    md.add(_rec(0))  # the stores are unharmed: the failure was the checkpoint's
    md.close()


_KILLED_WRITER = """
import sys, threading, time, torch
from hermes.tiers.directory import MemoryDirectory
md = MemoryDirectory(sys.argv[1], {"model": "dir-test", "family": "synthetic", "num_layers": 3}, 0, 1 << 30)
md.save_checkpoint("session", {"x": torch.zeros(4)}, {"frames": 1})
md.disk.call_on_writer(lambda: time.sleep(60))  # the disk is slow: the next save waits behind this
md.save_checkpoint("session", {"x": torch.ones(4)}, {"frames": 2}, wait=False)  # snapshot taken, queued
print("queued", flush=True)
time.sleep(60)
"""


def test_a_kill_between_snapshot_and_write_leaves_the_previous_checkpoint(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "m")], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout.readline().strip() == "queued"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    md = MemoryDirectory(tmp_path / "m", FP, 0, 1 << 30)
    tensors, meta = md.load_checkpoint("session")
    assert meta == {"frames": 1} and torch.equal(tensors["x"], torch.zeros(4))
    ok, messages = md.verify()
    assert ok, messages


@pytest.mark.parametrize("fetch_readers", [1, 4])
def test_fetch_reads_disk_records_in_the_order_asked_and_leaves_out_a_damaged_one(tmp_path, fetch_readers):
    # several disk records per fetch are read at once (fetch_readers > 1): the answer must be the same
    shape = dict(layers=2, tokens=4, head_dim=8, embed_dim=16)
    md = MemoryDirectory(tmp_path, FP, dram_bytes=0, disk_bytes=1 << 30, durable_dram=False, prefetch_bytes=0,
                         fetch_readers=fetch_readers)
    for rid in range(12):
        md.add(synthetic_record(rid, **shape).compress("int8"))
    md.flush()
    damaged = next(e for e in md.disk.entries() if e.record_id == 7)
    with open(tmp_path / SEGMENTS / damaged.segment, "r+b") as f:
        f.seek(damaged.offset + damaged.length - 3)
        byte = f.read(1)
        f.seek(damaged.offset + damaged.length - 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    asked = [9, 7, 2, 11, 0]
    with pytest.warns(UserWarning, match="record 7"):
        got = md.fetch(asked)
    assert [r.record_id for r in got] == [9, 2, 11, 0]
    for r in got:
        want = synthetic_record(r.record_id, **shape).compress("int8").dequantize()
        assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                   for a, b in zip(r.layers, want.layers))
    assert len(md.skipped) == 1 and md.fetched["disk"] == 4
    md.close()


def test_disk_records_counts_only_what_a_restart_would_find(tmp_path, monkeypatch):
    # `stats()["disk_records"]` is what a stream's memory JSON shows as levels.disk.records: a record the
    # writer queued or encoded but whose manifest line is not yet fsynced is not counted, so a crash
    # cannot take away a record that was shown
    from hermes.tiers.disk import DiskStore

    started, release, real_sync = threading.Event(), threading.Event(), DiskStore._sync_group

    def held_sync_group(self, *job):  # the fsyncs of a slow disk, made to order
        started.set()
        release.wait(timeout=30)
        return real_sync(self, *job)

    monkeypatch.setattr(DiskStore, "_sync_group", held_sync_group)
    md = _open(tmp_path / "mem", dram_bytes=0)
    try:
        for rid in range(3):
            md.add(_rec(rid))
        assert started.wait(30)
        reader = MemoryDirectory(tmp_path / "mem", None, 0, 0, readonly=True)
        assert md.stats()["disk_records"] == 0 == reader.disk.num_records and md.disk.pending_ids()
        reader.close(spill_dram=False)
    finally:
        release.set()
    md.disk.flush()
    reader = MemoryDirectory(tmp_path / "mem", None, 0, 0, readonly=True)
    assert md.stats()["disk_records"] == 3 == reader.disk.num_records
    reader.close(spill_dram=False)
    md.close()


def test_a_close_that_fails_on_level_2_still_releases_level_3(tmp_path, monkeypatch):
    """A full disk can fail level 2's log as the directory closes: level 3 still closes and lets the
    directory go, so that the process opens it again once there is room (the error is still raised)."""
    md = _open(tmp_path / "mem")
    md.add(_rec(1))
    md.flush()
    assert md.wal is not None

    def full():  # as the log's writer reports a failed write once its close has let the log go
        raise MemoryDirError("level 2's log: No space left on device")

    monkeypatch.setattr(md.wal, "_raise_if_failed", full)
    with pytest.raises(MemoryDirError, match="No space left"):
        md.close(spill_dram=False)
    again = _open(tmp_path / "mem")  # before: "memory directory ... is in use by process <this one>"
    assert [r.record_id for r in again.fetch([1])] == [1]  # and what was committed is there
    again.close()
