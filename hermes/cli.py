"""`hermes-video` (also `python -m hermes`): the command line, a thin layer over the Python API.

Nothing heavy is imported before the input is checked: arguments, files and configuration are
validated first (usage, file and config errors are one line, raised before torch or transformers
loads), then the command imports what it needs. Every `HermesError` becomes one line on stderr and
the exit code of DESIGN §6; anything else is a bug: one line too, and a traceback with `--debug`
(accepted before or after the subcommand).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from hermes import __version__
from hermes.cli_run import AskAction, AtAction, execute_run, prepare_run
from hermes.errors import EXIT_INTERNAL, HermesError, UsageError

PROG = "hermes-video"
LOG_LEVELS = ("debug", "info", "warning", "error")


# ---- output ----------------------------------------------------------------------------------------


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


# ---- commands ----------------------------------------------------------------------------------------


def cmd_memory_inspect(args) -> int:
    from hermes.tiers.commands import inspect_command

    return inspect_command(args.directory, args.records, args.json)


def cmd_memory_verify(args) -> int:
    from hermes.tiers.commands import verify_command

    return verify_command(args.directory)


def cmd_memory_repair(args) -> int:
    from hermes.tiers.commands import repair_command

    return repair_command(args.directory)


def resolve_config(args, *, default_memory: bool = False):
    """The configuration of a command: presets, --config, --set and the flags that are sugar for a key.

    Args:
        default_memory: without --memory, start from the model's bounded preset
            (`default_memory_preset`) instead of the dataclass default (`full`), as `run` does.
    """
    from hermes.config import build_config, default_memory_preset

    overrides = list(args.set or [])
    for flag, key in (("fps", "stream.fps"), ("chunk_frames", "stream.chunk_frames"), ("device", "model.device"),
                      ("max_new_tokens", "model.max_new_tokens")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    memory = args.memory
    if memory is None and default_memory:
        memory = default_memory_preset(build_config(model=args.model, config_file=args.config,
                                                    overrides=overrides).model.name)
    return build_config(model=args.model, memory=memory, config_file=args.config, overrides=overrides)


def cmd_run(args) -> int:
    plan = prepare_run(args, lambda a: resolve_config(a, default_memory=True))
    progress = sys.stderr.isatty() and not args.quiet
    config = plan.cfg.to_dict() if args.json else None

    def show(answer, question) -> None:
        extra = {"id": question.id} if question is not None and question.id is not None else {}
        print_answer(answer, args.json, config, extra)

    execute_run(args, plan, progress=progress, on_answer=show)
    return 0


def cmd_demo(args) -> int:
    """A synthetic 40 s stream, a question of each family, answered by the trained micro model offline."""
    check_output_path(args.output, "--output", directory=True)
    from hermes.models.micro import MICRO_NAME

    args.model, args.config = MICRO_NAME, None
    user_budget = any(item.strip().startswith("memory.budget=") for item in args.set or [])
    if args.memory is None:
        args.memory = "hermes-4k"
    if not user_budget:  # 8 frames' worth of the micro model: under any bounded preset memory is at work
        args.set = [f"memory.budget={DEMO_BUDGET}"] + list(args.set or [])
    cfg = resolve_config(args)
    if args.output:
        return run_demo(args, cfg, Path(args.output))
    with tempfile.TemporaryDirectory(prefix="hermes-demo-") as folder:  # removed afterwards
        return run_demo(args, cfg, Path(folder))


DEMO_BUDGET = 128  # visual tokens per layer in the demo: 8 frames of the micro model's 16 tokens


def run_demo(args, cfg, folder: Path) -> int:
    from hermes.cli_run import AskedQuestion, RunPlan
    from hermes.datasets.parsing import parse_strict
    from hermes.datasets.synthetic_bench import write_demo
    from hermes.models.micro import MICRO_NAME
    from hermes.pipelines.session import OPTION_LETTERS

    folder.mkdir(parents=True, exist_ok=True)
    video, planned = write_demo(folder)
    print(f"wrote a synthetic 40 s stream of coloured shapes: {video}" + ("" if args.output else " (removed at exit)"),
          file=sys.stderr)
    print(f"model: {MICRO_NAME} (trained on CPU on such streams; see benchmarks/MICRO.md)", file=sys.stderr)
    budget = "no eviction" if cfg.memory.policy == "full" else f"budget {cfg.memory.budget} tokens per layer"
    print(f"memory: {args.memory} ({cfg.memory.policy}, {budget})", file=sys.stderr)
    args.source = str(video)
    for name in ("interactive", "memory_dir", "resume"):
        setattr(args, name, False if name != "memory_dir" else None)
    plan = RunPlan(cfg, [AskedQuestion(q.question, q.t_s, tuple(q.options), i) for i, q in enumerate(planned)])
    right = 0

    def show(answer, question) -> None:
        nonlocal right
        q = planned[question.id]
        expected = q.answer if q.gt is None else OPTION_LETTERS[q.gt]
        # the benchmark's strict rule: the option letter (optionally with its text), or exactly the count
        hit = parse_strict(answer.answer, q.options) == q.gt if q.gt is not None \
            else answer.answer.strip().rstrip(".") == q.answer
        right += hit
        print_answer(answer, args.json, extra={"expected": expected, "right": bool(hit)})
        if not args.json:
            print(f"        expected: {expected}" + (f" ({q.answer})" if q.gt is not None else "")
                  + ("  [right]" if hit else "  [wrong]"), flush=True)

    execute_run(args, plan, progress=False, on_answer=show)
    print(f"{right}/{len(planned)} answers right (memory: {cfg.memory.policy}, {budget})", file=sys.stderr)
    return 0


def check_output_path(path: str | None, flag: str, *, directory: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written: a directory where a file is
    expected or the reverse, or a parent folder that is missing or read-only."""
    if not path:
        return
    target = Path(path)
    if directory:
        if target.exists() and not target.is_dir():
            raise UsageError(f"{flag} expects a directory, found a file: {path}")
    elif target.is_dir():
        raise UsageError(f"{flag} expects a file, found a directory: {path}")
    parent = target.parent if not target.exists() else target if directory else target.parent
    parent = parent if str(parent) else Path(".")
    while not parent.exists() and directory and parent != parent.parent:
        parent = parent.parent  # a directory output is created with its parents
    if not parent.is_dir():
        raise UsageError(f"{flag}: folder {parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag}: folder {parent} is not writable")


