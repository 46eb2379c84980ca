"""`hermes-video serve`: one process, one model, many streams, an HTTP API and a web page.

docs/ARCHITECTURE.md, Serving.

One concept per module:

- `settings`: the server's typed settings and the checks made before the model loads;
- `security`: bearer keys and the source allowlist;
- `streams`: one served stream (its source pump, pending frames, clock, watches) and the registry
  that admits streams (503 when full);
- `scheduler`: the single model worker thread that owns the model and every session;
- `events`: per-stream event logs (watch answers, gaps, reconnects, drops) read by SSE;
- `metrics`: the Prometheus text of `/metrics`;
- `app`: the FastAPI routes; `openai_api`: the OpenAI chat protocol over them; `static/`: the web page at `/`;
- `cli`: the `serve` subcommand.

FastAPI and uvicorn are the optional extra `[serve]`; nothing here imports them before `serve` runs.
"""
