"""The HTTP API of `hermes-video serve` (FastAPI) and the `Server` it fronts.

Routes, authentication and status codes: README.md, "Serving". Errors are JSON ``{"error": "one
line"}``; the OpenAI routes answer in OpenAI's error shape (`openai_api`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse

from hermes.errors import HermesError, SourceError, StorageError, UsageError, check_keys
from hermes.pipelines.asked import Question
from hermes.pipelines.serve import metrics, openai_api
from hermes.pipelines.serve.events import check_watch
from hermes.pipelines.serve.registry import Conflict, Full, NotAdopted, NotFound, Registry
from hermes.pipelines.serve.scheduler import Scheduler
from hermes.pipelines.serve.security import Forbidden, bearer_ok
from hermes.pipelines.serve.settings import ServeSettings, memory_root_problem
from hermes.pipelines.serve.stream import Behind, Stream, TooManyFrames
from hermes.tiers.lease import LeaseHeld

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
PUBLIC_PATHS = ("/", "/docs", "/openapi.json")  # no data: no key needed
HEALTH_PATHS = ("/healthz", "/readyz")  # for load balancers and orchestrators: no key, nothing about streams
QUESTION_KEYS = ("question", "options", "recall", "max_new_tokens", "at")
MAX_NEW_TOKENS = 256
EVENTS_POLL_S = 0.2
KEEPALIVE_S = 15.0


class TooLarge(HermesError):
    """A request body over `--max-request-bytes` (HTTP 413); one without a Content-Length is measured once read."""


class Server:
    """One model, its worker and the stream registry.

    Args:
        model: a loaded adapter, or a function that loads one (`load_in_background` runs it on a thread
            while the server listens and answers 503 "loading").
        resolve_config, capacity_bytes: as `Registry`'s.
        adopt_saved: adopt the stream table's streams once the model is loaded (False: an engine that
            places streams itself opens them, `ray_replica`).
    """

    def __init__(self, settings: ServeSettings, model, resolve_config: Callable[[str | None], Any], *,
                 capacity_bytes: int | None = None, adopt_saved: bool = True) -> None:
        self.settings = settings
        self.adopt_saved = adopt_saved
        self.resolve_config = resolve_config
        self.capacity_bytes = capacity_bytes
        self.model = self.scheduler = self.registry = None
        self.load_error: str | None = None
        self._loader = model if callable(model) else None
        if self._loader is None:
            self._attach(model)

    def _attach(self, model) -> None:
        self.scheduler = Scheduler(model)
        self.registry = Registry(self.settings, self.scheduler, self.resolve_config, self.capacity_bytes)
        if self.adopt_saved:
            self.registry.adopt_all()  # a restarted server's streams, before it says ready
        self.model = model  # last: `model` set means ready to serve

    def load_in_background(self) -> None:
        """Start loading the model on a thread when it was given as a function (else nothing to do)."""
        def load():
            try:
                self._attach(self._loader())
            except BaseException as exc:  # noqa: BLE001 - reported by /readyz (and by `serve`, which exits)
                self.load_error = " ".join(str(exc).split()) or type(exc).__name__

        if self._loader is not None and self.model is None:
            threading.Thread(target=load, daemon=True, name="hermes-serve-load").start()

    def not_ready(self) -> str | None:
        """Why the server cannot answer questions now (None: ready); says nothing about streams."""
        if self.load_error is not None:
            return "the model failed to load"
        if self.model is None:
            return "loading: the model is not loaded yet"
        if not self.scheduler.alive:
            return "the model worker stopped"
        if self.settings.memory_root is not None:
            problem = memory_root_problem(self.settings.memory_root) or self.registry.table.problem()
            if problem:
                return f"the memory root cannot be used: {problem}"
        return None

    def stream(self, stream_id: str) -> Stream:
        stream = self.registry.get(stream_id)
        if stream is None:
            why = self.registry.unadopted.get(stream_id)
            if why is not None:  # a new error each time: one raised again would grow its traceback
                raise NotAdopted(str(why), why.retry_after_s)
            raise NotFound(f"no stream {stream_id!r}; GET /v1/streams lists them")
        return stream

    def close(self) -> None:
        """Close every stream (each memory directory checkpointed, each spec kept), then the worker."""
        if self.registry is None:
            return
        self.registry.close()
        self.scheduler.shutdown()


STATUS = ((NotFound, 404), (TooLarge, 413), (Forbidden, 403), (Conflict, 409), (Full, 503), (Behind, 503),
          (TooManyFrames, 429), (NotAdopted, 503), (LeaseHeld, 503), (StorageError, 503), (UsageError, 422),
          (SourceError, 422))


def http_status(exc: HermesError) -> int:
    """The HTTP status an error answers with (`STATUS`, the first class it is an instance of; else 500)."""
    return next((code for cls, code in STATUS if isinstance(exc, cls)), 500)


def error_json(path: str, code: int, message: str, settings: ServeSettings,
               headers: dict[str, str] | None = None, retry_after_s: float | None = None) -> JSONResponse:
    """An error response: ``{"error": message}``, or OpenAI's error shape on the OpenAI routes; a 503 says
    Retry-After: `retry_after_s` rounded up when known, else ``--retry-after``'s default."""
    if code == 503:
        wait_s = settings.retry_after_s if retry_after_s is None else max(math.ceil(retry_after_s), 1)
        headers = {**(headers or {}), "Retry-After": str(wait_s)}
    if openai_api.is_openai_path(path):
        code, body = openai_api.error_body(code, message)
    else:
        body = {"error": message}
    return JSONResponse(body, status_code=code, headers=headers)