def bench_model(args, cfg):
    """The model a bench measures: `--arch` (random weights, built on the device), `--model`, or the
    random CPU benchmark model (`cpu-small`: 8 layers, 512 wide, 16 tokens per frame, so that `full`
    over thousands of frames stays computable on a CPU)."""
    from hermes.models.loading import load_model, resolve_device, resolve_dtype
    from hermes.models.realsize import CPU_SMALL, build_random

    if args.model:
        return load_model(cfg.model)
    device = resolve_device(cfg.model.device)
    return build_random(args.arch or CPU_SMALL, device, resolve_dtype(cfg.model.dtype, device),
                        num_layers=args.num_layers, vision_layers=args.vision_layers,
                        seed=cfg.model.seed, system_prompt=cfg.model.system_prompt)


def bench_config(args, default_budget: int):
    """The bench's configuration, checked before anything loads. The budget of bounded policies is
    `memory.budget`: `--budget N` sets it, and so do --memory, --config and --set; otherwise the
    suite's default. Output paths are checked here too, so a long run cannot fail at its end."""
    if args.arch and args.model:
        raise UsageError("give --arch (random weights) or --model (a checkpoint), not both")
    for flag in ("num_layers", "vision_layers"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} expects a positive whole number, found {value}")
    if args.chunk_frames_bench is not None and args.chunk_frames_bench < 1:
        raise UsageError(f"--chunk-frames expects a positive whole number, found {args.chunk_frames_bench}")
    check_output_path(args.output, "--output")
    check_output_path(getattr(args, "markdown", None), "--markdown")
    overrides = list(args.set or [])
    if args.budget is not None:
        overrides.append(f"memory.budget={args.budget}")
    elif not (args.memory or args.config or any(o.strip().startswith("memory.budget=") for o in overrides)):
        overrides.insert(0, f"memory.budget={default_budget}")
    args.set = overrides
    return resolve_config(args)


def write_bench_files(args, meta: dict, result, columns) -> None:
    """`--output` JSON and `--markdown` report, when asked (rewritten as results come in)."""
    from hermes.pipelines.bench_report import report_markdown

    if args.output:
        Path(args.output).write_text(json.dumps(bench_record(meta, result), indent=2))
    if getattr(args, "markdown", None):
        Path(args.markdown).write_text(report_markdown(meta, result, columns))


