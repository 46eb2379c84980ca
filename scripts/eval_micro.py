"""Accuracy of memory policies on the synthetic streaming benchmark, with the trained micro model (CPU).

    python scripts/eval_micro.py                                   # writes benchmarks/MICRO.md + PNG
    python scripts/eval_micro.py --weights /tmp/other.safetensors --videos 4 --md /tmp/M.md   # quick

Two benchmarks are generated (`hermes.datasets.synthetic_bench`, OVO-Bench format):
- short: 20 s streams (as long as the clips the model was trained on), answered with `full` memory (the
  model's ceiling: every frame in memory), and with the bounded policies at 128 tokens (8 frames);
- long: 180 s streams under tight budgets (64-256 visual tokens per layer = 4-16 frames of 16 tokens),
  answered by `full`, `sliding`, `uniform`, `recall-only`, `hermes` and `hermes+recall`.
Each (policy, budget) is one `run_eval("ovo-bench", ...)`: the official streaming protocol, prompts
and scorer of `hermes-video eval ovo-bench`, with the micro model passed in. Accuracy is the
official verdict per question family (read from each run's samples.jsonl; the family is in the qid).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from hermes.config import ModelConfig, build_config
from hermes.datasets import synthetic_bench as sb
from hermes.datasets.runner import run_eval
from hermes.models.llava_onevision import LlavaOnevisionAdapter
from hermes.models.micro import (MICRO_NAME, MICRO_STREAM_FPS, WEIGHTS_FILE, file_sha256, load_micro,
                                 read_training_info)
from hermes.pipelines.bench import resolve_policies

BOUNDED = ("sliding", "uniform", "recall-only", "hermes", "hermes+recall")
FAMILY_OF_TASK = {task: kind.split("_")[0] for kind, task in sb.TASK_OF.items()}  # each task code is one family


def micro_adapter(weights: Path | None) -> LlavaOnevisionAdapter:
    """The trained micro model as hermes loads it (what the builtin id `micro-llava-onevision` gives)."""
    model, tokenizer = load_micro(path=weights)
    return LlavaOnevisionAdapter(MICRO_NAME, model, tokenizer, device=torch.device("cpu"),
                                 dtype=torch.float32, system_prompt=ModelConfig().system_prompt)


def family_accuracy(summary: dict) -> dict[str, tuple[int, int]]:
    """{family: (correct, scored)} from a `run_eval` summary's official per-task counts."""
    per_task = summary["accuracy"]["official"]["per_task"]
    return dict(sorted((FAMILY_OF_TASK[task], (cell["correct"], cell["scored"])) for task, cell in per_task.items()))


def chance(root: Path) -> dict[str, float]:
    """Expected accuracy of guessing: 1 / options for multiple choice, the commonest count for counting."""
    entries = json.loads((root / sb.ANNOTATION_FILE).read_text())
    per: dict[str, list[float]] = defaultdict(list)
    counts: list[int] = []
    for e in entries:
        if e["task"] == "REC":
            counts += [p["count"] for p in e["test_info"]]
        else:
            per[e["family"]].append(1.0 / len(e["options"]))
    out = {f: sum(v) / len(v) for f, v in per.items()}
    if counts:
        out["counting"] = max(counts.count(c) for c in set(counts)) / len(counts)
    return out


def run_one(adapter, root: Path, out: Path, policy: str, budget: int, chunk_frames: int) -> dict:
    """One `run_eval` over the benchmark at `root`; returns per-family (correct, answered) and wall time.

    `policy` is a bench policy spec: `hermes+recall` is `hermes` with `memory.recall` on, `recall-only`
    is `sliding` with it on.
    """
    overrides = [f"stream.fps={MICRO_STREAM_FPS}", f"stream.chunk_frames={chunk_frames}", "model.max_new_tokens=4",
                 "model.device=cpu"]
    cfg = build_config(model=MICRO_NAME, overrides=overrides)
    cfg.memory = resolve_policies(policy, cfg.memory, budget)[0].memory
    started = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time (run_eval refuses to mix runs)
    summary = run_eval("ovo-bench", root, cfg, output_dir=out, progress=False, model=adapter)
    return {"families": family_accuracy(summary), "wall_s": round(time.perf_counter() - started, 1)}


def share(cell: tuple[int, int]) -> float:
    """(correct, scored) as a percentage; NaN when nothing was scored."""
    correct, n = cell
    return 100 * correct / n if n else float("nan")


