"""SIGKILL `hermes-video serve` with streams open; the streams' memory directories verify, and after a
restart streams re-created with the same names resume their memory."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from live_fixtures import start_mjpeg_server  # noqa: E402
from serve_fixtures import ServeProcess, jpeg, wait_for  # noqa: E402

from hermes.cli import main  # noqa: E402

pytestmark = pytest.mark.slow


def test_sigkill_then_restart_resumes_each_streams_memory(tmp_path, capsys):
    root = tmp_path / "memory"
    mjpeg = start_mjpeg_server(10.0)
    args = ["--memory-root", str(root), "--allow-source", "http://127.0.0.1:*"]
    serve = ServeProcess(args)
    try:
        serve.start()
        with serve.client() as c:
            assert c.post("/v1/streams", json={"source": "push", "name": "door"}).json()["resumed_frames"] == 0
            assert c.post("/v1/streams", json={"source": mjpeg.url, "name": "yard", "fps": 2}).status_code == 201
            for i in range(8):  # two chunks of four, each checkpointed when encoded
                c.post("/v1/streams/door/frames", params={"t_s": i * 0.5}, content=jpeg(30 * i))
            wait_for(lambda: c.get("/v1/streams/door").json()["frames_encoded"] == 8, what="door encoded")
            yard_seen = wait_for(lambda: c.get("/v1/streams/yard").json()["frames_encoded"] >= 8 and
                                 c.get("/v1/streams/yard").json()["frames_encoded"], what="yard encoded")
            time.sleep(0.5)  # the checkpoint is written right after the chunk's encode
        serve.kill()  # no shutdown, no last checkpoint

        for name in ("door", "yard"):
            capsys.readouterr()
            assert main(["memory", "verify", str(root / name)]) == 0, name
            assert "all checksums hold" in capsys.readouterr().out

        serve = ServeProcess(args, port=serve.port).start()
        with serve.client() as c:
            door = c.post("/v1/streams", json={"source": "push", "name": "door"}).json()
            assert door["resumed_frames"] == 8
            r = c.post("/v1/streams/door/frames", params={"t_s": 3.0}, content=jpeg(10))
            assert r.status_code == 422  # before what the memory already holds
            for t in (4.0, 4.5):
                assert c.post("/v1/streams/door/frames", params={"t_s": t}, content=jpeg(10)).status_code == 202
            answer = c.post("/v1/streams/door/questions", json={"question": "Who came?"}).json()
            assert (answer["frames_seen"], answer["last_frame_t_s"]) == (10, 4.5)
            yard = c.post("/v1/streams", json={"source": mjpeg.url, "name": "yard", "fps": 2}).json()
            assert yard["resumed_frames"] >= yard_seen  # at most the chunk in flight is lost, and here none
            answer = c.post("/v1/streams/yard/questions", json={"question": "What moves?"}).json()
            assert answer["frames_seen"] >= yard["resumed_frames"]
            assert answer["last_frame_t_s"] < answer["at_s"]
    finally:
        serve.stop()
        mjpeg.stop()