def bench_record(meta: dict, result) -> dict:
    from hermes.pipelines.bench_report import rows_as_dicts

    return {**meta, "notes": result.notes, "rows": rows_as_dicts(result.rows)}


def write_bench_outputs(args, meta: dict, result, columns) -> None:
    """The table on stdout (with --json: the run as one JSON object), notes on stderr, and the files."""
    from hermes.pipelines.bench_report import markdown_table

    if args.json:
        print(json.dumps(bench_record(meta, result)))
    else:
        print(markdown_table(result.rows, columns))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    write_bench_files(args, meta, result, columns)


def cmd_bench_memory(args) -> int:
    lengths = parse_int_list(args.lengths, "--lengths")
    cfg = bench_config(args, default_budget=512)
    from hermes.pipelines.bench import bench_memory, resolve_policies
    from hermes.pipelines.bench_report import MEMORY_COLUMNS, run_info

    chunk_frames = args.chunk_frames_bench or 16
    model = bench_model(args, cfg)
    policies = resolve_policies(args.policies, cfg.memory, cfg.memory.budget)
    print(f"bench memory: model {model.name} ({model.tokens_per_frame} tokens/frame) on {model.device}, "
          f"budget {cfg.memory.budget} tokens, chunks of {chunk_frames} frames", file=sys.stderr)
    result = bench_memory(model, policies, lengths, chunk_frames=chunk_frames, progress=not args.quiet)
    meta = {"suite": "memory", **run_info(model), "budget": cfg.memory.budget, "chunk_frames": chunk_frames,
            "lengths": lengths, "policies": [p.label for p in policies]}
    write_bench_outputs(args, meta, result, MEMORY_COLUMNS)
    return 0


def cmd_bench_tiers(args) -> int:
    sizes = tuple(parse_int_list(args.records, "--records"))
    if args.write_mib < 1:
        raise UsageError(f"--write-mib expects a positive whole number, found {args.write_mib}")
    check_output_path(args.output, "--output")
    from hermes.tiers.bench import run

    rows, table = run(sizes, write_bytes=args.write_mib << 20)
    print(json.dumps(rows, default=str) if args.json else table)
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2, default=str))
    return 0


def cmd_bench_sweep(args) -> int:
    lengths = parse_int_list(args.lengths, "--lengths")
    chunk_sizes = parse_int_list(args.chunk_sizes, "--chunk-frames")
    if args.decode_tokens < 1 or args.repeats < 1 or args.frame_px < 1:
        raise UsageError("--decode-tokens, --repeats and --frame-px must be at least 1")
    if args.dtype:
        args.set = list(args.set or []) + [f"model.dtype={args.dtype}"]
    args.chunk_frames_bench = None
    cfg = bench_config(args, default_budget=4096)
    from hermes.pipelines.bench import resolve_policies, run_sweep
    from hermes.pipelines.bench_report import SWEEP_COLUMNS, run_info

    model = bench_model(args, cfg)
    policies = resolve_policies(args.policies, cfg.memory, cfg.memory.budget)
    print(f"bench sweep: model {model.name} ({model.tokens_per_frame} tokens/frame) on {model.device} "
          f"({model.dtype}), budget {cfg.memory.budget} tokens, chunks of {'/'.join(map(str, chunk_sizes))} frames, "
          f"{args.decode_tokens} tokens per answer", file=sys.stderr)
    meta = {"suite": "sweep", **run_info(model), "budget": cfg.memory.budget, "decode_tokens": args.decode_tokens,
            "repeats": args.repeats, "frame_px": args.frame_px, "chunk_frames": chunk_sizes, "lengths": lengths,
            "policies": [p.label for p in policies], "command": "hermes-video " + " ".join(sys.argv[1:])}
    result = run_sweep(model, policies, lengths, chunk_sizes, decode_tokens=args.decode_tokens,
                       repeats=args.repeats, frame_px=args.frame_px, progress=not args.quiet,
                       on_stream=lambda partial: write_bench_files(args, {**meta, "partial": True}, partial,
                                                                   SWEEP_COLUMNS))
    write_bench_outputs(args, meta, result, SWEEP_COLUMNS)
    return 0


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} expects comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} expects positive integers, found {text!r}")
    return values


