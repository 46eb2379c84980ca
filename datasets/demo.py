"""`hermes-video demo`: a synthetic 40 s stream, a question of each family, answered offline by the trained
micro model and scored against the stream's ground truth, through the same `execute_run` as `run`. It
lives here because the stream and its answers come from the synthetic benchmark world."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from hermes.cli_args import add_common_options, add_config_options, check_output_path, config_from_args

DEMO_BUDGET = 128  # visual tokens per layer in the demo: 8 frames of the micro model's 16 tokens
DEMO_MEMORY = "hermes-4k"
DEMO_MODEL = "micro-llava-onevision"  # hermes.models.micro.MICRO_NAME, named here so no torch loads before the checks


def cmd_demo(args) -> int:
    """`demo [--memory PRESET] [--set ...] [--output DIR]`; returns the exit code."""
    check_output_path(args.output, "--output", directory=True)
    # under any bounded preset the budget is 8 frames' worth, so memory is at work; --set memory.budget wins
    cfg = config_from_args(args, model=DEMO_MODEL, memory=DEMO_MEMORY, extra=[f"memory.budget={DEMO_BUDGET}"])
    memory_label = args.memory or DEMO_MEMORY
    if args.output:
        return run_demo(cfg, Path(args.output), memory_label=memory_label, as_json=args.json, keep=True)
    with tempfile.TemporaryDirectory(prefix="hermes-demo-") as folder:  # removed afterwards
        return run_demo(cfg, Path(folder), memory_label=memory_label, as_json=args.json, keep=False)


def run_demo(cfg, folder: Path, *, memory_label: str, as_json: bool, keep: bool) -> int:
    """Write the demo stream into `folder`, answer its questions under `cfg`, print each answer with the
    expected one, then the count of right answers on stderr; returns 0.

    Args:
        memory_label: the memory preset's name, for the messages.
        as_json: one JSON object per answer on stdout (with `expected` and `right`).
        keep: the folder stays after the demo (else the caller removes it; said in the message).
    """
    from hermes.datasets.parsing import parse_strict
    from hermes.datasets.synthetic_bench import write_demo
    from hermes.pipelines.asked import Question
    from hermes.pipelines.cli import print_answer
    from hermes.pipelines.run import RunPlan, execute_run
    from hermes.pipelines.session import OPTION_LETTERS

    folder.mkdir(parents=True, exist_ok=True)
    video, planned = write_demo(folder)
    print(f"wrote a synthetic 40 s stream of coloured shapes: {video}" + ("" if keep else " (removed at exit)"),
          file=sys.stderr)
    print(f"model: {cfg.model.name} (trained on CPU on such streams; see benchmarks/MICRO.md)", file=sys.stderr)
    budget = "no eviction" if cfg.memory.policy == "full" else f"budget {cfg.memory.budget} tokens per layer"
    print(f"memory: {memory_label} ({cfg.memory.policy}, {budget})", file=sys.stderr)
    plan = RunPlan(cfg, str(video), [Question(q.question, q.t_s, tuple(q.options), i)
                                     for i, q in enumerate(planned)], memory_chosen=True)
    right = 0

    def show(answer, question) -> None:
        nonlocal right
        q = planned[question.id]
        expected = q.answer if q.gt is None else OPTION_LETTERS[q.gt]
        # the benchmark's strict rule: the option letter (optionally with its text), or exactly the count
        hit = parse_strict(answer.answer, q.options) == q.gt if q.gt is not None \
            else answer.answer.strip().rstrip(".") == q.answer
        right += hit
        print_answer(answer, as_json, extra={"expected": expected, "right": bool(hit)})
        if not as_json:
            print(f"        expected: {expected}" + (f" ({q.answer})" if q.gt is not None else "")
                  + ("  [right]" if hit else "  [wrong]"), flush=True)

    execute_run(plan, progress=False, on_answer=show)
    print(f"{right}/{len(planned)} answers right (memory: {cfg.memory.policy}, {budget})", file=sys.stderr)
    return 0


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    """Register `demo` on a subparsers object; returns its parser (handler `cmd_demo`)."""
    demo = subparsers.add_parser("demo", help="offline demo: a synthetic stream answered by the trained micro model")
    demo.add_argument("--output", metavar="DIR", help="keep the demo video in DIR (default: a temporary folder, "
                                                      "removed at exit)")
    add_config_options(demo, flags=("--device",), model=False, config=False,
                       memory_help=f"memory preset (full, sliding, uniform, hermes-4k, ...; default: {DEMO_MEMORY}); "
                                   f"bounded presets run at {DEMO_BUDGET} tokens per layer (8 frames) unless "
                                   f"--set memory.budget")
    demo.add_argument("--json", action="store_true", help="one JSON object per answer on stdout, with the "
                                                          "expected answer and whether it is right")
    add_common_options(demo)
    demo.set_defaults(func=cmd_demo)
    return demo
