"""Reports of `hermes-video bench`: markdown tables, JSON rows, and what a run depended on.

`pipelines/bench.py` measures; this module only formats. Tables pick their columns from one
registry (`_COLUMNS`: header and number format per `StreamRow` field), so `bench memory` and
`bench sweep` print the same numbers the same way; a missing value (no CUDA, no `full` row) is "-".
"""

from __future__ import annotations

import time
from dataclasses import asdict

import torch

from hermes.markdown import spread_cell, table
from hermes.pipelines.bench.memory import OverheadRow, StreamRow, SweepResult


# (header, row field, format) per column; "-" where a value is None
_COLUMNS = {
    "policy": ("policy", "{}"), "chunk_frames": ("chunk", "{}"), "frames": ("frames", "{}"),
    "cache_tokens": ("cache tokens", "{}"), "peak_kv_mb": ("peak KV MiB", "{:.1f}"),
    "peak_device_mb": ("peak device MiB", "{:.0f}"), "ttft_ms": ("TTFT ms", "{:.1f}"),
    "ttft_vs_full": ("TTFT vs full", "{:.2f}"), "tpot_ms": ("TPOT ms", "{:.1f}"), "recall_ms": ("recall ms", "{:.1f}"),
    "encode_ms_per_chunk": ("encode ms/chunk", "{:.1f}"), "maintain_ms_per_chunk": ("maintain ms/chunk", "{:.1f}"),
    "maintain_ratio": ("maintain / encode", "{:.3f}"), "amortised_maintain_ratio": ("amortised", "{:.3f}"),
    "ingest_ms_per_evicting_chunk": ("encode + maintain ms (evicting)", "{:.1f}"),
    "ingest_fps": ("ingest fps", "{:.1f}"),
    "ingest_fps_vs_full": ("fps vs full", "{:.2f}"), "peak_kv_vs_full": ("KV vs full", "{:.3f}"),
}
# a ratio with its spread over repeats: "min / median / max" from `<field>_min`, `<field>`, `<field>_max`
_SPREAD_COLUMNS = {"ttft_vs_full_spread": ("TTFT vs full, min / median / max", "ttft_vs_full", "{:.2f}"),
                   "ingest_fps_vs_full_spread": ("fps vs full, min / median / max", "ingest_fps_vs_full", "{:.2f}")}
MEMORY_COLUMNS = ["policy", "frames", "cache_tokens", "peak_kv_mb", "peak_device_mb", "ttft_ms", "ttft_vs_full_spread",
                  "encode_ms_per_chunk", "maintain_ms_per_chunk", "maintain_ratio", "amortised_maintain_ratio"]
SWEEP_COLUMNS = ["policy", "chunk_frames", "frames", "cache_tokens", "peak_kv_mb", "peak_device_mb", "ttft_ms",
                 "ttft_vs_full", "tpot_ms", "recall_ms", "encode_ms_per_chunk", "maintain_ms_per_chunk",
                 "maintain_ratio", "amortised_maintain_ratio", "ingest_ms_per_evicting_chunk", "ingest_fps",
                 "ingest_fps_vs_full"]


def markdown_table(rows: list[StreamRow], columns: list[str] = SWEEP_COLUMNS) -> str:
    """The rows as a markdown table with the given columns (`SWEEP_COLUMNS` or `MEMORY_COLUMNS`)."""
    cells = [[_cell(r, c) for c in columns] for r in rows]
    headers = [_SPREAD_COLUMNS[c][0] if c in _SPREAD_COLUMNS else _COLUMNS[c][0] for c in columns]
    return table(headers, cells, right=[c != "policy" for c in columns])


def _cell(row: StreamRow, column: str) -> str:
    if column in _SPREAD_COLUMNS:
        _, field, fmt = _SPREAD_COLUMNS[column]
        return spread_cell([getattr(row, name) for name in (f"{field}_min", field, f"{field}_max")], fmt)
    value = getattr(row, column)
    return "-" if value is None else _COLUMNS[column][1].format(value)


def overhead_table(rows: list[OverheadRow]) -> str:
    """`bench overhead`'s rows as markdown: the paired overhead (min / median / max over repeats) beside the
    per-chunk encode and maintenance of both policies."""
    cells = [[r.geometry, r.budget, r.frames, r.paired_chunks,
              spread_cell([r.overhead_min, r.overhead_median, r.overhead_max]),
              f"{r.encode_ms:.1f}", f"{r.maintain_ms:.1f}", f"{r.baseline_encode_ms:.1f}", f"{r.baseline_maintain_ms:.1f}"]
             for r in rows]
    policy, baseline = (rows[0].policy, rows[0].baseline) if rows else ("policy", "baseline")
    header = ["geometry", "budget", "frames", "paired chunks", f"{policy} over {baseline}, min / median / max",
              f"{policy} encode ms", f"{policy} maintain ms", f"{baseline} encode ms", f"{baseline} maintain ms"]
    return table(header, cells, right=[False] + [True] * (len(header) - 1))


def rows_as_dicts(rows: list[StreamRow]) -> list[dict]:
    return [asdict(r) for r in rows]


def rows_from_dicts(items: list[dict]) -> list[StreamRow]:
    """Rows read back from `rows_as_dicts` output (a sweep JSON's "rows")."""
    return [StreamRow(**item) for item in items]


def run_info(model) -> dict:
    """What the numbers depend on: model, device (and on a CPU, threads and load), dtype, library versions."""
    import os
    import platform

    import transformers

    device = model.device
    cpu = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo")
                if line.startswith("model name")), platform.machine())
    return {"model": model.name, "family": model.family, "tokens_per_frame": model.tokens_per_frame,
            "device": str(device), "dtype": str(model.dtype).replace("torch.", ""),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
            # CPU timings on a shared machine mean little when the load exceeds the cores
            "cpu_threads": torch.get_num_threads(), "load_avg_1m": round(os.getloadavg()[0], 2),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "weights_mb": sum(p.numel() * p.element_size() for p in model.model.parameters()) / 2**20}


def _read_lines(path: str) -> list[str]:
    try:
        return open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return []


def report_markdown(meta: dict, result: SweepResult, columns: list[str] = SWEEP_COLUMNS) -> str:
    """A self-describing markdown report: what ran where, the table, and the notes."""
    keys = ("model", "device", "device_name", "cpu_threads", "load_avg_1m", "dtype", "tokens_per_frame", "budget",
            "decode_tokens", "repeats", "frame_px", "torch", "transformers", "date", "command")
    lines = [f"- {k}: {meta[k]}" for k in keys if meta.get(k) is not None]
    lines += ["", markdown_table(result.rows, columns)]
    if result.notes:
        lines += [""] + [f"- note: {n}" for n in result.notes]
    return "\n".join(lines) + "\n"
