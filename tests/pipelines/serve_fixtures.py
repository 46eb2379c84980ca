"""Helpers for the `serve` tests: an in-process app over the tiny model, JPEG frames, a real server process.

The in-process server shares the session's tiny model (`tiny_model`, never mutated: the scheduler only
reads it). `ServeProcess` runs `python -m hermes serve` on a free loopback port as a subprocess (the
real uvicorn), waits until `/readyz` answers 200 and stops it by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import httpx
import numpy as np

from live_fixtures import free_port

KEY = "test-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout_s: float = 90.0, what: str = "condition"):
    """Poll `predicate` every 0.2 s until it returns something true (returned), or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def set_aws_env(monkeypatch) -> None:
    """Test credentials and region for moto, or for a SeaweedFS already started (one started with them in
    its environment would ask for them); no endpoint from outside."""
    for name, value in (("AWS_ACCESS_KEY_ID", "hermes-test"), ("AWS_SECRET_ACCESS_KEY", "hermes-secret"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def jpeg(value: int, size=(48, 64)) -> bytes:
    """A flat grey JPEG of brightness `value`."""
    ok, buf = cv2.imencode(".jpg", np.full((*size, 3), value, np.uint8))
    assert ok
    return buf.tobytes()


def synthetic_jpeg(t_s: float, size=(160, 120)) -> bytes:
    """The synthetic video's frame at `t_s` (moving shapes) as JPEG."""
    from hermes.pipelines.synthetic import make_frame

    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(make_frame(t_s, size), cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def make_server(model, *, memory_root=None, allow_source=(), max_streams=4, capacity_bytes=10**12,
                api_key=KEY, max_push_fps=1000.0, max_new_tokens=6, overrides=()):
    """A `Server` over `model` (a tiny-llava-onevision) with the test key and configuration `overrides`
    (``KEY=VALUE``); returns (server, app)."""
    from hermes.config import build_config
    from hermes.pipelines.serve.app import Server, create_app
    from hermes.pipelines.serve.settings import ServeSettings, check_settings

    def resolve(memory):
        return build_config(model="tiny-llava-onevision", memory=memory or "hermes-4k",
                            overrides=[f"model.max_new_tokens={max_new_tokens}", *overrides])

    settings = check_settings(ServeSettings(api_key=api_key, max_streams=max_streams, memory_root=memory_root,
                                            allow_source=tuple(allow_source), max_push_fps=max_push_fps))
    server = Server(settings, model, resolve, capacity_bytes=capacity_bytes)
    return server, create_app(server)


def sse_events(text: str) -> list[tuple[str, dict]]:
    """`(event, data)` pairs of an SSE body (comments skipped)."""
    events = []
    for block in text.split("\n\n"):
        kind, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
        if kind is not None:
            events.append((kind, data))
    return events


class ServeProcess:
    """`python -m hermes serve ...` on a free loopback port, as a subprocess."""

    def __init__(self, args: list[str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "hermes", "serve", "--model", "tiny-llava-onevision", "--port",
                     str(self.port), "--api-key", KEY, *args]
        self.proc: subprocess.Popen | None = None
        self.log = b""

    def start(self, timeout_s: float = 120.0) -> "ServeProcess":
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}: {self.proc.stdout.read().decode()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:  # the model is loaded
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError("serve was not ready (/readyz) in time")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=AUTH, timeout=120.0)

    def kill(self) -> None:
        """SIGKILL: nothing is flushed or checkpointed on the way out."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM (uvicorn closes the streams and checkpoints), then SIGKILL after 30 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
