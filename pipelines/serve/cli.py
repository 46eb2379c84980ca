"""The `serve` subcommand: its parser, the checks made before the model loads, then uvicorn.

Order: flags and settings (bind, port, key, memory root, allowlist), the configuration (model and
memory presets), the model's name in the registry, the `[serve]` extra, and that the port can be
bound — each a one-line error with its exit code. Then the server listens and the model loads in the
background (`/readyz` answers 503 until it is loaded); a model that fails to load stops the server
with that error's one line and exit code.
"""

from __future__ import annotations

import argparse
import socket
import sys

from hermes.cli_args import add_common_options, add_config_options, config_from_args, positive_int
from hermes.errors import UsageError


def port_number(text: str) -> int:
    """argparse type: a TCP port 1-65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1-65535, found {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1-65535, found {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, found {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, found {text!r}")
    return value


def settings_from_args(args):
    """The checked `ServeSettings` of the flags (HERMES_API_KEY when --api-key is not given)."""
    from hermes.pipelines.serve.settings import ServeSettings, check_settings

    return check_settings(ServeSettings(
        host=args.host, port=args.port, api_key=args.api_key, max_streams=args.max_streams,
        memory_root=args.memory_root, allow_source=tuple(args.allow_source or ()),
        max_request_bytes=args.max_request_bytes, max_push_fps=args.max_push_fps))


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another program holds (or this host cannot bind) before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port or --host") \
                from None


def cmd_serve(args) -> int:
    """`serve`: check everything, listen, load the model once in the background, serve until Ctrl-C or SIGTERM."""
    from hermes.model_registry import resolve_source

    settings = settings_from_args(args)
    cfg = config_from_args(args, default_memory=True)
    resolve_source(cfg.model.name, cfg.model.hub_id)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise UsageError("serve needs FastAPI and uvicorn: pip install 'hermes-video[serve]'") from None
    check_port_free(settings.host, settings.port)

    def resolve_config(memory: str | None):
        if memory is None:
            return config_from_args(args, default_memory=True)
        return config_from_args(argparse.Namespace(**{**vars(args), "memory": memory}), default_memory=True)

    from hermes.models.loading import load_model
    from hermes.pipelines.serve.app import Server, create_app

    failed: list[BaseException] = []

    def load():
        try:
            return load_model(cfg.model)
        except BaseException as exc:
            failed.append(exc)  # raised again below once uvicorn has stopped: the usual one-line error
            web.should_exit = True
            raise

    server = Server(settings, load, resolve_config)  # listens at once; /readyz says 200 once loaded
    web = uvicorn.Server(uvicorn.Config(create_app(server), host=settings.host.strip("[]"), port=settings.port,
                                        log_level=args.log_level or "warning", access_log=False))
    auth = "bearer key required" if settings.api_key else "no key (loopback only)"
    print(f"serving {cfg.model.name} on http://{settings.host}:{settings.port}/ ({auth}; up to "
          f"{settings.max_streams} streams; /readyz answers 200 once the model is loaded); Ctrl-C stops",
          file=sys.stderr, flush=True)
    web.run()
    if failed:
        raise failed[0]
    return 0


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Register `serve` on a subparsers object; returns its parser (handler `cmd_serve`)."""
    serve = subparsers.add_parser("serve", help="serve many streams with one model: an HTTP API, SSE and a web page")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1; any other needs --api-key)")
    serve.add_argument("--port", type=port_number, default=8000, help="TCP port (default 8000)")
    serve.add_argument("--api-key", metavar="KEY",
                       help="bearer key every request must carry (default: $HERMES_API_KEY; at least 16 characters)")
    serve.add_argument("--max-streams", type=positive_int, default=4, metavar="N",
                       help="streams open at once; one more gets 503 (default 4)")
    serve.add_argument("--memory-root", metavar="DIR",
                       help="each stream's memory directory is DIR/NAME; a stream re-created with its name resumes")
    serve.add_argument("--allow-source", action="append", metavar="PATTERN",
                       help="sources clients may open: rtsp://HOST:*, http://HOST:PORT/*, an absolute folder, "
                            "or 'webcam' (repeatable; push streams need none)")
    serve.add_argument("--max-request-bytes", type=positive_int, default=8 * 2**20, metavar="N",
                       help="largest request body, e.g. a pushed frame (default 8 MiB)")
    serve.add_argument("--max-push-fps", type=positive_float, default=30.0, metavar="F",
                       help="frames per second a push client may send to one stream (default 30)")
    add_config_options(serve, flags=("--device", "--fps", "--max-new-tokens"),
                       flag_help={"--fps": "frames sampled per second for streams that give no fps"})
    add_common_options(serve)
    serve.set_defaults(func=cmd_serve)
    return serve