def pct(cell: tuple[int, int]) -> str:
    return f"{share(cell):.0f}" if cell[1] else "-"


def overall(result: dict) -> tuple[int, int]:
    """(correct, scored) over every family of one run."""
    fam = result["families"]
    return sum(c for c, _ in fam.values()), sum(n for _, n in fam.values())


def compare_table(paths: list[Path], runs: list[dict]) -> str:
    """Markdown: per run, overall and episodic accuracy (%) of each weights file, side by side."""
    seeds = [read_training_info(path).get("seed", "?") for path in paths]
    head = " | ".join(f"{what}, seed {seed}" for what in ("all", "episodic") for seed in seeds)
    lines = [f"| run | {head} |", "|---" * (1 + 2 * len(paths)) + "|"]
    for key in runs[0]:
        cells = [pct(overall(r[key])) for r in runs] + [pct(r[key]["families"].get("episodic", (0, 0))) for r in runs]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: list[tuple[str, dict]], chance_row: dict[str, float]) -> str:
    """Markdown: one row per run, accuracy % per family and overall."""
    lines = ["| memory | " + " | ".join(sb.FAMILIES) + " | all |", "|---" * (len(sb.FAMILIES) + 2) + "|"]
    for label, result in rows:
        fam = result["families"]
        lines.append(f"| {label} | " + " | ".join(pct(fam.get(f, (0, 0))) for f in sb.FAMILIES)
                     + f" | {pct(overall(result))} |")
    lines.append("| *chance* | " + " | ".join(f"{100 * chance_row.get(f, 0):.0f}" for f in sb.FAMILIES) + " | |")
    return "\n".join(lines)


