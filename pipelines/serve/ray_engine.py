"""`serve --engine ray`: today's server as a Ray Serve application (docs/SCALE_OUT.md; docs/ARCHITECTURE.md,
"Serving").

One ingress deployment is the HTTP entry: it checks the API key and the body size, reads the names of
the stream table (`table.StreamTable` under the memory root, written by the replicas' registries) and
forwards every request to a `StreamReplica` through a handle whose multiplexed model id is the stream's
name, so Ray places each stream on one replica and sends its requests there. The replicas run today's
FastAPI app, so routes, errors and SSE are the local server's own. A loop sends every saved stream to
its replica each `REROUTE_PERIOD_S`: after a replica dies (or the whole application restarts), Ray routes
the stream to a live replica, which adopts it from its memory directory once the dead holder's lease has
expired; until then its requests get 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import signal
import sys
import threading
from typing import Any

from hermes.errors import HermesError
from hermes.pipelines.serve.registry import NAME_RE

log = logging.getLogger(__name__)
APP_NAME = "hermes"
REROUTE_PERIOD_S = 2.0  # how often the ingress re-sends every stream to its replica (failover's round)
ENSURE_TIMEOUT_S = 60.0  # one re-route call; opening a stream loads nothing but its memory directory
# a request refused unrun by a replica that cannot hold its stream now (typically another process holds it: Ray's
# routers learn of a new holder ~0.1-1 s after it opens the stream, and meanwhile send the stream to the replica
# with fewest): sent again after 0.2, 0.4, 0.8 s, then answered with the replica's 503 and Retry-After
ELSEWHERE_RETRY_S = (0.2, 0.4, 0.8)
MAX_ONGOING = 10_000  # SSE clients hold requests open: a "busy" replica must not push a stream elsewhere
STREAM_PATH = re.compile(r"^/v1/(?:streams|models)/([^/]+)(?:/.*)?$")
HOP_HEADERS = ("transfer-encoding", "connection", "keep-alive")


def build_app(settings, resolve_config, replicas: int, gpus: int = 0):
    """The Ray Serve application: the ingress bound to `replicas` replicas.

    Args:
        settings: the checked `ServeSettings` (its API key, perhaps from HERMES_API_KEY here, travels with
            it: Ray's worker processes need not see this environment).
        resolve_config: the server's configuration per memory preset (`serve.cli.config_resolver`).
        replicas: model replicas; gpus: GPUs each asks Ray for (CPU replicas ask for one CPU).
    """
    from ray import serve

    from hermes.pipelines.serve.ray_replica import StreamReplica

    bound = serve.deployment(StreamReplica, name="StreamReplica").options(
        num_replicas=replicas, max_ongoing_requests=MAX_ONGOING,
        ray_actor_options={"num_cpus": 0 if gpus else 1, "num_gpus": gpus}).bind(settings, resolve_config)
    return serve.deployment(Ingress, name="Ingress").options(
        num_replicas=1, max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 0}).bind(
            bound, settings, resolve_config)


def run_ray(app, settings, replicas: int, address: str | None) -> int:
    """`serve --engine ray`: join the Ray cluster at `address` (None: start a local one), run `app`
    (`build_app`'s) on the settings' host and port, and keep it until Ctrl-C or SIGTERM, then delete it
    (each replica checkpoints its streams)."""
    import ray
    from ray import serve

    ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    serve.start(http_options={"host": settings.host.strip("[]"), "port": settings.port})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve.run(app, name=APP_NAME, route_prefix="/")
        auth = "bearer key required" if settings.api_key else "no key (loopback only)"
        print(f"serving on http://{settings.host}:{settings.port}/ with Ray Serve ({replicas} replicas, up "
              f"to {settings.max_streams} streams each; {auth}); Ctrl-C stops", file=sys.stderr, flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)
        if address is None:  # the cluster is this command's own; a joined one keeps Serve for its other apps
            serve.shutdown()
        ray.shutdown()
    return 0


class Ingress:
    """The HTTP entry (see the module docstring).

    Args:
        replicas: the `StreamReplica` deployment's handle.
        settings: the checked `ServeSettings`.
        resolve_config: the server's configuration (how an ``s3://`` memory root is reached).
    """

    async def __init__(self, replicas, settings, resolve_config) -> None:
        from hermes.pipelines.serve.table import StreamTable
        from hermes.tiers.remote_level import remote_options

        self.settings = settings
        self.replicas = replicas
        self.table = StreamTable(settings.memory_root, remote_options(resolve_config(None).memory).settings)
        # the streams of the table, kept here so that a request needs no listing of the store; a restarted
        # application starts from the saved ones, and its first round places them on replicas
        self.names: set[str] = set()
        try:
            self.names = set(await asyncio.to_thread(self.table.names))
        except HermesError as exc:  # the store is down: the rounds read it again
            log.warning("stream table: %s", exc)
        self.creating: set[str] = set()  # names being created: the rounds leave them alone
        self.changed: dict[str, bool] = {}  # name -> created (True) or deleted here during a round's listing
        self.moving: dict[str, str] = {}  # name -> why its last round failed (absent: a replica holds it)
        # the ingress's own requests to replicas carry the key too: a replica's app checks it again
        self.auth = [("authorization", f"Bearer {settings.api_key}")] if settings.api_key else []
        self._reroute = asyncio.get_running_loop().create_task(self._reroute_forever())

    # ---- forwarding ---------------------------------------------------------------------------------

    def _error(self, path: str, code: int, message: str, headers: dict[str, str] | None = None,
               retry_after_s: float | None = None):
        from hermes.pipelines.serve.app import error_json

        return error_json(path, code, message, self.settings, headers, retry_after_s)

    async def _forward(self, name: str | None, method: str, path: str, query: bytes, headers, body: bytes):
        """The head and body iterator of one request answered by the replica holding `name` (any replica
        when None), or (None, a 503 response) when no replica answers now. A request refused unrun by a
        replica that cannot hold the stream now is sent again (`ELSEWHERE_RETRY_S`)."""
        handle = self.replicas.options(stream=True, **({"multiplexed_model_id": name} if name else {}))
        for wait_s in (*ELSEWHERE_RETRY_S, None):
            parts = handle.call.remote(name, method, path, query, headers, body)
            try:
                head = await parts.__anext__()
            except Exception as exc:  # noqa: BLE001 - a dead or restarting replica: the client retries
                if name:
                    self.moving[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                return None, self._error(path, 503, f"stream {name!r} is moving to another replica; retry" if name
                                         else f"no replica answers now ({type(exc).__name__}); retry")
            if not head.pop("elsewhere", False) or wait_s is None:
                return head, parts
            async for _ in parts:  # the refusal's body: read to its end, so that the call finishes
                pass
            await asyncio.sleep(wait_s)

    async def _read(self, name: str, path: str) -> tuple[int, Any]:
        """GET `path` (about stream `name`) from its replica: (status, JSON body)."""
        head, parts = await self._forward(name, "GET", path, b"", self.auth, b"")
        if head is None:
            return parts.status_code, json.loads(parts.body)
        return head["status"], json.loads(b"".join([chunk async for chunk in parts]) or b"null")

    async def __call__(self, request):
        from starlette.responses import JSONResponse, StreamingResponse

        from hermes.pipelines.serve.app import HEALTH_PATHS, PUBLIC_PATHS
        from hermes.pipelines.serve.security import bearer_ok
        from hermes.pipelines.serve.settings import is_loopback

        path, method = request.url.path, request.method
        if path == "/healthz":
            return JSONResponse({"status": "ok"})
        if self.settings.api_key is None and not is_loopback(request.client.host if request.client else ""):
            # `serve run` configs choose the address themselves: without a key, only this machine is served
            return self._error(path, 403, "this server has no API key and answers only loopback clients")
        if not (path in PUBLIC_PATHS or path in HEALTH_PATHS or path.startswith("/static/")) and \
                not bearer_ok(request.headers.get("authorization"), self.settings.api_key):
            return self._error(path, 401, "missing or wrong API key: send Authorization: Bearer KEY",
                               {"WWW-Authenticate": "Bearer"})
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.settings.max_request_bytes:
            return self._error(path, 413, f"request body over {self.settings.max_request_bytes} bytes")
        body = await request.body()
        if len(body) > self.settings.max_request_bytes:
            return self._error(path, 413, f"request body over {self.settings.max_request_bytes} bytes")
        if path in ("/v1/streams", "/v1/models") and method == "GET":
            return JSONResponse(await self._list(path))
        if path == "/metrics" and method == "GET" and self.names:
            return await self._metrics()
        if path == "/v1/streams" and method == "POST":
            return await self._create(body)
        name = self._stream_of(path, body)
        if name is not None and name not in self.names:
            return self._error(path, 404, f"no stream {name!r}; GET /v1/streams lists them")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-length"]
        head, parts = await self._forward(name, method, path, request.url.query.encode(), headers, body)
        if head is None:
            return parts
        if method == "DELETE" and name is not None and head["status"] == 200:
            self.names.discard(name)  # the replica removed it from the table
            self.changed[name] = False
            self.moving.pop(name, None)
        return StreamingResponse(parts, status_code=head["status"],
                                 headers={k: v for k, v in head["headers"] if k.lower() not in HOP_HEADERS})

    def _stream_of(self, path: str, body: bytes) -> str | None:
        """The stream a request is about: from its path, or an OpenAI chat body's `model` (None: none)."""
        if (match := STREAM_PATH.match(path)) is not None:
            return match.group(1)
        if path == "/v1/chat/completions":
            try:
                model = json.loads(body).get("model")
            except (ValueError, AttributeError):
                return None  # any replica answers the malformed body with its one-line error
            return model if isinstance(model, str) and model in self.names else None
        return None

    # ---- the stream table ---------------------------------------------------------------------------

    async def _create(self, raw: bytes):
        """`POST /v1/streams`: create the stream on the replica Ray picks (which saves its spec)."""
        from starlette.responses import JSONResponse

        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            body = None
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(body, dict) or (name is not None and not (isinstance(name, str) and NAME_RE.match(name))):
            head, parts = await self._forward(None, "POST", "/v1/streams", b"", self.auth, raw)  # refused there
            return parts if head is None else JSONResponse(json.loads(b"".join([c async for c in parts])),
                                                           status_code=head["status"])
        name = name or f"s-{secrets.token_hex(4)}"
        if name in self.names:
            return self._error("/v1/streams", 409, f"a stream named {name!r} is already open; DELETE it first or "
                                                   f"choose another name")
        self.names.add(name)  # reserved: a second create of the name is refused meanwhile
        self.creating.add(name)
        self.changed[name] = True
        try:
            held = await self.replicas.options(multiplexed_model_id=name).ensure.remote(name, {**body, "name": name})
        except Exception as exc:  # noqa: BLE001
            held = {"status": 503, "body": {"error": f"no replica could open the stream now ({type(exc).__name__})"},
                    "retry_after_s": None}
        finally:
            self.creating.discard(name)
        if held["status"] != 200:
            self.names.discard(name)
            self.changed.pop(name, None)
            return self._error("/v1/streams", held["status"], held["body"]["error"],
                               retry_after_s=held["retry_after_s"])
        return JSONResponse(held["body"], status_code=201)

    async def _list(self, path: str) -> dict[str, Any]:
        """`GET /v1/streams` (or `/v1/models`): each stream of the table as its replica describes it (with
        its `replica`); a stream no replica holds now shows status "moving" and why."""
        async def one(name: str):
            code, body = await self._read(name, f"{path}/{name}")
            if code != 200:
                error = (body or {}).get("error")
                return {"id": name, "name": name, "status": "moving", "replica": None, "open": False,
                        "error": (error.get("message") if isinstance(error, dict) else error) or self.moving.get(name)}
            return body

        items = await asyncio.gather(*(one(name) for name in sorted(self.names - self.creating)))
        return {"streams": items} if path == "/v1/streams" else {"object": "list", "data": items}

    async def _metrics(self):
        """`GET /metrics`: every replica holding a stream, each sample labelled `replica="PID@NODE"` (the first
        8 characters of Ray's node id); a replica holding none is not reached (a plain request reaches one)."""
        from starlette.responses import PlainTextResponse

        from hermes.pipelines.serve import metrics

        via: dict[str, str] = {}  # replica -> a stream it holds, whose id routes a request there
        for stream in (await self._list("/v1/streams"))["streams"]:
            if stream.get("replica"):
                via.setdefault(f"{stream['replica']['pid']}@{stream['replica']['node'][:8]}", stream["name"])
        texts = {}
        for replica, name in via.items():
            head, parts = await self._forward(name, "GET", "/metrics", b"", self.auth, b"")
            if head is not None and head["status"] == 200:
                texts[replica] = b"".join([chunk async for chunk in parts]).decode()
        return PlainTextResponse(metrics.merge(texts), media_type=metrics.CONTENT_TYPE)

    async def _reroute_forever(self) -> None:
        """Every `REROUTE_PERIOD_S`, read the table's names and send each stream to its replica, which
        adopts it when it does not hold it (after the replica that did has died); `moving` keeps why one
        is not held."""
        while True:
            await asyncio.sleep(REROUTE_PERIOD_S)
            self.changed = {}
            try:  # streams saved by another ingress (or left by a stopped application) join; deleted ones leave
                listed = set(await asyncio.to_thread(self.table.names))
                # what this ingress created or deleted while the store was listed wins over the listing
                self.names = {n for n in listed if self.changed.get(n, True)} | \
                    {n for n, there in self.changed.items() if there} | self.creating
                self.moving = {name: why for name, why in self.moving.items() if name in self.names}
            except Exception as exc:  # noqa: BLE001 - the store is down: keep the names known, try again
                log.warning("stream table: %s", exc)
            await asyncio.gather(*(self._ensure(name) for name in list(self.names - self.creating)))

    async def _ensure(self, name: str) -> None:
        try:
            held = await asyncio.wait_for(self.replicas.options(multiplexed_model_id=name).ensure.remote(name),
                                          ENSURE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - tried again next round
            self.moving[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            return
        if held["status"] == 200:
            if self.moving.pop(name, None) is not None:
                log.warning("stream %s is held by a replica again", name)
        else:
            self.moving[name] = held["body"]["error"]
