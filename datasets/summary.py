"""What `summary.json` says about a run: accuracy under both parsers, coverage, cost percentiles, and the
versions and git commit that make the numbers traceable."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .metrics import summarize
from .records import BenchmarkQuestion

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float]) -> dict | None:
    """{"p50", "p90", "p99", "mean", "max", "n"} of `values` (None entries skipped); None when there are none."""
    present = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if present.size == 0:
        return None
    points = np.percentile(present, PERCENTILES)
    out = {f"p{p}": float(v) for p, v in zip(PERCENTILES, points, strict=True)}
    out.update(mean=float(present.mean()), max=float(present.max()), n=int(present.size))
    return out


def cost_figures(samples: Sequence[Mapping]) -> dict:
    """{"ttft_ms", "latency_ms", "hbm_bytes", "hbm_tokens", "dram_bytes", "disk_bytes", "frames_seen"},
    each the `percentiles` of the samples."""
    def memory(key: str) -> list:
        return [(s.get("memory") or {}).get(key) for s in samples]

    return {
        "ttft_ms": percentiles([s.get("ttft_ms") for s in samples]),
        "latency_ms": percentiles([s.get("latency_ms") for s in samples]),
        "hbm_bytes": percentiles(memory("hbm_bytes")),
        "hbm_tokens": percentiles(memory("hbm_tokens")),
        "dram_bytes": percentiles(memory("dram_bytes")),
        "disk_bytes": percentiles(memory("disk_bytes")),
        "frames_seen": percentiles([s.get("frames_seen") for s in samples]),
    }


def accuracy(metric: str, questions: Sequence[BenchmarkQuestion], results: Mapping[str, Mapping]) -> dict:
    """{"official": summarize(...), "strict": summarize(...)}; the judge metric only "official" (both would
    read the judge's verdicts)."""
    out = {"official": summarize(metric, questions, results, key="official")}
    if metric != "judge":
        out["strict"] = summarize(metric, questions, results, key="strict")
    return out


def versions() -> dict:
    """Versions of the packages that decide the numbers (None when not importable)."""
    import platform

    out = {"python": platform.python_version()}
    for module in ("hermes", "torch", "transformers", "numpy", "decord", "cv2"):
        try:
            out[module] = getattr(__import__(module), "__version__", "installed")
        except Exception:  # a missing or broken optional package is reported, not fatal
            out[module] = None
    return out


def git_state() -> dict | None:
    """{"commit", "dirty"} of the hermes source tree, or None outside a git checkout."""
    import hermes

    folder = Path(hermes.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())} if commit else None


def coverage(questions: Sequence[BenchmarkQuestion], results: Mapping[str, Mapping], videos: Mapping) -> dict:
    """Counts of expected, answered and missing questions and videos, with the missing and unreadable ids.

    Args:
        videos: {"expected": n, "missing": [ids], "unreadable": [{"video_id", "error"}]}.
    """
    answered = sum(1 for q in questions if q.qid in results)
    return {
        "questions_expected": len(questions),
        "questions_answered": answered,
        "questions_missing": len(questions) - answered,
        "fraction": answered / len(questions) if questions else None,
        "videos_expected": videos["expected"],
        "videos_missing": len(videos["missing"]),
        "videos_unreadable": len(videos["unreadable"]),
        "missing_videos": list(videos["missing"]),
        "unreadable_videos": list(videos["unreadable"]),
    }


def environment() -> dict:
    """Versions and git state (not the command line: it can hold a judge URL with credentials)."""
    return {"versions": versions(), "git": git_state()}


def input_settings(cfg, model, judge, tasks, variant: str, shard) -> dict:
    """What every reported number was measured with (input resolution alone moves StreamingBench by about 4
    points in peers' reports).

    Returns:
        {"fps", "pixels_per_frame", "frame_size", "tokens_per_frame", "judge", "subset",
        "protocol_variant", "shard"}; a value the model does not state is None.
    """
    side = getattr(model, "image_size", None)
    frame_size = getattr(model, "frame_size", None) or ((side, side) if isinstance(side, int) else None)
    return {
        "fps": cfg.stream.fps,
        "pixels_per_frame": frame_size[0] * frame_size[1] if frame_size else None,
        "frame_size": list(frame_size) if frame_size else None,
        "tokens_per_frame": getattr(model, "tokens_per_frame", None) or None,
        "judge": None if judge is None else f"{judge.describe()['kind']}:{judge.describe()['model']}",  # see judged_by
        "subset": tasks or "all",
        "protocol_variant": variant,
        "shard": None if shard is None else str(shard),
    }
