"""The `bench` subcommand: one parser and one handler per suite, every argument checked before anything
loads. The budget of bounded policies is `memory.budget`; the suite's own default is the lowest layer."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from hermes.cli_args import (add_common_options, add_config_options, check_output_path, config_from_args,
                             parse_int_list, positive_float, positive_int)
from hermes.errors import UsageError

BENCH_COSTS = ("What each suite costs on a 2-core CPU with the default cpu-small model: `bench memory` about "
               "an hour (full and hermes up to 2048 frames, three streams each; --lengths 64,256 took 1.4 CPU-minutes a "
               "stream), `bench sweep` "
               "longer (four policies at two chunk sizes up to 1024 frames; --lengths 16,64 for a short run), `bench "
               "tiers` about a minute (--records 100000 takes minutes), `bench serve` about 3 minutes, `bench overhead` "
               "45 s with its defaults at load 2 (4x64 and 8x512, 384 frames, three repeats), `bench day --hours 24` "
               "15 minutes at load 4-8 (one torch thread). Progress lines "
               "go to stderr (--quiet hides them).")

# the budget each suite measures at unless the configuration says otherwise
MEMORY_SUITE_BUDGET = 512
SWEEP_SUITE_BUDGET = 4096
DEVICE_SECTIONS = ("preprocess", "decode", "probe")
BUDGET_HELP = {"--budget": f"visual tokens per layer for bounded policies (default: the preset's with --memory, "
                           f"else {MEMORY_SUITE_BUDGET} for memory, {SWEEP_SUITE_BUDGET} for sweep)"}


def bench_model(args, cfg):
    """The model a bench measures: `--arch` (random weights on the device), `--model`, or `cpu-small`."""
    from hermes.models.loading import build_random_model, load_model
    from hermes.models.realsize import CPU_SMALL

    if args.model:
        return load_model(cfg.model)
    return build_random_model(args.arch or CPU_SMALL, cfg.model, num_layers=args.num_layers,
                              vision_layers=args.vision_layers)


def bench_config(args, suite_budget: int):
    """The bench's configuration and output paths, checked before anything loads.

    Args:
        suite_budget: `memory.budget` where no preset, file, override or --budget sets it.

    Raises:
        UsageError, ConfigError: one line.
    """
    if args.arch and args.model:
        raise UsageError("give --arch (random weights) or --model (a checkpoint), not both")
    check_output_path(args.output, "--output")
    check_output_path(getattr(args, "markdown", None), "--markdown")
    return config_from_args(args, base={"memory": {"budget": suite_budget}})


def write_bench_files(args, meta: dict, result, columns) -> None:
    """`--output` JSON and `--markdown` report, when asked (rewritten as results come in)."""
    from hermes.pipelines.bench.common import write_json_output
    from hermes.pipelines.bench.memory import report_markdown
    from hermes.tiers.files import write_bytes_atomic

    write_json_output(args.output, bench_record(meta, result))
    if getattr(args, "markdown", None):
        write_bytes_atomic(Path(args.markdown), report_markdown(meta, result, columns).encode())


def bench_record(meta: dict, result) -> dict:
    from hermes.pipelines.bench.memory import rows_as_dicts

    return {**meta, "notes": result.notes, "rows": rows_as_dicts(result.rows)}


def write_bench_outputs(args, meta: dict, result, columns) -> None:
    """The table on stdout (with --json: the run as one JSON object), notes on stderr, and the files."""
    import json

    from hermes.pipelines.bench.memory import markdown_table

    print(json.dumps(bench_record(meta, result)) if args.json else markdown_table(result.rows, columns))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    write_bench_files(args, meta, result, columns)


def cmd_bench_memory(args) -> int:
    lengths = parse_int_list(args.lengths, "--lengths")
    cfg = bench_config(args, MEMORY_SUITE_BUDGET)
    from hermes.pipelines.bench.common import run_info
    from hermes.pipelines.bench.memory import BENCH_QUESTION, MEMORY_COLUMNS, bench_memory, resolve_policies

    chunk_frames, question = cfg.stream.chunk_frames, args.question or BENCH_QUESTION
    policies = resolve_policies(args.policies, cfg.memory, cfg.memory.budget)  # a bad name fails before the model loads
    model = bench_model(args, cfg)
    print(f"bench memory: model {model.name} ({model.tokens_per_frame} tokens/frame) on {model.device}, "
          f"budget {cfg.memory.budget} tokens, chunks of {chunk_frames} frames", file=sys.stderr)
    result = bench_memory(model, policies, lengths, chunk_frames=chunk_frames, stream_repeats=args.stream_repeats,
                          progress=not args.quiet, question=question)
    meta = {"suite": "memory", **run_info(model), "budget": cfg.memory.budget, "chunk_frames": chunk_frames,
            "lengths": lengths, "policies": [p.label for p in policies], "stream_repeats": args.stream_repeats,
            "question": question}
    write_bench_outputs(args, meta, result, MEMORY_COLUMNS)
    return 0


def cmd_bench_sweep(args) -> int:
    lengths = parse_int_list(args.lengths, "--lengths")
    chunk_sizes = parse_int_list(args.chunk_sizes, "--chunk-frames")
    cfg = bench_config(args, SWEEP_SUITE_BUDGET)
    from hermes.pipelines.bench.common import run_info
    from hermes.pipelines.bench.memory import SWEEP_COLUMNS, resolve_policies, run_sweep

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


def cmd_bench_tiers(args) -> int:
    sizes = tuple(parse_int_list(args.records, "--records"))
    check_output_path(args.output, "--output")
    from hermes.pipelines.bench.common import print_result
    from hermes.pipelines.bench.tiers import run

    if args.store:
        from hermes.pipelines.run import check_memory_dir
        from hermes.tiers.s3 import S3Location, parse_location

        if not isinstance(parse_location(args.store), S3Location):
            raise UsageError(f"--store expects s3://bucket/prefix, found {args.store}")
        check_memory_dir(args.store)
    rows, table = run(sizes, write_bytes=args.write_mib << 20, store=args.store)
    print_result(args, rows, table)
    return 0


def cmd_bench_serve(args) -> int:
    """`bench serve`: N synthetic cameras into one served model vs N `run` processes."""
    counts = parse_int_list(args.streams, "--streams")
    check_output_path(args.output, "--output")
    cfg = config_from_args(args, memory="hermes-4k", model="tiny-llava-onevision")  # checked before any process starts
    from hermes.pipelines.bench.common import print_result, rows_table
    from hermes.pipelines.bench.serve import SERVE_COLUMNS, bench_serve

    memory = args.memory or "hermes-4k"
    print(f"bench serve: {cfg.model.name}, memory {memory}, streams {counts} at {args.stream_fps:g} fps for "
          f"{args.seconds:g} s each side, a question per stream every {args.ask_every:g} s, {args.threads} torch "
          f"thread(s) per process", file=sys.stderr)
    rows = bench_serve(cfg.model.name, memory, counts, fps=args.stream_fps, seconds=args.seconds,
                       ask_every_s=args.ask_every, max_new_tokens=cfg.model.max_new_tokens, threads=args.threads,
                       progress=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)))
    record = {"suite": "serve", "model": cfg.model.name, "memory": memory, "stream_fps": args.stream_fps,
              "seconds": args.seconds, "ask_every_s": args.ask_every, "threads": args.threads, "rows": rows}
    print_result(args, record, rows_table(rows, SERVE_COLUMNS))
    return 0


def cmd_bench_reference(args) -> int:
    from hermes.pipelines.bench.reference import check_reference, compare, parse_geometries, ratio_table

    geometries = parse_geometries(args.geometries, args.tokens_per_frame)
    check_output_path(args.output, "--output")
    check_reference(args.ref_dir, args.ref_python)  # before any model is built
    from hermes.pipelines.bench.common import print_result

    rows = compare(args.ref_dir, args.ref_python, geometries, frames=args.frames, chunk_frames=args.chunk_frames,
                   budget=args.budget, repeats=args.repeats, rounds=args.rounds)
    print_result(args, rows, ratio_table(rows))
    return 0


def cmd_bench_overhead(args) -> int:
    """`bench overhead`: a policy's whole ingest cost over a baseline's at the same budget, paired chunk by chunk."""
    from hermes.pipelines.bench.reference import geometry_model, parse_geometries

    geometries = parse_geometries(args.geometries, args.tokens_per_frame)
    check_output_path(args.output, "--output")
    if args.floor and args.baseline != "sliding":
        raise UsageError(f"--floor pairs the floor with --baseline sliding, found --baseline {args.baseline}")
    not_memory = [item for item in args.set if not item.startswith("memory.")]
    if not_memory:
        raise UsageError(f"--set {not_memory[0]}: bench overhead takes memory.KEY=VALUE (both policies)")
    import torch

    from hermes.config import build_config
    from hermes.pipelines.bench.common import print_result
    from hermes.pipelines.bench.memory import overhead_table, paired_overhead, probe_floor_spec, resolve_policies

    base = build_config(overrides=args.set).memory  # ConfigError (one line) before any model loads
    policy, baseline = resolve_policies([args.policy, args.baseline], base, args.budget)
    for spec in (policy, baseline):
        if spec.memory is None:
            raise UsageError(spec.note)
    torch.set_num_threads(args.threads)
    rows = []
    for geo in geometries:
        model, _ = geometry_model(geo)
        if not args.quiet:
            print(f"bench overhead: {geo.label}, {policy.label} vs {baseline.label}, budget {args.budget}, "
                  f"{args.frames} frames x {args.repeats}", file=sys.stderr, flush=True)
        for measured in (policy, probe_floor_spec(baseline)) if args.floor else (policy,):
            rows.append(paired_overhead(model, measured, baseline, args.frames, chunk_frames=args.chunk_frames,
                                        repeats=args.repeats, geometry=geo.label))
    record = {"suite": "overhead", "threads": args.threads, "rows": [dataclasses.asdict(r) for r in rows]}
    print_result(args, record, overhead_table(rows))
    return 0


def cmd_bench_device(args) -> int:
    """`bench device`: preprocessing on the host vs the device, eager vs compiled decode, the probe's memory."""
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not sections or set(sections) - set(DEVICE_SECTIONS):
        raise UsageError(f"--sections expects a comma-separated subset of {','.join(DEVICE_SECTIONS)}, "
                         f"found {args.sections!r}")
    if args.decode_tokens < 2:
        raise UsageError(f"--decode-tokens expects at least 2 (TPOT is over the steps after the first), "
                         f"found {args.decode_tokens}")
    cfg = bench_config(args, MEMORY_SUITE_BUDGET)
    import torch

    from hermes.pipelines.bench import device
    from hermes.pipelines.bench.common import print_result, write_json_output

    model = bench_model(args, cfg)
    result = {"suite": "device", "arch": model.name, "device": str(model.device), "dtype": str(model.dtype),
              "num_layers": model.num_layers, "torch": torch.__version__}
    for section in sections:  # the file holds every finished section, should a later one be cut short
        if section == "preprocess":
            result[section] = device.bench_preprocess(model, args.chunk_frames, args.repeats)
        elif section == "decode":
            result[section] = device.bench_decode(model, args.tokens, args.decode_tokens, args.repeats,
                                                  [m for m in args.compile_modes.split(",") if m])
        else:
            result[section] = device.bench_probe(model, args.tokens)
        write_json_output(args.output, result)
    print_result(args, result, device.device_tables(result))
    return 0


