"""The `run` and `bench` subcommands of `hermes-video`: their parsers and handlers.

`hermes/cli.py` registers them with `add_run_parser(subparsers)` and `add_bench_parser(subparsers)`
(`hermes.pipelines.bench.cli`). A handler turns flags into the typed calls of `hermes.pipelines.run`;
the configuration comes from `hermes.cli_args.config_from_args` (each config flag is sugar for one
key, `CONFIG_FLAGS`). Only argparse and the preset layer are imported here, so `--help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys

from hermes.cli_args import add_common_options, add_config_options, config_from_args, memory_chosen
from hermes.errors import UsageError


class AskAction(argparse.Action):
    """`--ask TEXT`: a new question; `--at S` (`AtAction`) then times the question just before it."""

    def __call__(self, parser, namespace, values, option_string=None):
        asked = list(getattr(namespace, "asked", None) or [])
        asked.append([values, None])
        namespace.asked = asked


class AtAction(argparse.Action):
    """`--at S` times the `--ask` right before it; without `--at` a question is asked at the end."""

    def __call__(self, parser, namespace, values, option_string=None):
        asked = getattr(namespace, "asked", None) or []
        if not asked:
            raise UsageError(f"--at {values} comes before any --ask: write --ask TEXT --at S")
        if asked[-1][1] is not None:
            raise UsageError(f"--at {values}: the question {asked[-1][0]!r} already has --at {asked[-1][1]}; "
                             f"give one --at per --ask")
        asked[-1][1] = values


def print_answer(answer, as_json: bool, config: dict | None = None, extra: dict | None = None) -> None:
    """One answer: a JSON line (with `extra` fields such as the question's `id`), or a few text lines."""
    if as_json:
        record = answer.to_json()
        record.update(extra or {})
        if config is not None:
            record["config"] = config
        print(json.dumps(record, ensure_ascii=False), flush=True)
        return
    when = "end" if answer.at_s is None else f"{answer.at_s:.1f}s"
    ident = f" ({extra['id']})" if extra and extra.get("id") is not None else ""
    print(f"[{when}]{ident} Q: {answer.question}")
    for i, option in enumerate(answer.options):
        print(f"        {chr(65 + i)}. {option}")
    print(f"        A: {answer.answer}")
    print(f"        ({answer.frames_seen} frames seen, ttft {answer.ttft_ms:.0f} ms, "
          f"{answer.memory['hbm_tokens']} tokens / {answer.memory['hbm_bytes'] / 2**20:.1f} MiB in memory)",
          flush=True)


def cmd_run(args) -> int:
    """`run SOURCE ...`: check everything, then stream and print each answer. Returns the exit code."""
    from hermes.pipelines.run import execute_run, prepare_run

    plan = prepare_run(args.source, [tuple(pair) for pair in getattr(args, "asked", None) or []],
                       lambda: config_from_args(args, default_memory=True), questions_file=args.questions,
                       ask_every=args.ask_every, reconnect_timeout=args.reconnect_timeout,
                       interactive=args.interactive, memory_dir=args.memory_dir, resume=args.resume,
                       memory_chosen=memory_chosen(args), read_only=args.read_only, to_end=args.to_end)
    progress = sys.stderr.isatty() and not args.quiet
    config = plan.cfg.to_dict() if args.json else None

    def show(answer, question) -> None:
        extra = {"id": question.id} if question is not None and question.id is not None else {}
        print_answer(answer, args.json, config, extra)

    execute_run(plan, progress=progress, on_answer=show)
    return 0


def add_run_parser(subparsers) -> argparse.ArgumentParser:
    """Register `run SOURCE ...` on a subparsers object; returns its parser (handler `cmd_run`)."""
    run = subparsers.add_parser("run", help="stream a video, camera or folder and answer questions at chosen "
                                            "moments")
    run.add_argument("source", nargs="?", help="a video file, an image folder, a webcam index (0, 1, ...) or an "
                                               "rtsp://, rtmp:// or http(s):// stream URL (none with --read-only)")
    add_config_options(run, flags=("--device", "--fps", "--chunk-frames", "--max-new-tokens"))
    run.add_argument("--json", action="store_true", help="JSON on stdout (one object per answer or run)")
    add_common_options(run)
    run.add_argument("--ask", action=AskAction, metavar="TEXT", help="a question (repeatable)")
    run.add_argument("--at", action=AtAction, metavar="S",
                     help="seconds into the video to ask the --ask right before it (default: at the end); "
                          "timed and end-of-video questions can be mixed")
    run.add_argument("--questions", metavar="FILE", help='JSONL: {"question", "at_s", "options", "id"} per line')
    run.add_argument("--interactive", action="store_true",
                     help="type questions while the stream runs; each is answered from the frames before it "
                          "was typed (files play back in real time)")
    run.add_argument("--ask-every", metavar="S",
                     help="ask every --ask question without --at every S seconds of stream time (on a file: "
                          "as fast as the model)")
    run.add_argument("--reconnect-timeout", metavar="S",
                     help="live streams: give up after S seconds without a connection (default 30)")
    run.add_argument("--memory-dir", metavar="DIR",
                     help="keep evicted memory (levels 2 and 3) and checkpoints of the stream in DIR")
    run.add_argument("--resume", action="store_true",
                     help="continue the stream saved in --memory-dir (frames already seen are skipped)")
    run.add_argument("--read-only", action="store_true",
                     help="answer from the stream another process writes into --memory-dir (e.g. s3://...): "
                          "its last checkpoint plus recall over its records, followed as they arrive; "
                          "nothing is written")
    run.add_argument("--to-end", action="store_true",
                     help="keep streaming after the last question is answered, until the source ends (a live "
                          "stream: until Ctrl-C); without it a run whose timed questions are all answered stops")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)
    return run
