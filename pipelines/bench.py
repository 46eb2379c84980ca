"""`hermes-video bench`: performance of memory policies, measured in one run so ratios are comparable.

`bench memory` streams N random frames through a model under each policy and reports, per stream
length: the KV cache's peak bytes (and peak device memory on CUDA), time to first token of a
question asked at the end (median of repeats), and per-chunk encode and maintenance time.

On a CPU the default model is the tiny random LLaVA-OneVision at 16 visual tokens per frame, so a
`full` cache over 2048 frames stays computable; ratios against `full` are what to read, absolute
times only mean something on a GPU with a real-size model.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from hermes.config import MemoryConfig
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession

BENCH_QUESTION = "What is happening in the video?"


@dataclass
class MemoryBenchRow:
    """One (policy, stream length) measurement."""

    policy: str
    frames: int
    cache_tokens: int  # tokens per layer at the end
    peak_cache_mb: float  # largest KV cache over the stream
    peak_device_mb: float | None  # torch.cuda.max_memory_allocated, CUDA only
    ttft_ms: float  # median over repeats, question asked after the last frame
    encode_ms_per_chunk: float  # mean vision + prefill time per chunk
    maintain_ms_per_chunk: float  # mean maintenance time per chunk once eviction runs (0 if never)
    maintain_ratio: float  # maintain / encode over the chunks that evicted


def synthetic_frames(n: int, size: tuple[int, int] = (32, 32), interval_s: float = 0.5, seed: int = 0):
    """`n` random frames (content does not matter for speed or memory)."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield Frame(i * interval_s, rng.integers(0, 256, (*size, 3), dtype=np.uint8), i)


def bench_memory_one(model, memory: MemoryConfig, frames: int, *, chunk_frames: int = 16,
                     repeats: int = 3) -> MemoryBenchRow:
    """Stream `frames` random frames under `memory` and measure it.

    Args:
        model: a loaded adapter.
        memory: the memory policy configuration.
        frames: stream length in frames.
        chunk_frames: frames per chunk.
        repeats: questions asked at the end; the median time to first token is reported.

    Returns:
        The measured `MemoryBenchRow`.
    """
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    session = StreamingSession(model, memory, synthetic_frames(frames), chunk_frames=chunk_frames,
                               max_new_tokens=1)
    session.advance()
    ttfts = [session.ask(BENCH_QUESTION).ttft_ms for _ in range(repeats)]
    evicting = [c for c in session.chunk_stats if c.maintain_ms > 0]
    encode = statistics.fmean(c.encode_ms for c in session.chunk_stats)
    maintain = statistics.fmean(c.maintain_ms for c in evicting) if evicting else 0.0
    ratio = (sum(c.maintain_ms for c in evicting) / sum(c.encode_ms for c in evicting)) if evicting else 0.0
    if cuda:
        torch.cuda.synchronize()
    return MemoryBenchRow(
        policy=memory.policy, frames=frames, cache_tokens=session.cache.num_tokens,
        peak_cache_mb=session.peak_cache_bytes / 2**20,
        peak_device_mb=torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        ttft_ms=statistics.median(ttfts), encode_ms_per_chunk=encode, maintain_ms_per_chunk=maintain,
        maintain_ratio=ratio)


def bench_memory(model, memories: list[MemoryConfig], lengths: list[int], *, chunk_frames: int = 16,
                 progress: bool = False) -> list[MemoryBenchRow]:
    """Every policy at every stream length, after one warm-up run (first calls pay one-off costs)."""
    bench_memory_one(model, memories[0], min(lengths), chunk_frames=chunk_frames, repeats=1)
    rows = []
    for memory in memories:
        for frames in lengths:
            start = time.perf_counter()
            rows.append(bench_memory_one(model, memory, frames, chunk_frames=chunk_frames))
            if progress:
                print(f"  {memory.policy:<8} {frames:>5} frames  {time.perf_counter() - start:6.1f} s",
                      file=sys.stderr, flush=True)
    return rows


def markdown_table(rows: list[MemoryBenchRow]) -> str:
    """The rows as a markdown table, with TTFT and peak cache relative to `full` at the same length."""
    full = {r.frames: r for r in rows if r.policy == "full"}
    lines = ["| policy | frames | cache tokens | peak KV MiB | TTFT ms | TTFT vs full | encode ms/chunk | "
             "maintain ms/chunk | maintain / encode |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ref = full.get(r.frames)
        vs = f"{r.ttft_ms / ref.ttft_ms:.2f}" if ref else "-"
        lines.append(f"| {r.policy} | {r.frames} | {r.cache_tokens} | {r.peak_cache_mb:.1f} | {r.ttft_ms:.1f} | "
                     f"{vs} | {r.encode_ms_per_chunk:.1f} | {r.maintain_ms_per_chunk:.1f} | {r.maintain_ratio:.3f} |")
    return "\n".join(lines)


def rows_as_dicts(rows: list[MemoryBenchRow]) -> list[dict]:
    return [asdict(r) for r in rows]
