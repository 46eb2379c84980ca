"""Adoption in one process: a server started again on the same `--memory-root` opens the streams its stream
table holds (push streams take frames, watches come back, memory resumes); a deleted stream stays closed;
a damaged spec is listed as an error and kept; a stream whose memory another writer's lease holds is a 503
with Retry-After, and is adopted once that lease expires unless it was deleted meanwhile."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from serve_fixtures import AUTH, jpeg, make_server, set_aws_env, wait_for  # noqa: E402


def push(c, name: str, times) -> None:
    for t in times:
        sent = c.post(f"/v1/streams/{name}/frames", params={"t_s": t}, content=jpeg(int(40 * t) % 250))
        assert sent.status_code == 202


def test_a_restarted_server_adopts_its_streams_and_forgets_deleted_ones(tiny_model, tmp_path):
    root = str(tmp_path / "mem")
    _, app = make_server(tiny_model, memory_root=root)
    with TestClient(app, headers=AUTH) as c:
        assert c.post("/v1/streams", json={"source": "push", "name": "door", "fps": 2}).status_code == 201
        assert c.post("/v1/streams", json={"source": "push", "name": "gone"}).status_code == 201
        watch = c.post("/v1/streams/door/watches", json={"question": "Is the door open?", "every_s": 100})
        assert watch.status_code == 201
        push(c, "door", [0.5 * i for i in range(8)])
        wait_for(lambda: c.get("/v1/streams/door").json()["frames_seen"] == 8, 60, "door encoded")
        assert c.delete("/v1/streams/gone").status_code == 200

    _, app = make_server(tiny_model, memory_root=root)  # the same root: no client creates anything
    with TestClient(app, headers=AUTH) as c:
        streams = {s["name"]: s for s in c.get("/v1/streams").json()["streams"]}
        assert set(streams) == {"door"}  # "gone" was deleted: not adopted again
        door = streams["door"]
        assert (door["status"], door["resumed_frames"], door["frames_seen"], door["fps"]) == ("running", 8, 8, 2.0)
        assert [(w["question"], w["every_s"]) for w in door["watches"]] == [("Is the door open?", 100.0)]
        assert door["replica"]["pid"] > 0 and door["replica"]["node"]
        push(c, "door", [4.0, 4.5, 5.0, 5.5])
        answer = c.post("/v1/streams/door/questions", json={"question": "What is there?"}).json()
        assert (answer["frames_seen"], answer["last_frame_t_s"]) == (12, 5.5)
        assert c.get("/v1/streams/door").json()["frames_seen"] == 12
        assert c.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 409


def test_a_damaged_spec_is_listed_as_an_error_and_kept(tiny_model, tmp_path):
    root = tmp_path / "mem"
    _, app = make_server(tiny_model, memory_root=str(root))
    with TestClient(app, headers=AUTH) as c:
        assert c.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 201
        assert c.post("/v1/streams", json={"source": "push", "name": "yard"}).status_code == 201
    spec = root / "_streams" / "yard.json"
    spec.write_text('{"source": "push", "na')  # torn
    _, app = make_server(tiny_model, memory_root=str(root))
    with TestClient(app, headers=AUTH) as c:
        streams = {s["name"]: s for s in c.get("/v1/streams").json()["streams"]}
        assert streams["door"]["status"] == "running"
        assert (streams["yard"]["status"], streams["yard"]["open"]) == ("error", False)
        assert "yard.json) is not JSON" in streams["yard"]["error"]
        shown = c.get("/v1/streams/yard")
        assert shown.status_code == 503 and "could not be opened again" in shown.json()["error"]
    assert spec.read_text() == '{"source": "push", "na'  # left for its owner to look at


def test_a_leased_memory_is_a_503_with_retry_after_then_adopted_when_the_lease_expires(tiny_model, tmp_path,
                                                                                        monkeypatch):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    from hermes.tiers.lease import Lease
    from hermes.tiers.s3 import S3Location, S3Objects

    set_aws_env(monkeypatch)
    overrides = [f"memory.s3_cache_dir={tmp_path / 'cache'}", "memory.s3_lease_s=30"]
    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket="mem")
        _, app = make_server(tiny_model, memory_root="s3://mem/site", overrides=overrides)
        with TestClient(app, headers=AUTH) as c:
            other = Lease(S3Objects(S3Location("mem", "site/door")), ttl_s=30.0)  # another server's writer
            other.acquire()
            refused = c.post("/v1/streams", json={"source": "push", "name": "door"})
            assert refused.status_code == 503 and "in use by writer" in refused.json()["error"]
            assert 25 <= int(refused.headers["retry-after"]) <= 30  # what is left of the lease, not a default
            other.release()
            assert c.post("/v1/streams", json={"source": "push", "name": "door"}).status_code == 201
            assert c.post("/v1/streams", json={"source": "push", "name": "gate"}).status_code == 201
            push(c, "door", [0.0, 0.5, 1.0, 1.5])
            wait_for(lambda: c.get("/v1/streams/door").json()["frames_seen"] == 4, 60, "door encoded")

        # the first server's leases were released on close: these hold them now ("gate"'s expires first)
        # leases of seconds: the server below must start and list both streams before "gate"'s expires
        for name, ttl_s in (("door", 4.0), ("gate", 3.5)):
            Lease(S3Objects(S3Location("mem", f"site/{name}")), ttl_s=ttl_s).acquire()
        _, app = make_server(tiny_model, memory_root="s3://mem/site", overrides=overrides)
        with TestClient(app, headers=AUTH) as c:
            listed = c.get("/v1/streams").json()["streams"]
            assert [(s["name"], s["status"]) for s in listed] == [("door", "error"), ("gate", "error")]
            waiting = c.get("/v1/streams/door")
            # what is left of door's lease (not the default 5 s)
            assert waiting.status_code == 503 and 1 <= int(waiting.headers["retry-after"]) <= 4
            assert c.delete("/v1/streams/gate").status_code == 200  # forgotten before its retry
            door = wait_for(lambda: c.get("/v1/streams/door").status_code == 200 and c.get("/v1/streams/door").json(),
                            30, "the stream adopted once the lease expired")
            assert (door["status"], door["resumed_frames"]) == ("running", 4)
            assert [s["name"] for s in c.get("/v1/streams").json()["streams"]] == ["door"]
            assert c.get("/v1/streams/gate").status_code == 404
