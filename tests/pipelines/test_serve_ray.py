"""`serve --engine ray` on a local Ray cluster and a SeaweedFS started here (one of each per module: their
start is paid once): the API key at the ingress, today's API through it, and failover: a SIGKILLed
replica's streams answer again on the others with their memory (frames seen, records) intact, adopted
from the S3 store once the dead replica's leases expire."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("boto3")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

import httpx  # noqa: E402
from live_fixtures import free_port  # noqa: E402
from serve_fixtures import AUTH, KEY, jpeg, set_aws_env, synthetic_jpeg, wait_for  # noqa: E402

from hermes.cli import main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))
from seaweedfs import seaweedfs  # noqa: E402

pytestmark = pytest.mark.slow
REPLICAS = 2
BUDGET = 256  # visual tokens per layer: about a frame of the tiny model, so records leave level 1 early
LEASE_S = 5.0  # memory.s3_lease_s: how long a killed replica's streams wait before another may write them
ROOT = "s3://mem/fleet"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The application (2 replicas of the tiny model, streams' memory in SeaweedFS under `ROOT`) on a free
    loopback port of a fresh local Ray cluster; yields (base URL, S3 endpoint, video folder, a function that
    deploys the application again)."""
    from hermes.pipelines.serve.cli import ray_app
    from hermes.pipelines.serve.ray_engine import APP_NAME
    from hermes.pipelines.synthetic import write_synthetic_video

    root = tmp_path_factory.mktemp("ray")
    videos = root / "videos"
    write_synthetic_video(videos / "yard.mp4", duration_s=240.0, fps=2.0, size=(64, 48))
    port = free_port()
    with seaweedfs(root) as endpoint, pytest.MonkeyPatch.context() as env:
        set_aws_env(env)  # in the environment Ray's workers inherit
        # Ray's sockets live under its temp dir and a Unix socket path has at most 107 bytes: pytest-xdist's
        # tmp_path (/tmp/pytest-of-root/pytest-N/popen-gwK/...) is too deep for one
        ray_tmp = tempfile.mkdtemp(prefix="hray", dir="/tmp")
        ray.init(num_cpus=REPLICAS, include_dashboard=False, log_to_driver=False, _temp_dir=ray_tmp)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})

            def deploy():
                serve.run(ray_app({
                    "model": "tiny-llava-onevision", "replicas": REPLICAS, "max_streams": 6, "memory_root": ROOT,
                    "api_key": KEY, "allow_source": str(videos), "max_new_tokens": 4, "max_push_fps": 1000,
                    "set": [f"memory.budget={BUDGET}", "memory.dram_bytes=0", f"memory.s3_lease_s={LEASE_S}",
                            f"memory.s3_endpoint={endpoint}", f"memory.s3_cache_dir={root / 'cache'}"]}),
                    name=APP_NAME, route_prefix="/")

            deploy()
            yield f"http://127.0.0.1:{port}", endpoint, videos, deploy
        finally:
            serve.shutdown()
            ray.shutdown()
            shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_api_key_is_enforced_at_the_ingress(fleet):
    url = fleet[0]
    assert httpx.get(f"{url}/v1/streams").status_code == 401
    wrong = httpx.post(f"{url}/v1/streams", json={"source": "push"}, headers={"Authorization": "Bearer " + "x" * 24})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{url}/v1/streams/anything/memory").status_code == 401
    assert httpx.get(f"{url}/healthz").status_code == 200  # health needs no key
    assert httpx.get(f"{url}/v1/streams", headers=AUTH).status_code == 200


