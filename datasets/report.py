"""`report.md`: a run's summary as a person reads it, with plots of accuracy per task and device memory over
stream time where matplotlib is installed (hermes does not depend on it; without it the report says so)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from hermes.markdown import table

from .results import REPORT_FILE, write_atomic

ACCURACY_PLOT = "accuracy_per_task.png"
MEMORY_PLOT = "memory_over_time.png"
_MIB = 2**20


def pct(value: float | None) -> str:
    """A fraction as a percentage, "n/a" when undefined."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value / scale:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return table(header, rows).split("\n")


def _breakdown(title: str, official: Mapping, strict: Mapping | None) -> list[str]:
    rows = []
    for label, tally in sorted(official.items()):
        other = (strict or {}).get(label, {})
        rows.append([label, tally["expected"], tally["answered"], pct(tally["accuracy"]),
                     pct(other.get("accuracy")) if strict is not None else "-"])
    return [f"## {title}", ""] + _table(["", "questions", "answered", "official", "strict"], rows) + [""]


def render_markdown(summary: Mapping, plots: Sequence[str], notes: Sequence[str]) -> str:
    """The report's markdown for a `summary`, linking `plots` (file names beside it), with extra `notes`."""
    acc = summary["accuracy"]
    official, strict = acc["official"], acc.get("strict")
    cfg = summary["config"]
    lines = [f"# {summary['benchmark']}: {summary['model']} / memory {cfg['memory']['policy']}", ""]
    git = summary["environment"].get("git") or {}
    versions = summary["environment"]["versions"]
    commit = git.get("commit", "unknown")[:12] + (" (dirty)" if git.get("dirty") else "") if git else "unknown"
    settings = summary.get("settings") or {}
    lines += [f"- protocol: {summary['protocol']} ({summary.get('protocol_variant', 'strict')}), "
              f"metric: {summary['metric']}"
              + (f", parser variant: {summary['parser_variant']}" if summary.get("parser_variant") else ""),
              f"- every number below: fps {settings.get('fps')}, pixels per frame {settings.get('pixels_per_frame')}"
              f" ({'x'.join(map(str, settings['frame_size'])) if settings.get('frame_size') else 'not stated'}), "
              f"judge {settings.get('judge') or ', '.join(summary.get('judged_by') or {}) or 'none'}, "
              f"subset {settings.get('subset', 'all')}"
              + (f", shard {settings['shard']}" if settings.get("shard") else ""),
              f"- finished {summary['finished_at']}, wall time {summary['wall_time_s']:.1f} s, git {commit}",
              "- " + ", ".join(f"{k} {versions.get(k)}" for k in ("hermes", "torch", "transformers")), ""]
    rows = _leaderboard_rows(official, strict) if "leaderboard" in official else []
    rows.append(["overall" + (" (every question; missing or letterless count wrong)" if rows else ""),
                 pct(official["overall"]), pct(strict["overall"]) if strict else "-"])
    if "m_avg" in official:
        rows.append(["M-Avg", pct(official["m_avg"]), pct(strict["m_avg"]) if strict else "-"])
    if official.get("mean_score") is not None:
        rows.append(["mean judge score (0-5)", f"{official['mean_score']:.2f}", "-"])
    if "rekv_accuracy" in official:  # RVS as ReKV scores it
        rows.append(["ReKV yes/(yes+no) (official)", pct(official["rekv_accuracy"]), "-"])
        rows.append(["ReKV mean score (official)", _num(official["rekv_mean_score"], digits=2), "-"])
    lines += ["## Accuracy", ""] + _table(["", "official parser", "strict parser"], rows) + [""]
    lines += _breakdown("Per task", official["per_task"], strict["per_task"] if strict else None)
    if "per_category" in official:
        lines += _breakdown("Per category", official["per_category"], strict["per_category"] if strict else None)
    if "per_category" in official and summary.get("benchmark") == "ovo-bench":
        backward = official["per_category"].get("backward", {})
        lines += ["- memory-dependent subset (OVO backward tracing): " + pct(backward.get("accuracy")), ""]
    lines += _coverage_lines(summary["coverage"])
    lines += _issue_lines(summary.get("data_issues"))
    lines += _cost_lines(summary["cost"])
    if plots:
        lines += ["## Plots", ""] + [f"![{name.removesuffix('.png')}]({name})" for name in plots] + [""]
    all_notes = list(summary.get("notes", [])) + list(notes)
    if all_notes:
        lines += ["## Notes", ""] + [f"- {note}" for note in all_notes] + [""]
    lines += ["## Config", "", "```json", json.dumps(cfg, indent=2), "```", ""]
    if summary.get("judge"):
        judge = {k: v for k, v in summary["judge"].items() if k not in ("system", "user_template")}
        lines += ["## Judge", "", "```json", json.dumps(judge, indent=2), "```", ""]
    return "\n".join(lines)


def _leaderboard_rows(official: Mapping, strict: Mapping | None) -> list[list[str]]:
    """Video-MME's leaderboard numbers (eval_your_results.py: over replies with a letter), entire set first."""
    board, other = official["leaderboard"], (strict or {}).get("leaderboard", {})
    rows = [[f"Video-MME leaderboard (eval_your_results.py; {board['extracted']} with a letter)",
             pct(board["overall"]), pct(other.get("overall")) if strict else "-"]]
    for bucket, tally in board["per_duration"].items():
        theirs = other.get("per_duration", {}).get(bucket, {})
        rows.append([f"leaderboard {bucket} ({tally['extracted']} with a letter)", pct(tally["accuracy"]),
                     pct(theirs.get("accuracy")) if strict else "-"])
    return rows


