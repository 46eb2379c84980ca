"""The micro testbed's sweep: every policy on the suite's sets, each number with a 95 % bootstrap interval.

This module holds the sweep's sets, tables and statistics (`bootstrap`, also the other pages' interval)
and loads no model; `eval_micro.sweep` runs the grid. It imports nothing from `eval_micro`.

    python scripts/eval_micro.py --sweep                      # the standard sweep (see README for its cost)
    python scripts/eval_micro.py --quick --md /tmp/Q.md       # a CI smoke run (seconds)

Sets are `hermes.datasets.synthetic_bench`'s suite (`SUITE_S`: 20, 180, 600 and 1,800 s streams, every
question family at every length, episodic questions one per depth). Each (set, policy, budget) is
one `run_eval("ovo-bench", ...)` through `eval_micro.run_one`, the official protocol and scorer.
Per cell the page shows accuracy % [95 % bootstrap interval over questions, 2000 resamples, seed 0];
several weights files (training seeds) are pooled with each question's verdicts kept together, and
their spread (per-seed accuracy) gets its own table. (+) / (-): the paired difference to `hermes` on
the same questions has a 95 % interval above / below 0. Beside accuracy: device memory (the largest
`hbm_bytes`, the KV cache on the device, over the run's questions) and time per chunk (the run's
wall time less its answers' latency, over the chunks streamed).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from hermes.datasets import synthetic_bench as sb

# label -> (bench policy spec for `run_one`, memory preset to start from, memory options applied last)
POLICIES: dict[str, tuple[str, str | None, dict]] = {
    "full": ("full", None, {}), "sliding": ("sliding", None, {}), "uniform": ("uniform", None, {}),
    "recent-frames": ("recent-frames", None, {}), "rekv": ("rekv", None, {}),
    "recall-only": ("recall-only", None, {}), "hermes": ("hermes", None, {}),
    "hermes+recall": ("hermes+recall", None, {}), "hermes-plus": ("hermes", "hermes-plus", {}),
    # ours, opt-in (--sweep-policies): hermes+recall with the per-question recall gate (hermes.recall_gate)
    "hermes+recall+gate=frames": ("hermes+recall", None, {"recall_gate": "above_frames"}),
    "hermes+recall+gate=level1": ("hermes+recall", None, {"recall_gate": "above_level1"}),
}
STANDARD_POLICIES = ("full", "sliding", "uniform", "recent-frames", "rekv", "recall-only", "hermes", "hermes+recall",
                     "hermes-plus")  # the standard sweep's (the nine)
MIN_MARKED = 10  # fewer questions than this: a percentile bootstrap is too coarse to mark a difference
DEPTH_COLUMNS = ("first", *(str(p) for p in sb.DEPTHS_PCT))
# The standard sweep: streams per set, and budgets (visual tokens per layer; 16 per frame).
STANDARD_VIDEOS = {"short": 8, "long": 4, "long600": 2, "long1800": 1}
STANDARD_BUDGETS = (64, 256)
# The smoke run: one short and one long stream, one budget, every policy.
QUICK_VIDEOS = {"short": 1, "long": 1}
QUICK_BUDGETS = (128,)


def written(root: Path, recorded: dict, write) -> Path:
    """`root` when it holds a finished set whose meta file records `recorded`, else what `write()` makes
    there: parallel processes then read a set without rewriting it."""
    meta = root / sb.META_FILE
    if meta.is_file() and (root / sb.ANNOTATION_FILE).is_file():
        info = json.loads(meta.read_text())
        if all(info.get(key) == value for key, value in recorded.items()):
            return root
    return write()


def suite_set(work: Path, name: str, seed: int, num_videos: int) -> Path:
    """The set `name` under `work`, written unless a finished copy with the same arguments is there."""
    root = work / f"suite-{seed}" / f"{name}-{num_videos}"
    return written(root, {"suite": name, "seed": seed, "num_videos": num_videos},
                   lambda: sb.write_suite_set(root, name, seed=seed, num_videos=num_videos))


def question_tags(root: Path) -> dict[str, tuple[str, str]]:
    """{qid as run_eval names it: (family, depth tag or "")} of one suite set."""
    tags = {}
    for e in json.loads((root / sb.ANNOTATION_FILE).read_text()):
        if e["task"] == "REC":
            tags.update({f"ovo-{e['id']}-{i}": ("counting", "") for i in range(len(e["test_info"]))})
        else:
            tags[f"ovo-{e['id']}"] = (e["family"], e.get("depth", ""))
    return tags


def cost(out: Path, chunk_frames: int, wall_s: float) -> dict[str, float]:
    """Device KV bytes (largest over the run's questions) and ms per streamed chunk, from samples.jsonl."""
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    frames: dict[str, int] = {}
    for s in samples:
        frames[s["video_id"]] = max(frames.get(s["video_id"], 0), int(s.get("frames_seen") or 0))
    chunks = sum(math.ceil(n / chunk_frames) for n in frames.values())
    answering_s = sum(float(s.get("latency_ms") or 0) for s in samples) / 1000
    return {"kv_bytes": max(int((s.get("memory") or {}).get("hbm_bytes") or 0) for s in samples),
            "ms_per_chunk": 1000 * max(0.0, wall_s - answering_s) / max(1, chunks)}


def run_dir(runs: Path, key: str) -> Path:
    return runs / re.sub(r"[^A-Za-z0-9_.+-]+", "_", key.replace("/", "-")).strip("_")


def bootstrap(runs: list[dict[str, bool]], qids: list[str], base: list[dict[str, bool]] | None = None,
              n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(accuracy %, 2.5 %, 97.5 % percentiles) over questions resampled with replacement, the seeds' verdicts
    on a question kept together; with `base`, the same for the paired difference (runs - base)."""
    if not qids:
        return float("nan"), float("nan"), float("nan")
    m = np.array([[r[q] for q in qids] for r in runs], dtype=float)  # (seeds, Q)
    if base is not None:
        m = m - np.array([[r[q] for q in qids] for r in base], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(qids), (n, len(qids)))
    draws = m[:, idx].mean(axis=(0, 2))  # (n,)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return 100 * m.mean(), 100 * lo, 100 * hi


def shown_args(argv: list[str]) -> list[str]:
    """The command line as the page shows it: `--note` and its text left out (the note is on the page)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--note":
            skip = True
        elif not arg.startswith("--note="):
            out.append(arg)
    return out


def interval(runs: list[dict[str, bool]], qids: list[str], base: list[dict[str, bool]] | None,
             min_marked: int = MIN_MARKED) -> str:
    """"acc [lo, hi]", marked (+) / (-) when the paired difference to `base` excludes 0 (never under
    `min_marked` questions); "-" without questions."""
    if not qids:
        return "-"
    acc, lo, hi = bootstrap(runs, qids)
    mark = ""
    if base is not None and len(qids) >= min_marked:
        _, dlo, dhi = bootstrap(runs, qids, base)
        mark = " (+)" if dlo > 0 else " (-)" if dhi < 0 else ""
    return f"{acc:.0f} [{lo:.0f}, {hi:.0f}]{mark}"


def rows_of(all_runs: list[dict], name: str, policies: list[str], budget: int) -> list[tuple[str, str]]:
    """(label, result key) of each policy at `budget` on set `name`."""
    return [(p if p == "full" else f"{p} @{budget}", f"{name}/{p}" + ("" if p == "full" else f"/{budget}"))
            for p in policies if (f"{name}/{p}" + ("" if p == "full" else f"/{budget}")) in all_runs[0]]


def tables(all_runs: list[dict], tags: dict[str, dict], policies: list[str], budgets: list[int]) -> str:
    """Markdown: per set and budget, a family table (with cost) and an episodic-by-depth table."""
    parts = []
    for name, set_tags in tags.items():
        for budget in budgets:
            base_key = f"{name}/hermes/{budget}"
            base = [r[base_key]["outcomes"] for r in all_runs] if base_key in all_runs[0] else None
            fam_cols = (*sb.FAMILIES, "all")
            n = {c: sum(1 for f, _ in set_tags.values() if c in ("all", f)) for c in fam_cols}
            head = " | ".join(f"{c} (n={n[c]})" for c in fam_cols)
            fam = [f"**{name} ({sb.SUITE_S[name]} s), budget {budget}**", "",
                   f"| policy | {head} | KV bytes | ms / chunk |", "|---" * (len(fam_cols) + 3) + "|"]
            dcount = {d: sum(1 for _, t in set_tags.values() if t == d) for d in DEPTH_COLUMNS}
            depth = [f"*{name}, budget {budget}: episodic by depth* (first object; \"just before X\" with X at "
                     "this % of the question time)", "",
                     "| policy | " + " | ".join(f"{d} (n={dcount[d]})" for d in DEPTH_COLUMNS) + " |",
                     "|---" * (len(DEPTH_COLUMNS) + 1) + "|"]
            for label, key in rows_of(all_runs, name, policies, budget):
                runs = [r[key]["outcomes"] for r in all_runs]
                marked = base if base is not None and key != base_key else None
                have = set.intersection(*(set(o) for o in runs + (marked or [])))

                def qids(test):
                    return sorted(q for q, t in set_tags.items() if q in have and test(*t))

                cells = [interval(runs, qids(lambda f, _, c=c: c in ("all", f)), marked) for c in fam_cols]
                first = all_runs[0][key]
                fam.append(f"| {label} | " + " | ".join(cells)
                           + f" | {first['kv_bytes']:,} | {first['ms_per_chunk']:.0f} |")
                cells = [interval(runs, qids(lambda _, t, d=d: t == d), marked) for d in DEPTH_COLUMNS]
                depth.append(f"| {label} | " + " | ".join(cells) + " |")
            parts += ["\n".join(fam), "", "\n".join(depth), ""]
    return "\n".join(parts)


def spread_table(all_runs: list[dict], seeds: list[str]) -> str:
    """Markdown: overall accuracy % of every run per weights file, and the spread (max - min) over them."""
    lines = ["| run | " + " | ".join(f"seed {s}" for s in seeds) + " | spread |", "|---" * (len(seeds) + 2) + "|"]
    for key in all_runs[0]:
        accs = [100 * float(np.mean(list(r[key]["outcomes"].values()))) for r in all_runs]
        lines.append(f"| {key} | " + " | ".join(f"{a:.0f}" for a in accs) + f" | {max(accs) - min(accs):.0f} |")
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def suite_plot(path: Path, all_runs: list[dict], tags: dict[str, dict], policies: list[str], budget: int) -> bool:
    """Accuracy against stream length, one panel per family, one line per policy at `budget` (and `full`),
    each point with its 95 % bootstrap interval; False (no file) when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    names = list(tags)
    lengths = [sb.SUITE_S[n] for n in names]
    fig, axes = plt.subplots(1, len(sb.FAMILIES), figsize=(4 * len(sb.FAMILIES), 3.4), sharey=True)
    for ax, family in zip(axes, sb.FAMILIES):
        for policy in policies:
            xs, ys, err = [], [], [[], []]
            for name, length in zip(names, lengths):
                key = f"{name}/{policy}" + ("" if policy == "full" else f"/{budget}")
                if key not in all_runs[0]:
                    continue
                runs = [r[key]["outcomes"] for r in all_runs]
                have = set.intersection(*(set(o) for o in runs))
                qids = sorted(q for q, (f, _) in tags[name].items() if f == family and q in have)
                if not qids:
                    continue
                acc, lo, hi = bootstrap(runs, qids)
                xs.append(length)
                ys.append(acc)
                err[0].append(acc - lo)
                err[1].append(hi - acc)
            if xs:
                style = {"color": "black", "linestyle": "--"} if policy == "full" else {}
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=policy, **style)
        ax.set_xscale("log")
        ax.minorticks_off()  # the log axis's own minor labels would overlap the lengths
        ax.set_xticks(lengths, [f"{n} s" for n in lengths])
        ax.set_title(family)
        ax.set_xlabel("stream length")
    axes[0].set_ylabel(f"accuracy (%), budget {budget}")
    axes[0].set_ylim(0, 100)
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


PAGE = """# Memory policies on the micro testbed's suite (micro model, CPU)

Weights: {weights}. Suite seed {seed}: {sets}; 1 frame per second, 16 visual tokens per frame.
Each cell: accuracy % [95 % bootstrap interval over questions], pooled over the {n_weights} weights
file(s), each question's verdicts kept together; (+) / (-): the paired difference to `hermes` at the
same budget has a 95 % interval above / below 0 (unmarked: within noise; never marked under
{min_marked} questions). Budgets are visual tokens
per layer (64 = 4 frames). KV bytes: the largest device KV cache over the run's questions; ms / chunk:
the run's wall time less its answers' latency, per 16-frame chunk (first weights file; a shared CPU,
so compare within one page). Episodic questions: one "first object" and one "just before X" per depth
(X at 10 ... 90 % of the question time) per stream. The runs took {run_s} s per weights file (their
wall time, summed); this page took {wall} s (finished runs are read back with `--reuse`).
Reproduce: `python scripts/eval_micro.py {command}`.

{tables}
"""