def cmd_info(args) -> int:
    import platform

    from hermes.config import preset_names

    lines = [f"hermes-video {__version__}", f"python       {platform.python_version()} ({sys.platform})"]
    for module in ("torch", "transformers", "decord", "cv2", "faiss", "numpy"):
        try:
            version = getattr(__import__(module), "__version__", "installed")
        except Exception as exc:  # a broken optional backend is reported, not fatal
            version = f"not available ({type(exc).__name__})"
        lines.append(f"{module:<12} {version}")
    import torch

    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        lines.append(f"device       cuda ({names})")
    else:
        lines.append("device       cpu (no CUDA device)")
    from hermes.pipelines.video import available_backends

    lines.append(f"video        {', '.join(available_backends()) or 'none'}")
    from hermes.models.loading import supported_families

    lines.append(f"families     {', '.join(supported_families())}")
    lines.append(f"models       {', '.join(preset_names('models'))}")
    lines.append(f"memory       {', '.join(preset_names('memory'))}")
    print("\n".join(lines))
    return 0


def cmd_pull(args) -> int:
    from hermes.models.hub import hub_id_of, pull

    hub_id = hub_id_of(args.model)
    if args.local_dir:
        check_output_path(args.local_dir, "--local-dir", directory=True)
    print(f"pulling {hub_id}" + (f" at {args.revision}" if args.revision else "")
          + (f" into {args.local_dir}" if args.local_dir else " into the Hugging Face cache"), file=sys.stderr)
    path = pull(args.model, revision=args.revision, local_dir=args.local_dir, progress=not args.quiet)
    print(path)
    where = f"--model {path}" if args.local_dir else f"--model {args.model}"
    print(f"ready: hermes-video run VIDEO {where} ... (works offline, HF_HUB_OFFLINE=1)", file=sys.stderr)
    return 0


def cmd_models(args) -> int:
    from hermes.models.hub import format_models, list_models

    entries = list_models()
    if args.json:
        for e in entries:
            print(json.dumps({"name": e.name, "family": e.family, "hub_id": e.hub_id,
                              "on_disk": e.on_disk_bytes is not None, "size_bytes": e.on_disk_bytes}))
    else:
        print(format_models(entries))
    return 0


# ---- parser --------------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: a usage error is a `UsageError` (exit 2), not a usage dump."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, found {text!r}")
    return value


def add_common_options(p: argparse.ArgumentParser, top: bool = False) -> None:
    """--debug and --log-level, accepted before and after the subcommand."""
    default = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--debug", action="store_true", help="show tracebacks", **default)
    p.add_argument("--log-level", choices=LOG_LEVELS, help="log messages at this level and above on stderr "
                   "(default: warning; debug also shows OpenCV/FFmpeg messages)", **default)


def add_config_options(p: argparse.ArgumentParser, memory_default: str = "the model's bounded preset, "
                       "hermes-4k for every shipped model") -> None:
    from hermes.config import preset_names  # YAML only: --help stays instant

    p.add_argument("--model", help="auto (the default: smolvlm2-500m without CUDA, llava-onevision-7b with it), "
                                   f"a preset ({', '.join(preset_names('models'))}), a hub id like org/name, "
                                   "or a local checkpoint directory")
    p.add_argument("--memory", help=f"memory preset ({', '.join(preset_names('memory'))}; "
                                    f"default: {memory_default})")
    p.add_argument("--config", metavar="FILE", help="YAML file with model:, memory:, stream: sections, or a "
                                                    "preset name (a paper, model or memory preset)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one config key, e.g. --set model.max_new_tokens=32 (repeatable)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (sets model.device)")
    p.add_argument("--json", action="store_true", help="JSON on stdout (one object per answer or run)")
    add_common_options(p)


def add_bench_model_options(p: argparse.ArgumentParser) -> None:
    from hermes.models.realsize import arch_names

    p.add_argument("--arch", choices=arch_names(),
                   help="random weights at a published size, built on the device without downloads "
                        "(default without --model: cpu-small)")
    p.add_argument("--num-layers", type=int, metavar="N", help="--arch: language-model layers (widths unchanged)")
    p.add_argument("--vision-layers", type=int, metavar="N", help="--arch: vision-tower layers")
    p.add_argument("--budget", type=int, metavar="N",
                   help="visual tokens per layer for bounded policies (sets memory.budget; default: the preset's "
                        "with --memory, else 512 for memory, 4096 for sweep)")


