"""Levels 2 and 3 wired to a session: capture on eviction, recall, bounds, persistence, resume."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hermes.cache import KIND_PREFIX, METADATA
from hermes.config import MemoryConfig, ModelConfig
from hermes.errors import UsageError
from hermes.lower import content_vector
from hermes.models.loading import load_model
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.rope import RotarySpec
from tests.conftest import random_frames

TPF = 196
ROOT = Path(__file__).resolve().parents[2]


def tiered(**overrides) -> MemoryConfig:
    settings = dict(policy="hermes", budget=TPF, compress_threshold=0.0, recall_top_k=2)
    settings.update(overrides)
    return MemoryConfig(**settings)


def needle_stream(n: int = 24, needle=(8, 12)) -> list[Frame]:
    """Noise frames, with frames needle[0]..needle[1]-1 a solid, distinct colour."""
    frames = random_frames(n, interval_s=0.5, size=(16, 16), seed=3)
    return [Frame(f.t_s, np.full_like(f.rgb, (250, 10, 10)) if needle[0] <= i < needle[1] else f.rgb, i)
            for i, f in enumerate(frames)]


@pytest.mark.parametrize("policy", ["hermes", "sliding"])  # sliding + recall is the `recall-only` baseline
@pytest.mark.slow
def test_a_planted_needle_is_recalled_after_leaving_level_1(tiny_model, monkeypatch, tmp_path, policy):
    """Controlled test embedding (query by example): a random model's text and vision do not align, so the
    question's search vector is the content of the needle frame's own last-layer keys."""
    frames = needle_stream()
    probe = StreamingSession(tiny_model, "full", frames[8:9])
    probe.advance()
    keys, _ = probe.cache.layer_tensors()[-1]
    visual = probe.cache.kinds[-1] != KIND_PREFIX
    spec = RotarySpec.from_text_config(tiny_model.text_config)
    needle_vector = content_vector(keys[0][:, visual], probe.cache.positions[-1][:, visual], spec)

    session = StreamingSession(tiny_model, tiered(policy=policy, recall=True), frames, chunk_frames=4,
                               memory_dir=tmp_path)
    monkeypatch.setattr(type(session.lower), "question_vector", lambda self, cache, embeds: needle_vector)
    answer = session.ask("What was red?", at=100.0)
    hits = session.lower.store.search(needle_vector, 2)
    spans = [session.lower.store.fetch([rid])[0] for rid, _ in hits]
    assert any(r.frame_start < 12 and r.frame_end > 8 for r in spans)  # the needle's record is in the top 2
    assert set(session.cache.frame_index[-1][session.cache.kinds[-1] != KIND_PREFIX].tolist()).isdisjoint(range(8, 12))
    assert answer.recall["records"] >= 1 and answer.recall["tokens"] > 0
    session.close()


@pytest.mark.slow
def test_a_threshold_keeps_equally_many_tokens_per_layer_and_recall_brings_them_back(tiny_model):
    """Scores are normalised per layer: a per-layer threshold alone left layers empty and recall splicing nothing."""
    memory = tiered(recall=True, compress_threshold=0.3, recall_top_k=8)
    session = StreamingSession(tiny_model, memory, needle_stream(), chunk_frames=4)
    answer = session.ask("What happened?", at=100.0)
    records = session.lower.store.fetch([rid for rid, _ in session.lower.store.search(session.lower.last_vector, 8)])
    assert records
    for record in records:
        counts = {layer.num_tokens for layer in record.layers}
        assert len(counts) == 1 and counts.pop() > 0
        scores = torch.stack([layer.scores.float() for layer in record.layers])  # (L, m)
        assert bool((scores >= memory.compress_threshold).any(dim=1).any())  # some layer chose that many
    assert answer.recall["tokens"] == sum(r.layers[0].num_tokens for r in records) > 0  # every record, whole
    session.close()


def test_recall_leaves_no_trace_in_level_1(tiny_model):
    session = StreamingSession(tiny_model, tiered(recall=True), needle_stream(), chunk_frames=4)
    session.advance(until_s=8.0)
    before = [t.clone() for kv in session.cache.layer_tensors() for t in kv] + \
        [getattr(session.cache, n).clone() for n in METADATA]
    answer = session.ask("What happened?")
    after = [t for kv in session.cache.layer_tensors() for t in kv] + [getattr(session.cache, n) for n in METADATA]
    assert answer.recall["tokens"] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    session.close()


@pytest.mark.slow
def test_levels_2_and_3_stay_within_their_budgets_over_2000_frames(tmp_path):
    from hermes.models.llava_onevision import LlavaOnevisionAdapter
    from hermes.models.tiny import tiny_llava_onevision

    net, tokenizer = tiny_llava_onevision(seed=0, image_size=28)  # 16 tokens per frame: 2000 frames stay quick
    model = LlavaOnevisionAdapter("tiny-16", net, tokenizer, device=torch.device("cpu"), dtype=torch.float32,
                                  system_prompt="s")
    cfg = tiered(budget=48, dram_bytes=40_000, disk_bytes=400_000)
    session = StreamingSession(model, cfg, [], chunk_frames=16, memory_dir=tmp_path)
    peak_disk_records = 0
    for start in range(0, 2000, 16):
        session.ingest([Frame((start + i) * 0.5, np.full((8, 8, 3), (start + i) % 251, np.uint8), start + i)
                        for i in range(16)])
        stats = session.lower.store.stats()
        assert stats["dram_bytes"] <= cfg.dram_bytes
        assert stats["disk_bytes"] <= cfg.disk_bytes
        peak_disk_records = max(peak_disk_records, stats["disk_records"])
    session.lower.store.flush()
    final = session.lower.store.stats()
    assert final["disk_bytes"] <= cfg.disk_bytes
    assert peak_disk_records > 0  # records did move down to disk
    assert len(session.encoded_t_s) == 2000
    session.close()


@pytest.mark.slow
def test_resume_equals_streaming_in_one_go(tiny_model, tmp_path):
    frames = random_frames(24, size=(16, 16), seed=5)
    cfg = tiered(budget=2 * TPF)
    whole = StreamingSession(tiny_model, cfg, frames, chunk_frames=4, memory_dir=tmp_path / "whole")
    whole.advance()

    first = StreamingSession(tiny_model, cfg, frames[:12], chunk_frames=4, memory_dir=tmp_path / "split")
    first.advance()
    first.close()
    second = StreamingSession(tiny_model, cfg, frames, chunk_frames=4, memory_dir=tmp_path / "split", resume=True)
    assert list(second.encoded_t_s) == [f.t_s for f in frames[:12]]
    second.advance()  # frames already seen are skipped, the rest encoded
    assert second.encoded_t_s == whole.encoded_t_s
    for (k1, v1), (k2, v2) in zip(whole.cache.layer_tensors(), second.cache.layer_tensors()):
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)
    for name in METADATA:
        assert torch.equal(getattr(whole.cache, name), getattr(second.cache, name)), name
    a = whole.ask("q?")
    b = second.ask("q?")
    torch.testing.assert_close(a.first_token_logits, b.first_token_logits, atol=1e-4, rtol=1e-4)
    assert whole.lower.store.stats()["dram_records"] + whole.lower.store.stats()["disk_records"] == \
        second.lower.store.stats()["dram_records"] + second.lower.store.stats()["disk_records"]
    whole.close()
    second.close()


def _stored_spans(directory: Path) -> list[tuple[int, int, int]]:
    """(frame_start, frame_end, frames_seen) of every record in a closed directory, sorted; a record in
    both level 3 and level 2's log (committed just before the stop) is one record, read from level 3."""
    from hermes.tiers.directory import MemoryDirectory

    md = MemoryDirectory(directory, None, 2**30, 2**30, readonly=True)
    try:
        logged = set(md.wal.ids()) if md.wal is not None else set()
        records = [md.disk.load(rid) for rid in md.disk.ids()] + \
            [md.wal.load(rid) for rid in sorted(logged - set(md.disk.ids()))]
        return sorted((r.frame_start, r.frame_end, r.frames_seen) for r in records)
    finally:
        md.close(spill_dram=False)