def cmd_bench_gc(args) -> int:
    """`bench gc`: garbage-collector pauses in a long stream, the start-up heap collected vs frozen."""
    if args.frames < 40:
        raise UsageError(f"--frames expects at least 40 (a question every 20 frames), found {args.frames}")
    check_output_path(args.output, "--output")
    from hermes.pipelines.bench.common import print_result, rows_table
    from hermes.pipelines.bench.host import GC_COLUMNS, bench_gc

    rows = bench_gc(args.frames)
    print_result(args, {"suite": "gc", "frames": args.frames, "rows": rows}, rows_table(rows, GC_COLUMNS))
    return 0


def cmd_bench_ingest(args) -> int:
    """`bench ingest`: a 1080p file's ingest rate, end to end."""
    check_output_path(args.output, "--output")
    if args.video and not Path(args.video).exists():
        check_output_path(args.video, "--video")  # written there
    import torch

    from hermes.pipelines.bench.common import print_result, rows_table
    from hermes.pipelines.bench.host import bench_ingest, write_1080p

    video = Path(args.video or f"/tmp/hermes-1080p-{args.seconds:g}s.mp4")
    if not video.exists():
        write_1080p(video, seconds=args.seconds)
    torch.set_num_threads(args.threads)
    row = bench_ingest(video, args.fps)
    print_result(args, {"suite": "ingest", "threads": args.threads, **row}, rows_table([row]))
    return 0


