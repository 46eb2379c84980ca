"""Crash campaign over a whole streaming session: SIGKILL loses nothing beyond the chunk in flight.

A fork server (session_crash_writer.py) runs one streaming session per trial on the same memory
directory, resuming from its checkpoint, with default memory settings (level-1 budget aside). Each
child reports, after every chunk, the ids of the records that chunk's eviction kept. It dies by
SIGKILL: at a random moment, or at a dangerous one (inside a checkpoint save, between a segment
write and its manifest line, half-way through close). After every kill the directory must verify
(crash leftovers are notes, never damage), and every record reported by any chunk except the last
one a child reported (that chunk's records may still have been in the write queue: the chunk in
flight) must be in the directory, in host memory's log (level 2) or on disk (level 3). Half the
trials use a small host-memory budget so that records move to disk while the stream runs.
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

from hermes.tiers.directory import MemoryDirectory

WRITER = Path(__file__).with_name("session_crash_writer.py")
DEFAULT_DRAM = 2 * 2**30  # MemoryConfig's default
SMALL_DRAM = 700_000  # about two records: the rest move to disk as the stream runs
# (mode, how many) per dangerous moment; plus random kills
PLAN = [("random", 10), ("checkpoint", 4), ("manifest", 6), ("close", 4)]


class _Server:
    def __init__(self, directory: Path) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([sys.executable, str(WRITER), str(directory)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def trial(self, mode: str, n: int, dram: int, kill_after_s: float | None,
              frames: str = "random") -> tuple[list[list[int]], int]:
        """One child: its per-chunk record ids, and its wait status."""
        self.proc.stdin.write(f"go {mode} {n} {dram} {frames}\n")
        self.proc.stdin.flush()
        chunks: list[list[int]] = []
        pid = None
        killed_at = None
        while True:
            line = self.proc.stdout.readline()
            assert line, "the fork server died"
            if line.startswith("pid "):
                pid = int(line.split()[1])
            elif line.strip() == "ready" and kill_after_s is not None:
                killed_at = time.monotonic() + kill_after_s
            elif line.startswith("chunk "):
                ids = line.split()[2]
                chunks.append([] if ids == "-" else [int(i) for i in ids.split(",")])
            elif line.startswith("done "):
                return chunks, int(line.split()[1])
            if killed_at is not None and time.monotonic() >= killed_at:
                os.kill(pid, signal.SIGKILL)
                killed_at = None

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _held(directory: Path) -> tuple[set[int], dict]:
    """Ids the directory holds (level 2's log and level 3), after checking it verifies."""
    md = MemoryDirectory(directory, None, 0, 0, readonly=True)
    try:
        ok, messages = md.verify()
        assert ok, messages
        held = set(md.disk.ids()) | (set(md.wal.ids()) if md.wal is not None else set())
        return held, {"disk": md.disk.num_records, "dram_log": md.wal.num_records if md.wal else 0}
    finally:
        md.close(spill_dram=False)


@pytest.mark.slow
def test_sigkill_campaign_loses_nothing_beyond_the_chunk_in_flight(tmp_path):
    rng = random.Random(14)
    directory = tmp_path / "mem"
    trials = [(mode, i) for mode, count in PLAN for i in range(count)]
    rng.shuffle(trials)
    committed: set[int] = set()
    kills, lost, figures = 0, set(), []
    server = _Server(directory)
    try:
        for k, (mode, _) in enumerate(trials):
            dram = DEFAULT_DRAM if k % 2 == 0 else SMALL_DRAM
            n = {"random": 0, "checkpoint": rng.randint(1, 3), "manifest": rng.randint(2, 12),
                 "close": rng.randint(1, 4)}[mode]
            chunks, status = server.trial(mode, n, dram, rng.uniform(0.3, 2.5) if mode == "random" else None)
            if os.WIFEXITED(status):  # `close` may finish before its second manifest write: a clean stop
                assert os.WEXITSTATUS(status) == 0 and mode == "close", f"{mode}: child exited {status}"
                in_flight = set()
            else:
                assert os.WTERMSIG(status) == signal.SIGKILL
                kills += 1
                in_flight = set(chunks[-1]) if chunks else set()
            for ids in chunks:
                committed |= set(ids)
            held, counts = _held(directory)
            missing = committed - held - in_flight
            lost |= missing
            figures.append((mode, len(committed), len(committed & held), counts))
            assert not missing, f"trial {k} ({mode}): records {sorted(missing)} reported committed are gone"
            committed -= in_flight - held  # what the kill took with it was never committed
    finally:
        server.close()
    print(f"\ncrash campaign: {kills} SIGKILLs in {len(trials)} trials; records committed before the "
          f"kills {len(committed)}, found after {len(committed & _held(directory)[0])}, lost {len(lost)}; "
          f"per trial (mode, committed, found, stores): {figures}")
    assert kills >= 20 and len(committed) > 40 and not lost


@pytest.mark.slow
def test_a_blank_camera_keeps_every_committed_record_through_a_sigkill_and_a_restart(tmp_path):
    """A stream of flat grey frames, all of it summarised into level 3 (no host memory), is SIGKILLed after
    its records commit; the restart's writable open checks the newest level-3 records' meaning, and must
    keep every one (it quarantined healthy summarised records of flat frames: 3 records before, 2 after)."""
    directory = tmp_path / "mem"
    server = _Server(directory)
    try:
        chunks, status = server.trial("manifest", 40, 0, None, frames="flat")  # killed at manifest write 40
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        committed = set().union(*chunks[:-1])  # the last chunk's records were in flight
        assert len(committed) >= 8 and committed <= _held(directory)[0]
        chunks, status = server.trial("random", 0, 0, 0.0, frames="flat")  # the restart, killed once open
        assert os.WIFSIGNALED(status) and not chunks
    finally:
        server.close()
    held, counts = _held(directory)
    assert committed <= held, f"records {sorted(committed - held)} committed before the kill are gone"
    assert not [p.name for p in directory.glob("quarantine/**/*meaning*")]  # (a torn tail goes there too)