def test_the_ingress_forwards_todays_api_to_the_streams_replica(fleet):
    from serve_fixtures import sse_events

    url = fleet[0]
    with httpx.Client(base_url=url, headers=AUTH, timeout=120.0) as c:
        created = c.post("/v1/streams", json={"source": "push", "name": "porch"})
        assert created.status_code == 201, created.text
        assert created.json()["replica"]["pid"] != os.getpid()
        assert created.json()["replica"]["node"] == ray.get_runtime_context().get_node_id()  # Ray's node id
        assert c.post("/v1/streams", json={"source": "push", "name": "porch"}).status_code == 409
        assert c.post("/v1/streams", json={"source": "push", "fps": 99}).status_code == 422  # the replica's check
        for i in range(4):
            assert c.post("/v1/streams/porch/frames", params={"t_s": i * 0.5}, content=jpeg(50 * i)).status_code == 202
        with c.stream("POST", "/v1/streams/porch/questions", json={"question": "Who is there?"},
                      headers={"Accept": "text/event-stream"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.read().decode())
        kinds = [kind for kind, _ in events]
        assert kinds[-1] == "answer" and set(kinds[:-1]) == {"token"} and events[-1][1]["frames_seen"] == 4
        chat = c.post("/v1/chat/completions",
                      json={"model": "porch", "messages": [{"role": "user", "content": "Who?"}]})
        assert chat.status_code == 200 and chat.json()["model"] == "porch"
        assert c.get("/v1/streams/nowhere").status_code == 404
        assert c.delete("/v1/streams/porch").status_code == 200
        assert "porch" not in streams_by_name(c)
        assert c.get("/v1/streams/porch/memory").status_code == 404
        again = c.post("/v1/streams", json={"source": "push", "name": "porch"})  # its memory resumes, on any replica
        assert again.status_code == 201 and again.json()["resumed_frames"] == 4
        assert c.delete("/v1/streams/porch").status_code == 200


def streams_by_name(client: httpx.Client) -> dict[str, dict]:
    return {s["id"]: s for s in client.get("/v1/streams").json()["streams"]}


def test_a_killed_replicas_streams_answer_again_with_their_memory(fleet, capsys, monkeypatch):
    url, endpoint, videos, _ = fleet
    push, files = ["door", "hall", "gate"], ["yard", "lot", "dock"]
    with httpx.Client(base_url=url, headers=AUTH, timeout=120.0) as c:
        for name in push:
            r = c.post("/v1/streams", json={"source": "push", "name": name})
            assert r.status_code == 201, r.text
        for name in files:
            r = c.post("/v1/streams", json={"source": str(videos / "yard.mp4"), "name": name, "fps": 2})
            assert r.status_code == 201, r.text
        for name in push:
            for i in range(12):  # three chunks of four, each checkpointed once encoded
                assert c.post(f"/v1/streams/{name}/frames", params={"t_s": i * 0.5},
                              content=synthetic_jpeg(i * 0.5, (64, 48))).status_code == 202
        wait_for(lambda: all(streams_by_name(c)[n]["frames_encoded"] >= 12 for n in push + files), 120.0,
                 "every stream encoded three chunks")
        before = {}
        for name in push + files:
            answer = c.post(f"/v1/streams/{name}/questions", json={"question": "What is there?"})
            assert answer.status_code == 200, answer.text
            before[name] = answer.json()["frames_seen"]
            assert before[name] >= 12
        records = {name: c.get(f"/v1/streams/{name}/memory").json()["levels"]["disk"]["records"]
                   for name in push + files}
        assert all(n > 0 for n in records.values()), records  # level 2 is off: evicted records are on disk
        streams = {name: s for name, s in streams_by_name(c).items() if name in push + files}
        pids = {s["replica"]["pid"] for s in streams.values()}
        assert len(pids) == REPLICAS  # Ray placed the six streams on both replicas
        # /metrics reaches both replicas: each sample names its replica, each stream is counted once
        text = c.get("/metrics").text
        assert {int(m) for m in re.findall(r'^hermes_streams\{replica="(\d+)@', text, re.M)} == pids
        counted = re.findall(r'^hermes_stream_chunks_total\{replica="\d+@\w+",stream="(\w+)"\}', text, re.M)
        assert sorted(counted) == sorted(push + files) and text.count("# HELP hermes_streams ") == 1
        victim = max(pids, key=lambda pid: sum(s["replica"]["pid"] == pid for s in streams.values()))
        moved = sorted(name for name, s in streams.items() if s["replica"]["pid"] == victim)
        time.sleep(0.5)  # the last chunk's checkpoint follows its encode
        os.kill(victim, signal.SIGKILL)

        killed_at = time.monotonic()
        after: dict[str, dict] = {}

        def answered_again() -> bool:
            for name in push + files:
                if name not in after:
                    r = c.post(f"/v1/streams/{name}/questions", json={"question": "What is there now?"})
                    if r.status_code == 200:
                        after[name] = r.json()
                    else:  # between replicas: a bounded wait, said so, never a reset memory
                        assert r.status_code == 503 and r.headers["retry-after"], r.text
            return len(after) == len(push + files)

        wait_for(answered_again, 60.0, "every stream to answer after the replica was killed")
        assert time.monotonic() - killed_at < 60.0
        for name in push + files:
            assert after[name]["frames_seen"] >= before[name], (name, before[name], after[name])
        streams = streams_by_name(c)
        for name in moved:
            assert streams[name]["replica"]["pid"] != victim and streams[name]["status"] == "running", streams[name]
            assert streams[name]["resumed_frames"] >= 12  # reopened from its memory directory, not anew
        for name in push + files:  # its level 3 came with it
            assert c.get(f"/v1/streams/{name}/memory").json()["levels"]["disk"]["records"] > 0, name
        for name in push:  # a push stream takes frames again, after what its memory holds
            r = c.post(f"/v1/streams/{name}/frames", params={"t_s": 30.0}, content=jpeg(200))
            assert r.status_code == 202, r.text
        for name in files:  # closed (checkpointed, spec removed): verify must not race a writer still playing
            assert c.delete(f"/v1/streams/{name}").status_code == 200
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name in push + files:  # the records are in the store: each directory verifies, read-only
        capsys.readouterr()
        assert main(["memory", "verify", f"{ROOT}/{name}"]) == 0, (name, capsys.readouterr().out)
        assert "all checksums hold" in capsys.readouterr().out


def test_the_application_deployed_again_adopts_every_saved_stream(fleet):
    from hermes.pipelines.serve.ray_engine import APP_NAME

    url, _, videos, deploy = fleet
    with httpx.Client(base_url=url, headers=AUTH, timeout=120.0) as c:
        def created() -> bool:  # 503 while the killed replica's replacement loads and the survivor is full
            r = c.post("/v1/streams", json={"source": "push", "name": "attic"})
            assert r.status_code in (201, 503), r.text
            return r.status_code == 201

        wait_for(created, 120.0, "a replica with room for another stream")
        for i in range(8):
            assert c.post("/v1/streams/attic/frames", params={"t_s": i * 0.5},
                          content=synthetic_jpeg(i * 0.5, (64, 48))).status_code == 202
        assert c.post("/v1/streams/attic/watches", json={"question": "Is it dark?", "every_s": 5}).status_code == 201
        shed = {"source": str(videos / "yard.mp4"), "name": "shed", "fps": 2}
        assert c.post("/v1/streams", json=shed).status_code == 201
        wait_for(lambda: c.get("/v1/streams/attic").json()["frames_seen"] == 8 and
                 c.get("/v1/streams/shed").json()["frames_seen"] >= 8, 60.0, "attic and shed encoded")
        before = streams_by_name(c)
        serve.delete(APP_NAME)  # every replica closes its streams; their specs stay in the table
        deploy()  # no client creates anything again
        wait_for(lambda: all(s["status"] == "running" for s in streams_by_name(c).values()), 60.0,
                 "every saved stream to be adopted")
        after = streams_by_name(c)
        assert set(after) == set(before)
        for name, stream in after.items():
            assert stream["frames_seen"] >= before[name]["frames_seen"] and stream["resumed_frames"] > 0, name
        assert [w["question"] for w in after["attic"]["watches"]] == ["Is it dark?"]
        assert c.post("/v1/streams/attic/frames", params={"t_s": 9.0}, content=jpeg(90)).status_code == 202
        wait_for(lambda: c.get("/v1/streams/shed").json()["frames_seen"] > after["shed"]["frames_seen"], 60.0,
                 "the file to play on from its checkpoint")
