"""Fixtures that run the loopback test servers of tests/servers/ as subprocesses.

Import the fixtures into a test module (``from live_fixtures import rtsp_server, ...``). Servers
listen on 127.0.0.1 only, on a free port, and are always stopped (also when a test fails). The
RTSP server needs Debian's ``/usr/bin/python3`` with the GStreamer RTSP bindings
(tests/servers/install-system-deps.sh); without them the RTSP tests are skipped with that reason.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hermes.pipelines.bench.chaos import free_port  # noqa: F401  (the fixtures' servers and tests use it)

SERVERS = Path(__file__).resolve().parents[1] / "servers"
SYSTEM_PYTHON = "/usr/bin/python3"
READY_TIMEOUT_S = 20.0


@functools.lru_cache(maxsize=1)
def rtsp_unavailable_reason() -> str | None:
    """None when the RTSP server can run here, else why not (a skip reason)."""
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is missing; the RTSP test server needs Debian's python3-gi"
    probe = ("import gi; gi.require_version('Gst', '1.0'); "
             "gi.require_version('GstRtspServer', '1.0'); "
             "from gi.repository import Gst, GstRtspServer; Gst.init(None); "
             "els = ('videotestsrc', 'videoconvert', 'x264enc', 'rtph264pay', 'rtpbin'); "
             "raise SystemExit(0 if all(Gst.ElementFactory.find(e) for e in els) else 1)")
    try:
        done = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {SYSTEM_PYTHON}: {exc}"
    if done.returncode != 0:
        return (f"{SYSTEM_PYTHON} cannot import GstRtspServer or lacks GStreamer plugins; run "
                f"tests/servers/install-system-deps.sh (as root) to install the GStreamer packages")
    return None


class ServerProcess:
    """One test server subprocess that can be stopped and started again on the same port."""

    def __init__(self, argv: list[str], url: str) -> None:
        self.argv = argv
        self.url = url
        self.proc: subprocess.Popen | None = None
        self._stderr_lines: list[str] = []

    def start(self) -> "ServerProcess":
        """Start the server and wait until it prints READY.

        Raises:
            RuntimeError: it exited or stayed silent for READY_TIMEOUT_S (its stderr attached).
        """
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        ready = threading.Event()

        def drain_stdout(stream) -> None:
            for line in stream:  # keep reading so the pipe never fills up
                if line.startswith("READY"):
                    ready.set()

        def drain_stderr(stream, sink: list[str]) -> None:
            for line in stream:
                sink.append(line)
                del sink[:-50]  # only the tail matters for a failure message

        threading.Thread(target=drain_stdout, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=drain_stderr, args=(self.proc.stderr, self._stderr_lines),
                         daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"test server {self.argv} did not start:\n"
                                   + "".join(self._stderr_lines))
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); safe to call twice."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def start_rtsp_server(mount: str = "test") -> ServerProcess:
    """Start tests/servers/rtsp_server.py (160x120, 10 fps) on a free port, or skip the test."""
    reason = rtsp_unavailable_reason()
    if reason:
        pytest.skip(reason)
    port = free_port()
    server = ServerProcess([SYSTEM_PYTHON, str(SERVERS / "rtsp_server.py"), str(port), mount],
                           f"rtsp://127.0.0.1:{port}/{mount}")
    server.port = port
    return server.start()


def start_mjpeg_server(fps: float = 10.0) -> ServerProcess:
    """Start tests/servers/mjpeg_server.py (160x120) at `fps` on a free port."""
    port = free_port()
    server = ServerProcess([sys.executable, str(SERVERS / "mjpeg_server.py"), str(port), str(fps)],
                           f"http://127.0.0.1:{port}/stream")
    server.port = port
    return server.start()


@pytest.fixture(scope="module")
def rtsp_server():
    """A shared RTSP server for tests that do not stop it; `.url` is the stream URL."""
    server = start_rtsp_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_rtsp_server():
    """An RTSP server for one test, which may `.stop()` and `.start()` it (same port)."""
    server = start_rtsp_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mjpeg_server():
    """An MJPEG-over-HTTP server at 10 fps for one test; `.url` is the stream URL."""
    server = start_mjpeg_server(10.0)
    try:
        yield server
    finally:
        server.stop()