def plot(path: Path, budgets: list[int], long_rows: dict, full_long: dict, chance_row: dict) -> bool:
    """Accuracy against budget, one panel per family; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(sb.FAMILIES), figsize=(4 * len(sb.FAMILIES), 3.4), sharey=True)
    for ax, family in zip(axes, sb.FAMILIES):
        for policy in BOUNDED:
            ys = [share(long_rows[(policy, b)]["families"].get(family, (0, 0))) for b in budgets]
            ax.plot(budgets, ys, marker="o", label=policy)
        full = full_long["families"].get(family, (0, 0))
        if full[1]:
            ax.axhline(share(full), color="black", linestyle="--", label="full")
        ax.axhline(100 * chance_row.get(family, 0), color="grey", linestyle=":", label="chance")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_title(family)
        ax.set_xlabel("budget (visual tokens / layer)")
    axes[0].set_ylabel("accuracy (%)")
    axes[0].set_ylim(0, 100)
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def evaluate(adapter, short: Path, long: Path, runs: Path, budgets: list[int], chunk_frames: int) -> dict:
    """Every (benchmark, policy, budget) run of one model: {"short/full", "short/<policy>/128", "long/full",
    "long/<policy>/<budget>"} -> per-family results."""
    grid = [("short", "full", 1)] + [("short", policy, 128) for policy in BOUNDED] + [("long", "full", 1)]
    grid += [("long", policy, budget) for budget in budgets for policy in BOUNDED]
    results = {}
    for bench, policy, budget in grid:
        key = f"{bench}/{policy}" + ("" if policy == "full" else f"/{budget}")
        results[key] = run_one(adapter, short if bench == "short" else long, runs / key.replace("/", "-"), policy,
                               budget, chunk_frames)
        print(key, results[key], flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", type=Path, help="weights file (default: the shipped, checksum-verified one)")
    p.add_argument("--compare-weights", type=Path, nargs="+", default=[],
                   help="more weights files (e.g. trained with other seeds): their accuracy is tabled beside the "
                        "first's, to show what training noise does")
    p.add_argument("--work", type=Path, default=Path("/tmp/hermes-micro-eval"), help="benchmarks and run outputs")
    p.add_argument("--seed", type=int, default=1000, help="benchmark seed (training never draws from it)")
    p.add_argument("--videos", type=int, default=32, help="streams per benchmark")
    p.add_argument("--short-s", type=int, default=20, help="short streams: as long as training clips")
    p.add_argument("--long-s", type=int, default=180)
    p.add_argument("--budgets", default="64,128,256", help="visual tokens per layer for bounded policies")
    p.add_argument("--chunk-frames", type=int, default=16, help="frames per forward (hermes's default for files)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--md", type=Path, default=Path("benchmarks/MICRO.md"))
    p.add_argument("--png", type=Path, help="plot (default: next to --md, micro_accuracy.png)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    started = time.perf_counter()

    short = sb.write_benchmark(args.work / "short", seed=args.seed, num_videos=args.videos, duration_s=args.short_s,
                               per_family=2)
    long = sb.write_benchmark(args.work / "long", seed=args.seed + 1, num_videos=args.videos,
                              duration_s=args.long_s, per_family=3)
    results = evaluate(micro_adapter(args.weights), short, long, args.work / "runs", budgets, args.chunk_frames)
    compared = [evaluate(micro_adapter(path), short, long, args.work / f"runs-compare-{i}", budgets, args.chunk_frames)
                for i, path in enumerate(args.compare_weights)]

    weights = args.weights or WEIGHTS_FILE
    info = read_training_info(weights)
    short_rows = [("full", results["short/full"])] + [(f"{p} @128", results[f"short/{p}/128"]) for p in BOUNDED]
    rows = [("full (unbounded)", results["long/full"])]
    rows += [(f"{policy} @{budget}", results[f"long/{policy}/{budget}"]) for budget in budgets for policy in BOUNDED]
    long_rows = {(policy, budget): results[f"long/{policy}/{budget}"] for budget in budgets for policy in BOUNDED}
    png = args.png or args.md.with_name("micro_accuracy.png")
    args.md.parent.mkdir(parents=True, exist_ok=True)
    plotted = plot(png, budgets, long_rows, results["long/full"], chance(long))
    n_short = overall(results["short/full"])[1]
    n_long = overall(results["long/full"])[1]
    text = MD_TEMPLATE.format(
        weights=Path(weights).name, sha=file_sha256(weights)[:16], train_cmd=info.get("command", "?"),
        train_s=info.get("wall_s", "?"), eval_cmd="python scripts/eval_micro.py " + " ".join(sys.argv[1:]),
        videos=args.videos, short_s=args.short_s, long_s=args.long_s, n_short=n_short, n_long=n_long,
        seed=args.seed, short_table=table(short_rows, chance(short)), long_table=table(rows, chance(long)),
        plot=f"![accuracy against budget]({png.name})" if plotted else "(matplotlib not installed: no plot)",
        wall=round(time.perf_counter() - started))
    if compared:
        text += COMPARE_TEMPLATE.format(
            commands="\n".join(f"- `{read_training_info(path).get('command', '?')}`" for path in args.compare_weights),
            table=compare_table([weights, *args.compare_weights], [results, *compared]))
    args.md.write_text(text)
    (args.work / "results.json").write_text(json.dumps({"results": results, "compared": compared}, indent=1))
    print(f"wrote {args.md}" + (f" and {png}" if plotted else ""))
    return 0


MD_TEMPLATE = """# Memory policies on the synthetic streaming benchmark (micro model, CPU)

Weights: `{weights}` (sha256 `{sha}...`), trained by `{train_cmd}` in {train_s} s.
Reproduce this page: `{eval_cmd}` ({wall} s).

Benchmarks (`hermes.datasets.synthetic_bench`, OVO-Bench format, seed {seed}): {videos} streams each;
short = {short_s} s ({n_short} questions), long = {long_s} s ({n_long} questions); 1 frame per second,
16 visual tokens per frame. Each row is one `run_eval("ovo-bench", ...)` (official streaming protocol,
prompts and scorer). Numbers are accuracy in %, per question family; budgets are visual tokens per
layer (64 = 4 frames). `hermes+recall` is `hermes` with `memory.recall=true`: evicted tokens go to
levels 2-3 and each question brings back the records nearest to it before answering; `recall-only`
(ReKV-style) is `sliding` with recall on: a recent window in device memory, every evicted token
findable, no importance scores. *Chance* is
1/6 for the colour questions and, for counting, always answering the benchmark's commonest count.
The model was trained with at most 20 frames (320 visual tokens) in memory: `full` on long streams
(180 frames) is outside what it has seen. What the numbers say: README, "The micro model and the
synthetic benchmark".

## Short streams

{short_table}

## Long streams under a budget

{long_table}

{plot}
"""


COMPARE_TEMPLATE = """
## Training noise: the same recipe, other seeds

Accuracy (%) of every run above, overall and on episodic questions, with the shipped weights and
with weights trained by the same recipe and other seeds, on the same benchmarks:

{commands}

{table}
"""


if __name__ == "__main__":
    sys.exit(main())