@pytest.mark.slow
def test_a_resume_after_records_outran_the_checkpoint_stores_each_eviction_once(tiny_model, tmp_path):
    frames = random_frames(24, size=(16, 16), seed=5)
    cfg = tiered(budget=2 * TPF, checkpoint_every=100)  # one checkpoint, after the first chunk (4 frames)
    whole = StreamingSession(tiny_model, cfg, frames, chunk_frames=4, memory_dir=tmp_path / "whole")
    whole.advance()
    whole.close()
    expected = _stored_spans(tmp_path / "whole")
    assert [span[2] for span in expected] == [4, 8, 12, 16, 20, 24]  # every chunk evicts, one record each

    # the stream stops after 16 frames without another checkpoint (as a crash would): the records of
    # the evictions at 8, 12 and 16 frames are committed after level 1 was saved as it was at 4 frames
    first = StreamingSession(tiny_model, cfg, frames[:16], chunk_frames=4, memory_dir=tmp_path / "split")
    first.advance()
    first.lower.store.wait_checkpoint()
    first.lower.close()  # the levels close; the session is never checkpointed again
    assert [span[2] for span in _stored_spans(tmp_path / "split")] == [4, 8, 12, 16]

    second = StreamingSession(tiny_model, cfg, frames, chunk_frames=4, memory_dir=tmp_path / "split", resume=True)
    assert list(second.encoded_t_s) == [f.t_s for f in frames[:4]]
    second.advance()  # frames 4-23 encoded again: 8, 12 and 16 evict as before, 20 and 24 are new
    second.close()
    assert _stored_spans(tmp_path / "split") == expected


