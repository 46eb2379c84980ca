"""Level 3 on a real S3 server (SeaweedFS on loopback, started and stopped here), through the CLI.

A streams a video into s3://; B, another process with its own cache, answers a recall question
from A's stream while A is still running; A is SIGKILLed mid-stream and the store still verifies
(no visible partial group); a second writer is refused while A's lease lasts; C resumes A's stream
once the lease has expired. Then the store-level faults against the same real server: a flipped
byte in a segment object is detected and never served, and the server gone is one storage error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("boto3")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "servers"))
from seaweedfs import seaweedfs  # noqa: E402

from hermes.pipelines.synthetic import write_synthetic_video  # noqa: E402

HERMES = str(Path(sys.executable).parent / "hermes-video")
STREAM = "s3://mem/cams/door"
LEASE_S = 2.0


def _common(endpoint: str, cache: Path) -> list[str]:
    return ["--model", "tiny-llava-onevision", "--set", "model.max_new_tokens=3", "--quiet", "--memory", "hermes-4k",
            "--set", "memory.budget=64", "--fps", "2", "--chunk-frames", "4",
            "--set", f"memory.s3_endpoint={endpoint}", "--set", f"memory.s3_lease_s={LEASE_S}",
            "--set", f"memory.s3_cache_dir={cache}", "--set", "memory.checkpoint_every=1",
            "--set", "memory.dram_bytes=20000"]  # a small level 2, so level 3 fills from the first chunks


def _env(endpoint: str) -> dict:
    return dict(os.environ, AWS_ACCESS_KEY_ID="hermes-test", AWS_SECRET_ACCESS_KEY="hermes-secret",
                AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _objects(endpoint: str, prefix: str) -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="mem", Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.mark.slow
def test_two_processes_share_a_stream_and_a_third_resumes_it_after_a_kill(tmp_path):
    # longer than A can stream while B and a second writer load and answer, even on a loaded machine: A is
    # killed mid-stream; C stops at its timed question, so the length costs nothing
    video = write_synthetic_video(tmp_path / "long.mp4", duration_s=1800.0, fps=2.0)
    with seaweedfs(tmp_path) as endpoint:
        env = _env(endpoint)
        writer = subprocess.Popen([HERMES, "run", str(video), "--memory-dir", STREAM,
                                   *_common(endpoint, tmp_path / "cache-a")], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # wait until A has checkpointed and committed to level 3 (its records are in the store)
            deadline = time.monotonic() + 300
            while not ("cams/door/checkpoints/session.json" in (keys := _objects(endpoint, "cams/door/"))
                       and sum(k.startswith("cams/door/segments/") for k in keys) >= 3):
                assert writer.poll() is None, writer.stderr.read()
                assert time.monotonic() < deadline, "A never committed"
                time.sleep(0.5)
            # B: another process, its own cache, asks about the stream while A is still writing it
            reader = subprocess.run([HERMES, "run", "--memory-dir", STREAM, "--read-only", "--json",
                                     "--ask", "What happened at the start?", *_common(endpoint, tmp_path / "cache-b")],
                                    env=env, capture_output=True, text=True, timeout=300)
            assert reader.returncode == 0, reader.stderr
            answer = json.loads(reader.stdout.splitlines()[-1])
            assert answer["recall"]["records"] >= 1 and answer["frames_seen"] > 0
            assert writer.poll() is None, "A finished before B answered: make the video longer"
            assert "hermes-secret" not in reader.stderr + reader.stdout
            # a second writer is refused while A holds the lease (exit 2, one line)
            second = subprocess.run([HERMES, "run", str(video), "--memory-dir", STREAM, "--resume",
                                     *_common(endpoint, tmp_path / "cache-x")], env=env, capture_output=True,
                                    text=True, timeout=300)
            assert second.returncode == 2 and "in use by writer" in second.stderr
            assert len(second.stderr.strip().splitlines()) == 1
            assert writer.poll() is None, "A finished before it was killed: make the video longer"
        finally:
            writer.send_signal(signal.SIGKILL)  # mid-stream, perhaps mid-group
            writer.wait()
        verify = subprocess.run([HERMES, "memory", "verify", STREAM], env=env, capture_output=True, text=True,
                                timeout=300)
        assert verify.returncode == 0, verify.stdout + verify.stderr  # no partial group is visible
        records_of_a = int(verify.stdout.split("disk_manifest ")[1].split(",")[0])
        inspect = subprocess.run([HERMES, "memory", "inspect", STREAM, "--json"], env=env, capture_output=True,
                                 text=True, timeout=300)
        assert inspect.returncode == 0, inspect.stderr
        report = json.loads(inspect.stdout)
        assert report["path"] == STREAM
        ask_at_s = report["time_span_s"][1] + 30.0  # 60 frames past A's records: 15 chunks
        time.sleep(LEASE_S + 0.5)  # A's lease runs out: the stream may be taken over
        resumed = subprocess.run([HERMES, "run", str(video), "--memory-dir", STREAM, "--resume", "--json",
                                  "--ask", "What is there now?", "--at", f"{ask_at_s:.1f}",
                                  *_common(endpoint, tmp_path / "cache-c")],
                                 env=env, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr
        # C went on from A's last checkpoint to its question
        assert json.loads(resumed.stdout.splitlines()[-1])["frames_seen"] > answer["frames_seen"]
        verify = subprocess.run([HERMES, "memory", "verify", STREAM], env=env, capture_output=True, text=True,
                                timeout=300)
        assert verify.returncode == 0, verify.stdout
        assert int(verify.stdout.split("disk_manifest ")[1].split(",")[0]) > records_of_a


@pytest.mark.slow
def test_real_server_faults_flipped_byte_and_server_gone(tmp_path, monkeypatch):
    import boto3

    from hermes.errors import StorageError
    from hermes.pipelines.bench.tiers import synthetic_record
    from hermes.tiers.directory import MemoryDirectory
    from hermes.tiers.remote_level import RemoteOptions
    from hermes.tiers.s3 import S3Settings

    fp = {"model": "s3-server-test"}
    with seaweedfs(tmp_path) as endpoint:
        # a timeout of seconds: a refused connection (the server gone, below) fails at once anyway
        options = RemoteOptions(S3Settings(endpoint=endpoint, timeout_s=10.0, retries=2), str(tmp_path / "c1"))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("AWS_ACCESS_KEY_ID", "x"))  # undone after the test:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY", "x"))  # a later weed
        # would take credentials left in the environment as its own
        md = MemoryDirectory("s3://mem/faults", fp, 0, 1 << 30, remote=options)
        for rid in range(6):
            md.add(synthetic_record(rid, layers=2, heads=1, tokens=4, head_dim=8, embed_dim=6))
        md.flush()
        entry = md.disk.entries()[3]
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        data = bytearray(client.get_object(Bucket="mem", Key=f"faults/{entry.segment}")["Body"].read())
        data[entry.offset + entry.length - 5] ^= 0x10
        client.put_object(Bucket="mem", Key=f"faults/{entry.segment}", Body=bytes(data))
        reader = MemoryDirectory("s3://mem/faults", None, 0, 0, readonly=True,
                                 remote=RemoteOptions(S3Settings(endpoint=endpoint), str(tmp_path / "c2")))
        with pytest.warns(UserWarning, match="sha256"):
            assert reader.fetch([entry.record_id]) == []
        ok, messages = reader.verify()
        assert not ok and any(f"record {entry.record_id}" in m for m in messages)
        md.add(synthetic_record(6, layers=2, heads=1, tokens=4, head_dim=8, embed_dim=6))
        md.flush()
        committed = set(md.disk.ids())
    # the server is gone: the next commit fails with one storage error, bounded by the retries
    md.add(synthetic_record(7, layers=2, heads=1, tokens=4, head_dim=8, embed_dim=6))
    with pytest.raises(StorageError) as err:
        md.flush()
    assert "\n" not in str(err.value) and "committed before this are kept" in str(err.value)
    assert committed == set(range(7)) and set(md.disk.entries()[i].record_id for i in range(7)) == committed
