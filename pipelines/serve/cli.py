"""The `serve` subcommand: its parser, the one-line checks made before the model loads (flags, settings,
configuration, model name, the `[serve]` extra, the port), then uvicorn; the model loads in the
background while `/readyz` answers 503. `--engine ray` hands the checked flags to `ray_engine` instead."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

from hermes.cli_args import (Parser, add_common_options, add_config_options, config_from_args, port_number,
                             positive_float, positive_int)
from hermes.errors import UsageError


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


def config_resolver(args):
    """The server's configuration with a stream's memory preset (None: the server's own), from the flags."""
    def resolve_config(memory: str | None):
        if memory is None:
            return config_from_args(args, default_memory=True)
        return config_from_args(argparse.Namespace(**{**vars(args), "memory": memory}), default_memory=True)

    return resolve_config


def check_engine_flags(args) -> None:
    """Refuse engine flags that do not go together, and `--engine ray` without Ray, before anything loads."""
    import importlib.util

    if args.engine == "local":
        for flag, value in (("--replicas", args.replicas), ("--ray-address", args.ray_address)):
            if value is not None:
                raise UsageError(f"{flag} goes with --engine ray")
        return
    if args.memory_root is None:
        raise UsageError("--engine ray needs --memory-root (a folder every replica reaches, or s3://bucket/prefix): "
                         "a stream moved to another replica resumes from it")
    if importlib.util.find_spec("ray") is None:
        raise UsageError("--engine ray needs Ray Serve: pip install 'hermes-video[ray]'")


def cmd_serve(args) -> int:
    """`serve`: check everything, listen, load the model once in the background, serve until Ctrl-C or SIGTERM."""
    from hermes.model_registry import resolve_source

    check_engine_flags(args)
    settings = settings_from_args(args)
    cfg = config_from_args(args, default_memory=True)
    resolve_source(cfg.model.name, cfg.model.hub_id)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise UsageError("serve needs FastAPI and uvicorn: pip install 'hermes-video[serve]'") from None
    check_port_free(settings.host, settings.port)
    if args.engine == "ray":
        from hermes.pipelines.serve.ray_engine import run_ray

        return run_ray(ray_application(args, settings, cfg), settings, args.replicas or 1, args.ray_address)
    resolve_config = config_resolver(args)

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


def ray_application(args, settings, cfg):
    """`ray_engine.build_app` over checked flags: their settings, configuration and replicas (each asks Ray
    for a GPU when the model's device is CUDA)."""
    from hermes.pipelines.serve.ray_engine import build_app

    gpus = 1 if cfg.model.device.startswith("cuda") else 0
    return build_app(settings, config_resolver(args), args.replicas or 1, gpus)


def argv_from_mapping(config: dict[str, Any]) -> list[str]:
    """A `serve run` config's `args` as `serve` flags: ``{"memory_root": "m", "allow_source": ["a", "b"]}``
    is ``--memory-root m --allow-source a --allow-source b``; true adds a bare flag, false or null nothing."""
    argv: list[str] = []
    for key, value in (config or {}).items():
        flag = "--" + str(key).replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            if item is True:
                argv.append(flag)
            elif item is not None and item is not False:
                argv += [flag, str(item)]
    return argv


def ray_app(config: dict[str, Any]):
    """`serve run`'s entry (configs/serve_ray.yaml's `import_path`): its `args` are `serve`'s flags by name,
    checked as `serve --engine ray` checks them.

    Raises:
        UsageError: a flag `serve --engine ray` would refuse (ConfigError: a bad configuration).
    """
    parser = Parser(prog="hermes-video")
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", *argv_from_mapping({**(config or {}), "engine": "ray"})])
    check_engine_flags(args)
    settings = settings_from_args(args)
    return ray_application(args, settings, config_from_args(args, default_memory=True))


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
    serve.add_argument("--memory-root", metavar="ROOT",
                       help="a folder or s3://bucket/prefix: stream NAME's memory is ROOT/NAME, its spec is saved, "
                            "and a server restarted on ROOT opens its streams again")
    serve.add_argument("--allow-source", action="append", metavar="PATTERN",
                       help="sources clients may open: rtsp://HOST:*, http://HOST:PORT/*, an absolute folder, "
                            "or 'webcam' (repeatable; push streams need none)")
    serve.add_argument("--max-request-bytes", type=positive_int, default=8 * 2**20, metavar="N",
                       help="largest request body, e.g. a pushed frame (default 8 MiB)")
    serve.add_argument("--max-push-fps", type=positive_float, default=30.0, metavar="F",
                       help="frames per second a push client may send to one stream (default 30)")
    serve.add_argument("--engine", choices=("local", "ray"), default="local",
                       help="local: one process (default); ray: a Ray Serve application, --replicas processes each "
                            "with one model (pip install 'hermes-video[ray]'; docs/SCALE_OUT.md)")
    serve.add_argument("--replicas", type=positive_int, metavar="N",
                       help="--engine ray: model replicas, each holding up to --max-streams streams (default 1)")
    serve.add_argument("--ray-address", metavar="ADDR",
                       help="--engine ray: the Ray cluster to join, e.g. ray://HEAD:10001 or auto (default: start "
                            "a local one)")
    add_config_options(serve, flags=("--device", "--fps", "--max-new-tokens"),
                       flag_help={"--fps": "frames sampled per second for streams that give no fps"})
    add_common_options(serve)
    serve.set_defaults(func=cmd_serve)
    return serve
