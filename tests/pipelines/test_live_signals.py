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

from hermes.tiers.directory import MemoryDirectory  # noqa: E402

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
            deadline = time.monotonic() + 60
            while not _answers(out.with_suffix(".out")) and time.monotonic() < deadline:
                time.sleep(0.05)  # the stream is running once the first answer is out
            answers = _answers(out.with_suffix(".out"))
            assert answers, f"trial {trial}: no answer within 60 s: {out.with_suffix('.err').read_text()[-2000:]}"
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