def check_question(body: Any) -> tuple[Question, dict[str, Any]]:
    """The question of a `POST .../questions` body, and its answer length, recall choice and moment (stream
    seconds) as `Scheduler.ask`'s keyword arguments.

    Raises:
        UsageError: a body that is not such an object.
    """
    if not isinstance(body, dict) or not isinstance(body.get("question"), str) or not body["question"].strip():
        raise UsageError('expected a JSON object with "question": a non-empty string')
    check_keys(body, QUESTION_KEYS, "a question")
    options = body.get("options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options) or len(options) > 10:
        raise UsageError('"options" must be a list of at most 10 strings')
    tokens = body.get("max_new_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or not 1 <= tokens <= MAX_NEW_TOKENS):
        raise UsageError(f'"max_new_tokens" must be a whole number from 1 to {MAX_NEW_TOKENS}')
    recall = body.get("recall")
    if recall is not None and not isinstance(recall, bool):
        raise UsageError('"recall" must be true or false')
    at_s = body.get("at")
    if at_s is not None and (isinstance(at_s, bool) or not isinstance(at_s, (int, float)) or not 0 <= at_s < math.inf):
        raise UsageError('"at" must be a number of stream seconds >= 0')
    ask = {"max_new_tokens": tokens, "recall": recall, "at_s": at_s}
    return Question(body["question"], options=tuple(options)), ask


def answer_json(stream: Stream, answer) -> dict[str, Any]:
    """The answer JSON of `run --json`, with the stream's id and the newest frame the answer saw."""
    out = answer.to_json()
    out.update(stream=stream.id, last_frame_t_s=answer.last_frame_t_s)
    return out


async def answer_pieces(server: Server, stream: Stream, question: Question, ask: dict[str, Any]) -> AsyncIterator:
    """Ask `question` on `stream` (`ask`: `check_question`'s keyword arguments) and wait for the answer to begin.

    Returns:
        An iterator of the answer's text pieces as they are generated, then the `Answer`.

    Raises:
        HermesError: the question failed before its answer began (so the response gets its own status).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    future = server.scheduler.ask(stream, question, **ask,
                                  on_text=lambda text: loop.call_soon_threadsafe(queue.put_nowait, text))
    future.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, f))
    first = await queue.get()
    if not isinstance(first, str):
        first.result()

    async def pieces():
        item = first
        while isinstance(item, str):
            yield item
            item = await queue.get()
        yield item.result()

    return pieces()


async def push_image(stream: Stream, data: bytes, t_s: float | None) -> float:
    """Decode a JPEG or PNG and push it to `stream` (waiting for room while the model catches up); its time."""
    rgb = await asyncio.to_thread(decode_image, data)
    return await asyncio.to_thread(stream.push_frame, rgb, t_s)


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """A server-sent events response (never cached)."""
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-store"})


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def decode_image(body: bytes):
    """A JPEG or PNG body as (H, W, 3) RGB uint8.

    Raises:
        UsageError: empty, or not an image OpenCV can decode.
    """
    import cv2
    import numpy as np

    if not body:
        raise UsageError("empty body: POST a JPEG or PNG image")
    bgr = cv2.imdecode(np.frombuffer(body, dtype=np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise UsageError("the body is not a JPEG or PNG image")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def create_app(server: Server) -> FastAPI:
    """The FastAPI application over `server` (closing it when the app shuts down)."""
    from contextlib import asynccontextmanager

    settings = server.settings

    @asynccontextmanager
    async def lifespan(app):
        server.load_in_background()
        yield
        await asyncio.to_thread(server.close)

    app = FastAPI(title="hermes-video serve", version="1", lifespan=lifespan,
                  description="Many video streams, one vision-language model with a bounded hierarchical KV "
                              "memory (HERMES). Send `Authorization: Bearer KEY` when the server has a key.")

    @app.middleware("http")
    async def guard(request: Request, call_next):
        path = request.url.path
        if path in HEALTH_PATHS:
            return await call_next(request)
        if not (path in PUBLIC_PATHS or path.startswith("/static/")) and \
                not bearer_ok(request.headers.get("authorization"), settings.api_key):
            return error_json(path, 401, "missing or wrong API key: send Authorization: Bearer KEY", settings,
                              {"WWW-Authenticate": "Bearer"})
        if server.model is None and path not in ("/docs", "/openapi.json"):
            return error_json(path, 503, server.not_ready(), settings)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_request_bytes:
            return error_json(path, 413, f"request body over {settings.max_request_bytes} bytes", settings)
        return await call_next(request)

    @app.exception_handler(HermesError)
    async def hermes_error(request: Request, exc: HermesError):
        return error_json(request.url.path, http_status(exc), " ".join(str(exc).split()), settings,
                          retry_after_s=getattr(exc, "retry_after_s", None))

    async def body_bytes(request: Request) -> bytes:
        raw = await request.body()
        if len(raw) > settings.max_request_bytes:
            raise TooLarge(f"request body over {settings.max_request_bytes} bytes")
        return raw

    async def json_body(request: Request) -> Any:
        raw = await body_bytes(request)
        try:
            return json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UsageError("the body is not JSON") from None

    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC / "index.html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        path = (STATIC / name).resolve()
        if path.parent != STATIC.resolve() or not path.is_file():
            raise NotFound(f"no static file {name!r}")
        return FileResponse(path)

    @app.get("/healthz", summary="Liveness: the process answers (no key needed)")
    def healthz():
        down = server.scheduler is not None and not server.scheduler.alive
        return JSONResponse({"status": "down" if down else "ok"}, status_code=503 if down else 200)

    @app.get("/readyz", summary="Readiness: model loaded, worker running, memory root writable (no key needed)")
    def readyz():
        reason = server.not_ready()
        if reason is None:
            return {"status": "ready"}
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503,
                            headers={"Retry-After": str(settings.retry_after_s)})

    @app.get("/metrics", summary="Prometheus text format")
    def prometheus():
        return PlainTextResponse(metrics.render(server.registry, server.scheduler), media_type=metrics.CONTENT_TYPE)

    @app.post("/v1/streams", status_code=201, summary="Open a stream: {source | \"push\", memory?, fps?, name?}")
    async def create_stream(request: Request):
        body = await json_body(request)
        stream = await asyncio.to_thread(server.registry.create, body)
        return JSONResponse(stream.to_json(), status_code=201)

    @app.get("/v1/streams", summary="The open streams, and saved ones that could not be opened again")
    def list_streams():
        unadopted = [{"id": name, "name": name, "status": "error", "error": str(exc), "open": False}
                     for name, exc in sorted(server.registry.unadopted.items())]
        return {"streams": [s.to_json() for s in server.registry.all()] + unadopted}

    @app.get("/v1/streams/{stream_id}", summary="One stream")
    def get_stream(stream_id: str):
        return server.stream(stream_id).to_json()

    @app.delete("/v1/streams/{stream_id}", summary="Close and forget a stream (its memory directory is kept)")
    def delete_stream(stream_id: str):
        if stream_id not in server.registry.unadopted:
            server.stream(stream_id)
        stream = server.registry.delete(stream_id)
        return {"id": stream_id, "status": stream.status if stream else "closed"}

    @app.post("/v1/streams/{stream_id}/frames", status_code=202,
              summary="Push one JPEG or PNG frame (t_s: the client's timestamp; default the arrival clock)")
    async def push_frame(stream_id: str, request: Request, t_s: float | None = None):
        stream = server.stream(stream_id)
        if not stream.push:
            raise Conflict(f"stream {stream_id!r} reads its own source; frames are pushed only to a \"push\" stream")
        body = await body_bytes(request)
        if t_s is not None and not (t_s >= 0 and t_s < float("inf")):
            raise UsageError("t_s must be a number of seconds >= 0")
        stamped = await push_image(stream, body, t_s)
        return JSONResponse({"t_s": stamped, "frames_received": stream.counters.frames_received}, status_code=202)

    @app.get("/v1/streams/{stream_id}/frame.jpg", summary="The latest frame received, as JPEG")
    def latest_frame(stream_id: str):
        import cv2

        frame = server.stream(stream_id).latest_frame()
        if frame is None:
            raise NotFound(f"stream {stream_id!r} has no frame yet")
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(frame.rgb, cv2.COLOR_RGB2BGR))
        return Response(jpeg.tobytes(), media_type="image/jpeg", headers={"Cache-Control": "no-store",
                                                                           "X-Frame-Time": f"{frame.t_s:.3f}"})

    @app.post("/v1/streams/{stream_id}/questions",
              summary="Ask about the frames before now: the answer JSON of `run --json` (or SSE tokens)")
    async def ask(stream_id: str, request: Request):
        stream = server.stream(stream_id)
        question, ask = check_question(await json_body(request))
        if "text/event-stream" not in request.headers.get("accept", ""):
            return answer_json(stream, await asyncio.wrap_future(server.scheduler.ask(stream, question, **ask)))
        pieces = await answer_pieces(server, stream, question, ask)

        async def tokens_then_answer():
            try:
                async for item in pieces:
                    yield sse("token", {"text": item}) if isinstance(item, str) else \
                        sse("answer", answer_json(stream, item))
            except Exception as exc:  # noqa: BLE001 - the status line is sent: the error is an event
                yield sse("error", {"error": " ".join(str(exc).split())})

        return event_stream(tokens_then_answer())

    @app.get("/v1/models", summary="OpenAI: the streams, as models")
    def list_models():
        return {"object": "list", "data": [openai_api.model_json(s) for s in server.registry.all()]}

    @app.get("/v1/models/{model}", summary="OpenAI: one stream, as a model")
    def get_model(model: str):
        return openai_api.model_json(server.stream(model))

    @app.post("/v1/chat/completions", summary="OpenAI chat: the last user message asks the stream named by model")
    async def chat_completions(request: Request):
        chat = openai_api.parse_chat(await json_body(request), MAX_NEW_TOKENS)
        stream = server.stream(chat.model)
        question, ask = check_question(chat.question)
        if chat.images and not stream.push:
            raise UsageError(f"stream {stream.id!r} reads its own source; image parts go only to a \"push\" stream")
        for image in chat.images:
            await push_image(stream, image, None)
        limit = ask["max_new_tokens"] or stream.cfg.model.max_new_tokens
        if not chat.stream:
            answer = await asyncio.wrap_future(server.scheduler.ask(stream, question, **ask))
            return openai_api.completion(chat, answer, limit)
        pieces = await answer_pieces(server, stream, question, ask)
        return event_stream(openai_api.chunks(chat, pieces, limit))

    @app.post("/v1/streams/{stream_id}/watches", status_code=201,
              summary="A standing question: {question, every_s}; an event each time its answer changes")
    async def add_watch(stream_id: str, request: Request):
        stream = server.stream(stream_id)
        question, every_s = check_watch(await json_body(request))
        if not stream.feeding:  # no frame will come: the watch would never see its answer change
            raise Conflict(f"stream {stream_id!r} no longer receives frames (status {stream.status}), so a watch "
                           f"would wait forever; ask a question instead")
        watch = server.registry.add_watch(stream, question, every_s)
        return JSONResponse(watch.to_json(), status_code=201)

    @app.get("/v1/streams/{stream_id}/watches", summary="The stream's watches")
    def list_watches(stream_id: str):
        return {"watches": [w.to_json() for w in server.stream(stream_id).watches]}

    @app.get("/v1/streams/{stream_id}/events",
             summary="SSE: watch answers that changed, gaps, reconnects, drops, end (Last-Event-ID resumes)")
    async def events(stream_id: str, request: Request, since: int = 0):
        stream = server.stream(stream_id)
        last = request.headers.get("last-event-id")
        seq = int(last) if last and last.isdigit() else since

        async def feed():
            nonlocal seq
            idle_s = 0.0
            while True:
                for event in stream.events.since(seq):
                    seq = event["seq"]
                    yield sse(event["type"], event, seq)
                    idle_s = 0.0
                if stream.status == "closed" or await request.is_disconnected():
                    return
                await asyncio.sleep(EVENTS_POLL_S)
                idle_s += EVENTS_POLL_S
                if idle_s >= KEEPALIVE_S:
                    idle_s = 0.0
                    yield ": keepalive\n\n"

        return event_stream(feed())

    @app.get("/v1/streams/{stream_id}/memory", summary="Memory per level; evictions and recall")
    def memory(stream_id: str):
        stream = server.stream(stream_id)
        m, c = stream.memory, stream.counters
        return {"stream": stream.id, "policy": stream.cfg.memory.policy, "budget_tokens": stream.cfg.memory.budget,
                "levels": {"hbm": {"tokens": m.get("hbm_tokens", 0), "bytes": m.get("hbm_bytes", 0)},
                           "dram": {"bytes": m.get("dram_bytes", 0)},
                           "disk": {"bytes": m.get("disk_bytes", 0), "records": m.get("disk_records", 0)}},
                "frames_encoded": c.frames_encoded, "evicted_tokens": c.evicted_tokens,
                "recall_records": c.recall_records, "persistent": stream.memory_dir is not None}

    return app
