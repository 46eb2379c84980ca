"""`memory verify` and `memory inspect` tell the truth after a crash or damage.

- verify compares every source of truth (segments, manifests, level 2's log, index, checkpoint
  claims) and exits 1 on a disagreement, naming the repair; a manifest cut after a header line that
  names every id handed out (so its ids alone look whole) is caught by the checkpoint's claim on the
  newest segment;
- inspect after a crash shows what a resume will see: the log's records it replays, and that a
  resume is pending.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from hermes.cli import main
from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.errors import MemoryDamagedError
from hermes.tiers.fingerprint import make_fingerprint
from hermes.tiers.manifest import MANIFEST
from hermes.tiers.repair import repair

import pytest

FP = make_fingerprint("truth-test", "synthetic", 3, 2, 16, weights="sha256:" + "c" * 64)
RECORDS = 12


def _rec(rid: int):
    return synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=12)


def _resumed_and_spilled(path) -> None:
    """12 records kept in the level-2 log; a resume with a small level 2 replays them (every id noted, so
    the disk writer's header line names next_id 12 before any record) and spills 10 to one segment;
    a checkpoint; a stop that keeps level 2 in its log."""
    md = MemoryDirectory(path, FP, 1 << 30, 1 << 30)
    for rid in range(RECORDS):
        md.add(_rec(rid))
    md.close(spill_dram=False)
    md = MemoryDirectory(path, FP, 9000, 1 << 30)
    md.save_checkpoint("session", {"x": torch.arange(3.0)}, {"frames": 40})
    md.close(spill_dram=False)


def test_a_manifest_cut_behind_a_header_naming_every_id_is_a_disagreement(tmp_path, capsys):
    path = tmp_path / "mem"
    _resumed_and_spilled(path)
    manifest = path / MANIFEST
    lines = manifest.read_bytes().splitlines(keepends=True)
    assert b'"next_id":12' in lines[1] and all(b'"op":"add"' in line for line in lines[2:])
    manifest.write_bytes(b"".join(lines[:6]))  # at a line boundary: 4 of the 10 records still named
    capsys.readouterr()
    assert main(["memory", "verify", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("a checkpoint saw records committed up to byte" in p for p in report["problems"]), report
    assert report["repair"] == f"hermes-video memory repair {path}"
    with pytest.raises(MemoryDamagedError, match="memory repair"):
        MemoryDirectory(path, FP, 9000, 1 << 30)  # a resume is refused, nothing cut
    assert repair(path).records["disk"] == 10
    capsys.readouterr()
    assert main(["memory", "verify", str(path)]) == 0, capsys.readouterr()


CRASH = """
import os, sys, torch
from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.fingerprint import make_fingerprint
fp = make_fingerprint("truth-test", "synthetic", 3, 2, 16, weights="sha256:" + "c" * 64)
md = MemoryDirectory(sys.argv[1], fp, 1 << 30, 1 << 30)
for rid in range(7):
    md.add(synthetic_record(rid, layers=3, heads=2, tokens=10, head_dim=16, embed_dim=12))
md.save_checkpoint("session", {"x": torch.arange(3.0)}, {"frames": 28})
md.barrier()
os._exit(0)  # gone without a close: as a SIGKILL leaves it (the records are durable in the log only)
"""


def test_inspect_after_a_crash_shows_the_log_a_resume_replays_and_that_it_is_pending(tmp_path, capsys):
    path = tmp_path / "mem"
    subprocess.run([sys.executable, "-c", CRASH, str(path)], check=True, timeout=300)
    capsys.readouterr()
    assert main(["memory", "inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["disk"]["records"] == 0  # level 3 holds nothing yet ...
    assert report["dram"]["records"] == 7 and report["records_total"] == 7  # ... but a resume replays 7
    assert [r["level"] for r in report["records"]] == ["dram_log"] * 7
    assert report["resume"] == {"pending": True, "stopped": "crash", "checkpoint": "session", "frames": 28,
                                "replays_dram_log": 7}
    assert main(["memory", "inspect", str(path)]) == 0
    assert "records: 7" in capsys.readouterr().out  # the text report no longer reads "records: 0"
    md = MemoryDirectory(path, FP, 1 << 30, 1 << 30)  # the resume: what inspect said
    assert sorted(md.dram.ids()) == list(range(7))
    md.close()
    capsys.readouterr()
    assert main(["memory", "inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resume"]["pending"] is False and report["resume"]["stopped"] == "closed"
    assert report["disk"]["records"] == 7 and report["dram"]["records"] == 0
