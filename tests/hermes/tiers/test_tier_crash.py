"""Crash safety of the disk store: a writer killed with SIGKILL at random moments loses nothing committed.

Each trial starts a writer (forked by the server in tests/hermes/tiers/crash_writer.py) on the
same directory, waits until it has the store open, lets it write for a seeded random time (records
of varying size, a small disk cap so segments are dropped and the manifest compacted along the
way) and kills it with SIGKILL. Then the directory
must open (cutting a torn tail, stray bytes, an orphan segment), `verify` must pass, and every
record the writer reported committed must read back with exactly its content, unless the cap
removed it, in which case everything older is gone too (oldest first).

Which torn state a kill leaves is up to timing; test_tier_disk.py builds each one (torn manifest
line, stray segment bytes, orphan segment, dropped-but-not-deleted segment, unfinished
compaction) deterministically.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from crash_writer import FINGERPRINT, crash_record  # noqa: E402

from hermes.tiers.disk import DiskStore  # noqa: E402

WRITER = Path(__file__).with_name("crash_writer.py")
CAPACITY, SEGMENT = 400_000, 48_000  # ~40 records; a segment holds ~5
TRIALS = 40


def _same(a, b) -> bool:
    def tensors(r):
        return [t for l in r.layers for t in l.tensors().values()] + [r.embedding]

    return a.record_id == b.record_id and all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b)))


class _Server:
    """The fork server of crash_writer.py: one writer per trial without paying start-up each time."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(WRITER), str(directory), str(CAPACITY), str(SEGMENT)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run_and_kill(self, delay_s: float) -> list[int]:
        """Start a writer, let it run `delay_s` after it opened the store, SIGKILL it; its committed ids."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        pid, ready, ids = None, False, []
        while pid is None or not ready:
            line = self.proc.stdout.readline()
            assert line, "the fork server died"
            if line.startswith("pid "):
                pid = int(line.split()[1])
            elif line.strip() == "ready":
                ready = True
            else:
                ids.append(int(line))
        time.sleep(delay_s)
        os.kill(pid, signal.SIGKILL)
        while not (line := self.proc.stdout.readline()).startswith("done"):
            assert line, "the fork server died"
            ids.append(int(line))
        assert os.WTERMSIG(int(line.split()[1])) == signal.SIGKILL
        return ids

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_committed(tmp_path):
    rng = random.Random(1234)
    directory = tmp_path / "mem"
    committed: list[int] = []
    deadline = time.monotonic() + 60  # a hard bound; 40 trials take about 10 s
    trials = 0
    server = _Server(directory)
    try:
        while trials < TRIALS and time.monotonic() < deadline:
            committed += server.run_and_kill(rng.uniform(0.0, 0.25))
            trials += 1
            with DiskStore(directory, CAPACITY, FINGERPRINT, segment_bytes=SEGMENT) as store:
                assert not store.open_problems, store.open_problems
                report = store.verify()
                assert report.ok, report.problems
                live = set(store.ids())
                assert store.disk_bytes <= CAPACITY
                oldest_live = min(live, default=float("inf"))
                for rid in committed:
                    if rid in live:
                        assert _same(store.load(rid), crash_record(rid)), f"record {rid} changed"
                    else:  # removed by the cap, oldest first: never a record newer than a live one
                        assert rid < oldest_live, f"committed record {rid} is missing"
                assert all(_same(store.load(rid), crash_record(rid)) for rid in live)
    finally:
        server.close()
    assert trials == TRIALS, f"only {trials} trials ran within the time bound"
    assert len(committed) > 40, "the writer committed too little to test anything"
    assert len(set(committed)) == len(committed), "a record id was reused after a crash"
