"""The Ray ingress's forwarding against a scripted replica handle, without Ray: a request that a replica
refused unrun because another process holds its stream is sent again (Ray's routers learn of a new holder
late), and every other answer, a 503 of the stream's own included, is passed on as it came."""

from __future__ import annotations

import asyncio

import pytest

from hermes.pipelines.serve import ray_engine

REFUSED = [{"status": 503, "headers": [("retry-after", "5")], "elsewhere": True}, b'{"error": "leased"}']
ANSWERED = [{"status": 200, "headers": [("content-type", "application/json")]}, b'{"ok": true}']
BUSY = [{"status": 503, "headers": [("retry-after", "1")]}, b'{"error": "the stream is busy"}']


class ScriptedReplicas:
    """A stand-in for the replicas' deployment handle: each `call` answers with the next scripted parts."""

    def __init__(self, *answers: list) -> None:
        self.answers = list(answers)
        self.calls: list[tuple] = []
        self.call = self

    def options(self, **kwargs):
        self.routed_by = kwargs.get("multiplexed_model_id")
        return self

    def remote(self, *args):
        self.calls.append(args)
        parts = [dict(p) if isinstance(p, dict) else p for p in self.answers.pop(0)]

        async def stream():
            for part in parts:
                yield part
        return stream()


def forward(replicas: ScriptedReplicas, name: str = "porch"):
    ingress = ray_engine.Ingress.__new__(ray_engine.Ingress)  # its __init__ starts the table's rounds
    ingress.replicas, ingress.moving = replicas, {}

    async def run():
        head, parts = await ingress._forward(name, "DELETE", f"/v1/streams/{name}", b"", [], b"")
        return head, b"".join([chunk async for chunk in parts])
    return asyncio.run(run())


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(ray_engine, "ELSEWHERE_RETRY_S", (0.0, 0.0, 0.0))


def test_a_request_refused_because_another_replica_holds_the_stream_is_sent_again():
    replicas = ScriptedReplicas(REFUSED, REFUSED, ANSWERED)
    head, body = forward(replicas)
    assert (head["status"], body) == (200, b'{"ok": true}') and "elsewhere" not in head
    assert len(replicas.calls) == 3 and replicas.routed_by == "porch"


def test_the_refusal_is_answered_once_the_retries_are_spent():
    replicas = ScriptedReplicas(*[REFUSED] * 5)
    head, body = forward(replicas)
    assert head == {"status": 503, "headers": [("retry-after", "5")]} and body == b'{"error": "leased"}'
    assert len(replicas.calls) == 4 and len(replicas.answers) == 1


def test_an_answer_of_the_holder_is_never_sent_again():
    replicas = ScriptedReplicas(BUSY, ANSWERED)
    head, body = forward(replicas)
    assert head["status"] == 503 and body == b'{"error": "the stream is busy"}' and len(replicas.calls) == 1
