"""`serve`'s OpenAI-compatible API driven by the official `openai` client: streams as models, chat
completions equal to the native endpoint's answer (plain and streamed), image parts pushed as frames,
the `hermes` extra fields, and errors in OpenAI's shape. In-process (FastAPI's test client as the
client's transport), and once against a real `hermes-video serve` on loopback."""

from __future__ import annotations

import base64

import cv2
import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from fastapi.testclient import TestClient  # noqa: E402
from serve_fixtures import AUTH, KEY, ServeProcess, jpeg, make_server  # noqa: E402

QUESTION = "What is in the picture?"


@pytest.fixture
def served(tiny_model, tmp_path):
    """(native httpx client, openai client) over one in-process server with a push stream `door` of 5 frames."""
    _, app = make_server(tiny_model, allow_source=[str(tmp_path)], max_new_tokens=8)
    with TestClient(app, headers=AUTH) as native:
        assert native.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 201
        for i in range(5):
            assert native.post("/v1/streams/door/frames", params={"t_s": i * 0.5},
                               content=jpeg(40 * i)).status_code == 202
        yield native, openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=native, max_retries=0)


def native_answer(native, **body) -> dict:
    r = native.post("/v1/streams/door/questions", json={"question": QUESTION, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_models_are_the_streams_and_a_completion_is_the_native_answer(served, tiny_model):
    from hermes.pipelines.session import format_prompt

    native, client = served
    models = client.models.list().data
    assert [(m.id, m.object, m.owned_by, m.status) for m in models] == [("door", "model", "hermes-video", "running")]
    reply = client.chat.completions.create(model="door", messages=[
        {"role": "system", "content": "You watch a door."}, {"role": "user", "content": QUESTION}])
    same = native_answer(native)
    assert reply.choices[0].message.content == same["answer"] and same["answer"]
    assert reply.choices[0].message.role == "assistant" and reply.model == "door"
    # the prompt is the memory the answer attended to plus the question; every generated token counts
    question_tokens = tiny_model.question_embeds(format_prompt(QUESTION)).shape[0]
    assert reply.usage.prompt_tokens == same["memory"]["hbm_tokens"] + question_tokens
    assert 1 <= reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.choices[0].finish_reason == ("length" if reply.usage.completion_tokens == 8 else "stop")


def test_streamed_deltas_join_to_the_same_answer(served):
    native, client = served
    chunks = list(client.chat.completions.create(model="door", messages=[{"role": "user", "content": QUESTION}],
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == native_answer(native)["answer"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].object == "chat.completion.chunk"


def test_stop_cuts_the_answer_before_the_first_stop_string(served):
    native, client = served
    full = native_answer(native)["answer"]
    stop = full[len(full) // 2:len(full) // 2 + 2]
    expected = full[:full.find(stop)].rstrip()
    messages = [{"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(model="door", messages=messages, stop=[stop, "never-in-it-\u2603"])
    assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == (expected, "stop")
    streamed = client.chat.completions.create(model="door", messages=messages, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected


def test_image_parts_are_frames_pushed_before_the_question(served, tmp_path):
    native, client = served
    uri = "data:image/jpeg;base64," + base64.b64encode(jpeg(200)).decode()
    png = "data:image/png;base64," + base64.b64encode(cv2.imencode(".png", np.zeros((48, 64, 3), np.uint8))[1]).decode()
    content = [{"type": "image_url", "image_url": {"url": uri}}, {"type": "image_url", "image_url": {"url": png}},
               {"type": "text", "text": QUESTION}]
    # earlier turns are not pushed again: only the last user message's images are new frames
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": content}]
    reply = client.chat.completions.create(model="door", messages=messages)
    stream = native.get("/v1/streams/door").json()
    assert stream["frames_received"] == 7 and stream["frames_encoded"] == 7
    after = native_answer(native)
    assert after["frames_seen"] == 7 and reply.choices[0].message.content == after["answer"]

    from hermes.pipelines.synthetic import write_synthetic_video

    video = write_synthetic_video(tmp_path / "clip.mp4", duration_s=2.0, fps=5.0)
    assert native.post("/v1/streams", json={"source": str(video), "name": "clip"}).status_code == 201
    with pytest.raises(openai.BadRequestError, match="push"):
        client.chat.completions.create(model="clip", messages=[{"role": "user", "content": content}])
    for url in ("https://example.org/cat.jpg", "data:image/gif;base64,R0lGOD", "data:image/png;base64,%%%"):
        with pytest.raises(openai.BadRequestError, match="data: URI"):
            client.chat.completions.create(model="door", messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}])


def test_hermes_fields_options_recall_and_at(served):
    native, client = served
    messages = [{"role": "user", "content": "Which colour?"}]
    extra = {"hermes": {"options": ["red", "green", "blue"], "recall": False}}
    reply = client.chat.completions.create(model="door", messages=messages, extra_body=extra)
    assert reply.choices[0].message.content in ("A", "B", "C") and reply.usage.completion_tokens == 1
    with pytest.raises(openai.BadRequestError, match="after stream door's clock"):
        client.chat.completions.create(model="door", messages=messages, extra_body={"hermes": {"at": 99.0}})
    with pytest.raises(openai.BadRequestError, match="did you mean 'recall'"):
        client.chat.completions.create(model="door", messages=messages, extra_body={"hermes": {"recal": True}})
    # the native endpoint takes "at" too: an answer from exactly the frames before that moment
    for t in (2.5, 3.0, 3.5):
        native.post("/v1/streams/door/frames", params={"t_s": t}, content=jpeg(10))
    at = native_answer(native, at=2.6)
    assert (at["frames_seen"], at["last_frame_t_s"], at["at_s"]) == (6, 2.5, 2.6)
    assert native_answer(native)["frames_seen"] == 8
    for accept in ("application/json", "text/event-stream"):  # frames after it are encoded: refused, either way
        r = native.post("/v1/streams/door/questions", json={"question": "?", "at": 2.7}, headers={"Accept": accept})
        assert r.status_code == 422 and "time order" in r.json()["error"]


def test_errors_take_openais_shape_and_status(served, tiny_model):
    native, client = served
    messages = [{"role": "user", "content": QUESTION}]
    cases = [({"model": "nope"}, openai.NotFoundError, 404, "not_found_error"),
             ({"model": "door", "n": 2}, openai.BadRequestError, 400, "invalid_request_error"),
             ({"model": "door", "temperature": 0.7}, openai.BadRequestError, 400, "invalid_request_error"),
             ({"model": "door", "stop": {"a": 1}}, openai.BadRequestError, 400, "invalid_request_error"),
             ({"model": "door", "max_tokens": 0}, openai.BadRequestError, 400, "invalid_request_error")]
    for kwargs, error, status, kind in cases:
        with pytest.raises(error) as caught:
            client.chat.completions.create(messages=messages, **kwargs)
        assert caught.value.status_code == status and caught.value.body["type"] == kind, kwargs
        assert set(caught.value.response.json()["error"]) == {"message", "type", "param", "code"}
    assert "max_tokens" in caught.value.message  # the OpenAI name, not the native one
    assert "temperature" in native.post("/v1/chat/completions", json={"model": "door", "messages": messages,
                                                                        "temperature": 1}).json()["error"]["message"]
    wrong = openai.OpenAI(base_url="http://testserver/v1", api_key="wrong-key-0123456789", http_client=native,
                          max_retries=0)
    for call in (wrong.models.list, lambda: wrong.chat.completions.create(model="door", messages=messages)):
        with pytest.raises(openai.AuthenticationError) as caught:
            call()
        assert caught.value.status_code == 401 and caught.value.body["type"] == "authentication_error"
    # the native routes keep their own shape
    assert native.get("/v1/streams/nope").json() == {"error": "no stream 'nope'; GET /v1/streams lists them"}


@pytest.mark.slow
def test_the_openai_client_against_a_real_server():
    """The issue's "must show": a real `hermes-video serve` on loopback, ready by /readyz without a key."""
    import httpx

    server = ServeProcess(["--max-new-tokens", "8"]).start()
    try:
        assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
        with server.client() as native:
            assert native.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 201
            for i in range(3):
                native.post("/v1/streams/door/frames", params={"t_s": i * 0.5}, content=jpeg(60 * i))
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
            assert [m.id for m in client.models.list()] == ["door"]
            messages = [{"role": "user", "content": QUESTION}]
            reply = client.chat.completions.create(model="door", messages=messages)
            streamed = client.chat.completions.create(model="door", messages=messages, stream=True)
            joined = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
            answer = native.post("/v1/streams/door/questions", json={"question": QUESTION}).json()
            assert reply.choices[0].message.content == joined == answer["answer"] and answer["frames_seen"] == 3
    finally:
        server.stop()
