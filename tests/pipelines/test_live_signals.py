"""Ctrl-C and SIGTERM on live runs with a memory directory: a clean stop between chunks, every time.

Each trial runs ``hermes-video run <mjpeg stream> --ask-every 1 --memory-dir DIR [--resume]`` (in
a child of a fork server, so the model is not loaded once per trial), waits for its first answer,
then sends one SIGINT (or SIGTERM) at a random moment: inside a chunk's encode, an answer, a
checkpoint. Every run must exit 0 having said why it stopped, the directory must verify, and the
next trial must resume the stream (its first answer has seen more frames than the last answer
before the stop) instead of being refused or failing on a half-updated cache.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from live_fixtures import mjpeg_server  # noqa: E402,F401

from hermes.config import MemoryConfig  # noqa: E402
from hermes.errors import UsageError  # noqa: E402
from hermes.pipelines.interactive import check_live_memory  # noqa: E402
from hermes.pipelines.live import LiveSource  # noqa: E402
from hermes.pipelines.persistence import InvariantError, save_session  # noqa: E402
from hermes.pipelines.session import Question, StreamingSession  # noqa: E402
from hermes.tiers.directory import MemoryDirectory  # noqa: E402
from tests.conftest import random_frames  # noqa: E402

MEMORY = MemoryConfig(policy="hermes", budget=64)


def _saved_frames(directory: Path) -> int:
    md = MemoryDirectory(directory, None, 0, 0, readonly=True)
    try:
        return md.load_checkpoint("session")[1]["frames"]
    finally:
        md.close(spill_dram=False)


def test_a_stop_request_ends_the_stream_between_chunks_and_it_resumes(tiny_model, tmp_path):
    frames = random_frames(24)
    session = None

    def source():
        for frame in frames:
            if frame.index == 9:  # a Ctrl-C arrives while chunk 3 (frames 8..11) is being read
                session.request_stop()
            yield frame

    session = StreamingSession(tiny_model, MEMORY, source(), chunk_frames=4, memory_dir=tmp_path / "mem")
    answers = list(session.run([Question("What now?"), Question("Later?", at_s=11.0)]))
    assert [a.question for a in answers] == ["What now?"]  # asked of what was seen; the later moment never came
    assert answers[0].frames_seen == 8  # two whole chunks: the third was not started
    assert _saved_frames(tmp_path / "mem") == 8
    resumed = StreamingSession(tiny_model, MEMORY, iter(frames), chunk_frames=4, memory_dir=tmp_path / "mem",
                               resume=True)
    assert list(resumed.run([Question("All?")]))[0].frames_seen == 24


@pytest.mark.slow
def test_a_chunk_that_fails_half_way_is_never_checkpointed(tiny_model, tmp_path, monkeypatch):
    session = StreamingSession(tiny_model, MEMORY, (), chunk_frames=4, memory_dir=tmp_path / "mem")
    frames = random_frames(12)
    session.ingest(frames[:4])  # the first chunk is checkpointed at once
    session.ingest(frames[4:8])
    import hermes.pipelines.session as session_module

    prefill_chunk = session_module.prefill_chunk

    def interrupted(*args, **kwargs):
        prefill_chunk(*args, **kwargs)
        raise KeyboardInterrupt  # lands after the cache grew, before its metadata did

    monkeypatch.setattr(session_module, "prefill_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.ingest(frames[8:])
    monkeypatch.undo()
    assert session.broken
    with pytest.raises(UsageError, match="not checkpointing"):
        session.checkpoint()
    session.close()  # closes the stores, keeps the last good checkpoint
    assert _saved_frames(tmp_path / "mem") == 4
    resumed = StreamingSession(tiny_model, MEMORY, iter(frames), chunk_frames=4, memory_dir=tmp_path / "mem",
                               resume=True)
    assert list(resumed.run([Question("q")]))[0].frames_seen == 12


def test_a_cache_that_fails_its_invariants_is_not_saved(tiny_model, tmp_path):
    session = StreamingSession(tiny_model, MEMORY, (), chunk_frames=4, memory_dir=tmp_path / "mem")
    session.ingest(random_frames(4))
    session.cache.token_ids = session.cache.token_ids[:, :-1]  # one layer's metadata out of step
    with pytest.raises(InvariantError, match="fails its invariants"):
        save_session(session)
    session.lower.store.wait_checkpoint()  # chunk 1's, written on the disk writer while ingest went on
    assert _saved_frames(tmp_path / "mem") == 4  # the checkpoint after chunk 1 stands


def test_full_memory_on_a_live_source_is_refused_or_bounded():
    with pytest.raises(UsageError, match="live stream never ends.*--memory hermes-4k"):
        check_live_memory(MemoryConfig(policy="full"), live=True, explicit=True)
    assert check_live_memory(MemoryConfig(policy="full"), live=True, explicit=False).policy == "hermes"
    assert check_live_memory(MemoryConfig(policy="full"), live=False, explicit=True).policy == "full"


def test_a_stalled_stream_is_reported_as_a_gap(mjpeg_server):  # noqa: F811
    source = LiveSource(mjpeg_server.url, fps=5, stall_s=1.0)
    try:
        it = iter(source)
        for _ in range(5):
            next(it)
        assert source.stats.gaps == 0
        os.kill(mjpeg_server.proc.pid, signal.SIGSTOP)  # the server freezes, the connection stays up
        paused = time.monotonic()
        time.sleep(2.5)
        os.kill(mjpeg_server.proc.pid, signal.SIGCONT)
        pause_s = time.monotonic() - paused
        while source.stats.frames_read < 5 + 10:
            next(it)
        time.sleep(0.5)
        assert source.stats.gaps == 1 and len(source.gaps) == 1
        assert source.gaps[0].duration_s >= 0.5 * pause_s  # the span without frames, on the source's clock
        assert source.stats.reconnects == 0  # a stall, not a lost connection
    finally:
        os.kill(mjpeg_server.proc.pid, signal.SIGCONT)
        source.close()

SERVER = Path(__file__).with_name("cli_fork_server.py")
TRIALS = 20
ARGS = ["--model", "tiny-llava-onevision", "--set", "model.max_new_tokens=2", "--quiet", "--json", "--fps", "4",
        "--memory", "hermes-4k", "--set", "memory.budget=64", "--ask-every", "1", "--ask", "What now?"]


def _answers(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_ctrl_c_at_random_moments_exits_0_and_resumes(tmp_path, mjpeg_server):  # noqa: F811
    rng = random.Random(1414)
    directory = tmp_path / "mem"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    server = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    codes, last_seen = [], 0
    try:
        assert server.stdout.readline().strip() == "ready"
        for trial in range(TRIALS):
            out = tmp_path / f"trial{trial}"
            resume = ["--resume"] if trial else []
            argv = ["run", mjpeg_server.url, *ARGS, "--memory-dir", str(directory), *resume]
            server.stdin.write(" ".join(["run", str(out), *[json.dumps(a) for a in argv]]) + "\n")
            server.stdin.flush()
            pid = int(server.stdout.readline().split()[1])
            hang_guard = time.monotonic() + 600  # not a speed bound: only a run that never answers stops it
            while not _answers(out.with_suffix(".out")) and time.monotonic() < hang_guard:
                time.sleep(0.05)  # the stream is running once the first answer is out
            answers = _answers(out.with_suffix(".out"))
            assert answers, f"trial {trial}: no answer within 600 s: {out.with_suffix('.err').read_text()[-2000:]}"
            assert answers[0]["frames_seen"] >= last_seen, f"trial {trial} did not resume: {answers[0]}"
            time.sleep(rng.uniform(0.0, 2.0))
            os.kill(pid, signal.SIGTERM if trial % 4 == 3 else signal.SIGINT)
            status = int(server.stdout.readline().split()[1])
            err = out.with_suffix(".err").read_text()
            codes.append(os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
            assert codes[-1] == 0, f"trial {trial}: exit {codes[-1]}: {err[-2000:]}"
            assert "stopped (interrupted)" in err and "Traceback" not in err, err[-2000:]
            last_seen = _answers(out.with_suffix(".out"))[-1]["frames_seen"]
            md = MemoryDirectory(directory, None, 0, 0, readonly=True)
            try:
                ok, messages = md.verify()
                assert ok, messages
                assert md.checkpoints() and md.load_checkpoint("session")[1]["frames"] >= last_seen
            finally:
                md.close(spill_dram=False)
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=20)
        finally:
            if server.poll() is None:
                server.kill()
    print(f"\nCtrl-C campaign: {len(codes)} trials, exit codes {sorted(set(codes))}, last frames_seen {last_seen}")
    assert codes == [0] * TRIALS


def test_a_live_source_checkpoints_level_1_after_every_chunk(tiny_model, tmp_path):
    # A file's frames after the last checkpoint are re-encoded on --resume; a live source's cannot be read
    # again, so its level 1 is saved after every chunk: a SIGKILL then loses at most the chunk in flight.
    live_cfg = check_live_memory(MemoryConfig(policy="hermes", budget=64), live=True, explicit=True)
    file_cfg = check_live_memory(MemoryConfig(policy="hermes", budget=64), live=False, explicit=True)
    assert (live_cfg.checkpoint_every, file_cfg.checkpoint_every) == (1, 8)
    session = StreamingSession(tiny_model, live_cfg, (), chunk_frames=4, memory_dir=tmp_path / "mem")
    frames = random_frames(20)
    saved = []
    for start in range(0, 20, 4):
        session.ingest(frames[start:start + 4])
        saved.append(_saved_frames(tmp_path / "mem"))  # what a kill right now would resume from
    assert saved == [4, 8, 12, 16, 20]
    session.close()
