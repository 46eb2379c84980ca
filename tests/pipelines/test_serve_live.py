"""`hermes-video serve` as a real uvicorn process on loopback: an MJPEG stream, an RTSP stream, a file
and a push stream at once, answered by one model; each answer sees only frames from before its
question; events arrive by SSE; a fifth stream is refused; a camera lost and back is a gap and a
reconnect event."""

from __future__ import annotations


import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from live_fixtures import rtsp_unavailable_reason, start_mjpeg_server, start_rtsp_server  # noqa: E402
from serve_fixtures import ServeProcess, jpeg, sse_events, wait_for  # noqa: E402

from hermes.pipelines.synthetic import write_synthetic_video  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def servers(tmp_path):
    mjpeg = start_mjpeg_server(10.0)
    rtsp = start_rtsp_server() if rtsp_unavailable_reason() is None else None
    video = write_synthetic_video(tmp_path / "clip.mp4", duration_s=60.0, fps=5.0)
    serve = ServeProcess(["--allow-source", "http://127.0.0.1:*", "--allow-source", "rtsp://127.0.0.1:*",
                          "--allow-source", str(tmp_path), "--max-streams", "4"])
    try:
        serve.start()
        yield serve, mjpeg, rtsp, video
    finally:
        serve.stop()
        mjpeg.stop()
        if rtsp is not None:
            rtsp.stop()


def test_several_streams_one_model_answers_see_only_earlier_frames(servers):
    serve, mjpeg, rtsp, video = servers
    with serve.client() as c:
        sources = {"mjpeg": mjpeg.url, "file": str(video), "push": "push",
                   "rtsp": rtsp.url if rtsp is not None else "push"}  # without GStreamer: a second push stream
        for name, source in sources.items():
            r = c.post("/v1/streams", json={"source": source, "name": name, "fps": 2})
            assert r.status_code == 201, r.text
        refused = c.post("/v1/streams", json={"source": "push", "name": "fifth"})
        assert refused.status_code == 503 and refused.headers["retry-after"]
        for i in range(12):
            for name in ("push",) + (("rtsp",) if rtsp is None else ()):
                assert c.post(f"/v1/streams/{name}/frames", params={"t_s": i * 0.5},
                              content=jpeg(20 * i)).status_code == 202
        for name in sources:  # every stream gets chunks from the one model
            wait_for(lambda: c.get(f"/v1/streams/{name}").json()["chunks"] >= 2, what=f"{name} encoding")
        for name in sources:
            before = c.get(f"/v1/streams/{name}").json()["clock_s"]
            answer = c.post(f"/v1/streams/{name}/questions", json={"question": "What is moving?"}).json()
            after = c.get(f"/v1/streams/{name}").json()["clock_s"]
            assert before <= answer["at_s"] <= after + 1e-3, name  # stamped when it arrived
            assert answer["last_frame_t_s"] < answer["at_s"], name  # and answered from earlier frames only
            assert answer["frames_seen"] >= 8, name
        assert c.get("/healthz").json() == {"status": "ok"} and c.get("/readyz").json() == {"status": "ready"}
        metrics = c.get("/metrics").text
        assert "hermes_streams 4" in metrics


def test_events_arrive_by_sse_from_a_real_server(servers):
    serve, *_ = servers
    with serve.client() as c:
        c.post("/v1/streams", json={"source": "push", "name": "door"})
        c.post("/v1/streams/door/watches", json={"question": "Is someone at the door?", "every_s": 1})
        for i in range(6):
            c.post("/v1/streams/door/frames", params={"t_s": i * 0.5}, content=jpeg(40 * i))
        with c.stream("GET", "/v1/streams/door/events", timeout=60) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            text = ""
            for chunk in r.iter_text():
                text += chunk
                if "event: watch" in text and text.endswith("\n\n"):
                    break
        kind, event = sse_events(text)[0]
        assert kind == "watch" and event["at_s"] == 1.0 and event["frames_seen"] == 2
        assert event["previous"] is None and event["question"] == "Is someone at the door?"


def test_a_lost_camera_is_a_gap_and_a_reconnect_event():
    mjpeg = start_mjpeg_server(10.0)
    serve = ServeProcess(["--allow-source", "http://127.0.0.1:*"])
    try:
        serve.start()
        with serve.client() as c:
            assert c.post("/v1/streams", json={"source": mjpeg.url, "name": "cam", "fps": 2}).status_code == 201
            wait_for(lambda: c.get("/v1/streams/cam").json()["frames_received"] >= 2, what="first frames")
            mjpeg.stop()
            mjpeg.start()  # the same port: the stream's reader reconnects with backoff
            def lost_and_back():
                events = _events(c, "cam")
                return events if {"gap", "reconnect"} <= {k for k, _ in events} else None

            events = wait_for(lost_and_back, what="gap and reconnect events")
            assert [k for k, _ in events].count("reconnect") == 1
            gap = next(d for k, d in events if k == "gap")
            assert gap["end_t_s"] > gap["start_t_s"] and gap["duration_s"] > 0
            assert c.get("/v1/streams/cam").json()["status"] == "running"
    finally:
        serve.stop()
        mjpeg.stop()


def _events(client, stream_id):
    """The events so far (the SSE stream read for a moment)."""
    text = ""
    try:
        with client.stream("GET", f"/v1/streams/{stream_id}/events", timeout=2.0) as r:
            for chunk in r.iter_text():
                text += chunk
    except Exception:  # noqa: BLE001 - the read timeout ends the look
        pass
    return sse_events(text)