def cmd_bench_chaos(args) -> int:
    """`bench chaos`: `run_campaign`'s exit code."""
    from hermes.pipelines.bench.chaos import run_campaign

    return run_campaign(kills=args.kills, kinds=args.kinds, seed=args.seed, video_s=args.video_s,
                        work_dir=args.work_dir, as_json=args.json, quiet=args.quiet)


# ---- the parser: one `suite(...)` per subcommand, then its own flags ---------------------------------------


def add_bench_model_options(p: argparse.ArgumentParser, config_flags: tuple[str, ...],
                            memory_default: str = "full; --policies picks the policies") -> None:
    """The configuration (with `config_flags`), and --arch, --num-layers, --vision-layers (the model measured)."""
    from hermes.models.realsize import arch_names

    add_config_options(p, flags=config_flags, memory_default=memory_default, flag_help=BUDGET_HELP)
    p.add_argument("--arch", choices=arch_names(),
                   help="random weights at a published size, built on the device without downloads "
                        "(default without --model: cpu-small)")
    p.add_argument("--num-layers", type=positive_int, metavar="N",
                   help="--arch: language-model layers (widths unchanged)")
    p.add_argument("--vision-layers", type=positive_int, metavar="N", help="--arch: vision-tower layers")


def add_geometry_options(p: argparse.ArgumentParser, *, tokens_per_frame: int, frames: int, budget: int) -> None:
    """The random LLaVA-OneVision decoders' flags of `bench reference` and `bench overhead`."""
    p.add_argument("--geometries", default="4x64,8x512",
                   help="random LLaVA-OneVision decoders, LAYERSxWIDTH (default: %(default)s)")
    p.add_argument("--tokens-per-frame", type=int, choices=(16, 196), default=tokens_per_frame,
                   help="visual tokens per frame (default: %(default)s)")
    p.add_argument("--frames", type=positive_int, default=frames, help="stream length (default: %(default)s)")
    p.add_argument("--chunk-frames", type=positive_int, default=16, help="frames per chunk (default: %(default)s)")
    p.add_argument("--budget", type=positive_int, default=budget,
                   help="visual tokens kept per layer, both sides (default: %(default)s)")