def _coverage_lines(cov: Mapping) -> list[str]:
    answered = (f"- questions answered: {cov['questions_answered']} of {cov['questions_expected']} "
                f"({pct(cov['fraction'])}); {cov['questions_missing']} missing count as wrong")
    videos = (f"- videos: {cov['videos_expected']} selected, {cov['videos_missing']} not on disk, "
              f"{cov['videos_unreadable']} unreadable")
    lines = ["## Coverage", "", answered, videos]
    shown = 20  # a long list of ids helps nobody in a report; summary.json has them all
    if cov["missing_videos"]:
        more = len(cov["missing_videos"]) - shown
        tail = f" (+{more} more)" if more > 0 else ""
        lines.append("- not on disk: " + ", ".join(cov["missing_videos"][:shown]) + tail)
    for item in cov["unreadable_videos"][:shown]:
        lines.append(f"- unreadable {item['video_id']}: {item['error']}")
    return lines + [""]


def _issue_lines(issues: Mapping | None) -> list[str]:
    if not issues or not (issues["flagged"] or issues["excluded"]):
        return []
    lines = ["## Annotation issues", "", f"- flagged (kept, scoring unaffected): {issues['flagged']} "
             f"{dict(issues['flagged_by_field'])}", f"- excluded from the denominator: {issues['excluded']}"]
    shown = 20
    for item in issues["excluded_items"][:shown]:
        lines.append(f"  - {item['where']}: {item['reason']}")
    for item in issues["flagged_items"][:shown]:
        lines.append(f"  - flagged {item['where']}: {item['field']} {item['value']!r}: {item['reason']}")
    return lines + ["", "summary.json `data_issues` lists them (the first 200 of each kind)."]


def _cost_lines(cost: Mapping) -> list[str]:
    rows = []
    for key, label, scale, digits in (("ttft_ms", "TTFT (ms)", 1, 1), ("latency_ms", "latency (ms)", 1, 1),
                                      ("hbm_bytes", "device memory (MiB)", _MIB, 2),
                                      ("hbm_tokens", "device tokens", 1, 0), ("frames_seen", "frames seen", 1, 0)):
        p = cost.get(key)
        if p:
            rows.append([label] + [_num(p[k], scale, digits) for k in ("p50", "p90", "p99", "max")])
    if not rows:
        return []
    return ["## Cost per question", ""] + _table(["", "p50", "p90", "p99", "max"], rows) + [""]


def draw_plots(folder: Path, summary: Mapping, samples: Sequence[Mapping]) -> tuple[list[str], list[str]]:
    """Draw the accuracy and memory plots as PNGs in `folder`; (file names, notes: why none was drawn)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never open a window
        import matplotlib.pyplot as plt
    except ImportError:
        return [], ["plots skipped: matplotlib is not installed (pip install matplotlib)"]
    written = []
    per_task = summary["accuracy"]["official"]["per_task"]
    if per_task:
        strict = (summary["accuracy"].get("strict") or {}).get("per_task", {})
        tasks = sorted(per_task)
        fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(tasks) + 2), 3.5))
        xs = range(len(tasks))
        ax.bar([x - 0.2 for x in xs], [100 * (per_task[t]["accuracy"] or 0) for t in tasks], 0.4, label="official")
        if strict:
            ax.bar([x + 0.2 for x in xs], [100 * (strict[t]["accuracy"] or 0) for t in tasks], 0.4, label="strict")
        ax.set_xticks(list(xs), tasks, rotation=45, ha="right")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / ACCURACY_PLOT, dpi=120)
        plt.close(fig)
        written.append(ACCURACY_PLOT)
    by_video: dict[str, list[tuple[float, float]]] = {}
    for order, s in enumerate(samples):
        hbm = (s.get("memory") or {}).get("hbm_bytes")
        if hbm is not None:
            x = s["at_s"] if s.get("at_s") is not None else float(order)
            by_video.setdefault(str(s.get("video_id")), []).append((x, hbm / _MIB))
    if by_video:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        shown = sorted(by_video.items())[:20]  # more lines than that are unreadable
        for video, points in shown:
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1, label=video)
        if len(shown) <= 8:
            ax.legend(fontsize="small")
        # From zero: autoscaled, a bounded memory's flat series (a few bytes apart, or equal) filled the
        # axis and its noise looked like swings; memory is read against nothing held.
        top_mib = max(p[1] for _, points in shown for p in points)
        ax.set_ylim(0, 1.1 * top_mib if top_mib > 0 else 1.0)
        streaming = summary["protocol"] == "streaming"
        ax.set_xlabel("question time (s)" if streaming else "question (order)")
        ax.set_ylabel("device KV memory (MiB)")
        ax.set_title("memory when each question is answered")
        fig.tight_layout()
        fig.savefig(folder / MEMORY_PLOT, dpi=120)
        plt.close(fig)
        written.append(MEMORY_PLOT)
    return written, []


def write_report(folder: Path, summary: Mapping, samples: Sequence[Mapping]) -> Path:
    """Draw the plots (when possible) and write `report.md` into `folder`; returns its path."""
    plots, notes = draw_plots(folder, summary, samples)
    path = folder / REPORT_FILE
    write_atomic(path, render_markdown(summary, plots, notes))
    return path
