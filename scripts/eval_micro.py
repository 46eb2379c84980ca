"""Accuracy of memory policies on the synthetic streaming benchmark, with the trained micro model (CPU).

    python scripts/eval_micro.py                                   # writes benchmarks/MICRO.md + PNG
    python scripts/eval_micro.py --weights /tmp/other.safetensors --videos 4 --md /tmp/M.md   # quick
    python scripts/eval_micro.py --sweep      # the suite sweep with intervals (`sweep`, over scripts/micro_suite.py)
    python scripts/eval_micro.py --quick      # its CI smoke variant

The page's templates (end of this file) say what each table measures; `--sweep` and `--quick` are
`micro_suite`'s. Each (policy, budget) is one `run_eval("ovo-bench", ...)` with the micro model passed
in: the official protocol, prompts and scorer. Runs are kept under `--work` per weights file; `--reuse`
reads a finished run instead of repeating it, so several processes can fill the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from hermes.config import ModelConfig, build_config
from hermes.datasets import synthetic_bench as sb
from hermes.datasets.runner import run_eval
from hermes.models.base import VLMAdapter
from hermes.models.loading import load_model
from hermes.models.micro import (MICRO_NAME, MICRO_STREAM_FPS, WEIGHTS_FILE, file_sha256,
                                 read_training_info)
from hermes.pipelines.bench.memory import resolve_policies

import micro_suite  # this folder's (the script's own folder is on sys.path): the sweep's sets, tables, intervals
from micro_suite import interval, run_dir, run_key, shown_args

BOUNDED = ("sliding", "uniform", "recall-only", "hermes", "hermes+recall")
FAMILY_OF_TASK = {task: kind.split("_")[0] for kind, task in sb.TASK_OF.items()}  # each task code is one family


def micro_adapter(weights: Path | None) -> VLMAdapter:
    """The trained micro model as hermes loads it (what the builtin id `micro-llava-onevision` gives)."""
    return load_model(ModelConfig(name=MICRO_NAME, device="cpu", dtype="float32"), builder_options={"path": weights})


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


def run_one(adapter, root: Path, out: Path, policy: str, budget: int, chunk_frames: int, *, memory: str | None = None,
            options: dict | None = None, reuse: bool = False) -> dict:
    """One `run_eval` over the benchmark at `root`; returns per-family (correct, answered), wall time and
    each question's verdict.

    `policy` is a bench policy spec: `hermes+recall` is `hermes` with `memory.recall` on, `recall-only`
    is `sliding` with it on. `memory` names a memory preset to start from (e.g. `hermes-plus`), `options`
    are memory settings applied last. With `reuse`, a finished run in `out` with the same configuration
    is read instead of run again.
    """
    overrides = [f"stream.fps={MICRO_STREAM_FPS}", f"stream.chunk_frames={chunk_frames}", "model.max_new_tokens=4",
                 "model.device=cpu"]
    cfg = build_config(model=MICRO_NAME, memory=memory, overrides=overrides)
    cfg.memory = dataclasses.replace(resolve_policies(policy, cfg.memory, budget)[0].memory, **(options or {}))
    summary_path, bench_mark = out / "summary.json", out / "benchmark.sha256"
    bench_sha = file_sha256(root / sb.ANNOTATION_FILE)
    if reuse and summary_path.is_file() and bench_mark.is_file() and bench_mark.read_text() == bench_sha:
        summary = json.loads(summary_path.read_text())
        if summary.get("config", {}).get("memory") == json.loads(json.dumps(dataclasses.asdict(cfg.memory))):
            return {"families": family_accuracy(summary), "wall_s": summary.get("wall_time_s"),
                    "outcomes": outcomes(out)}
    started = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time (run_eval refuses to mix runs)
    summary = run_eval("ovo-bench", root, cfg, output_dir=out, progress=False, model=adapter)
    bench_mark.write_text(bench_sha)  # which benchmark (annotations) the run answered
    return {"families": family_accuracy(summary), "wall_s": round(time.perf_counter() - started, 1),
            "outcomes": outcomes(out)}


def outcomes(out: Path) -> dict[str, bool]:
    """{qid: official verdict} of one run, from its samples.jsonl (a counting probe is its own question)."""
    lines = (out / "samples.jsonl").read_text().splitlines()
    return {s["qid"]: bool(s["official"]) for s in map(json.loads, lines) if s.get("official") is not None}


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


def plot(path: Path, budgets: list[int], long_rows: dict, full_long: dict, chance_row: dict,
         policies: tuple[str, ...] = BOUNDED) -> bool:
    """Accuracy against budget, one panel per family; False when matplotlib is missing."""
    def draw(ax, family: str) -> None:
        for policy in policies:
            ys = [share(long_rows[(policy, b)]["families"].get(family, (0, 0))) for b in budgets]
            ax.plot(budgets, ys, marker="o", label=policy)
        full = full_long["families"].get(family, (0, 0))
        if full[1]:
            ax.axhline(share(full), color="black", linestyle="--", label="full")
        ax.axhline(100 * chance_row.get(family, 0), color="grey", linestyle=":", label="chance")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])

    return micro_suite.family_panels(path, draw, "budget (visual tokens / layer)", "accuracy (%)", 8)


def evaluate(adapter, short: Path, long: Path, runs: Path, budgets: list[int], chunk_frames: int,
             reuse: bool = False, policies: tuple[str, ...] = BOUNDED) -> dict:
    """Every (benchmark, policy, budget) run of one model: {"short/full", "short/<policy>/128", "long/full",
    "long/<policy>/<budget>"} -> per-family results."""
    grid = [("short", "full", 1)] + [("short", policy, 128) for policy in policies] + [("long", "full", 1)]
    grid += [("long", policy, budget) for budget in budgets for policy in policies]
    results = {}
    for bench, policy, budget in grid:
        key = run_key(bench, policy, budget)
        results[key] = run_one(adapter, short if bench == "short" else long, run_dir(runs, key), policy,
                               budget, chunk_frames, reuse=reuse)
        print(key, results[key]["families"], results[key]["wall_s"], flush=True)
    return results


# ---- memory options (issue #13) -------------------------------------------------------------------

FORMER = {"recency_unit": "frame", "recency_k_fall": 0.0, "summary_position": "mean_evicted", "accumulation": "sum"}
# label -> (memory settings on top of the defaults, memory preset to start from)
VARIANTS: dict[str, tuple[dict, str | None]] = {
    "hermes": ({}, None),  # the reference's choices: the defaults
    "recency_unit=frame": ({"recency_unit": "frame"}, None),
    "recency_k_fall=0": ({"recency_k_fall": 0.0}, None),
    "summary_position=mean_evicted": ({"summary_position": "mean_evicted"}, None),
    "accumulation=sum": ({"accumulation": "sum"}, None),
    "accumulation=ema": ({"accumulation": "ema", "accumulate_decay": 0.5}, None),
    "former (all four)": (FORMER, None),
    "hermes-plus": ({}, "hermes-plus"),
    # ours, for speed: evict below the budget so that chunks that fit run no probe (fewer tokens between evictions)
    "evict_headroom=0.25": ({"evict_headroom": 0.25}, None),
    "evict_headroom=0.5": ({"evict_headroom": 0.5}, None),
}
OPTION_COLUMNS = ("realtime", "episodic_first", "episodic_before", "counting", "ordering", "all")
DEPTH_BINS = ((0.0, 1 / 3), (1 / 3, 2 / 3), (2 / 3, 1.01))  # how long ago, as a share of the stream


def evaluate_options(adapter, sets: dict[str, Path], runs: Path, budgets: list[int], chunk_frames: int,
                     variants: list[str], reuse: bool, done: dict | None = None) -> dict:
    """{"<set>/<variant>/<budget>": result} for every memory variant of `hermes` on every set and budget
    (runs already in `done`, such as the baseline page's `long/hermes/<budget>`, are taken from it)."""
    results = {}
    for name, root in sets.items():
        for budget in budgets:
            for label in variants:
                options, preset = VARIANTS[label]
                key = f"{name}/{label}/{budget}"
                if done and key in done:
                    results[key] = done[key]
                    continue
                results[key] = run_one(adapter, root, run_dir(runs, key), "hermes", budget, chunk_frames,
                                       memory=preset, options=options, reuse=reuse)
                print(key, results[key]["families"], results[key]["wall_s"], flush=True)
    return results


def question_groups(root: Path) -> dict[str, tuple[str, float]]:
    """{qid: (column, depth)}: the family (episodic split into first / before) and, for episodic questions,
    how long before the question the object asked about left the screen, as a share of the stream."""
    entries = json.loads((root / sb.ANNOTATION_FILE).read_text())
    meta = json.loads((root / sb.META_FILE).read_text())
    groups: dict[str, tuple[str, float]] = {}
    for e in entries:
        if e["family"] != "episodic":
            if e["task"] == "REC":
                for i, _ in enumerate(e["test_info"]):
                    groups[f"ovo-{e['id']}-{i}"] = ("counting", float("nan"))
            else:
                groups[f"ovo-{e['id']}"] = (e["family"], float("nan"))
            continue
        seen = [a for a in meta["timelines"][e["video"]] if a["start_s"] < e["realtime"]]
        if e["kind"] == "episodic_first":
            target = seen[0]
        else:
            name = re.search(r"just before the (.+)\?$", e["question"]).group(1)
            target = seen[[f"{a['colour']} {a['shape']}" for a in seen].index(name) - 1]
        groups[f"ovo-{e['id']}"] = (e["kind"], (e["realtime"] - target["end_s"]) / meta["duration_s"])
    return groups


def column_qids(groups: dict[str, tuple[str, float]], column: str, depth: tuple[float, float] | None = None,
                have: set[str] | None = None) -> list[str]:
    """The qids of one column (a family, or "all"), within `depth` and among `have` where given."""
    out = []
    for qid, (col, d) in sorted(groups.items()):
        if (column == "all" or col == column) and (depth is None or depth[0] <= d < depth[1]):
            if have is None or qid in have:
                out.append(qid)
    return out


def options_tables(all_runs: list[dict], groups: dict[str, dict], sets: list[str], budgets: list[int],
                   variants: list[str]) -> str:
    """Markdown: per set and budget, accuracy [95 % interval] per column, pooled over weights files; a
    difference to `hermes` whose paired interval excludes 0 is marked (+) or (-)."""
    parts = []
    for name in sets:
        for budget in budgets:
            lines = [f"**{name}, budget {budget}**", "", "| variant | " + " | ".join(OPTION_COLUMNS) + " |",
                     "|---" * (len(OPTION_COLUMNS) + 1) + "|"]
            lines += [variant_row(all_runs, groups[name], name, budget, label, [(c, None) for c in OPTION_COLUMNS])
                      for label in variants]
            n = {col: len(column_qids(groups[name], col)) for col in OPTION_COLUMNS}
            lines += ["", "questions per weights file: " + ", ".join(f"{c} {k}" for c, k in n.items()), ""]
            parts.append("\n".join(lines))
    return "\n".join(parts)


def depth_table(all_runs: list[dict], groups: dict[str, tuple[str, float]], name: str, budget: int,
                variants: list[str]) -> str:
    """Markdown: episodic accuracy [95 % interval] by kind and by how long ago the object was on screen."""
    cols = [(kind, bin_) for kind in ("episodic_first", "episodic_before") for bin_ in DEPTH_BINS]
    cols = [c for c in cols if column_qids(groups, c[0], c[1])]
    head = " | ".join(f"{k.split('_')[1]} {lo:.2f}-{min(hi, 1):.2f} (n={len(column_qids(groups, k, (lo, hi)))})"
                      for k, (lo, hi) in cols)
    lines = [f"**{name}, budget {budget}: episodic by depth** (depth = time since the object left the screen, "
             "share of the stream)", "", f"| variant | {head} |", "|---" * (len(cols) + 1) + "|"]
    lines += [variant_row(all_runs, groups, name, budget, label, cols) for label in variants]
    return "\n".join(lines) + "\n"


def variant_row(all_runs: list[dict], groups: dict[str, tuple[str, float]], name: str, budget: int, label: str,
                columns: list[tuple[str, tuple[float, float] | None]]) -> str:
    """One row: `label`'s accuracy [95 % interval] per (column, depth), marked against `hermes` at `budget`."""
    runs = [r[f"{name}/{label}/{budget}"]["outcomes"] for r in all_runs]
    base = [r[f"{name}/hermes/{budget}"]["outcomes"] for r in all_runs]
    have = set.intersection(*(set(o) for o in runs + base))
    marked = None if label == "hermes" else base
    return f"| {label} | " + " | ".join(interval(runs, column_qids(groups, col, depth, have), marked, 0)
                                       for col, depth in columns) + " |"


def admission(adapter, checkpoints: list[int], budget: int, chunk_frames: int, seed: int) -> dict[str, list[float]]:
    """{accumulation: [share of the newest chunk's visual tokens held by long-term layers after each checkpoint]}
    on one synthetic stream (the micro model's own attention), per accumulation setting."""
    from hermes.config import MemoryConfig
    from hermes.pipelines.frames import Frame
    from hermes.pipelines.session import StreamingSession

    timeline = sb.random_timeline(np.random.default_rng([seed, 7]), max(checkpoints) * chunk_frames)
    out = {}
    for label, options in (("none", {}), ("sum", {"accumulation": "sum"}),
                           ("ema 0.5", {"accumulation": "ema", "accumulate_decay": 0.5}),
                           ("ema 0.9", {"accumulation": "ema", "accumulate_decay": 0.9})):
        session = StreamingSession(adapter, MemoryConfig(policy="hermes", budget=budget, **options), (),
                                   chunk_frames=chunk_frames)
        longterm = [i for i, band in enumerate(session.memory.bands) if band == "longterm"]
        shares = []
        for chunk in range(max(checkpoints)):
            frames = [Frame(float(i), sb.render_frame(timeline, i), i)
                      for i in range(chunk * chunk_frames, (chunk + 1) * chunk_frames)]
            session.ingest(frames)
            if chunk + 1 in checkpoints:
                newest = session.cache.frame_index[longterm] >= chunk * chunk_frames  # (layers, T)
                per_chunk = chunk_frames * adapter.tokens_per_frame
                shares.append(float(newest.sum(dim=1).float().mean()) / per_chunk)
        out[label] = shares
        print("admission", label, shares, flush=True)
    return out


def admission_table(result: dict[str, list[float]], checkpoints: list[int]) -> str:
    lines = ["| accumulation | " + " | ".join(f"after {c} chunks" for c in checkpoints) + " |",
             "|---" * (len(checkpoints) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(f"{100 * v:.1f} %" for v in shares) + " |" for label, shares in result.items()]
    return "\n".join(lines)


def plus_settings() -> str:
    """The memory settings the `hermes-plus` preset changes from the defaults, as text."""
    import yaml
    from hermes.config import load_preset

    preset = {k: v for k, v in load_preset("memory", "hermes-plus").items() if k not in ("policy", "budget")}
    return ", ".join(f"`{k}: {yaml.safe_dump(v).splitlines()[0]}`" for k, v in preset.items()) or \
        "nothing (it equals the reference's defaults)"


def benchmark(root: Path, **kwargs) -> Path:
    """`synthetic_bench.write_benchmark(root, **kwargs)`, unless `root` already holds that very benchmark."""
    return micro_suite.written(root, kwargs, lambda: sb.write_benchmark(root, **kwargs))


def run_grid(adapter, sets: dict[str, Path], runs: Path, policies: list[str], budgets: list[int], chunk_frames: int,
             reuse: bool) -> dict[str, dict]:
    """{"<set>/<policy>/<budget>": run_one's result + cost} ("<set>/full" once: it ignores the budget)."""
    # one throw-away run first: the first run_eval of a process pays one-off costs (imports, allocator
    # warm-up) that would otherwise land on the first policy's time per chunk
    first_set = next(iter(sets.values()))
    run_one(adapter, first_set, runs / "warm-up", "sliding", 64, chunk_frames, reuse=reuse)
    results = {}
    for name, root in sets.items():
        for policy in policies:
            spec, preset, options = micro_suite.policy_of(policy)
            for budget in ([0] if policy == "full" else budgets):
                key = run_key(name, policy, budget)
                out = run_dir(runs, key)
                result = run_one(adapter, root, out, spec, budget or 1, chunk_frames, memory=preset,
                                            options=options, reuse=reuse)
                result.update(micro_suite.cost(out, chunk_frames, float(result["wall_s"] or 0)))
                results[key] = result
                print(key, result["families"], result["wall_s"], flush=True)
    return results


def sweep(args, weights: list[Path]) -> int:
    """Run the suite sweep (`--sweep`, or `--quick`) for every weights file and write its page to `--md`."""
    started = time.perf_counter()
    videos = dict(micro_suite.QUICK_VIDEOS if args.quick else micro_suite.STANDARD_VIDEOS)
    for spec in filter(None, (args.set_videos or "").split(",")):
        name, _, count = spec.partition("=")
        videos[name] = int(count)
    unknown = sorted(set(videos) - set(sb.SUITE_S)) + \
        sorted({p.split(":")[0] for p in args.sweep_policies} - set(micro_suite.POLICIES))
    if unknown:
        raise SystemExit(f"error: unknown set or policy {', '.join(unknown)}; sets: {', '.join(sb.SUITE_S)}, "
                         f"policies: {', '.join(micro_suite.POLICIES)}")
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else \
        list(micro_suite.QUICK_BUDGETS if args.quick else micro_suite.STANDARD_BUDGETS)
    sets = {name: micro_suite.suite_set(args.work, name, args.suite_seed, videos[name], args.memory_kinds)  # shortest first
            for name in sorted(videos, key=sb.SUITE_S.get) if videos[name] > 0}
    tags = {name: micro_suite.question_tags(root) for name, root in sets.items()}
    all_runs = []
    for path in weights:
        adapter = micro_adapter(path)
        runs = args.work / f"suite-runs-{file_sha256(path)[:12]}"
        all_runs.append(run_grid(adapter, sets, runs, args.sweep_policies, budgets, args.chunk_frames, args.reuse))
    seeds = [str(read_training_info(p).get("seed", "?")) for p in weights]
    text = micro_suite.PAGE.format(weights=", ".join(f"`{Path(p).name}` (seed {s}, sha256 `{file_sha256(p)[:12]}...`)"
                                         for p, s in zip(weights, seeds)),
                       seed=args.suite_seed, sets=", ".join(f"{n} = {sb.SUITE_S[n]} s x {k} streams"
                                                            for n, k in videos.items() if k > 0),
                       n_weights=len(weights),
                       tables="\n\n".join(micro_suite.summary_table(all_runs, tags, args.sweep_policies, b)
                                          for b in budgets) + "\n\n" +
                       micro_suite.tables(all_runs, tags, args.sweep_policies, budgets),
                       wall=round(time.perf_counter() - started), min_marked=micro_suite.MIN_MARKED,
                       run_s=" / ".join(str(round(sum(float(r["wall_s"] or 0) for r in runs.values())))
                                        for runs in all_runs),
                       command=" ".join(shown_args(sys.argv[1:])))
    png = args.png or args.md.with_suffix(".png")
    if micro_suite.suite_plot(png, all_runs, tags, args.sweep_policies, max(budgets)):
        text += (f"\n## Accuracy against stream length (budget {max(budgets)})\n\n![accuracy against stream length]"
                 f"({png.name})\n\nEach point pools the weights files; bars are the 95 % bootstrap intervals.\n")
    if len(weights) > 1:
        text += "\n## Spread over training seeds\n\nOverall accuracy (%) of each run per weights file:\n\n"
        text += micro_suite.spread_table(all_runs, seeds) + "\n"
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(text)
    (args.md.with_suffix(".json")).write_text(json.dumps(all_runs, indent=1))
    print(f"wrote {args.md}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", type=Path, help="weights file (default: the shipped, checksum-verified one)")
    p.add_argument("--compare-weights", type=Path, nargs="+", default=[],
                   help="more weights files (e.g. trained with other seeds): their accuracy is tabled beside the "
                        "first's, to show what training noise does; option tables pool all of them")
    p.add_argument("--work", type=Path, default=Path("/tmp/hermes-micro-eval"), help="benchmarks and run outputs")
    p.add_argument("--seed", type=int, default=1000, help="benchmark seed (training never draws from it)")
    p.add_argument("--videos", type=int, default=32, help="streams per benchmark")
    p.add_argument("--short-s", type=int, default=20, help="short streams: as long as training clips")
    p.add_argument("--long-s", type=int, default=180)
    p.add_argument("--budgets", help="visual tokens per layer for bounded policies (default 64,128,256; "
                                     "--sweep: 64,256; --quick: 128)")
    p.add_argument("--chunk-frames", type=int, default=16, help="frames per forward (hermes's default for files)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--md", type=Path, help="page to write (default benchmarks/MICRO.md; --sweep: WORK/SUITE.md, "
                                          "--quick: WORK/QUICK.md)")
    p.add_argument("--png", type=Path, help="plot (default: next to --md, micro_accuracy.png)")
    p.add_argument("--options", action="store_true", help="also sweep the hermes memory options (long and 600 s sets)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="option variants to run (labels of VARIANTS)")
    p.add_argument("--videos-600", type=int, default=16, help="streams of the 600 s set")
    p.add_argument("--admission", action="store_true",
                   help="also measure what long-term layers admit after 10, 30, 100 chunks")
    p.add_argument("--admission-chunks", default="10,30,100", help="checkpoints of --admission, in chunks")
    p.add_argument("--reuse", action="store_true", help="read finished runs under --work instead of running them again")
    p.add_argument("--no-page", action="store_true", help="only fill the runs (for parallel processes); no page")
    p.add_argument("--policies", default=",".join(BOUNDED), help="bounded policies of the comparison")
    p.add_argument("--no-baseline", action="store_true", help="skip the policy comparison runs (with --no-page)")
    p.add_argument("--note", default="", help="a paragraph for the top of the page (e.g. how the runs were filled)")
    p.add_argument("--option-sets", default="long,long600", help="sets the option sweep runs on")
    p.add_argument("--sweep", action="store_true",
                   help="run the suite sweep instead (every policy on 20 / 180 / 600 / 1,800 s sets, with intervals; "
                        "scripts/micro_suite.py) and write its page to --md (default WORK/SUITE.md)")
    p.add_argument("--quick", action="store_true", help="a smoke-test sweep: one short and one long stream, budget 128")
    p.add_argument("--suite-seed", type=int, default=sb.SUITE_SEED, help="seed of the suite's sets (--sweep)")
    p.add_argument("--set-videos", help="streams per suite set, e.g. short=8,long=4,long600=2,long1800=0 (--sweep)")
    p.add_argument("--memory-kinds", action="store_true",
                   help="--sweep: the suite's sets with the memory kinds too (just after X, which of two came "
                        "first, a rare colour in the last N s), each tabled by depth")
    p.add_argument("--sweep-policies",
                   help="policies of --sweep / --quick (default: the standard nine; more in micro_suite.POLICIES)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.sweep or args.quick:
        chosen = args.sweep_policies or ",".join(micro_suite.STANDARD_POLICIES)
        args.sweep_policies = [q for q in chosen.split(",") if q]
        args.md = args.md or args.work / ("QUICK.md" if args.quick else "SUITE.md")
        return sweep(args, [args.weights or WEIGHTS_FILE, *args.compare_weights])
    budgets = [int(b) for b in (args.budgets or "64,128,256").split(",")]
    args.md = args.md or Path("benchmarks/MICRO.md")
    variants = [v for v in args.variants.split(",") if v]
    checkpoints = [int(c) for c in args.admission_chunks.split(",")]
    policies = tuple(q for q in args.policies.split(",") if q)
    started = time.perf_counter()

    short = benchmark(args.work / "short", seed=args.seed, num_videos=args.videos, duration_s=args.short_s,
                               per_family=2)
    long = benchmark(args.work / "long", seed=args.seed + 1, num_videos=args.videos,
                              duration_s=args.long_s, per_family=4)
    sets = {"long": long}
    if args.options:
        sets["long600"] = benchmark(args.work / "long600", seed=args.seed + 2, num_videos=args.videos_600,
                                             duration_s=600, per_family=6)
        sets = {name: sets[name] for name in args.option_sets.split(",")}
    if args.no_baseline and not args.no_page:
        p.error("--no-baseline needs --no-page (the page shows the policy comparison)")
    weights = args.weights or WEIGHTS_FILE
    all_weights = [weights, *args.compare_weights]
    results_per_weights, options_per_weights, admissions = [], [], []
    for path in all_weights:
        adapter = micro_adapter(path)
        runs = args.work / f"runs-{file_sha256(path)[:12]}"
        results_per_weights.append({} if args.no_baseline else
                                   evaluate(adapter, short, long, runs, budgets, args.chunk_frames, args.reuse,
                                            policies))
        if args.options:
            options_per_weights.append(evaluate_options(adapter, sets, runs, budgets, args.chunk_frames, variants,
                                                        args.reuse, results_per_weights[-1]))
        if args.admission:
            admissions.append(admission(adapter, checkpoints, 128, args.chunk_frames, args.seed))
    if args.no_page:
        return 0
    results, compared = results_per_weights[0], results_per_weights[1:]

    info = read_training_info(weights)
    short_rows = [("full", results["short/full"])] + [(f"{p} @128", results[f"short/{p}/128"]) for p in policies]
    rows = [("full (unbounded)", results["long/full"])]
    rows += [(f"{policy} @{budget}", results[f"long/{policy}/{budget}"]) for budget in budgets for policy in policies]
    long_rows = {(policy, budget): results[f"long/{policy}/{budget}"] for budget in budgets for policy in policies}
    png = args.png or args.md.with_name("micro_accuracy.png")
    args.md.parent.mkdir(parents=True, exist_ok=True)
    plotted = plot(png, budgets, long_rows, results["long/full"], chance(long), policies)
    n_short = overall(results["short/full"])[1]
    n_long = overall(results["long/full"])[1]
    text = MD_TEMPLATE.format(
        weights=Path(weights).name, sha=file_sha256(weights)[:16], train_cmd=info.get("command", "?"),
        train_s=info.get("wall_s", "?"), eval_cmd="python scripts/eval_micro.py " + " ".join(shown_args(sys.argv[1:])),
        videos=args.videos, short_s=args.short_s, long_s=args.long_s, n_short=n_short, n_long=n_long,
        seed=args.seed, short_table=table(short_rows, chance(short)), long_table=table(rows, chance(long)),
        policies=", ".join(f"`{q}`" for q in policies),
        plot=f"![accuracy against budget]({png.name})" if plotted else "(matplotlib not installed: no plot)",
        wall=round(time.perf_counter() - started))
    if args.note:
        text = text.replace("\n\nBenchmarks (", f"\n\n{args.note}\n\nBenchmarks (", 1)
    if compared:
        text += COMPARE_TEMPLATE.format(
            commands="\n".join(f"- `{read_training_info(path).get('command', '?')}`" for path in args.compare_weights),
            table=compare_table(all_weights, [results, *compared]))
    if args.options:
        merged = [{**r, **o} for r, o in zip(results_per_weights, options_per_weights)]
        groups = {name: question_groups(root) for name, root in sets.items()}
        seeds = ", ".join(str(read_training_info(path).get("seed", "?")) for path in all_weights)
        text += OPTIONS_TEMPLATE.format(
            seeds=seeds, n_weights=len(all_weights), videos=args.videos, videos_600=args.videos_600,
            tables=options_tables(merged, groups, list(sets), budgets, variants), plus=plus_settings(),
            depth="\n".join(depth_table(merged, groups[name], name, budget, variants)
                            for name in sets for budget in budgets))
    if args.admission:
        for path, result in zip(all_weights, admissions):
            text += ADMISSION_TEMPLATE.format(seed=read_training_info(path).get("seed", "?"),
                                              table=admission_table(result, checkpoints))
    args.md.write_text(text)
    (args.work / "results.json").write_text(json.dumps({"results": results_per_weights, "options": options_per_weights,
                                                        "admission": admissions}, indent=1))
    print(f"wrote {args.md}" + (f" and {png}" if plotted else ""))
    return 0


MD_TEMPLATE = """# Memory policies on the synthetic streaming benchmark (micro model, CPU)

Weights: `{weights}` (sha256 `{sha}...`), trained by `{train_cmd}` in {train_s} s.
Reproduce this page: `{eval_cmd}` ({wall} s).

Benchmarks (`hermes.datasets.synthetic_bench`, OVO-Bench format, seed {seed}): {videos} streams each;
short = {short_s} s ({n_short} questions), long = {long_s} s ({n_long} questions); 1 frame per second,
16 visual tokens per frame. Each row is one `run_eval("ovo-bench", ...)` (official streaming protocol,
prompts and scorer). Numbers are accuracy in %, per question family; budgets are visual tokens per
layer (64 = 4 frames). Bounded policies run here: {policies}. `hermes` is the reference's HERMES (the
defaults). `hermes+recall` is `hermes` with `memory.recall=true`: evicted tokens go to
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


OPTIONS_TEMPLATE = """
## Memory options of `hermes`

Each row is `hermes` with one memory option changed from the reference's choice (the default), our
former combination (all four of: recency_unit=frame, recency_k_fall=0, summary_position=mean_evicted,
accumulation=sum), and the `hermes-plus` preset. `memory.mrope_compaction` is not swept: the micro
model uses 1-D RoPE, where both rules give consecutive positions (the golden tests cover M-RoPE).
Sets: `long` = the 180 s set above ({videos} streams), `long600` = 600 s streams ({videos_600} streams,
seed + 2, 6 questions per family per stream). Weights: seeds {seeds}; every cell pools the
{n_weights} weights files (each question's verdicts kept together) and gives the accuracy in % with
its 95 % bootstrap interval over questions (2000 resamples). (+) / (-): the paired difference to
`hermes` on the same questions has a 95 % interval above / below 0; unmarked differences are within
noise. The micro model has 4 decoder layers, so its working band is one layer (p = 0): the ramp of
`k` (`recency_k_fall`) cannot act there, and its row equals `hermes`.

How `hermes-plus` is chosen: an alternative joins it when, on both sets and at every budget, it has a
(+) somewhere and a (-) nowhere (family and depth columns alike), so that no kind of question pays
for another's gain; of two alternatives of one option the one with more (+) wins. `hermes-plus`
now sets: {plus}.

{tables}

{depth}
"""


ADMISSION_TEMPLATE = """
## What long-term layers admit over time (weights seed {seed})

Share of the newest chunk's visual tokens that the long-term layers hold (mean over those layers),
after the given numbers of chunks of 16 frames of one synthetic stream, `hermes` at budget 128, with each
accumulation setting (the micro model's own pseudo-query attention):

{table}
"""


if __name__ == "__main__":
    sys.exit(main())
