"""Restores are checked for meaning, not only bytes (`hermes.tiers.meaning`).

A record whose bytes pass their checksum but whose keys mean something else under the directory's KV
layout (written or read under another one: heads swapped, another rotary base) is never replayed by a
resume, never spliced by a recall, fails `memory verify`, and `memory repair` moves it to quarantine.
A directory made under another KV layout (the same model in another dtype) is refused on open.
Healthy records of flat frames (a blank camera), summarised on their way to disk, pass: in a folder, in
an object store, and on a writable reopen, whose spot check must not quarantine them.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from hermes.config import MemoryConfig
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.rope import RotarySpec
from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.commands import open_readonly, verify_command
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.errors import MemoryDirError
from hermes.tiers.fingerprint import kv_layout, make_fingerprint
from hermes.tiers.meaning import content_vector, meaning_problem
from hermes.tiers.repair import repair

SPEC = RotarySpec(head_dim=16, theta=1e6)
FP = make_fingerprint("meaning-test", "synthetic", 3, 2, 16, weights="sha256:" + "d" * 64,
                      kv=kv_layout(SPEC, 2, "float32"))
BAD = 5  # the record whose keys are stored with their heads swapped


def _rec(rid: int):
    """A record whose embedding is its last layer's content (`content_vector`), as `hermes.lower` makes them."""
    rec = synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=32)
    last = rec.layers[-1]
    rec.embedding = content_vector(last.keys, last.positions, SPEC, counts=last.counts)
    return rec


def _misread(rid: int):
    """Record `rid` with the embedding it was made with but its keys' heads swapped (a layout bug)."""
    rec = _rec(rid)
    last = rec.layers[-1]
    rec.layers[-1] = dataclasses.replace(last, keys=last.keys.flip(0).contiguous())
    return rec


def _open(path, dram_bytes, fingerprint=FP):
    return MemoryDirectory(path, fingerprint, dram_bytes=dram_bytes, disk_bytes=1 << 30)


def _quarantined(path) -> list[str]:
    return sorted(p.name for p in (path / "quarantine").rglob("*") if p.is_file())


def test_the_check_passes_records_as_written_and_fails_misread_ones():
    assert meaning_problem(_rec(1), FP) is None
    assert meaning_problem(_rec(1).compress("int8"), FP) is None  # quantised: still itself
    made_before = _rec(1)  # embeddings weighted every token alike before they were count-weighted
    made_before.embedding = content_vector(made_before.layers[-1].keys, made_before.layers[-1].positions, SPEC)
    assert meaning_problem(made_before, FP) is None
    assert "disagrees" in meaning_problem(_misread(1), FP)
    other_base = make_fingerprint("meaning-test", "synthetic", 3, 2, 16, kv=kv_layout(RotarySpec(head_dim=16), 2,
                                                                                      "float32"))
    assert "disagrees" in meaning_problem(_rec(1), other_base)  # read under another rotary base
    three_heads = synthetic_record(1, layers=3, heads=3, tokens=10, head_dim=16, embed_dim=48)
    assert "3 key heads" in meaning_problem(three_heads, FP)


def test_a_resume_never_replays_a_record_that_means_something_else(tmp_path):
    path = tmp_path / "mem"
    md = _open(path, 1 << 30)  # everything stays in level 2: durable in its log
    for rid in range(8):
        md.add(_misread(rid) if rid == BAD else _rec(rid))
    md.close(spill_dram=False)
    with pytest.warns(UserWarning, match=f"record {BAD}: its embedding recomputed"):
        md = _open(path, 1 << 30)
    assert sorted(md.dram.ids()) == [r for r in range(8) if r != BAD]
    assert any(f"record {BAD}" in s for s in md.skipped)
    md.close(spill_dram=False)
    assert _quarantined(path) == [f"dram-meaning-{BAD}.safetensors"]  # kept, not deleted
    ok, messages = MemoryDirectory(path, None, 0, 0, readonly=True).verify()
    assert ok, messages  # out of the log: nothing left that disagrees


def test_recall_leaves_out_and_quarantines_a_misread_level3_record(tmp_path):
    path = tmp_path / "mem"
    md = _open(path, 0)  # straight to level 3
    for rid in range(8):
        md.add(_misread(rid) if rid == BAD else _rec(rid))
    md.flush()
    with pytest.warns(UserWarning, match=f"record {BAD}"):
        got = md.fetch([3, BAD, 6])
    assert [r.record_id for r in got] == [3, 6]
    md.flush()  # the removal is the writer's
    assert BAD not in md.index.ids().tolist() and BAD not in md.disk.ids()
    md.close()
    assert _quarantined(path) == [f"meaning-{BAD}.safetensors"]


