"""`serve --memory-root s3://bucket/prefix`: a bad URL is refused before the model loads, a missing bucket
is a 503 from /readyz with its reason, and against a real S3 server (SeaweedFS) a SIGKILLed server's
stream is adopted by the next one once the dead one's lease expires, its memory whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
boto3 = pytest.importorskip("boto3")

from serve_fixtures import AUTH, ServeProcess, jpeg, make_server, set_aws_env, wait_for  # noqa: E402

from hermes.errors import UsageError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))
from seaweedfs import seaweedfs  # noqa: E402


@pytest.mark.parametrize("root, message", [
    ("s3://Bad_Bucket/x", "--memory-root s3://Bad_Bucket/x: 'Bad_Bucket' is not an S3 bucket name"),
    ("gs://bucket/x", "--memory-root gs://bucket/x: gs:// is not supported")])
def test_a_bad_s3_root_is_refused_in_one_line(root, message):
    from hermes.pipelines.serve.settings import ServeSettings, check_settings

    with pytest.raises(UsageError) as err:
        check_settings(ServeSettings(memory_root=root))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_missing_bucket_makes_readyz_503_with_the_reason(tiny_model, tmp_path, monkeypatch):
    moto = pytest.importorskip("moto")
    set_aws_env(monkeypatch)
    from fastapi.testclient import TestClient

    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket="other")
        _, app = make_server(tiny_model, memory_root="s3://mem/site", overrides=["memory.s3_retries=1"])
        with TestClient(app, headers=AUTH) as c:
            ready = c.get("/readyz")
            assert ready.status_code == 503 and "Retry-After" in ready.headers
            assert "the bucket 'mem' does not exist; create it first" in ready.json()["reason"]
            refused = c.post("/v1/streams", json={"source": "push", "name": "door"})
            assert refused.status_code == 503 and "does not exist" in refused.json()["error"]
            boto3.client("s3").create_bucket(Bucket="mem")
            assert c.get("/readyz").status_code == 200
            assert c.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 201


@pytest.mark.slow
def test_a_killed_servers_s3_stream_is_adopted_once_its_lease_expires(tmp_path, monkeypatch):
    lease_s = 15.0  # longer than a restart here, so the new server usually meets the dead one's lease
    with seaweedfs(tmp_path) as endpoint:
        set_aws_env(monkeypatch)  # for the serve processes
        args = ["--memory-root", "s3://mem/site", "--set", f"memory.s3_endpoint={endpoint}",
                "--set", f"memory.s3_lease_s={lease_s}", "--set", f"memory.s3_cache_dir={tmp_path / 'cache'}"]
        serve = ServeProcess(args)
        try:
            serve.start()
            with serve.client() as c:
                assert c.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 201
                for i in range(8):
                    c.post("/v1/streams/door/frames", params={"t_s": i * 0.5}, content=jpeg(30 * i))
                wait_for(lambda: c.get("/v1/streams/door").json()["frames_seen"] == 8, 60, "door encoded")
                before = c.post("/v1/streams/door/questions", json={"question": "Who came?"}).json()
            serve.kill()  # its lease stays in the store until it expires

            serve = ServeProcess(args, port=serve.port).start()
            with serve.client() as c:
                shown = c.get("/v1/streams/door")
                if shown.status_code == 503:  # the dead server's lease has not expired yet
                    assert "in use by writer" in shown.json()["error"]
                    assert 1 <= int(shown.headers["retry-after"]) <= lease_s
                door = wait_for(lambda: c.get("/v1/streams/door").status_code == 200 and
                                c.get("/v1/streams/door").json(), 3 * lease_s, "door adopted")
                assert (door["status"], door["resumed_frames"], door["frames_seen"]) == ("running", 8, 8)
                for t in (4.0, 4.5, 5.0, 5.5):
                    assert c.post("/v1/streams/door/frames", params={"t_s": t}, content=jpeg(10)).status_code == 202
                after = c.post("/v1/streams/door/questions", json={"question": "Who came?"}).json()
                assert (after["frames_seen"], after["last_frame_t_s"]) == (12, 5.5)
                assert before["frames_seen"] == 8
        finally:
            serve.stop()
