"""`hermes-video` (also `python -m hermes`): the command line, a thin layer over the Python API.

Heavy modules (torch, transformers, video decoders) are imported inside the commands, so `--help`
answers at once. Every `HermesError` becomes one line on stderr and the exit code of DESIGN §6;
anything else is a bug: one line too, and a traceback with `--debug`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from hermes import __version__
from hermes.errors import EXIT_INTERNAL, HermesError, UsageError

PROG = "hermes-video"


# ---- questions from the command line or a file ---------------------------------------------------


def questions_from_args(asks: list[str], ats: list[float]):
    """Pair each `--ask` with its `--at`; without any `--at` every question is asked at the end."""
    from hermes.pipelines.session import Question

    if ats and len(ats) != len(asks):
        raise UsageError(f"got {len(asks)} --ask and {len(ats)} --at: give one --at per --ask, or none "
                         f"to ask at the end of the video")
    return [Question(text, ats[i] if ats else None) for i, text in enumerate(asks)]


def read_questions_file(path: str):
    """Questions from a JSONL file: one `{"question", "at_s"?, "options"?}` object per line.

    Raises:
        UsageError: unreadable file, or a line that is not such an object (naming the line).
    """
    from hermes.pipelines.session import Question

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"questions file not found: {path}")
    questions = []
    for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg}); expected "
                             f'{{"question": "...", "at_s": 12.0, "options": [...]}}') from None
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            raise UsageError(f'{where}: expected an object with a "question" string')
        at_s = item.get("at_s")
        if at_s is not None and (isinstance(at_s, bool) or not isinstance(at_s, (int, float))):
            raise UsageError(f'{where}: "at_s" must be a number of seconds, found {at_s!r}')
        options = item.get("options") or []
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise UsageError(f'{where}: "options" must be a list of strings')
        questions.append(Question(item["question"], None if at_s is None else float(at_s), tuple(options)))
    if not questions:
        raise UsageError(f"questions file {path} holds no questions")
    return questions


def check_times(questions, duration_s: float | None) -> None:
    """Reject question times before the start or after the end of the video."""
    for q in questions:
        if q.at_s is None:
            continue
        if q.at_s < 0 or not math.isfinite(q.at_s):
            raise UsageError(f"question time {q.at_s:g}s is invalid: times count seconds from the start (>= 0)")
        if duration_s is not None and q.at_s > duration_s + 1e-6:
            raise UsageError(f"question time {q.at_s:g}s is past the end of the video ({duration_s:.2f}s)")


# ---- output ----------------------------------------------------------------------------------------


def print_answer(answer, as_json: bool, config: dict | None = None) -> None:
    if as_json:
        record = answer.to_json()
        if config is not None:
            record["config"] = config
        print(json.dumps(record, ensure_ascii=False), flush=True)
        return
    when = "end" if answer.at_s is None else f"{answer.at_s:.1f}s"
    print(f"[{when}] Q: {answer.question}")
    for i, option in enumerate(answer.options):
        print(f"        {chr(65 + i)}. {option}")
    print(f"        A: {answer.answer}")
    print(f"        ({answer.frames_seen} frames seen, ttft {answer.ttft_ms:.0f} ms, "
          f"{answer.memory['hbm_tokens']} tokens / {answer.memory['hbm_bytes'] / 2**20:.1f} MiB in memory)",
          flush=True)


# ---- commands ----------------------------------------------------------------------------------------


def open_run_source(args, cfg):
    """Open SOURCE (file, image folder, webcam index or stream URL) at the configured rate."""
    from hermes.pipelines.sources import open_source

    options = {}
    if getattr(args, "reconnect_timeout", None) is not None:
        options["reconnect_timeout_s"] = args.reconnect_timeout
    if cfg.stream.backend != "auto" and Path(args.source).is_file():
        options["backend"] = cfg.stream.backend
    return open_source(args.source, fps=cfg.stream.fps, **options)


def stream_answers(args, cfg, questions, *, progress: bool, on_answer) -> str | None:
    """Stream SOURCE into a session, calling `on_answer` for each answer; returns why a live run ended."""
    from hermes.models.loading import load_model
    from hermes.pipelines.session import StreamingSession

    live_mode = bool(getattr(args, "interactive", False) or getattr(args, "ask_every", None))
    with open_run_source(args, cfg) as source:
        info = getattr(source, "info", None)
        duration_s = info.duration_s if info is not None else None
        check_times(questions, duration_s)
        if not (source.live or live_mode):  # a recording: ask at the given media times, as fast as we can
            model = load_model(cfg.model)
            expected = math.ceil(duration_s * cfg.stream.fps) + 1 if duration_s else None
            session = StreamingSession(model, cfg.memory, source, chunk_frames=cfg.stream.chunk_frames,
                                       max_new_tokens=cfg.model.max_new_tokens, progress=progress,
                                       total_frames=expected, **memory_dir_options(args))
            try:
                for answer in session.run(questions, to_end=bool(getattr(args, "memory_dir", None))):
                    on_answer(answer)
            finally:
                session.close()  # flushes the memory directory, on Ctrl-C too
            return None
        return run_live_source(args, cfg, source, questions, on_answer)


def run_live_source(args, cfg, source, questions, on_answer) -> str:
    """A camera or stream, or a recording played back in real time, with typed or periodic questions."""
    from hermes.models.loading import load_model
    from hermes.pipelines.interactive import QuestionInbox, QuestionSchedule, check_live_memory, run_live
    from hermes.pipelines.session import StreamingSession

    explicit = bool(args.memory or args.config or any(s.startswith("memory.policy") for s in args.set or []))
    cfg.memory = check_live_memory(cfg.memory, source.live, explicit)
    timed = [q for q in questions if q.at_s is not None]
    untimed = [q.text for q in questions if q.at_s is None]
    if args.ask_every is not None and args.ask_every <= 0:
        raise UsageError(f"--ask-every must be a positive number of seconds, found {args.ask_every:g}")
    if untimed and args.ask_every is None:
        raise UsageError("on a live source, --ask needs --at S (stream time) or --ask-every S")
    model = load_model(cfg.model)
    session = StreamingSession(model, cfg.memory, (), chunk_frames=cfg.stream.live_chunk_frames,
                               max_new_tokens=cfg.model.max_new_tokens, **memory_dir_options(args))
    started = time.monotonic()
    # live sources stamp frames on their own clock; recordings play back on the wall clock from now
    clock = source.now_s if source.live else (lambda: time.monotonic() - started)
    frames = source
    if session.encoded_t_s and source.live:  # a resumed live stream: its clock continues after the saved one
        offset_s = session.encoded_t_s[-1] + 1e-3
        live_clock = clock

        def clock() -> float:
            return live_clock() + offset_s

        frames = (dataclasses.replace(f, t_s=f.t_s + offset_s) for f in source)
    elif session.encoded_t_s:  # a resumed recording: playback goes on from the last frame encoded
        resumed_s = session.encoded_t_s[-1]

        def clock() -> float:
            return time.monotonic() - started + resumed_s
    inbox = QuestionInbox(sys.stdin, clock) if args.interactive else None
    if inbox is not None:
        print(f"streaming {source.describe()}: type a question and press Enter (Ctrl-D or Ctrl-C to stop)",
              file=sys.stderr, flush=True)
    schedule = QuestionSchedule(timed, args.ask_every, untimed)
    try:
        reason = run_live(session, frames, clock=clock, pace=not source.live, schedule=schedule, inbox=inbox,
                          on_answer=on_answer, chunk_frames=cfg.stream.live_chunk_frames)
    finally:
        session.close()  # flushes the memory directory
    stats = source.stats
    print(f"stopped ({reason}): {len(session.encoded_t_s)} frames encoded, {stats.frames_dropped} dropped, "
          f"{stats.gaps} gaps, max lag {stats.max_lag_s:.2f} s", file=sys.stderr, flush=True)
    return reason


def memory_dir_options(args) -> dict:
    """`memory_dir` / `resume` for a session, from --memory-dir and --resume."""
    return {"memory_dir": getattr(args, "memory_dir", None), "resume": bool(getattr(args, "resume", False))}


def cmd_memory_inspect(args) -> int:
    from hermes.tiers.commands import inspect_command

    return inspect_command(args.directory, args.records, args.json)


def cmd_memory_verify(args) -> int:
    from hermes.tiers.commands import verify_command

    return verify_command(args.directory)


def cmd_memory_repair(args) -> int:
    from hermes.tiers.commands import repair_command

    return repair_command(args.directory)


def resolve_config(args):
    from hermes.config import build_config

    overrides = list(args.set or [])
    for flag, key in (("fps", "stream.fps"), ("chunk_frames", "stream.chunk_frames"), ("device", "model.device"),
                      ("max_new_tokens", "model.max_new_tokens")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    return build_config(model=args.model, memory=args.memory, config_file=args.config, overrides=overrides)


def cmd_run(args) -> int:
    cfg = resolve_config(args)
    questions = questions_from_args(args.ask or [], args.at or [])
    if args.questions:
        questions += read_questions_file(args.questions)
    progress = sys.stderr.isatty() and not args.quiet
    config = cfg.to_dict() if args.json else None
    stream_answers(args, cfg, questions, progress=progress,
                   on_answer=lambda answer: print_answer(answer, args.json, config))
    return 0


def cmd_demo(args) -> int:
    """A synthetic 40 s stream, a question of each family, answered by the trained micro model offline."""
    from hermes.datasets.parsing import parse_strict
    from hermes.datasets.synthetic_bench import write_demo
    from hermes.models.micro import MICRO_NAME
    from hermes.pipelines.session import OPTION_LETTERS, Question

    folder = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="hermes-demo-"))
    video, planned = write_demo(folder)
    print(f"wrote a synthetic 40 s stream of coloured shapes: {video}", file=sys.stderr)
    print(f"model: {MICRO_NAME} (trained on CPU on such streams; see benchmarks/MICRO.md)", file=sys.stderr)
    args.source = str(video)
    args.model, args.config = MICRO_NAME, None
    if args.memory is None:  # bounded by default, so the demo shows memory at work: 8 frames' worth of tokens
        args.memory = "hermes-4k"
        args.set = ["memory.budget=128"] + list(args.set or [])
    cfg = resolve_config(args)
    questions = [Question(q.question, q.t_s, tuple(q.options)) for q in planned]
    expected = iter(planned)
    right = 0

    def show(answer) -> None:
        nonlocal right
        q = next(expected)
        truth = q.answer if q.gt is None else OPTION_LETTERS[q.gt]
        # the benchmark's strict rule: the option letter (optionally with its text), or exactly the count
        hit = parse_strict(answer.answer, q.options) == q.gt if q.gt is not None \
            else answer.answer.strip().rstrip(".") == q.answer
        right += hit
        print_answer(answer, args.json)
        if not args.json:
            print(f"        expected: {truth}" + (f" ({q.answer})" if q.gt is not None else "")
                  + ("  [right]" if hit else "  [wrong]"), flush=True)

    stream_answers(args, cfg, questions, progress=False, on_answer=show)
    print(f"{right}/{len(planned)} answers right (memory: {cfg.memory.policy}, budget {cfg.memory.budget})",
          file=sys.stderr)
    return 0


def bench_model(args, cfg):
    """The model a bench measures: `--arch` (random weights, built on the device), `--model`, or the
    random CPU benchmark model (`cpu-small`: 8 layers, 512 wide, 16 tokens per frame, so that `full`
    over thousands of frames stays computable on a CPU)."""
    from hermes.models.loading import load_model, resolve_device, resolve_dtype
    from hermes.models.realsize import CPU_SMALL, build_random

    if args.arch and args.model:
        raise UsageError("give --arch (random weights) or --model (a checkpoint), not both")
    if args.model:
        return load_model(cfg.model)
    device = resolve_device(cfg.model.device)
    return build_random(args.arch or CPU_SMALL, device, resolve_dtype(cfg.model.dtype, device),
                        num_layers=args.num_layers, vision_layers=args.vision_layers,
                        seed=cfg.model.seed, system_prompt=cfg.model.system_prompt)


def write_bench_files(args, meta: dict, result, columns) -> None:
    """`--output` JSON and `--markdown` report, when asked (rewritten as results come in)."""
    from hermes.pipelines.bench_report import report_markdown, rows_as_dicts

    if args.output:
        Path(args.output).write_text(json.dumps({**meta, "notes": result.notes,
                                                 "rows": rows_as_dicts(result.rows)}, indent=2))
    if getattr(args, "markdown", None):
        Path(args.markdown).write_text(report_markdown(meta, result, columns))


def write_bench_outputs(args, meta: dict, result, columns) -> None:
    """The table on stdout, notes on stderr, and the files."""
    from hermes.pipelines.bench_report import markdown_table

    print(markdown_table(result.rows, columns))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    write_bench_files(args, meta, result, columns)


def cmd_bench_memory(args) -> int:
    from hermes.pipelines.bench import bench_memory, resolve_policies
    from hermes.pipelines.bench_report import MEMORY_COLUMNS, run_info

    lengths = parse_int_list(args.lengths, "--lengths")
    cfg = resolve_config(args)
    model = bench_model(args, cfg)
    policies = resolve_policies(args.policies, cfg.memory, args.budget)
    print(f"bench memory: model {model.name} ({model.tokens_per_frame} tokens/frame) on {model.device}, "
          f"budget {args.budget} tokens, chunks of {args.chunk_frames} frames", file=sys.stderr)
    result = bench_memory(model, policies, lengths, chunk_frames=args.chunk_frames, progress=not args.quiet)
    meta = {"suite": "memory", **run_info(model), "budget": args.budget, "chunk_frames": args.chunk_frames,
            "lengths": lengths, "policies": [p.label for p in policies]}
    write_bench_outputs(args, meta, result, MEMORY_COLUMNS)
    return 0


def cmd_bench_tiers(args) -> int:
    from hermes.tiers.bench import run

    sizes = tuple(parse_int_list(args.records, "--records"))
    rows, table = run(sizes, write_bytes=args.write_mib << 20)
    print(table)
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2, default=str))
    return 0


def cmd_bench_sweep(args) -> int:
    from hermes.pipelines.bench import resolve_policies, run_sweep
    from hermes.pipelines.bench_report import SWEEP_COLUMNS, run_info

    lengths = parse_int_list(args.lengths, "--lengths")
    chunk_sizes = parse_int_list(args.chunk_sizes, "--chunk-frames")
    if args.decode_tokens < 1 or args.repeats < 1:
        raise UsageError("--decode-tokens and --repeats must be at least 1")
    if args.dtype:
        args.set = list(args.set or []) + [f"model.dtype={args.dtype}"]
    cfg = resolve_config(args)
    model = bench_model(args, cfg)
    policies = resolve_policies(args.policies, cfg.memory, args.budget)
    print(f"bench sweep: model {model.name} ({model.tokens_per_frame} tokens/frame) on {model.device} "
          f"({model.dtype}), budget {args.budget} tokens, chunks of {'/'.join(map(str, chunk_sizes))} frames, "
          f"{args.decode_tokens} tokens per answer", file=sys.stderr)
    meta = {"suite": "sweep", **run_info(model), "budget": args.budget, "decode_tokens": args.decode_tokens,
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


# ---- parser --------------------------------------------------------------------------------------------


def add_config_options(p: argparse.ArgumentParser) -> None:
    from hermes.config import preset_names  # YAML only: --help stays instant

    p.add_argument("--model", help="auto (the default: smolvlm2-500m without CUDA, llava-onevision-7b with it), "
                                   f"a preset ({', '.join(preset_names('models'))}), a hub id like org/name, "
                                   "or a local checkpoint directory")
    p.add_argument("--memory", help="memory preset from configs/memory (default: full)")
    p.add_argument("--config", metavar="FILE", help="YAML file with model:, memory:, stream: sections")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one config key, e.g. --set model.max_new_tokens=32 (repeatable)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (sets model.device)")
    p.add_argument("--json", action="store_true", help="one JSON object per answer on stdout")


def add_bench_model_options(p: argparse.ArgumentParser) -> None:
    from hermes.models.realsize import arch_names

    p.add_argument("--arch", choices=arch_names(),
                   help="random weights at a published size, built on the device without downloads "
                        "(default without --model: cpu-small)")
    p.add_argument("--num-layers", type=int, metavar="N", help="--arch: language-model layers (widths unchanged)")
    p.add_argument("--vision-layers", type=int, metavar="N", help="--arch: vision-tower layers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Ask questions about video with a vision-language "
                                                            "model and a bounded KV memory (HERMES).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="stream a video, camera or folder and answer questions at chosen moments")
    run.add_argument("source", help="a video file, an image folder, a webcam index (0, 1, ...) or an rtsp://, "
                                    "rtmp:// or http(s):// stream URL")
    add_config_options(run)
    run.add_argument("--ask", action="append", metavar="TEXT", help="a question (repeatable)")
    run.add_argument("--at", action="append", type=float, metavar="S",
                     help="seconds into the video to ask the matching --ask (repeatable; default: at the end)")
    run.add_argument("--questions", metavar="FILE", help='JSONL: {"question", "at_s", "options"} per line')
    run.add_argument("--fps", type=float, help="frames sampled per second (sets stream.fps)")
    run.add_argument("--chunk-frames", type=int, help="frames encoded per forward (sets stream.chunk_frames)")
    run.add_argument("--max-new-tokens", type=int, help="answer length cap (sets model.max_new_tokens)")
    run.add_argument("--interactive", action="store_true",
                     help="type questions while the stream runs; each is answered from the frames before it "
                          "was typed (files play back in real time)")
    run.add_argument("--ask-every", type=float, metavar="S",
                     help="ask every --ask question every S seconds of stream time")
    run.add_argument("--reconnect-timeout", type=float, metavar="S",
                     help="live streams: give up after S seconds without a connection (default 30)")
    run.add_argument("--memory-dir", metavar="DIR",
                     help="keep evicted memory (levels 2 and 3) and checkpoints of the stream in DIR")
    run.add_argument("--resume", action="store_true",
                     help="continue the stream saved in --memory-dir (frames already seen are skipped)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="offline demo: a synthetic stream answered by the trained micro model")
    demo.add_argument("--output", metavar="DIR", help="where to write the demo video (default: a temp dir)")
    demo.add_argument("--memory", metavar="PRESET",
                      help="memory preset (full, sliding, uniform, hermes-4k, ...; default: hermes-4k at a "
                           "128-token budget)")
    demo.add_argument("--set", action="append", metavar="KEY=VALUE",
                      help="override one config key (e.g. memory.budget=64 to squeeze the memory)")
    demo.add_argument("--device", help="auto, cpu, cuda or cuda:N")
    demo.add_argument("--json", action="store_true", help="one JSON object per answer on stdout")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="performance measurements")
    bench_sub = bench.add_subparsers(dest="bench", metavar="SUITE", required=True)
    memory = bench_sub.add_parser("memory", help="peak KV memory, TTFT and maintenance cost over stream lengths")
    add_config_options(memory)
    add_bench_model_options(memory)
    memory.add_argument("--policies", default="full,hermes",
                        help="comma-separated policies, `name+flag` for a memory flag on, `recall-only` for "
                             "sliding+recall (default: full,hermes)")
    memory.add_argument("--lengths", default="64,128,256,512,1024,2048", help="stream lengths in frames")
    memory.add_argument("--budget", type=int, default=512, help="visual tokens per layer for bounded policies")
    memory.add_argument("--chunk-frames", type=int, default=16, help="frames per chunk")
    memory.add_argument("--output", metavar="FILE", help="also write the rows as JSON")
    memory.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    memory.set_defaults(func=cmd_bench_memory)

    tiers = bench_sub.add_parser("tiers", help="recall time at 10^3.. records, FAISS search, disk write throughput")
    tiers.add_argument("--records", default="1000,10000",
                       help="record counts for the recall and search rows (100000 takes minutes) "
                            "(default: %(default)s)")
    tiers.add_argument("--write-mib", type=int, default=64, help="MiB written per throughput row (default: 64)")
    tiers.add_argument("--output", metavar="FILE", help="also write the rows as JSON")
    tiers.set_defaults(func=cmd_bench_tiers)

    sweep = bench_sub.add_parser(
        "sweep", help="TTFT, time per output token, memory, encode/maintenance time and ingest fps over stream "
                      "lengths, chunk sizes and policies, with ratios against full")
    add_config_options(sweep)
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
    sweep.add_argument("--budget", type=int, default=4096,
                       help="visual tokens per layer for bounded policies (default: %(default)s)")
    sweep.add_argument("--decode-tokens", type=int, default=16,
                       help="answer length, forced; TPOT = (latency - TTFT) / (N - 1) (default: %(default)s)")
    sweep.add_argument("--repeats", type=int, default=3, help="questions per length; medians (default: %(default)s)")
    sweep.add_argument("--frame-px", type=int, default=448, help="side of the random frames (default: %(default)s)")
    sweep.add_argument("--output", metavar="FILE", help="also write the run and its rows as JSON")
    sweep.add_argument("--markdown", metavar="FILE", help="also write a markdown report (run details, table, notes)")
    sweep.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    sweep.set_defaults(func=cmd_bench_sweep)

    from hermes.datasets.cli import add_eval_parser  # argparse only: --help stays instant

    add_eval_parser(sub)

    memory_cmd = sub.add_parser("memory", help="inspect, verify or repair a memory directory")
    memory_sub = memory_cmd.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    inspect = memory_sub.add_parser("inspect", help="records, time spans, sizes, index state, checkpoints")
    inspect.add_argument("directory", metavar="DIR")
    inspect.add_argument("--records", type=int, default=20, help="records to list (default 20)")
    inspect.add_argument("--json", action="store_true", help="the report as JSON")
    inspect.set_defaults(func=cmd_memory_inspect)
    verify = memory_sub.add_parser("verify", help="check every checksum; exit 0 only when all hold")
    verify.add_argument("directory", metavar="DIR")
    verify.set_defaults(func=cmd_memory_verify)
    repair = memory_sub.add_parser("repair", help="rebuild the manifest and index from the segments; move what "
                                   "cannot be kept to DIR/quarantine (nothing is deleted)")
    repair.add_argument("directory", metavar="DIR")
    repair.set_defaults(func=cmd_memory_repair)

    info = sub.add_parser("info", help="versions, device, video backends, model and memory presets")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except HermesError as exc:
        if args.debug:
            raise
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL
