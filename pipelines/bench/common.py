"""What every bench suite shares: device synchronisation, synthetic frames, worker processes, tables, result
files, and what a run depended on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from hermes.markdown import table
from hermes.pipelines.frames import Frame


def device_sync(device: torch.device) -> None:
    """Wait for queued kernels on `device` (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_frames(n: int, side_px: int = 448, interval_s: float = 0.5, seed: int = 0,
                     pool: int = 16) -> Iterator[Frame]:
    """`n` random square frames at `interval_s` spacing.

    Content matters neither for speed nor memory, so `pool` frames are drawn once and cycled
    (`frame_pool_reuse`): drawing 1024 full-size frames would cost more than encoding them on a GPU.
    """
    rng = np.random.default_rng(seed)
    frame_pool_reuse = [rng.integers(0, 256, (side_px, side_px, 3), dtype=np.uint8) for _ in range(min(n, pool))]
    for i in range(n):
        yield Frame(i * interval_s, frame_pool_reuse[i % len(frame_pool_reuse)], i)


def spawn_worker(module: str, function: str, params: dict, *, threads: int = 1,
                 env: dict | None = None) -> subprocess.Popen:
    """`hermes.pipelines.bench.<module>.<function>(**params)` in a fresh process with `threads` torch threads
    (peak memory and garbage-collector state then belong to that run alone); `collect_worker` reads its result."""
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    code = (f"import json, torch; torch.set_num_threads({threads}); from hermes.pipelines.bench import {module}; "
            f"print(json.dumps({module}.{function}(**json.loads({json.dumps(json.dumps(params))}))))")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def collect_worker(proc: subprocess.Popen) -> dict:
    """A `spawn_worker` process's JSON result (its last stdout line).

    Raises:
        RuntimeError: the worker failed (the end of its stderr).
    """
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench worker failed ({proc.returncode}): {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def rows_table(rows: list[dict], columns: Sequence[tuple[str, str]] | None = None) -> str:
    """Rows of dicts as a markdown table: `columns` as (key, title) pairs, or every key once under its own name;
    a missing value is "-"; columns holding only numbers are right-aligned."""
    columns = columns or [(k, k) for k in dict.fromkeys(k for r in rows for k in r)]
    cells = [["-" if r.get(k) is None else r[k] for k, _ in columns] for r in rows]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] == "-" for row in cells) for i in range(len(columns))]
    return table([title for _, title in columns], cells, right=numeric)


def write_json_output(path: str | None, payload) -> None:
    """Write `payload` as indented JSON to `path` (`--output`) atomically, if a path was given."""
    if path:
        from hermes.tiers.files import write_bytes_atomic  # a stop mid-rewrite keeps the previous results

        write_bytes_atomic(Path(path), json.dumps(payload, indent=2, default=str).encode())


def print_result(args, record, text: str) -> None:
    """A suite's result: `text` (its table) on stdout, or with --json the record as one JSON line; and the
    record to --output."""
    print(json.dumps(record, default=str) if args.json else text)
    write_json_output(args.output, record)


def run_info(model) -> dict:
    """What the numbers depend on: model, device (and on a CPU, threads and load), dtype, library versions."""
    import transformers

    device = model.device
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        cpuinfo = []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
               platform.machine())
    return {"model": model.name, "family": model.family, "tokens_per_frame": model.tokens_per_frame,
            "device": str(device), "dtype": str(model.dtype).replace("torch.", ""),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
            # CPU timings on a shared machine mean little when the load exceeds the cores
            "cpu_threads": torch.get_num_threads(), "load_avg_1m": round(os.getloadavg()[0], 2),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "weights_mb": sum(p.numel() * p.element_size() for p in model.model.parameters()) / 2**20}