def test_verify_fails_on_a_misread_record_and_repair_quarantines_it(tmp_path):
    path = tmp_path / "mem"
    md = _open(path, 0)
    for rid in range(8):
        md.add(_misread(rid) if rid == BAD else _rec(rid))
    md.close()
    reader = MemoryDirectory(path, None, 0, 0, readonly=True)
    report = reader.verify_report()
    reader.close(spill_dram=False)
    assert not report["ok"] and any(f"record {BAD}: its embedding" in p for p in report["problems"]), report
    actions = repair(path).actions
    assert any(f"record {BAD}: its embedding" in a and "quarantine" in a for a in actions), actions
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the spot check on open finds nothing left
        md = _open(path, 0)
    assert sorted(md.disk.ids()) == [r for r in range(8) if r != BAD]
    md.close()


def test_a_directory_of_another_kv_layout_is_refused(tmp_path):
    path = tmp_path / "mem"
    _open(path, 0).close()
    bf16 = make_fingerprint("meaning-test", "synthetic", 3, 2, 16, weights="sha256:" + "d" * 64,
                            kv=kv_layout(SPEC, 2, "bfloat16"))
    with pytest.raises(MemoryDirError, match="differ in: kv"):
        _open(path, 0, fingerprint=bf16)


def test_a_recall_checks_each_level3_record_once_per_process(tmp_path, monkeypatch):
    import hermes.tiers.directory as directory_module

    path = tmp_path / "mem"
    md = _open(path, 0)
    for rid in range(4):
        md.add(_rec(rid))
    md.flush()
    checked = []
    original = directory_module.meaning_problem
    monkeypatch.setattr(directory_module, "meaning_problem", lambda rec, fp: checked.append(rec.record_id)
                        or original(rec, fp))
    for _ in range(3):  # the same question three times
        assert [r.record_id for r in md.fetch([1, 2])] == [1, 2]
    assert sorted(checked) == [1, 2]
    md.close()


def _flat_frames_stream(model, location: str, cache_dir) -> None:
    """Stream 16 flat grey frames (a blank camera; `serve_fixtures.jpeg`'s kind) into `location` with every
    record summarised on its way to level 3 (`dram_bytes=0`), as `serve` does with a small budget."""
    cfg = MemoryConfig(policy="hermes", budget=256, dram_bytes=0, s3_cache_dir=str(cache_dir))
    session = StreamingSession(model, cfg, (), chunk_frames=4, memory_dir=location)
    for i in range(16):
        session.ingest([Frame(i * 0.5, np.full((48, 64, 3), 50 * (i % 6), np.uint8), i)])
    session.close()


def _check_flat_stream(tiny_model, location: str, tmp_path, capsys) -> None:
    _flat_frames_stream(tiny_model, location, tmp_path / "cache")
    assert verify_command(location) == 0, capsys.readouterr()
    store = open_readonly(location)
    records = [store.disk.load(rid) for rid in store.disk.ids()]
    fingerprint = store.disk.fingerprint
    store.close(spill_dram=False)
    assert len(records) >= 10 and all(r.kind == "summary" for r in records)  # what failed: summaries
    last = records[0].layers[-1]
    misread = dataclasses.replace(records[0], layers=[*records[0].layers[:-1],
                                                      dataclasses.replace(last, keys=last.keys.flip(0).contiguous())])
    assert "disagrees" in meaning_problem(misread, fingerprint)  # flat content still shows a layout bug


def test_a_blank_camera_stream_verifies_in_a_folder_and_a_reopen_keeps_every_record(tiny_model, tmp_path, capsys):
    location = str(tmp_path / "mem")
    _check_flat_stream(tiny_model, location, tmp_path, capsys)
    before = MemoryDirectory(location, None, 0, 0, readonly=True)
    ids, fingerprint = before.disk.ids(), before.disk.fingerprint
    before.close(spill_dram=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a quarantine warns
        md = MemoryDirectory(location, fingerprint, dram_bytes=0, disk_bytes=1 << 30)
    assert md.disk.ids() == ids and not md.skipped  # a restart's spot check of level 3 drops none of them
    md.close()


@pytest.mark.slow  # ~14 s: moto answers each of the 15 commits
def test_a_blank_camera_stream_verifies_in_an_object_store(tiny_model, tmp_path, capsys, aws_env):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket="mem")
        _check_flat_stream(tiny_model, "s3://mem/cams/night", tmp_path, capsys)
