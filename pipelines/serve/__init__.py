"""`hermes-video serve`: one process, one model, many streams, an HTTP API and a web page.

Its modules, one concept each: docs/ARCHITECTURE.md, Serving; the API: README.md, "Serving". FastAPI
and uvicorn (the `[serve]` extra) are imported only once `serve` runs.
"""