def add_bench_parser(subparsers, more_suites=()) -> argparse.ArgumentParser:
    """Register `bench SUITE ...` on a subparsers object; returns the `bench` parser.

    Args:
        more_suites: callables given the `suite(name, help, func, ...)` factory, each registering suites of a
            layer above this one (`hermes.datasets.day`'s `bench day`: the synthetic world lives there).
    """
    bench = subparsers.add_parser("bench", help="performance measurements", description=BENCH_COSTS)
    add_common_options(bench)
    bench_sub = bench.add_subparsers(dest="bench", metavar="SUITE", required=True)

    def suite(name: str, help: str, func, *, output: str | None = "also write the rows as JSON",
              json: str = "the result as JSON on stdout instead of the table", quiet: bool = True):
        """A suite's parser with the flags every suite shares: --output FILE, --json, --quiet, --debug."""
        p = bench_sub.add_parser(name, help=help, description=BENCH_COSTS)
        if output:
            p.add_argument("--output", metavar="FILE", help=output)
        p.add_argument("--json", action="store_true", help=json)
        if quiet:
            p.add_argument("--quiet", action="store_true", help="no progress lines")
        add_common_options(p)
        p.set_defaults(func=func)
        return p

    memory = suite("memory", "peak KV memory, TTFT and maintenance cost over stream lengths (about an hour on a "
                             "2-core CPU with the defaults: three streams per policy)", cmd_bench_memory)
    add_bench_model_options(memory, ("--device", "--budget", "--chunk-frames"))
    memory.add_argument("--policies", default="full,hermes",
                        help="comma-separated policies, `name+flag` for a memory flag on, `recall-only` for "
                             "sliding+recall, or memory presets (hermes-4k,hermes-plus: ratios in one run) "
                             "(default: full,hermes)")
    memory.add_argument("--lengths", default="64,128,256,512,1024,2048", help="stream lengths in frames")
    memory.add_argument("--question",
                        help="asked at every length; one about the past (\"What colour was the first object?\") "
                             "makes recall fire and its time count in TTFT (default: \"What is happening in the "
                             "video?\", which names the present)")
    memory.add_argument("--stream-repeats", type=positive_int, default=3,
                        help="streams per policy, the policies' order reversed every other one; medians, and the "
                             "ratios' min / median / max (default: %(default)s)")

    tiers = suite("tiers", "recall time at 10^3.. records, FAISS search, disk write throughput (about a minute)",
                  cmd_bench_tiers, quiet=False)
    tiers.add_argument("--records", default="1000,10000",
                       help="record counts for the recall and search rows (100000 takes minutes) "
                            "(default: %(default)s)")
    tiers.add_argument("--write-mib", type=positive_int, default=64,
                       help="MiB written per throughput row (default: 64)")
    tiers.add_argument("--store", metavar="s3://BUCKET/PREFIX",
                       help="measure an S3-compatible object store instead of the local disk (commit throughput vs "
                            "a plain PUT, recall with a cold and a warm local cache); endpoint and credentials from "
                            "the AWS environment variables")

    reference = suite("reference", "the authors' HERMES pipeline (from a checkout you give, in its own environment) "
                                   "against ours on the same random geometry, frames and budget: TTFT, maintenance "
                                   "and peak-memory ratios", cmd_bench_reference, quiet=False)
    reference.add_argument("--ref-dir", required=True, metavar="DIR",
                           help="checkout of the reference code (has inference/llavaov_hermes.py)")
    reference.add_argument("--ref-python", default="python3", metavar="PY",
                           help="interpreter of the reference's environment (transformers 4.57.1; default: %(default)s)")
    add_geometry_options(reference, tokens_per_frame=196, frames=48, budget=4096)
    reference.add_argument("--repeats", type=positive_int, default=3, help="questions; medians (default: %(default)s)")
    reference.add_argument("--rounds", type=positive_int, default=3,
                           help="runs of both sides, which goes first alternating; medians, and the ratios' "
                                "min / median / max (default: %(default)s)")

    overhead = suite("overhead", "what a policy's ingest costs over a baseline's at the same budget (default hermes "
                                 "over sliding), both streamed side by side chunk by chunk, told whole: the probe in "
                                 "hermes's prefill counts; min / median / max over repeats", cmd_bench_overhead)
    add_geometry_options(overhead, tokens_per_frame=16, frames=384, budget=1024)
    overhead.add_argument("--policy", default="hermes", help="the policy measured (default: %(default)s)")
    overhead.add_argument("--baseline", default="sliding", help="the policy it is paired with (default: %(default)s)")
    overhead.add_argument("--repeats", type=positive_int, default=3, help="paired streams (default: %(default)s)")
    overhead.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")
    overhead.add_argument("--set", action="append", default=[], metavar="memory.KEY=VALUE",
                          help="a memory setting of both policies, e.g. memory.probe_text=bare (repeatable)")
    overhead.add_argument("--floor", action="store_true",
                          help="also measure the floor of any exact probe: the baseline with hermes's pseudo-query "
                               "riding in each evicting chunk through the model's own attention, nothing recorded")

    sweep = suite("sweep", "TTFT, time per output token, memory, encode/maintenance time and ingest fps over stream "
                           "lengths, chunk sizes and policies, with ratios against full (the longest suite)",
                  cmd_bench_sweep, output="also write the run and its rows as JSON")
    add_bench_model_options(sweep, ("--device", "--budget", "--dtype"))
    sweep.add_argument("--policies", default="full,sliding,hermes,hermes+recall",
                       help="comma-separated policies; `name+flag` turns a boolean memory setting on "
                            "(skipped with a note if this build has no such key); `recall-only` is sliding+recall "
                            "(default: %(default)s)")
    sweep.add_argument("--lengths", default="16,32,64,128,256,512,1024",
                       help="stream lengths in frames, measured on one stream per policy (default: %(default)s)")
    sweep.add_argument("--chunk-frames", dest="chunk_sizes", default="8,16",
                       help="chunk sizes in frames, the axis measured (not configuration; default: %(default)s)")
    sweep.add_argument("--decode-tokens", type=positive_int, default=16,
                       help="answer length, forced; TPOT = (latency - TTFT) / (N - 1) (default: %(default)s)")
    sweep.add_argument("--repeats", type=positive_int, default=3,
                       help="questions per length; medians (default: %(default)s)")
    sweep.add_argument("--frame-px", type=positive_int, default=448,
                       help="side of the random frames (default: %(default)s)")
    sweep.add_argument("--markdown", metavar="FILE", help="also write a markdown report (run details, table, notes)")

    serve = suite("serve", "N synthetic live streams into one served model vs N `run` processes: fps per stream, "
                           "question latency, memory (about 3 minutes)", cmd_bench_serve,
                  output="also write the run and its rows as JSON")
    add_config_options(serve, flags=("--max-new-tokens",), config=False, memory_default="hermes-4k")
    serve.add_argument("--streams", default="1,2,4,8", help="stream counts N (default: %(default)s)")
    serve.add_argument("--stream-fps", type=positive_float, default=4.0,
                       help="each camera's frame rate (default: %(default)s)")
    serve.add_argument("--seconds", type=positive_float, default=10.0,
                       help="seconds each side streams (default: %(default)s)")
    serve.add_argument("--ask-every", type=positive_float, default=2.0,
                       help="seconds between questions to each stream (default: %(default)s)")
    serve.add_argument("--threads", type=int, default=1, choices=range(1, 65), metavar="T",
                       help="torch threads of every process, serve's and each run's (default: %(default)s)")

    device = suite("device", "at a real geometry with random weights: preprocessing on the host vs the device, "
                             "decode eager vs torch.compile'd, the attention probe's transient memory against the KV "
                             "cache", cmd_bench_device, output="also write the result as JSON (after each section)",
                   quiet=False)
    add_bench_model_options(device, ("--device", "--dtype"), memory_default="not used here")
    device.add_argument("--sections", default="preprocess,decode,probe",
                        help="what to measure, in this order (default: %(default)s)")
    device.add_argument("--chunk-frames", type=positive_int, default=16, help="preprocess: 1080p frames per chunk "
                                                                    "(default: %(default)s)")
    device.add_argument("--tokens", type=positive_int, default=4096,
                        help="decode, probe: cached visual tokens (default: %(default)s)")
    device.add_argument("--decode-tokens", type=int, default=32, help="decode: answer length, forced "
                                                                      "(default: %(default)s)")
    device.add_argument("--repeats", type=positive_int, default=3, help="alternations; medians (default: %(default)s)")
    device.add_argument("--compile-modes", default="default,reduce-overhead",
                        help="decode: torch.compile modes beside eager (default: %(default)s)")

    gc = suite("gc", "garbage-collector pauses in a long stream on the micro model, the start-up heap collected vs "
                     "frozen, each in a process of its own", cmd_bench_gc, quiet=False)
    gc.add_argument("--frames", type=int, default=3000, help="stream length, one frame per second "
                                                             "(default: %(default)s)")

    ingest = suite("ingest", "ingest rate of a 1080p video file end to end (decode, preprocess, encode, maintenance) "
                             "on the cpu-small geometry", cmd_bench_ingest, quiet=False)
    ingest.add_argument("--video", help="the 1080p file (default: /tmp/hermes-1080p-<seconds>s.mp4, written if "
                                        "missing)")
    ingest.add_argument("--seconds", type=positive_float, default=12.0,
                        help="length of the video written (default: 12)")
    ingest.add_argument("--fps", type=positive_float, default=2.0,
                        help="frames sampled per second (default: %(default)s)")
    ingest.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")

    chaos = suite("chaos", "SIGKILL run (file, live), serve and an S3 writer at random moments, verify and resume each "
                           "time; records lost, duplicated, corrupt served (--kills 20 of every kind: 11-13 minutes on "
                           "2 busy cores)", cmd_bench_chaos, output=None,
                  json="the tallies as JSON on stdout instead of the table")
    chaos.add_argument("--kills", type=positive_int, default=20, help="SIGKILLs per kind (default: %(default)s)")
    chaos.add_argument("--kinds", default="file,live,serve,s3", help="which writers (default: %(default)s)")
    chaos.add_argument("--seed", type=int, default=0, help="seeds the kill moments (default: %(default)s)")
    chaos.add_argument("--video-s", type=float, default=60.0,
                       help="length of the synthetic video of file and s3, seconds (default: %(default)s)")
    chaos.add_argument("--work-dir", metavar="DIR",
                       help="keep the memory directories and logs here (default: a temporary folder, removed)")

    for add in more_suites:
        add(suite)
    return bench
