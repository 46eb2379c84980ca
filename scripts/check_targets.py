"""Check a `hermes-video bench sweep` JSON against Issue G's performance targets; print a markdown verdict.

    python scripts/check_targets.py runs/device_bench/llava-ov-7b.json [--policy hermes] [--chunk 16]

Targets (LLaVA-OV-7B at a 4K budget on an H100/H200-class GPU, `hermes`): the constants below, each
printed with its measurement by `evaluate`. The cost of remembering is an evicting chunk's encode plus
maintenance over `sliding`'s, since the probe rides in hermes's prefill (`maintain_ratio` alone misses it).

Exit code 0 when every target holds, 1 when one fails, 2 when the file holds no matching rows.
Standard library only, so it runs anywhere the JSON is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TTFT_MS_MAX = 30.0
TTFT_FLAT = 1.10  # longest / shortest stream
MEMORY_FLAT = 1.05
OVERHEAD_MAX = 0.10  # hermes's ingest over sliding's, minus one
SIXTEEN_FRAMES_S_MAX = 2.0


def overhead_over_baseline(mine: list[dict], rows: list[dict], baseline: str = "sliding") -> list[float]:
    """Per stream length where both evicted: `mine`'s encode + maintenance per evicting chunk over the
    baseline's at the same chunk size and length, minus one."""
    theirs = {(r["chunk_frames"], r["frames"]): r.get("ingest_ms_per_evicting_chunk") for r in rows
              if r["policy"] == baseline}
    out = []
    for r in mine:
        reference = theirs.get((r["chunk_frames"], r["frames"]))
        if r.get("ingest_ms_per_evicting_chunk") and reference:
            out.append(r["ingest_ms_per_evicting_chunk"] / reference - 1.0)
    return out


def evaluate(rows: list[dict], policy: str = "hermes", chunk_frames: int = 16) -> list[tuple[str, str, bool]]:
    """(target, measured, holds) per target, from the rows of one policy at one chunk size (and `sliding`'s).

    Raises:
        ValueError: no rows for that policy and chunk size.
    """
    mine = sorted((r for r in rows if r["policy"] == policy and r["chunk_frames"] == chunk_frames),
                  key=lambda r: r["frames"])
    if not mine:
        raise ValueError(f"no rows for policy {policy!r} at chunks of {chunk_frames}")
    first, last = mine[0], mine[-1]
    span = f"{first['frames']}->{last['frames']} frames"
    ttfts = [r["ttft_ms"] for r in mine]
    memory_key = "peak_device_mb" if all(r["peak_device_mb"] is not None for r in mine) else "peak_kv_mb"
    memory = [r[memory_key] for r in mine]
    overheads = overhead_over_baseline(mine, rows)
    per16_s = [(r["encode_ms_per_chunk"] + r["maintain_ms_per_chunk"]) / 1e3 * 16 / chunk_frames for r in mine]
    return [
        (f"TTFT <= {TTFT_MS_MAX:g} ms at every length", f"max {max(ttfts):.1f} ms", max(ttfts) <= TTFT_MS_MAX),
        (f"TTFT flat ({span}, within {TTFT_FLAT - 1:.0%})", f"{ttfts[-1]:.1f} / {ttfts[0]:.1f} ms",
         ttfts[-1] <= TTFT_FLAT * ttfts[0]),
        (f"peak memory flat within {MEMORY_FLAT - 1:.0%} ({memory_key}, {span})",
         f"max / min {max(memory) / min(memory):.3f}", max(memory) <= MEMORY_FLAT * min(memory)),
        (f"ingest <= {OVERHEAD_MAX:.0%} over sliding's (encode + maintenance per evicting chunk, probe included)",
         f"worst {max(overheads):+.3f}" if overheads else "no length where both evicted",
         bool(overheads) and max(overheads) <= OVERHEAD_MAX),
        (f"16 frames encoded + maintained <= {SIXTEEN_FRAMES_S_MAX:g} s", f"worst {max(per16_s):.2f} s",
         max(per16_s) <= SIXTEEN_FRAMES_S_MAX),
    ]


def verdict_markdown(data: dict, results: list[tuple[str, str, bool]], policy: str, chunk_frames: int) -> str:
    """The verdict as a markdown table under a line naming the run."""
    head = (f"Targets for `{policy}` at chunks of {chunk_frames}: {data.get('model')} on {data.get('device_name')} "
            f"({data.get('dtype')}), budget {data.get('budget')}, {data.get('date')}")
    lines = [head, "", "| target | measured | holds |", "|---|---:|:---:|"]
    lines += [f"| {t} | {m} | {'yes' if ok else 'NO'} |" for t, m, ok in results]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_json", type=Path)
    parser.add_argument("--policy", default="hermes")
    parser.add_argument("--chunk", type=int, default=16, help="chunk size the targets are read at (default 16)")
    args = parser.parse_args(argv)
    data = json.loads(args.sweep_json.read_text())
    try:
        results = evaluate(data["rows"], args.policy, args.chunk)
    except ValueError as exc:
        print(f"check_targets: {exc}", file=sys.stderr)
        return 2
    print(verdict_markdown(data, results, args.policy, args.chunk), end="")
    return 0 if all(ok for _, _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