def test_a_directory_is_refused_by_another_model_and_needs_resume(tiny_model, tmp_path):
    session = StreamingSession(tiny_model, tiered(), random_frames(3, size=(16, 16)), memory_dir=tmp_path)
    session.advance()
    session.close()
    other = load_model(ModelConfig(name="tiny-smolvlm2"))
    with pytest.raises(UsageError, match="tiny-llava-onevision"):
        StreamingSession(other, tiered(), [], memory_dir=tmp_path)
    with pytest.raises(UsageError, match="already holds a stream: pass --resume"):
        StreamingSession(tiny_model, tiered(), [], memory_dir=tmp_path)
    with pytest.raises(UsageError, match="give --memory-dir"):
        StreamingSession(tiny_model, tiered(), [], resume=True)


@pytest.mark.slow
def test_killed_runs_leave_a_directory_that_verifies(tmp_path):
    """A real `hermes-video run --memory-dir` killed with SIGKILL at random moments (5 trials here; the
    store-level test in tests/hermes/tiers kills a writer 40 times)."""
    from hermes.pipelines.synthetic import write_synthetic_video

    video = write_synthetic_video(tmp_path / "v.mp4", duration_s=30.0, fps=4.0, size=(32, 32))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    rng = random.Random(7)
    for trial in range(5):
        mem = tmp_path / f"mem{trial}"
        proc = subprocess.Popen([sys.executable, "-m", "hermes", "run", str(video), "--model", "tiny-llava-onevision",
                                 "--memory", "hermes-4k", "--set", "memory.budget=200", "--set",
                                 "memory.compress_threshold=0", "--set", "memory.checkpoint_every=1",
                                 "--chunk-frames", "2", "--fps", "4", "--memory-dir", str(mem), "--quiet"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(3.0, 7.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not (mem / "fingerprint.json").exists():
            continue  # killed before the directory existed
        check = subprocess.run([sys.executable, "-m", "hermes", "memory", "verify", str(mem)], cwd=ROOT, env=env,
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
