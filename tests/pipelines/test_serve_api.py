"""`serve`'s HTTP API in-process (FastAPI's test client) over the tiny model: streams, questions
(JSON and SSE), watches, memory, metrics, and what it refuses (401, 403, 404, 409, 413, 422, 429, 503)."""

from __future__ import annotations

import shutil
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from serve_fixtures import AUTH, jpeg, make_server, sse_events, wait_for  # noqa: E402

from hermes.pipelines.session import StreamingSession  # noqa: E402


@pytest.fixture
def client(tiny_model, tmp_path):
    _, app = make_server(tiny_model, allow_source=[str(tmp_path)], max_streams=3)
    with TestClient(app, headers=AUTH) as c:
        yield c


def push(client, stream_id, times, value=100):
    for t in times:
        r = client.post(f"/v1/streams/{stream_id}/frames", params={"t_s": t}, content=jpeg(value))
        assert r.status_code == 202, r.text
        assert r.json()["t_s"] == pytest.approx(t)


def test_a_question_sees_exactly_the_frames_pushed_before_it(client, tiny_model):
    assert client.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 201
    push(client, "door", [0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    first = client.post("/v1/streams/door/questions", json={"question": "What is there?"}).json()
    push(client, "door", [3.0, 3.5, 4.0])
    second = client.post("/v1/streams/door/questions", json={"question": "What is there?"}).json()
    assert (first["frames_seen"], first["last_frame_t_s"]) == (6, 2.5)
    assert first["at_s"] > 2.5
    assert (second["frames_seen"], second["last_frame_t_s"]) == (9, 4.0)
    # memory holds the prompt prefix plus those frames' tokens, nothing more (answers are rewound)
    empty = StreamingSession(tiny_model, "hermes", ())
    per_frame = tiny_model.tokens_per_frame
    assert first["memory"]["hbm_tokens"] == empty.cache.num_tokens + 6 * per_frame
    assert second["memory"]["hbm_tokens"] == empty.cache.num_tokens + 9 * per_frame
    # a frame timed before the last question would reach back before an answer already given
    r = client.post("/v1/streams/door/frames", params={"t_s": 3.9}, content=jpeg(100))
    assert r.status_code == 422 and "time order" in r.json()["error"]


def test_sse_tokens_join_to_the_json_answer(client):
    client.post("/v1/streams", json={"source": "push", "name": "cam"})
    push(client, "cam", [0.0, 1.0, 2.0, 3.0, 4.0])
    with client.stream("POST", "/v1/streams/cam/questions", json={"question": "What moves?", "max_new_tokens": 6},
                       headers={"Accept": "text/event-stream"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.read().decode())
    kinds = [k for k, _ in events]
    assert kinds[-1] == "answer" and set(kinds[:-1]) <= {"token"} and len(kinds) >= 2
    answer = events[-1][1]
    assert "".join(d["text"] for k, d in events if k == "token").strip() == answer["answer"]
    plain = client.post("/v1/streams/cam/questions", json={"question": "What moves?", "max_new_tokens": 6}).json()
    assert plain["answer"] == answer["answer"]  # same frames, same memory: the same greedy answer
    assert plain["frames_seen"] == answer["frames_seen"] == 5


def test_the_api_key_is_asked_on_every_endpoint_but_the_page_and_the_probes(tiny_model):
    _, app = make_server(tiny_model)
    with TestClient(app) as c:
        for path in ("/healthz", "/readyz"):  # for orchestrators: no key, and nothing about the streams
            r = c.get(path)
            assert r.status_code == 200 and set(r.json()) == {"status"}, path
        for method, path in (("get", "/metrics"), ("get", "/v1/streams"),
                             ("post", "/v1/streams"), ("get", "/v1/streams/x/events")):
            r = getattr(c, method)(path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"] == "Bearer"
        assert c.get("/v1/streams", headers={"Authorization": "Bearer wrong-key-0123456789"}).status_code == 401
        assert c.get("/v1/streams", headers=AUTH).status_code == 200
        page = c.get("/")
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert "test-key" not in c.get("/metrics", headers=AUTH).text


def test_sources_outside_the_allowlist_are_403(client, tmp_path, tiny_model):
    from hermes.pipelines.synthetic import write_synthetic_video

    inside = write_synthetic_video(tmp_path / "in.mp4", duration_s=2.0, fps=5.0)
    outside_dir = tmp_path.parent / f"{tmp_path.name}-outside"
    outside_dir.mkdir()
    outside = write_synthetic_video(outside_dir / "out.mp4", duration_s=2.0, fps=5.0)
    for source in (str(outside), str(tmp_path / ".." / outside_dir.name / "out.mp4"),
                   "rtsp://user:secret@10.0.0.1/cam", "http://127.0.0.1:9/stream", "0"):
        r = client.post("/v1/streams", json={"source": source})
        assert r.status_code == 403, source
        assert "secret" not in r.text
    r = client.post("/v1/streams", json={"source": str(inside), "fps": 2})
    assert r.status_code == 201, r.text


def test_admission_refuses_with_503_and_retry_after(tiny_model):
    _, app = make_server(tiny_model, max_streams=2)
    with TestClient(app, headers=AUTH) as c:
        assert c.post("/v1/streams", json={"source": "push", "name": "a"}).status_code == 201
        assert c.post("/v1/streams", json={"source": "push", "name": "b"}).status_code == 201
        full = c.post("/v1/streams", json={"source": "push", "name": "c"})
        assert full.status_code == 503 and int(full.headers["retry-after"]) > 0
        assert c.delete("/v1/streams/a").status_code == 200
        assert c.post("/v1/streams", json={"source": "push", "name": "c"}).status_code == 201
        assert "hermes_admissions_refused_total 1" in c.get("/metrics").text


def test_admission_counts_device_memory(tiny_model):
    from hermes.config import build_config
    from hermes.pipelines.serve.registry import cache_bytes_estimate

    one = cache_bytes_estimate(tiny_model, build_config(model="tiny-llava-onevision", memory="hermes-4k"))
    _, app = make_server(tiny_model, max_streams=8, capacity_bytes=int(2.5 * one))
    with TestClient(app, headers=AUTH) as c:
        assert [c.post("/v1/streams", json={"source": "push"}).status_code for _ in range(3)] == [201, 201, 503]
        assert "device memory" in c.post("/v1/streams", json={"source": "push"}).json()["error"]


def test_bad_requests_are_one_line_errors(client):
    cases = [
        ({"source": "push", "fsp": 2}, 422, "did you mean 'fps'"),
        ({"source": "push", "fps": 0}, 422, '"fps"'),
        ({"source": "push", "memory": "hermes-9k"}, 422, "hermes-9k"),
        ({"source": "push", "memory": "full"}, 422, "live stream never ends"),
        ({"source": "push", "name": "../etc"}, 422, '"name"'),
        ({"memory": "hermes-4k"}, 422, '"source"'),
    ]
    for body, code, text in cases:
        r = client.post("/v1/streams", json=body)
        assert (r.status_code, "\n" in r.json()["error"]) == (code, False), body
        assert text in r.json()["error"], body
    assert client.post("/v1/streams", json={"source": "push", "name": "x"}).status_code == 201
    assert client.post("/v1/streams", json={"source": "push", "name": "x"}).status_code == 409
    assert client.get("/v1/streams/nope").status_code == 404
    assert client.post("/v1/streams/x/questions", json={"q": "?"}).status_code == 422
    r = client.post("/v1/streams/x/questions", json={"question": "?", "recal": True})
    assert r.status_code == 422 and r.json()["error"].startswith("unknown key 'recal' (did you mean 'recall'?); "
                                                                 "a question takes question, options")
    assert client.post("/v1/streams/x/frames", content=b"not an image").status_code == 422
    assert client.post("/v1/streams/x/frames", content=b"\xff" * (9 * 2**20)).status_code == 413
    chunked = (part for part in [b"\xff" * 2**20] * 9)  # no Content-Length: refused once read
    assert client.post("/v1/streams/x/frames", content=chunked).status_code == 413
    assert client.post("/v1/streams/x/questions", content=(p for p in [b" " * 2**20] * 9)).status_code == 413


def test_push_rate_is_limited(tiny_model):
    _, app = make_server(tiny_model, max_push_fps=3)
    with TestClient(app, headers=AUTH) as c:
        c.post("/v1/streams", json={"source": "push", "name": "p"})
        codes = [c.post("/v1/streams/p/frames", content=jpeg(50)).status_code for _ in range(5)]
        assert codes == [202, 202, 202, 429, 429]


def test_a_watch_fires_exactly_when_its_answer_changes(tiny_model, monkeypatch):
    """The answer is a controlled function of the newest frame the session has seen: someone is at the
    door during [3, 5) and from 9 s on. A watch every second must emit one event per change, each
    from exactly the frames before its moment."""
    real_ask = StreamingSession.ask

    def door_answer(self, question, *args, **kwargs):
        answer = real_ask(self, question, *args, **kwargs)
        t = answer.last_frame_t_s
        answer.answer = "someone" if t is not None and (3 <= t < 5 or t >= 9) else "nobody"
        return answer

    monkeypatch.setattr(StreamingSession, "ask", door_answer)
    server, app = make_server(tiny_model)
    with TestClient(app, headers=AUTH) as c:
        c.post("/v1/streams", json={"source": "push", "name": "door"})
        assert c.post("/v1/streams/door/watches", json={"question": "Is someone at the door?",
                                                        "every_s": 1}).status_code == 201
        push(c, "door", [i * 0.5 for i in range(25)])  # 0 .. 12 s
        stream = server.registry.get("door")
        watch = stream.watches[0]
        import time

        deadline = time.monotonic() + 60
        while watch.answers < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.answers == 12  # at 1, 2, ..., 12 s
        events = [e for e in stream.events.since(0) if e["type"] == "watch"]
        assert [(e["at_s"], e["answer"], e["previous"]) for e in events] == [
            (1.0, "nobody", None), (4.0, "someone", "nobody"), (6.0, "nobody", "someone"),
            (10.0, "someone", "nobody")]
        assert [e["frames_seen"] for e in events] == [2, 8, 12, 20]  # the frames before each moment
        assert c.get("/v1/streams/door/watches").json()["watches"][0]["changes"] == 4


def test_a_watch_on_a_stream_that_has_ended_is_refused(client, tmp_path):
    from serve_fixtures import wait_for

    from hermes.pipelines.synthetic import write_synthetic_video

    video = write_synthetic_video(tmp_path / "short.mp4", duration_s=1.0, fps=5.0)
    assert client.post("/v1/streams", json={"source": str(video), "name": "clip", "fps": 5}).status_code == 201
    wait_for(lambda: client.get("/v1/streams/clip").json()["status"] == "ended", 60, "the recording to end")
    r = client.post("/v1/streams/clip/watches", json={"question": "Is someone there?", "every_s": 1})
    assert r.status_code == 409
    assert "no longer receives frames" in r.json()["error"] and "\n" not in r.json()["error"]
    assert client.get("/v1/streams/clip/watches").json()["watches"] == []
    # its memory still answers questions
    answer = client.post("/v1/streams/clip/questions", json={"question": "What was there?"})
    assert answer.status_code == 200 and answer.json()["frames_seen"] == 5


def test_memory_and_metrics_report_the_stream(client, tiny_model):
    client.post("/v1/streams", json={"source": "push", "name": "m"})
    push(client, "m", [0.0, 0.5, 1.0, 1.5])
    answer = client.post("/v1/streams/m/questions", json={"question": "?"}).json()
    memory = client.get("/v1/streams/m/memory").json()
    assert memory["levels"]["hbm"] == {"tokens": answer["memory"]["hbm_tokens"], "bytes": answer["memory"]["hbm_bytes"]}
    assert memory["frames_encoded"] == 4 and memory["policy"] == "hermes"
    text = client.get("/metrics").text
    assert 'hermes_stream_frames_encoded_total{stream="m"} 4' in text
    assert 'hermes_stream_questions_total{stream="m"} 1' in text
    assert 'hermes_stream_question_latency_ms_count{stream="m"} 1' in text
    assert "hermes_streams 1" in text


def test_the_server_listens_while_the_model_loads(tiny_model, tmp_path):
    """A model given as a loader loads on a thread: meanwhile the probes answer without a key (alive, not
    ready), every other route still asks for the key, and with it answers 503 "loading"."""
    release = threading.Event()

    def slow_load():
        release.wait(60)
        return tiny_model

    _, app = make_server(slow_load, memory_root=str(tmp_path / "mem"))
    with TestClient(app) as c:
        assert c.get("/healthz").status_code == 200
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "loading" in ready.json()["reason"] and ready.headers["retry-after"]
        assert c.get("/v1/streams").status_code == 401
        loading = c.get("/v1/streams", headers=AUTH)
        assert loading.status_code == 503 and "loading" in loading.json()["error"]
        assert c.get("/", headers=AUTH).status_code == 503
        release.set()
        wait_for(lambda: c.get("/readyz").status_code == 200, 60, "the model to load")
        assert c.get("/readyz").json() == {"status": "ready"}
        assert c.post("/v1/streams", json={"source": "push"}, headers=AUTH).status_code == 201


def test_readyz_reports_a_failed_load_and_an_unwritable_memory_root(tiny_model, tmp_path):
    def broken():
        raise RuntimeError("weights missing")

    _, app = make_server(broken)
    with TestClient(app) as c:
        wait_for(lambda: "failed" in c.get("/readyz").json()["reason"], 30, "the load to fail")
        assert c.get("/readyz").status_code == 503
    root = tmp_path / "mem"
    root.mkdir()
    _, app = make_server(tiny_model, memory_root=str(root))
    with TestClient(app) as c:
        assert c.get("/readyz").status_code == 200
        shutil.rmtree(root)  # it holds the stream table's folder
        root.write_text("a file where the memory root was")  # unusable even by root, who writes anywhere
        gone = c.get("/readyz")
        assert gone.status_code == 503 and gone.json() == {
            "status": "unavailable",
            "reason": f"the memory root cannot be used: expects a directory, found a file: {root}"}


def test_allowlist_patterns_match_scheme_host_port_and_path(tmp_path):
    from hermes.pipelines.serve.security import Allowlist, Forbidden

    allow = Allowlist(["rtsp://127.0.0.1:*", "http://cams.example.org/live/*", str(tmp_path)])
    for ok in ("rtsp://user:pw@127.0.0.1:8554/cam", "rtsp://127.0.0.1/cam", "http://cams.example.org/live/door",
               "HTTP://CAMS.example.org:80/live/x", str(tmp_path / "a.mp4"), f"file://{tmp_path}/b.mp4"):
        allow.check(ok)
    for refused in ("rtsp://127.0.0.2:8554/cam", "rtsps://127.0.0.1:322/cam", "http://cams.example.org:8080/live/x",
                    "http://cams.example.org/admin", "http://cams.example.org.evil.net/live/x",
                    "/etc/passwd", f"{tmp_path}/../x.mp4", "0"):
        with pytest.raises(Forbidden):
            allow.check(refused)


def test_only_loopback_binds_without_a_key(monkeypatch):
    from hermes.errors import UsageError
    from hermes.pipelines.serve.settings import ServeSettings, check_settings

    monkeypatch.delenv("HERMES_API_KEY", raising=False)
    for host in ("127.0.0.1", "127.0.0.5", "::1", "[::1]", "localhost"):
        assert check_settings(ServeSettings(host=host)).api_key is None
    for host in ("0.0.0.0", "::", "192.168.1.4", "myhost"):
        with pytest.raises(UsageError, match="listens beyond this machine"):
            check_settings(ServeSettings(host=host))
    monkeypatch.setenv("HERMES_API_KEY", "k" * 20)
    assert check_settings(ServeSettings(host="0.0.0.0")).api_key == "k" * 20


def test_the_pages_fps_box_allows_every_rate_the_api_takes():
    """Without a browser (test_serve_page.py checks it in chromium): the box's step does not restrict
    the value and its range is the API's (0, MAX_FPS]."""
    from html.parser import HTMLParser

    from hermes.pipelines.serve.app import STATIC
    from hermes.pipelines.serve.registry import MAX_FPS

    class FpsInput(HTMLParser):
        attrs: dict = {}

        def handle_starttag(self, tag, attrs):
            if tag == "input" and dict(attrs).get("id") == "fps":
                self.attrs = dict(attrs)

    parser = FpsInput()
    parser.feed((STATIC / "index.html").read_text())
    fps = parser.attrs
    assert fps["type"] == "number" and fps["step"] == "any"
    assert 0 < float(fps["min"]) <= 0.1 and float(fps["max"]) == MAX_FPS


def test_serve_stops_with_the_models_load_error_and_its_exit_code(capsys, monkeypatch):
    """The model loads after the server listens: a load that fails still ends `serve` with its one line."""
    import torch
    from live_fixtures import free_port

    from hermes.cli import main

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: --device cuda loads")
    monkeypatch.delenv("HERMES_API_KEY", raising=False)
    assert main(["serve", "--model", "tiny-llava-onevision", "--device", "cuda", "--port", str(free_port())]) == 4
    err = capsys.readouterr().err
    assert "error: device 'cuda' requested but CUDA is not available" in err and "Traceback" not in err
