"""SIGKILL `hermes-video serve` with streams open; the streams' memory directories verify, and the server
started again on the same `--memory-root` adopts every stream without its client: a push stream takes
frames again and keeps its watch, a file continues from its checkpoint, a camera reconnects, and no
stream's memory is reset."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from live_fixtures import start_mjpeg_server  # noqa: E402
from serve_fixtures import ServeProcess, jpeg, wait_for  # noqa: E402

from hermes.cli import main  # noqa: E402
from hermes.pipelines.synthetic import write_synthetic_video  # noqa: E402

pytestmark = pytest.mark.slow


def test_sigkill_then_restart_adopts_every_stream_with_its_memory(tmp_path, capsys):
    root = tmp_path / "memory"
    clips = tmp_path / "clips"
    clips.mkdir()
    clip = write_synthetic_video(clips / "clip.mp4", duration_s=120.0, fps=4.0, size=(160, 120))
    mjpeg = start_mjpeg_server(10.0)
    args = ["--memory-root", str(root), "--allow-source", "http://127.0.0.1:*", "--allow-source", str(clips)]
    serve = ServeProcess(args)
    try:
        serve.start()
        with serve.client() as c:
            assert c.post("/v1/streams", json={"source": "push", "name": "door"}).json()["resumed_frames"] == 0
            assert c.post("/v1/streams", json={"source": mjpeg.url, "name": "yard", "fps": 4}).status_code == 201
            assert c.post("/v1/streams", json={"source": str(clip), "name": "clip", "fps": 4}).status_code == 201
            for i in range(8):  # two chunks of four, each checkpointed when encoded
                c.post("/v1/streams/door/frames", params={"t_s": i * 0.5}, content=jpeg(30 * i))
            wait_for(lambda: c.get("/v1/streams/door").json()["frames_seen"] == 8, what="door encoded")
            watch = {"question": "Who is there?", "every_s": 1}
            assert c.post("/v1/streams/door/watches", json=watch).status_code == 201
            seen = {name: wait_for(lambda n=name: c.get(f"/v1/streams/{n}").json()["frames_seen"] >= 8 and
                                   c.get(f"/v1/streams/{n}").json()["frames_seen"], what=f"{name} encoded")
                    for name in ("yard", "clip")}
            time.sleep(0.5)  # the checkpoint is written right after the chunk's encode
        serve.kill()  # no shutdown, no last checkpoint

        for name in ("door", "yard", "clip"):
            capsys.readouterr()
            assert main(["memory", "verify", str(root / name)]) == 0, name
            assert "all checksums hold" in capsys.readouterr().out

        serve = ServeProcess(args, port=serve.port).start()  # ready once it has adopted its streams
        with serve.client() as c:
            streams = {s["name"]: s for s in c.get("/v1/streams").json()["streams"]}
            assert {n: s["status"] for n, s in streams.items()} == {"door": "running", "yard": "running",
                                                                   "clip": "running"}
            assert (streams["door"]["resumed_frames"], streams["door"]["frames_seen"]) == (8, 8)
            assert [w["question"] for w in streams["door"]["watches"]] == ["Who is there?"]
            for name in ("yard", "clip"):  # at most the chunk in flight is lost, and here none
                assert streams[name]["resumed_frames"] >= seen[name]
                assert streams[name]["frames_seen"] >= streams[name]["resumed_frames"]

            r = c.post("/v1/streams/door/frames", params={"t_s": 3.0}, content=jpeg(10))
            assert r.status_code == 422  # before what the memory already holds
            for t in (4.0, 4.5, 5.0, 5.5):
                assert c.post("/v1/streams/door/frames", params={"t_s": t}, content=jpeg(10)).status_code == 202
            answer = c.post("/v1/streams/door/questions", json={"question": "Who came?"}).json()
            assert (answer["frames_seen"], answer["last_frame_t_s"]) == (12, 5.5)
            wait_for(lambda: c.get("/v1/streams/door/watches").json()["watches"][0]["answers"] >= 1,
                     what="the adopted watch asked again")

            for name in ("yard", "clip"):  # each goes on from where its memory ends, not from frame 0
                resumed = streams[name]["resumed_frames"]
                wait_for(lambda n=name, r=resumed: c.get(f"/v1/streams/{n}").json()["frames_seen"] >= r + 4,
                         what=f"{name} encoding again")
                answer = c.post(f"/v1/streams/{name}/questions", json={"question": "What moves?"}).json()
                assert answer["frames_seen"] >= resumed + 4
                assert answer["last_frame_t_s"] < answer["at_s"]
            clip_t = c.post("/v1/streams/clip/questions", json={"question": "Where?"}).json()["last_frame_t_s"]
            assert clip_t >= (seen["clip"] + 4 - 1) / 4  # frame k of the clip at 4 fps is at k / 4 s
    finally:
        serve.stop()
        mjpeg.stop()
