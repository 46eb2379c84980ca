"""The `eval` command of `hermes-video`: run one benchmark and write its results.

    hermes-video eval ovo-bench --data-root ~/data/OVO-Bench --model llava-onevision-7b \\
        --memory hermes-4k --output runs/ovo-hermes4k [--resume] [--limit 10] [--limit-questions 50] \\
        [--tasks EPM ASI]

`hermes/cli.py` registers it with `add_eval_parser(subparsers)`; `cmd_eval` is the handler. Only
argparse and the preset layer are imported here, so `--help` stays instant; the runner (torch, transformers, decoders)
loads when the command runs. Errors are `hermes.errors` types: the entry point prints them as one
line and exits 2 (usage/config), 3 (source) or 4 (model/judge).
"""

from __future__ import annotations

import argparse
import json
import sys

from hermes.cli_args import add_config_options, config_from_args


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    """Register `eval BENCHMARK --data-root DIR ...` on a subparsers object.

    Args:
        subparsers: What `ArgumentParser.add_subparsers()` returned.

    Returns:
        The `eval` parser (its handler is `cmd_eval`, set as `func`).
    """
    p = subparsers.add_parser(
        "eval", help="run a benchmark (OVO-Bench, StreamingBench, RVS, Video-MME, MVBench, ...) and write results",
        description="Evaluate a model and memory configuration on one benchmark. Results: OUTPUT/samples.jsonl "
                    "(one line per question, appended as it goes), summary.json, report.md.")
    p.add_argument("benchmark", metavar="BENCHMARK",
                   help="ovo-bench, streamingbench, rvs-ego, rvs-movie, videomme, mvbench, egoschema, mlvu, "
                        "longvideobench, lvbench; or 'merge' (join --shard runs: eval merge PART... --output DIR "
                        "--data-root DIR) or 'check' (load the annotations only: eval check BENCHMARK --data-root DIR)")
    p.add_argument("parts", nargs="*", metavar="PART",
                   help="merge: the shard runs' results folders; check: the benchmark to check")
    p.add_argument("--data-root", metavar="DIR", help="the benchmark's folder (annotations, videos); required")
    p.add_argument("--protocol", choices=("official", "strict"), default="official",
                   help="official (default): as the published numbers were made (OVO-Bench clip [0, ceil(t)], "
                        "StreamingBench 60 s context); strict: only frames before the question, one stream")
    p.add_argument("--parser-variant", metavar="NAME",
                   help="an older official answer parser: 'legacy' for egoschema (lmms-eval mid-2024 exact match)")
    p.add_argument("--shard", metavar="I/N",
                   help="run only shard I of N (every N-th video from the I-th; 'auto': torchrun's RANK/WORLD_SIZE); "
                        "join the parts with eval merge")
    add_config_options(p, flags=("--device",), memory_default="full")
    p.add_argument("--limit", type=int, metavar="N", help="evaluate only the first N videos")
    p.add_argument("--limit-questions", type=int, metavar="N",
                   help="evaluate only the first N questions (lmms-eval's --limit counts these)")
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help="task or group names to keep (space- or comma-separated), e.g. EPM ASI or backward")
    p.add_argument("--output", metavar="DIR",
                   help="results folder (default: hermes-eval/<benchmark>-<model>-<memory policy>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output, skipping answered questions")
    p.add_argument("--strict-videos", action="store_true",
                   help="fail on the first missing or unreadable video instead of counting its questions as missing")
    p.add_argument("--judge", choices=("local", "http"),
                   help="score open-ended answers (RVS) with a local transformers model or an OpenAI-compatible server")
    p.add_argument("--judge-model", metavar="ID", help="judge model: hub id / directory (local) or model name (http)")
    p.add_argument("--judge-revision", metavar="COMMIT", help="hub commit of a local judge (pins it)")
    p.add_argument("--judge-url", metavar="URL", help="http judge base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--judge-api-key-env", metavar="VAR",
                   help="environment variable holding the http judge's API key (default OPENAI_API_KEY; '' for none)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)
    return p


def _judge_config(args):
    """A JudgeConfig from the --judge* flags, or None without --judge."""
    from .judge import DEFAULT_LOCAL_JUDGE, JudgeConfig

    if args.judge is None:
        return None
    default_model = DEFAULT_LOCAL_JUDGE if args.judge == "local" else ""
    config = JudgeConfig(kind=args.judge, model=args.judge_model or default_model,
                         revision=args.judge_revision or "", base_url=args.judge_url or "")
    if args.judge_api_key_env is not None:
        config.api_key_env = args.judge_api_key_env
    return config


def _headline(summary: dict, output: str) -> str:
    """Two lines for the terminal: accuracy with coverage, and where the results are."""
    acc = summary["accuracy"]
    cov = summary["coverage"]

    def pct(v):
        return "n/a" if v is None else f"{100 * v:.1f}%"

    board = acc["official"].get("leaderboard")  # Video-MME: the leaderboard's number comes first, named as such
    parts = ([f"leaderboard {pct(board['overall'])} (over {board['extracted']} replies with a letter)",
              f"every question {pct(acc['official']['overall'])}"] if board
             else [f"official {pct(acc['official']['overall'])}"])
    if "strict" in acc:
        parts.append(f"strict {pct(acc['strict']['overall'])}")
    missing = f"; videos missing: {cov['videos_missing']}" if cov["videos_missing"] else ""
    unreadable = f"; videos unreadable: {cov['videos_unreadable']}" if cov["videos_unreadable"] else ""
    limit = summary.get("limit") or {}  # which cut made the denominator: lmms-eval's --limit counts questions
    cuts = [f"the first {what} ({flag})" if n == 1 else f"the first {n} {what}s ({flag})"
            for what, flag, n in (("video", "--limit", limit.get("videos")),
                                  ("question", "--limit-questions", limit.get("questions"))) if n is not None]
    limited = f"; limited to {' then '.join(cuts)}" if cuts else ""
    return (f"{summary['benchmark']}: {', '.join(parts)} ({cov['questions_answered']}/{cov['questions_expected']} "
            f"questions answered{missing}{unreadable}{limited})\nresults: {output}/summary.json, {output}/report.md")


def _check(args) -> int:
    """`eval check BENCHMARK --data-root DIR`: load the annotations (no video needed, no model) and
    print how many questions they yield, and what was flagged or excluded, with reasons."""
    from hermes.errors import UsageError

    from . import registry
    from .common import annotations_only

    if len(args.parts) != 1:
        raise UsageError("eval check BENCHMARK --data-root DIR: name one benchmark")
    name = registry.canonical_name(args.parts[0])
    with annotations_only():
        tasks = ",".join(args.tasks) if args.tasks else None
        records = registry.get_benchmark(name).loader(args.data_root, tasks=tasks)
    issues = records.issues.to_json()
    report = {"benchmark": name, "videos": len(records), "questions": sum(len(r.questions) for r in records),
              "videos_on_disk": sum(1 for r in records if r.available), **issues}
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
        return 0
    print(f"{name}: {report['questions']} questions on {report['videos']} videos ({report['videos_on_disk']} on "
          f"disk); {issues['flagged']} flagged, {issues['excluded']} excluded")
    for kind in ("flagged", "excluded"):
        for item in issues[f"{kind}_items"][:20]:
            print(f"  {kind}: {item['where']}: {item.get('field', '')} {item['reason']}".replace("  ", " ", 1))
    return 0


def cmd_eval(args) -> int:
    """Run `eval` from parsed arguments.

    Returns:
        0 when the run completed (missing videos are reported, not failures, unless
        --strict-videos).

    Raises:
        HermesError: Usage/config (exit 2), source (3) or model/judge (4) errors.
    """
    from hermes.errors import UsageError

    from .runner import default_output_dir, merge_shards, run_eval
    from .shards import parse_shard

    if not args.data_root:
        raise UsageError("eval needs --data-root DIR (the benchmark's annotations and videos)")
    if args.benchmark == "merge":
        if not args.parts or not args.output:
            raise UsageError("eval merge PART... --output DIR --data-root DIR: give the shard folders and --output")
        summary = merge_shards(args.parts, args.output, args.data_root)
        print(json.dumps(summary, ensure_ascii=False) if args.json else _headline(summary, args.output))
        return 0
    if args.benchmark == "check":
        return _check(args)
    if args.parts:
        raise UsageError(f"eval {args.benchmark}: unexpected arguments {' '.join(args.parts)}")

    cfg = config_from_args(args)
    tasks = ",".join(args.tasks) if args.tasks else None
    output = args.output or str(default_output_dir(args.benchmark, cfg))
    shard = parse_shard(args.shard) if args.shard else None
    if shard is not None and not args.output:
        output = f"{output}-shard{shard.index}of{shard.count}"
    summary = run_eval(args.benchmark, args.data_root, cfg, limit=args.limit, limit_questions=args.limit_questions,
                       tasks=tasks, output_dir=output,
                       resume=args.resume, strict_videos=args.strict_videos, progress=not args.quiet,
                       judge=_judge_config(args), protocol=args.protocol, parser_variant=args.parser_variant,
                       shard=shard)
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print(_headline(summary, output))
    sys.stdout.flush()
    return 0
