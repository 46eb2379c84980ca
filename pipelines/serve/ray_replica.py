"""One replica of `serve --engine ray`: one model and many streams, today's `Server` and its FastAPI app
running in-process, each request handed to the app as an ASGI call (docs/ARCHITECTURE.md, "Serving").

The ingress (`ray_engine`) reaches a replica only through a Ray Serve handle whose multiplexed model id
is the stream's name, so Ray's router sends every request about a stream to the replica that holds it.
A replica that does not hold the stream yet adopts it from the stream table (`Registry.adopt`: its memory
resumes from the store, its watches come back), the first step of `call`; the stream's lease (or, on a
local folder, its lock) refuses a second holder while the first lives.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from hermes.errors import HermesError
from hermes.tiers.errors import MemoryDirError

log = logging.getLogger(__name__)
STOP_WAIT_S = 5.0  # how long an answered ASGI call may take to notice its client left before it is cancelled


async def asgi_call(app, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                    body: bytes) -> AsyncIterator:
    """Run one HTTP request through an ASGI `app` in this process.

    Args:
        method, path, query: the request line (`query` the raw query string).
        headers: (name, value) pairs as received.
        body: the whole request body.

    Returns:
        An async iterator: a head ``{"status": int, "headers": [(name, value), ...]}``, then the body's
        pieces as they are sent (an SSE response's events one by one). Leaving it early tells the app its
        client disconnected.
    """
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_given = False

    async def receive():
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
             "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80)}
    task = asyncio.ensure_future(app(scope, receive, sent.put))
    task.add_done_callback(lambda _: sent.put_nowait(None))
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                yield {"status": message["status"],
                       "headers": [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    break
        if task.done() and task.exception() is not None:
            raise task.exception()
    finally:
        gone.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)
        except BaseException:  # noqa: BLE001 - it had its chance to stop on the disconnect
            task.cancel()


class StreamReplica:
    """A replica: the model, today's `Server`, and the streams Ray routes here.

    Args:
        settings: the checked `ServeSettings`, as the command line (or `serve run`'s config) made them.
        resolve_config: the server's configuration per memory preset (None: its own, whose model loads here).
    """

    def __init__(self, settings, resolve_config) -> None:
        import ray
        from ray import serve

        from hermes.models.loading import load_model
        from hermes.pipelines.serve import stream as served
        from hermes.pipelines.serve.app import Server, create_app

        served.REPLICA_NODE = ray.get_runtime_context().get_node_id()  # a stream's JSON names Ray's node
        # no adoption at start: Ray places the saved streams, as the ingress sends each one to a replica
        self.server = Server(settings, load_model(resolve_config(None).model), resolve_config, adopt_saved=False)
        self.app = create_app(self.server)  # its lifespan is not run: the model is loaded, `__del__` closes it
        self._new: dict[str, dict] = {}  # name -> the POST /v1/streams body of a stream being created here
        self._opening = asyncio.Lock()

        async def hold(name: str):
            return await asyncio.to_thread(self._open, name)

        # one multiplexed "model" per stream: Ray then routes each stream's requests to this replica; `ensure`
        # refuses a stream past max_streams, so Ray never unloads (forgets) a live one to make room
        self._hold = serve.multiplexed(max_num_models_per_replica=settings.max_streams)(hold)

    def _open(self, name: str):
        """Stream `name` here: open already, created from its new body, or adopted from the stream table."""
        registry = self.server.registry
        stream = registry.get(name)
        if stream is None:
            body = self._new.pop(name, None)
            stream = registry.create(body) if body is not None else registry.adopt(name)
            log.info("stream %s opened here (%d frames resumed)", name, stream.resumed_frames)
        return stream

    async def ensure(self, name: str, body: dict | None = None) -> dict[str, Any]:
        """Hold stream `name` on this replica: create it from `body` (a `POST /v1/streams` body) or, without
        one, adopt it from the stream table (its memory resumes) unless it is open here.

        Returns:
            ``{"status": HTTP status, "body": the stream's JSON or {"error": ...}, "retry_after_s": seconds
            left of another holder's lease, or None}``.
        """
        from hermes.pipelines.serve.app import http_status
        from hermes.pipelines.serve.registry import Full

        if body is not None:
            self._new[name] = {**body, "name": name}
        registry = self.server.registry
        try:
            if registry.get(name) is not None:
                await self._hold(name)  # in Ray's cache already: marks it recently used
                stream = registry.get(name)
            else:
                async with self._opening:  # one at a time, so that the count below holds until Ray caches it
                    if registry.get(name) is None and len(registry.all()) >= self.server.settings.max_streams:
                        # refused before Ray's multiplexer would make room by unloading (forgetting) a live stream
                        raise Full(f"{len(registry.all())} streams are open on this replica, the most it takes "
                                   f"(--max-streams)")
                    await self._hold(name)
                    stream = await asyncio.to_thread(self._open, name)  # Ray's cache may list one deleted here
        except HermesError as exc:
            self._new.pop(name, None)
            self._unclaim()
            # another process holds its memory (a lease, or a folder's lock): 503, tried again next round
            code = 503 if isinstance(exc, MemoryDirError) else http_status(exc)
            return {"status": code, "body": {"error": " ".join(str(exc).split())},
                    "retry_after_s": getattr(exc, "retry_after_s", None)}
        return {"status": 200, "body": stream.to_json(), "retry_after_s": None}

    def _unclaim(self, name: str | None = None) -> None:
        """Tell Ray's routers again which streams this replica holds: after a failed open, or after stream
        `name` was deleted here (it leaves the multiplexer's cache, which would otherwise fill up with it).

        Ray announces a stream id as soon as its loading starts and says nothing when the loading fails, so
        the routers would keep sending the stream here (where it failed) beside its real holder. The cache
        and the flag used here are `_ModelMultiplexWrapper`'s own (Ray Serve 2.x, pinned <3): its next
        periodic push sends the true list.
        """
        wrapper = getattr(getattr(self._hold, "__wrapped__", None), "__serve_multiplex_wrapper", None)
        if wrapper is not None:
            if name is not None:
                wrapper.models.pop(name, None)
            wrapper._push_multiplexed_replica_info = True

    async def call(self, name: str | None, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                   body: bytes) -> AsyncIterator:
        """One HTTP request through today's app here (about stream `name`, held first when given).

        Returns:
            As `asgi_call`'s; when the stream cannot be held here, its error response (503 with Retry-After
            while another process holds its memory). A 503 head says ``"elsewhere": True``: the request was not
            run, as this replica cannot hold the stream now (another process holds it, this replica is full,
            or the store did not answer), and the ingress may send it again, as Ray's routers may not know
            the holder yet.
        """
        from hermes.pipelines.serve.app import error_json

        if name is not None:
            held = await self.ensure(name)
            if held["status"] != 200:
                refused = error_json(path, held["status"], held["body"]["error"], self.server.settings,
                                     retry_after_s=held["retry_after_s"])
                yield {"status": refused.status_code, "headers": list(refused.headers.items()),
                       "elsewhere": held["status"] == 503}
                yield refused.body
                return
        async for part in asgi_call(self.app, method, path, query, headers, body):
            if isinstance(part, dict) and method == "DELETE" and name is not None and part["status"] == 200:
                self._unclaim(name)
            yield part

    def __del__(self) -> None:
        """Ray Serve stops the replica: close every stream (each memory directory checkpointed, each spec
        kept, so the ingress's next round places it on another replica)."""
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