BENCH_COSTS = ("What each suite costs on a 2-core CPU with the default cpu-small model: `bench memory` about "
               "20 minutes (full and hermes up to 2048 frames; --lengths 64,256 took 1.4 CPU-minutes), `bench sweep` "
               "longer (four policies at two chunk sizes up to 1024 frames; --lengths 16,64 for a short run), `bench "
               "tiers` about a minute (--records 100000 takes minutes). Progress lines go to stderr (--quiet hides "
               "them).")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Ask questions about video with a vision-language "
                                           "model and a bounded KV memory (HERMES).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_common_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="stream a video, camera or folder and answer questions at chosen moments")
    run.add_argument("source", help="a video file, an image folder, a webcam index (0, 1, ...) or an rtsp://, "
                                    "rtmp:// or http(s):// stream URL")
    add_config_options(run)
    run.add_argument("--ask", action=AskAction, metavar="TEXT", help="a question (repeatable)")
    run.add_argument("--at", action=AtAction, metavar="S",
                     help="seconds into the video to ask the --ask right before it (default: at the end); "
                          "timed and end-of-video questions can be mixed")
    run.add_argument("--questions", metavar="FILE", help='JSONL: {"question", "at_s", "options", "id"} per line')
    run.add_argument("--fps", help="frames sampled per second (sets stream.fps)")
    run.add_argument("--chunk-frames", help="frames encoded per forward (sets stream.chunk_frames)")
    run.add_argument("--max-new-tokens", help="answer length cap (sets model.max_new_tokens)")
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
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="offline demo: a synthetic stream answered by the trained micro model")
    demo.add_argument("--output", metavar="DIR", help="keep the demo video in DIR (default: a temporary folder, "
                                                      "removed at exit)")
    demo.add_argument("--memory", metavar="PRESET",
                      help=f"memory preset (full, sliding, uniform, hermes-4k, ...; default: hermes-4k); bounded "
                           f"presets run at {DEMO_BUDGET} tokens per layer (8 frames) unless --set memory.budget")
    demo.add_argument("--set", action="append", metavar="KEY=VALUE",
                      help="override one config key (e.g. memory.budget=64 to squeeze the memory)")
    demo.add_argument("--device", help="auto, cpu, cuda or cuda:N")
    demo.add_argument("--json", action="store_true", help="one JSON object per answer on stdout, with the "
                                                          "expected answer and whether it is right")
    add_common_options(demo)
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="performance measurements", description=BENCH_COSTS)
    add_common_options(bench)
    bench_sub = bench.add_subparsers(dest="bench", metavar="SUITE", required=True)
    memory = bench_sub.add_parser("memory", help="peak KV memory, TTFT and maintenance cost over stream lengths "
                                                 "(about 20 min on a 2-core CPU with the defaults)",
                                  description=BENCH_COSTS)
    add_config_options(memory, memory_default="full; --policies picks the policies")
    add_bench_model_options(memory)
    memory.add_argument("--policies", default="full,hermes",
                        help="comma-separated policies, `name+flag` for a memory flag on, `recall-only` for "
                             "sliding+recall (default: full,hermes)")
    memory.add_argument("--lengths", default="64,128,256,512,1024,2048", help="stream lengths in frames")
    memory.add_argument("--chunk-frames", dest="chunk_frames_bench", type=int, help="frames per chunk (default 16)")
    memory.add_argument("--output", metavar="FILE", help="also write the rows as JSON")
    memory.add_argument("--quiet", action="store_true", help="no progress lines")
    memory.set_defaults(func=cmd_bench_memory)

    tiers = bench_sub.add_parser("tiers", help="recall time at 10^3.. records, FAISS search, disk write throughput "
                                               "(about a minute)", description=BENCH_COSTS)
    tiers.add_argument("--records", default="1000,10000",
                       help="record counts for the recall and search rows (100000 takes minutes) "
                            "(default: %(default)s)")
    tiers.add_argument("--write-mib", type=int, default=64, help="MiB written per throughput row (default: 64)")
    tiers.add_argument("--output", metavar="FILE", help="also write the rows as JSON")
    tiers.add_argument("--json", action="store_true", help="the rows as JSON on stdout instead of the table")
    add_common_options(tiers)
    tiers.set_defaults(func=cmd_bench_tiers)

    sweep = bench_sub.add_parser(
        "sweep", help="TTFT, time per output token, memory, encode/maintenance time and ingest fps over stream "
                      "lengths, chunk sizes and policies, with ratios against full (the longest suite)",
        description=BENCH_COSTS)
    add_config_options(sweep, memory_default="full; --policies picks the policies")
    add_bench_model_options(sweep)
    sweep.add_argument("--dtype", help="weights dtype: auto (bf16 on CUDA, fp32 on CPU), bfloat16, float16, float32")
    sweep.add_argument("--policies", default="full,sliding,hermes,hermes+recall",
                       help="comma-separated policies; `name+flag` turns a boolean memory setting on "
                            "(skipped with a note if this build has no such key); `recall-only` is sliding+recall "
                            "(default: %(default)s)")
    sweep.add_argument("--lengths", default="16,32,64,128,256,512,1024",
                       help="stream lengths in frames, measured on one stream per policy (default: %(default)s)")
    sweep.add_argument("--chunk-frames", dest="chunk_sizes", default="8,16",
                       help="chunk sizes in frames (default: %(default)s)")
    sweep.add_argument("--decode-tokens", type=int, default=16,
                       help="answer length, forced; TPOT = (latency - TTFT) / (N - 1) (default: %(default)s)")
    sweep.add_argument("--repeats", type=int, default=3, help="questions per length; medians (default: %(default)s)")
    sweep.add_argument("--frame-px", type=int, default=448, help="side of the random frames (default: %(default)s)")
    sweep.add_argument("--output", metavar="FILE", help="also write the run and its rows as JSON")
    sweep.add_argument("--markdown", metavar="FILE", help="also write a markdown report (run details, table, notes)")
    sweep.add_argument("--quiet", action="store_true", help="no progress lines")
    sweep.set_defaults(func=cmd_bench_sweep)

    from hermes.datasets.cli import add_eval_parser  # argparse only: --help stays instant

    add_common_options(add_eval_parser(sub))

    memory_cmd = sub.add_parser("memory", help="inspect, verify or repair a memory directory")
    add_common_options(memory_cmd)
    memory_sub = memory_cmd.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    inspect = memory_sub.add_parser("inspect", help="records, time spans, sizes, index state, checkpoints")
    inspect.add_argument("directory", metavar="DIR")
    inspect.add_argument("--records", type=positive_int, default=20, help="records to list (default 20)")
    inspect.add_argument("--json", action="store_true", help="the report as JSON")
    add_common_options(inspect)
    inspect.set_defaults(func=cmd_memory_inspect)
    verify = memory_sub.add_parser("verify", help="check every checksum; exit 0 only when all hold")
    verify.add_argument("directory", metavar="DIR")
    add_common_options(verify)
    verify.set_defaults(func=cmd_memory_verify)
    repair = memory_sub.add_parser("repair", help="rebuild the manifest and index from the segments; move what "
                                   "cannot be kept to DIR/quarantine (nothing is deleted)")
    repair.add_argument("directory", metavar="DIR")
    add_common_options(repair)
    repair.set_defaults(func=cmd_memory_repair)

    pull_cmd = sub.add_parser("pull", help="download a model's checkpoint (then it loads offline)")
    pull_cmd.add_argument("model", metavar="MODEL", help="a model preset (see `hermes-video models`) or a hub id")
    pull_cmd.add_argument("--revision", metavar="REV", help="commit hash, branch or tag to pin (default: main); "
                                                            "load it with --set model.revision=REV")
    pull_cmd.add_argument("--local-dir", metavar="DIR", help="download into DIR instead of the Hugging Face cache "
                                                             "(then --model DIR)")
    pull_cmd.add_argument("--quiet", action="store_true", help="no progress bars")
    add_common_options(pull_cmd)
    pull_cmd.set_defaults(func=cmd_pull)

    models_cmd = sub.add_parser("models", help="model presets, which are on disk (Hugging Face cache), sizes")
    models_cmd.add_argument("--json", action="store_true", help="one JSON object per model")
    add_common_options(models_cmd)
    models_cmd.set_defaults(func=cmd_models)

    info = sub.add_parser("info", help="versions, device, video backends, model and memory presets")
    add_common_options(info)
    info.set_defaults(func=cmd_info)
    return parser


def quiet_native_logs(level: str) -> None:
    """Logging on stderr at `level`; OpenCV's and FFmpeg's own console messages off unless debugging.

    Set before cv2 or decord is imported: both read their log level from the environment at load.
    """
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
