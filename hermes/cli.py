"""`hermes-video` (also `python -m hermes`): the parser of every package's subcommands, and errors mapped
to one line and the exit codes of docs/ARCHITECTURE.md, Interfaces (a traceback with `--debug`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from hermes import __version__
from hermes.cli_args import PROG, Parser, add_common_options
from hermes.errors import EXIT_INTERNAL, HermesError, UsageError


def cmd_info(args) -> int:
    """`info`: versions, device, video backends, families and presets."""
    import platform

    import torch

    from hermes.models.loading import supported_families
    from hermes.pipelines.video import available_backends
    from hermes.presets import preset_names

    lines = [f"hermes-video {__version__}", f"python       {platform.python_version()} ({sys.platform})"]
    for module in ("torch", "transformers", "decord", "cv2", "faiss", "numpy"):
        try:
            version = getattr(__import__(module), "__version__", "installed")
        except Exception as exc:  # a broken optional backend is reported, not fatal
            version = f"not available ({type(exc).__name__})"
        lines.append(f"{module:<12} {version}")
    cuda = torch.cuda.is_available()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count() if cuda else 0))
    lines += [f"device       {f'cuda ({names})' if names else 'cpu (no CUDA device)'}",
              f"video        {', '.join(available_backends()) or 'none'}",
              f"families     {', '.join(supported_families())}",
              f"models       {', '.join(preset_names('models'))}", f"memory       {', '.join(preset_names('memory'))}"]
    print("\n".join(lines))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: the top-level options and every package's subcommands (argparse only)."""
    from hermes.datasets.cli import add_eval_parser
    from hermes.datasets.day import add_day_suite
    from hermes.datasets.demo import add_demo_parser
    from hermes.models.cli import add_model_parsers
    from hermes.pipelines.bench.cli import add_bench_parser
    from hermes.pipelines.cli import add_run_parser
    from hermes.pipelines.serve.cli import add_serve_parser
    from hermes.cli_memory import add_memory_parser

    parser = Parser(prog=PROG, description="Ask questions about video with a vision-language "
                                           "model and a bounded KV memory (HERMES).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_common_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_run_parser(sub)
    add_serve_parser(sub)
    add_demo_parser(sub)
    add_bench_parser(sub, more_suites=(add_day_suite,))
    add_eval_parser(sub)
    add_memory_parser(sub)
    add_model_parsers(sub)
    info = sub.add_parser("info", help="versions, device, video backends, model and memory presets")
    add_common_options(info)
    info.set_defaults(func=cmd_info)
    return parser


def quiet_native_logs(level: str) -> None:
    """Logging on stderr at `level`; OpenCV's and FFmpeg's console messages off unless debugging (set
    before cv2 or decord is imported: both read it from the environment at load)."""
    logging.basicConfig(level=level.upper(), format=f"{PROG}: %(levelname)s: %(message)s", stream=sys.stderr)
    if level != "debug":
        os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
        os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET
        os.environ.setdefault("OPENCV_VIDEOIO_DEBUG", "0")


def check_utf8(argv: list[str]) -> None:
    """Refuse arguments that are not UTF-8 (Python keeps such bytes as lone surrogates)."""
    for i, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise UsageError(f"argument {i} ({shown!r}) is not UTF-8 text") from None


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (0 ok, 2 usage/config, 3 source, 4 model, 1 other)."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    debug = "--debug" in argv
    try:
        check_utf8(argv)
        parser = build_parser()
        args = parser.parse_args(argv)
        debug = bool(getattr(args, "debug", False)) or debug
        quiet_native_logs(getattr(args, "log_level", None) or "warning")
        if args.command is None:
            commands = ", ".join(parser._subparsers._group_actions[0].choices)
            raise UsageError(f"a COMMAND is required: {commands} (see {PROG} --help)")
        return args.func(args)
    except HermesError as exc:
        if debug:
            raise
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        print(f"{PROG}: internal error: {type(exc).__name__}: {one_line(exc)} (rerun with --debug for a traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


def one_line(exc: BaseException) -> str:
    """An error message on one line, whatever its text holds."""
    return " ".join(str(exc).split())
