"""The micro testbed's sweep: every policy on the suite's sets, each number with a 95 % bootstrap interval.

This module holds the sweep's sets, tables and statistics (`bootstrap`, also the other pages' interval)
and loads no model; `eval_micro.sweep` runs the grid. It imports nothing from `eval_micro`.

    python scripts/eval_micro.py --sweep                      # the standard sweep (see README for its cost)
    python scripts/eval_micro.py --quick --md /tmp/Q.md       # a CI smoke run (seconds)

Sets are `hermes.datasets.synthetic_bench`'s suite (`SUITE_S`); what each cell shows is on the page
(`PAGE`).
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
    "recent-frames": ("recent-frames", None, {}), "rekv": ("rekv", None, {}), "dscache": ("dscache", "dscache", {}),
    "recall-only": ("recall-only", None, {}), "hermes": ("hermes", None, {}),
    "hermes+recall": ("hermes+recall", None, {}), "hermes-plus": ("hermes", "hermes-plus", {}),
    "hermes-4k": ("hermes", "hermes-4k", {}), "hermes-recall": ("hermes", "hermes-recall", {}),
    "hermes+sum": ("hermes", None, {"accumulation": "sum"}),
    # ours, opt-in (--sweep-policies): hermes+recall with the per-question recall gate (hermes.recall_gate)
    "hermes+recall+gate=frames": ("hermes+recall", None, {"recall_gate": "above_frames"}),
    "hermes+recall+gate=level1": ("hermes+recall", None, {"recall_gate": "above_level1"}),
}


def policy_of(label: str) -> tuple[str, str | None, dict]:
    """(bench policy spec, preset, options) of a label: a `POLICIES` name, optionally followed by memory
    settings, ``hermes-4k:recent_keep=0.25:accumulation=sum`` (values read as YAML scalars).

    Raises:
        KeyError: an unknown policy name.
    """
    import yaml

    name, *settings = label.split(":")
    spec, preset, options = POLICIES[name]
    extra = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in settings)}
    return spec, preset, {**options, **extra}


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


def suite_set(work: Path, name: str, seed: int, num_videos: int, memory_kinds: bool = False) -> Path:
    """The set `name` under `work`, written unless a finished copy with the same arguments is there
    (`memory_kinds`: with issue 37's memory kinds, in a folder of its own)."""
    root = work / f"suite-{seed}" / f"{name}-{num_videos}{'-memory' if memory_kinds else ''}"
    recorded = {"suite": name, "seed": seed, "num_videos": num_videos} | ({"memory_kinds": True} if memory_kinds else {})
    return written(root, recorded, lambda: sb.write_suite_set(root, name, seed=seed, num_videos=num_videos,
                                                              memory_kinds=memory_kinds))


# a memory kind's depth tag names its kind ("after 30"), so the "just before X" columns ("30") stay its own
MEMORY_TAGS = {"episodic_after": "after", "ordering_pair": "pair", "episodic_recent": "recent"}
MEMORY_BINS = ((10, 30), (40, 60), (70, 90))  # depth bins (% of the question time) of the memory-kinds table


def question_tags(root: Path) -> dict[str, tuple[str, str]]:
    """{qid as run_eval names it: (family, depth tag or "")} of one suite set: "first", "10" ... "90" for
    "just before X", "after 10", "pair 10", "recent 10" ... for the memory kinds."""
    tags = {}
    for e in json.loads((root / sb.ANNOTATION_FILE).read_text()):
        if e["task"] == "REC":
            tags.update({f"ovo-{e['id']}-{i}": ("counting", "") for i in range(len(e["test_info"]))})
        elif e.get("kind") in MEMORY_TAGS:
            tags[f"ovo-{e['id']}"] = (e["family"], f"{MEMORY_TAGS[e['kind']]} {e['depth']}")
        else:
            tags[f"ovo-{e['id']}"] = (e["family"], e.get("depth", ""))
    return tags


def memory_kinds_in(set_tags: dict[str, tuple[str, str]]) -> list[str]:
    """The memory kinds' tags ("after", "pair", "recent") a set's questions carry, in `MEMORY_TAGS`' order."""
    present = {d.split()[0] for _, d in set_tags.values() if " " in d}
    return [kind for kind in MEMORY_TAGS.values() if kind in present]


def memory_columns(set_tags: dict[str, tuple[str, str]]) -> dict[str, object]:
    """{column: test on a question's (family, depth tag)} of the memory kinds a set holds, by depth bin."""
    return {f"{kind} {lo}-{hi}": (lambda f, d, kind=kind, lo=lo, hi=hi: d.startswith(kind + " ")
                                  and lo <= int(d.split()[1]) <= hi)
            for kind in memory_kinds_in(set_tags) for lo, hi in MEMORY_BINS}


def cost(out: Path, chunk_frames: int, wall_s: float) -> dict[str, float]:
    """From samples.jsonl: device KV bytes (largest over the run's questions: level 1 and, with recall,
    the tokens spliced for the answer), ms per streamed chunk, and the median time to the first token
    (recall included, as a user waits for it)."""
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    frames: dict[str, int] = {}
    for s in samples:
        frames[s["video_id"]] = max(frames.get(s["video_id"], 0), int(s.get("frames_seen") or 0))
    chunks = sum(math.ceil(n / chunk_frames) for n in frames.values())
    recall_ms = lambda s: float((s.get("recall") or {}).get("recall_ms") or 0)  # noqa: E731 - before the answer
    answering_s = sum(float(s.get("latency_ms") or 0) + recall_ms(s) for s in samples) / 1000

    def kv_bytes(s: dict) -> int:
        memory, recalled = s.get("memory") or {}, int((s.get("recall") or {}).get("tokens") or 0)
        held, tokens = int(memory.get("hbm_bytes") or 0), int(memory.get("hbm_tokens") or 0)
        return held + (held // tokens * recalled if tokens else 0)  # bytes per token of every layer

    return {"kv_bytes": max(map(kv_bytes, samples)),
            "ms_per_chunk": 1000 * max(0.0, wall_s - answering_s) / max(1, chunks),
            "ttft_ms": float(np.median([float(s.get("ttft_ms") or 0) + recall_ms(s) for s in samples]))}


def run_key(name: str, policy: str, budget: int) -> str:
    """A run's key in the results: "<set>/<policy>/<budget>", or "<set>/full" (it ignores the budget)."""
    return f"{name}/{policy}" + ("" if policy == "full" else f"/{budget}")


def run_dir(runs: Path, key: str) -> Path:
    """The folder of the run `key` under `runs` (its slashes and odd characters made safe)."""
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
    out, args = [], iter(argv)
    for arg in args:
        if arg == "--note":
            next(args, None)
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
    return [(p if p == "full" else f"{p} @{budget}", run_key(name, p, budget))
            for p in policies if run_key(name, p, budget) in all_runs[0]]


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
            mem_cols = memory_columns(set_tags)
            mcount = {c: sum(1 for t in set_tags.values() if test(*t)) for c, test in mem_cols.items()}
            memory = [(f"*{name}, budget {budget}: memory kinds by depth* (just after X, which of two came first "
                       "(X the earlier), a rare colour in the last N s (its newest object); % of the question time)"),
                      "", "| policy | " + " | ".join(f"{c} (n={mcount[c]})" for c in mem_cols) + " |",
                      "|---" * (len(mem_cols) + 1) + "|"]
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
                cells = [interval(runs, qids(test), marked) for test in mem_cols.values()]
                memory.append(f"| {label} | " + " | ".join(cells) + " |")
            parts += ["\n".join(fam), "", "\n".join(depth), ""] + (["\n".join(memory), ""] if mem_cols else [])
    return "\n".join(parts)


MIDDLE_PCT = (30, 70)  # "middle": "just before X" with X at 30 ... 70 % of the question time
SUMMARY_COLUMNS = {  # column -> test on a question's (family, depth tag)
    "realtime": lambda f, d: f == "realtime",
    "first": lambda f, d: d == "first",
    "middle": lambda f, d: d.isdigit() and MIDDLE_PCT[0] <= int(d) <= MIDDLE_PCT[1],
    "just before X": lambda f, d: d.isdigit(),
}


def summary_table(all_runs: list[dict], tags: dict[str, dict], policies: list[str], budget: int) -> str:
    """Markdown, per set: one row per policy with real-time and backward questions by depth (correct / asked,
    and accuracy % [95 % interval], pooled over weights files), KV bytes, ms per chunk and median TTFT (the
    first weights file's)."""
    parts = []
    for name, set_tags in tags.items():
        columns = SUMMARY_COLUMNS | {kind: (lambda f, d, kind=kind: d.startswith(kind + " "))
                                     for kind in memory_kinds_in(set_tags)}
        lines = [f"**Summary, {name} ({sb.SUITE_S[name]} s), budget {budget}**", "",
                 "| policy | " + " | ".join(columns) + " | KV bytes | ms / chunk | TTFT ms |",
                 "|---" * (len(columns) + 4) + "|"]
        for policy in policies:
            key = run_key(name, policy, budget)
            if key not in all_runs[0]:
                continue
            runs = [r[key]["outcomes"] for r in all_runs]
            have = set.intersection(*(set(o) for o in runs))
            cells = []
            for test in columns.values():
                qids = sorted(q for q, (f, d) in set_tags.items() if q in have and test(f, d))
                correct = sum(r[q] for r in runs for q in qids)
                cells.append(f"{correct}/{len(qids) * len(runs)}, {interval(runs, qids, None)}")
            first = all_runs[0][key]
            lines.append(f"| {policy} | " + " | ".join(cells) + f" | {first['kv_bytes']:,} | "
                         f"{first['ms_per_chunk']:.0f} | {first.get('ttft_ms', 0):.1f} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def spread_table(all_runs: list[dict], seeds: list[str]) -> str:
    """Markdown: overall accuracy % of every run per weights file, and the spread (max - min) over them."""
    lines = ["| run | " + " | ".join(f"seed {s}" for s in seeds) + " | spread |", "|---" * (len(seeds) + 2) + "|"]
    for key in all_runs[0]:
        accs = [100 * float(np.mean(list(r[key]["outcomes"].values()))) for r in all_runs]
        lines.append(f"| {key} | " + " | ".join(f"{a:.0f}" for a in accs) + f" | {max(accs) - min(accs):.0f} |")
    return "\n".join(lines)


def family_panels(path: Path, draw, xlabel: str, ylabel: str, legend_size: int) -> bool:
    """A PNG with one accuracy panel per question family, `draw(ax, family)` filling each (matplotlib's
    file-only Agg backend); False (no file) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(sb.FAMILIES), figsize=(4 * len(sb.FAMILIES), 3.4), sharey=True)
    for ax, family in zip(axes, sb.FAMILIES):
        draw(ax, family)
        ax.set_title(family)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(ylabel)
    axes[0].set_ylim(0, 100)
    axes[-1].legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def suite_plot(path: Path, all_runs: list[dict], tags: dict[str, dict], policies: list[str], budget: int) -> bool:
    """Accuracy against stream length, one panel per family, one line per policy at `budget` (and `full`),
    each point with its 95 % bootstrap interval; False (no file) when matplotlib is missing."""
    names = list(tags)
    lengths = [sb.SUITE_S[n] for n in names]

    def draw(ax, family: str) -> None:
        for policy in policies:
            xs, ys, err = [], [], [[], []]
            for name, length in zip(names, lengths):
                key = run_key(name, policy, budget)
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

    return family_panels(path, draw, "stream length", f"accuracy (%), budget {budget}", 7)


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
