"""Every damage class `memory verify` must catch, on one directory as a run leaves it: verify exits 1 and
names the repair; `memory repair` fixes it, moving what it replaces or leaves out to quarantine (nothing
deleted silently); verify then exits 0.

Classes: flipped bytes, a truncated segment, a cut manifest, a deleted index, a deleted segment,
duplicated manifest lines, another model's fingerprint. A read-only directory and a full disk are not
damage: a run stops with one line (exit 3) and the directory verifies as it was (the last two tests;
they need a filesystem of their own, a tmpfs, and are skipped with the reason where mounting is not
allowed).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
import torch

from hermes.errors import StorageError
from hermes.rope import RotarySpec
from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.commands import verify_command
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.fingerprint import FINGERPRINT, kv_layout, make_fingerprint
from hermes.tiers.index import INDEX, INDEX_META
from hermes.tiers.manifest import MANIFEST, SEGMENTS
from hermes.tiers.meaning import content_vector
from hermes.tiers.repair import WAL, repair

SPEC = RotarySpec(head_dim=16, theta=1e6)
FP = make_fingerprint("classes-test", "synthetic", 3, 2, 16, weights="sha256:" + "e" * 64,
                      kv=kv_layout(SPEC, 2, "float32"))
OTHER = make_fingerprint("another-model", "synthetic", 3, 4, 16, weights="sha256:" + "f" * 64,
                         kv=kv_layout(SPEC, 4, "float32"))
DISK, DRAM = 12, 3


def _rec(rid: int):
    rec = synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=32)
    rec.embedding = content_vector(rec.layers[-1].keys, rec.layers[-1].positions, SPEC)
    return rec


def _open(path, dram_bytes=1 << 30):
    return MemoryDirectory(path, FP, dram_bytes=dram_bytes, disk_bytes=1 << 30, segment_bytes=5000)


def _make(path) -> None:
    md = _open(path, dram_bytes=0)
    for rid in range(DISK):
        md.add(_rec(rid))
    md.close(spill_dram=False)
    md = _open(path)
    for rid in range(DISK, DISK + DRAM):
        md.add(_rec(rid))
    md.save_checkpoint("session", {"x": torch.arange(6.0)}, {"frames": 60})
    md.close(spill_dram=False)


def _segments(path):
    return sorted((path / SEGMENTS).iterdir())


def _flip(path):
    seg = _segments(path)[0]
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    seg.write_bytes(bytes(data))


def _truncate(path):
    seg = _segments(path)[0]
    os.truncate(seg, seg.stat().st_size - 100)


def _cut_manifest(path):
    manifest = path / MANIFEST
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(b"".join(lines[: len(lines) // 2]))


def _delete_index(path):
    (path / INDEX).unlink()
    (path / INDEX_META).unlink()


def _delete_segment(path):
    _segments(path)[0].unlink()


def _duplicate_lines(path):
    manifest = path / MANIFEST
    first_add = next(line for line in manifest.read_bytes().splitlines(keepends=True) if b'"op":"add"' in line)
    with open(manifest, "ab") as f:
        f.write(first_add)


def _other_fingerprint(path):
    (path / FINGERPRINT).write_text(json.dumps(OTHER))


DAMAGE = {"flipped bytes": _flip, "truncated segment": _truncate, "cut manifest": _cut_manifest,
          "deleted index": _delete_index, "deleted segment": _delete_segment, "duplicated lines": _duplicate_lines,
          "another model's fingerprint": _other_fingerprint}
# where the segments no longer hold every record's bytes, repair cannot give them all back
LOSSY = {"flipped bytes", "truncated segment", "deleted segment"}


def _files(path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()
            and "quarantine" not in p.parts and p.name != "lock"}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_each_damage_class_fails_verify_and_repair_keeps_what_it_replaces(tmp_path, damage, capsys):
    path = tmp_path / "mem"
    _make(path)
    assert verify_command(str(path)) == 0
    DAMAGE[damage](path)
    capsys.readouterr()
    assert verify_command(str(path), as_json=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["repair"] == f"hermes-video memory repair {path}"
    assert report["problems"] or report["disagreements"] or report["duplicates"]
    before = _files(path)
    result = repair(path)
    capsys.readouterr()
    assert verify_command(str(path)) == 0, (result, capsys.readouterr())
    quarantined = [p for p in (path / "quarantine").rglob("*") if p.is_file()] if (path / "quarantine").exists() else []
    # nothing deleted silently: every file that shrank or went is in quarantine (or a derived index, rebuilt)
    after = _files(path)
    for name, size in before.items():
        if after.get(name, -1) < size and name not in (INDEX, INDEX_META):
            assert any(q.name.endswith(os.path.basename(name)) or q.name.endswith(os.path.basename(name) + ".tail")
                       for q in quarantined), (name, [q.name for q in quarantined])
    md = _open(path)
    held = set(md.disk.ids()) | set(md.dram.ids())
    md.close(spill_dram=False)
    assert set(range(DISK, DISK + DRAM)) <= held <= set(range(DISK + DRAM))  # the log's records all came through
    if damage not in LOSSY:
        assert held == set(range(DISK + DRAM)), result.actions


def _tmpfs(tmp_path, size: str):
    """A tmpfs of `size` mounted under tmp_path (unmounted by the caller), or a skip saying why not."""
    mount = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): needs root and "
                    f"CAP_SYS_ADMIN")
    return mount


def test_a_read_only_directory_is_one_storage_error_and_not_damage(tmp_path):
    mount = _tmpfs(tmp_path, "8m")
    try:
        path = mount / "mem"
        _make(path)
        before = _files(path)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        with pytest.raises(StorageError) as err:
            _open(path)  # a run: exit 3, one line
        assert "\n" not in str(err.value) and str(path) in str(err.value)
        assert verify_command(str(path)) == 0  # read-only, but nothing is damaged
        with pytest.raises(StorageError):
            repair(path)
        assert _files(path) == before
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_stops_the_writer_with_one_line_and_loses_nothing_committed(tmp_path):
    mount = _tmpfs(tmp_path, "256k")
    try:
        path = mount / "mem"
        md = _open(path, dram_bytes=0)
        committed = 0
        with pytest.raises(StorageError) as err:
            for rid in range(10_000):  # each about 5 kB: the filesystem fills long before
                md.add(_rec(rid))
                md.flush()
                committed = rid + 1
        assert "\n" not in str(err.value) and str(path) in str(err.value)
        assert committed > 0
        try:
            md.close(spill_dram=False)
        except StorageError:
            pass  # the same failure, reported again
        assert verify_command(str(path)) == 0  # what failed was never committed: nothing damaged
        subprocess.run(["mount", "-o", "remount,size=16m", str(mount)], check=True)  # space freed
        again = _open(path, dram_bytes=0)  # and a run continues once there is room
        assert set(range(committed)) <= set(again.disk.ids())
        again.close()
    finally:
        subprocess.run(["umount", str(mount)], check=False)
