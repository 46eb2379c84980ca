"""`bench memory`, `bench sweep` and `bench overhead`: speed and memory of memory policies.

One stream measurement (`measure_stream`) serves all three: random frames through a `StreamingSession`,
a row at each checkpoint length, every interval closed by a device synchronisation and answers forced
to one length (docs/ARCHITECTURE.md, Performance). Ratios are against `full` at the same chunk size.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch

from hermes.config import MemoryConfig, load_preset, preset_names
from hermes.errors import ConfigError, UsageError
from hermes.markdown import spread_cell, table
from hermes.memory import HermesPolicy, SlidingPolicy
from hermes.pipelines.bench.common import device_sync, synthetic_frames
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.policies import POLICIES

BENCH_QUESTION = "What is happening in the video?"
OutOfMemory = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


@dataclass
class StreamRow:
    """One (policy, chunk size, stream length) measurement. Times in ms, sizes in MiB."""

    policy: str  # the policy spec, e.g. "hermes" or "hermes+recall"
    chunk_frames: int
    frames: int  # stream length when measured
    budget: int | None  # visual tokens per layer kept by bounded policies (None: `full`)
    cache_tokens: int  # tokens per layer after the last chunk's maintenance
    peak_kv_mb: float  # largest KV cache so far (before maintenance)
    peak_device_mb: float | None  # torch.cuda.max_memory_allocated so far (weights included); CUDA only
    ttft_ms: float  # median over repeats, question asked after the last frame; includes recall when on
    recall_ms: float | None  # median time to fetch recalled records into the cache (None: recall off)
    tpot_ms: float | None  # median (latency - ttft) / (decode_tokens - 1); None when decode_tokens < 2
    decode_tokens: int
    # chunk timings: over the chunks since the previous length (the cost at this length, not diluted)
    encode_ms_per_chunk: float  # mean vision + prefill time per chunk (hermes's probe rides in an evicting chunk's prefill)
    maintain_ms_per_chunk: float  # mean maintenance time over the chunks that evicted (0 if none did)
    maintain_ratio: float  # maintenance / encode time over the chunks that evicted (the probe counts as encode)
    ingest_fps: float  # frames / (encode + maintenance) time: the highest frame rate ingest sustains
    ttft_vs_full: float | None = None
    peak_kv_vs_full: float | None = None
    peak_device_vs_full: float | None = None
    ingest_fps_vs_full: float | None = None
    # the three below are None in result files older than them
    # maintenance / encode over every chunk from the first that evicted on: ingest's average once the cache
    # is full (below `maintain_ratio` when chunks that fit run no probe, memory.evict_headroom)
    amortised_maintain_ratio: float | None = None
    # mean encode + maintenance of the evicting chunks (None if none): the probe rides in the prefill, so
    # this sum, not `maintain_ratio`, compares ingest across versions and with the reference
    ingest_ms_per_evicting_chunk: float | None = None
    answer_ms: float | None = None  # median wall time of the whole `session.ask`, which TTFT leaves partly out
    stream_repeats: int = 1  # `bench memory`: medians over repeats, ratios against `full` with their spread
    ttft_vs_full_min: float | None = None
    ttft_vs_full_max: float | None = None
    ingest_fps_vs_full_min: float | None = None
    ingest_fps_vs_full_max: float | None = None


class ChunkTiming(NamedTuple):
    """One chunk's synchronised times."""

    frames: int
    encode_ms: float
    maintain_ms: float
    evicted: bool


@dataclass(frozen=True)
class PolicySpec:
    """A policy to measure: its label, its memory config, or None with the note saying why it is skipped."""

    label: str
    memory: MemoryConfig | None
    note: str = ""
    # a bench's own policy in place of the one `memory` names, built from (memory, model) (`probe_floor_spec`)
    make_policy: Callable | None = None


POLICY_ALIASES = {"recall-only": "sliding+recall"}  # ReKV-style baseline: a policy plus a flag, under its preset's name


def resolve_policies(specs: str | list[str], base: MemoryConfig, budget: int) -> list[PolicySpec]:
    """Turn "full,sliding,hermes,hermes+recall,hermes-plus" into memory configs on top of `base` at `budget`.

    Args:
        specs: comma-separated (or listed) `policy[+flag...]` names, a `POLICY_ALIASES` name, or a memory
            preset's name (its settings on top of `base`, e.g. `hermes-4k,hermes-plus`).
        budget: visual tokens per layer for bounded policies.

    Returns:
        One `PolicySpec` per spec, in order; `memory` is None (with a note) for a flag that is neither a
        boolean memory setting nor a section with an `enabled` switch.

    Raises:
        UsageError: no policy given.
    """
    names = [s.strip() for s in (specs.split(",") if isinstance(specs, str) else specs) if s.strip()]
    if not names:
        raise UsageError("--policies needs at least one policy, e.g. full,sliding,hermes")
    out = []
    for label in names:
        policy, *flags = POLICY_ALIASES.get(label, label).split("+")
        if policy not in POLICIES and policy in preset_names("memory"):  # a preset's settings, at this budget
            memory = dataclasses.replace(base, **{**load_preset("memory", policy), "budget": budget})
        else:
            memory = dataclasses.replace(base, policy=policy, budget=budget)
        note = ""
        for flag in flags:
            value = getattr(memory, flag, None)
            if isinstance(value, bool):
                memory = dataclasses.replace(memory, **{flag: True})
            elif dataclasses.is_dataclass(value) and isinstance(getattr(value, "enabled", None), bool):
                memory = dataclasses.replace(memory, **{flag: dataclasses.replace(value, enabled=True)})
            else:
                known = flag in {f.name for f in dataclasses.fields(MemoryConfig)}
                memory, note = None, f"{label}: skipped, memory.{flag} is " + \
                    ("not an on/off setting" if known else "not a known config key yet")
                break
        out.append(PolicySpec(label, memory, note))
    return out


# ---- what is measured and how ------------------------------------------------------------------------


class SyncedMaintainTimer:
    """A session's `phase_timer`: each ingest phase between device synchronisations (`ms`, per phase),
    and whether the maintenance evicted (the cache holds fewer tokens after it than before).

    The first synchronisation also closes the work queued before the phase.
    """

    def __init__(self, session: StreamingSession) -> None:
        self.session = session
        self.ms: dict[str, float] = {}
        self.evicted = False
        session.phase_timer = self.phase

    @property
    def maintain_ms(self) -> float:
        return self.ms.get("maintain", 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase (`StreamingSession.phase_timer`'s protocol)."""
        cache, device = self.session.cache, self.session.model.device
        device_sync(device)
        before, start = cache.num_tokens, time.perf_counter()
        yield
        device_sync(device)
        self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1e3
        if name == "maintain":
            self.evicted = cache.num_tokens < before


def timed_ingest(session: StreamingSession, timer: SyncedMaintainTimer, chunk: list[Frame]) -> ChunkTiming:
    """`session.ingest(chunk)` between device synchronisations; encode is its time less `timer`'s maintenance."""
    device = session.model.device
    device_sync(device)
    timer.ms, timer.evicted = {}, False
    start = time.perf_counter()
    session.ingest(chunk)
    device_sync(device)
    total_ms = (time.perf_counter() - start) * 1e3
    return ChunkTiming(len(chunk), total_ms - timer.maintain_ms, timer.maintain_ms, timer.evicted)


def time_per_output_token_ms(ttft_ms: float, latency_ms: float, tokens: int) -> float | None:
    """The mean decode step after the first token, ms (None below 2 tokens)."""
    return (latency_ms - ttft_ms) / (tokens - 1) if tokens >= 2 else None


def ingest_fps(frames: int, encode_ms: float, maintain_ms: float) -> float:
    """Frames per second of encode + maintenance time: the fastest stream ingest keeps up with."""
    total_s = (encode_ms + maintain_ms) / 1e3
    return frames / total_s if total_s > 0 else math.inf


def checkpointed_stream(n_frames: int, checkpoints: list[int], chunk_frames: int) -> Iterator[tuple[int, bool]]:
    """(chunk size, whether a checkpoint ends here) for a stream of `n_frames`, cut at every checkpoint."""
    done, marks = 0, sorted(c for c in set(checkpoints) if c <= n_frames)
    for mark in marks:
        while done < mark:
            size = min(chunk_frames, mark - done)
            done += size
            yield size, done == mark


def measure_stream(model, policy: PolicySpec, checkpoints: list[int], *, chunk_frames: int = 16,
                   decode_tokens: int = 16, repeats: int = 3, frame_px: int = 448,
                   seed: int = 0, progress: bool = False, question: str = BENCH_QUESTION
                   ) -> tuple[list[StreamRow], str | None]:
    """Stream random frames under one policy and measure it at every checkpoint length.

    Args:
        policy: its `memory` must not be None.
        checkpoints: stream lengths in frames at which to ask and record a row.
        decode_tokens: answer length, forced (1: TTFT only).
        repeats: questions per checkpoint; medians are reported.
        progress: a line on stderr at every checkpoint.
        question: what is asked at every checkpoint (one about the past makes `memory.recall` fire).

    Returns:
        (rows, note): one row per checkpoint reached, and why the stream stopped early (None if it did
        not: past the model's positions, such as `full` on long streams, or out of memory).
    """
    device, cuda = model.device, model.device.type == "cuda"
    if cuda:  # the previous stream's tensors must be gone before the peak counter restarts
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    session = StreamingSession(model, policy.memory, (), chunk_frames=chunk_frames, max_new_tokens=decode_tokens)
    timer = SyncedMaintainTimer(session)
    frames = synthetic_frames(max(checkpoints), side_px=frame_px, seed=seed)
    chunks: list[ChunkTiming] = []
    rows, note, seen, window = [], None, 0, 0  # window: first chunk since the previous checkpoint
    began = time.perf_counter()
    try:
        for size, checkpoint in checkpointed_stream(max(checkpoints), checkpoints, chunk_frames):
            chunks.append(timed_ingest(session, timer, [next(frames) for _ in range(size)]))
            seen += size
            if checkpoint:
                rows.append(_checkpoint_row(session, policy, chunks[window:], seen, chunk_frames, decode_tokens,
                                            repeats, question))
                window = len(chunks)
                if progress:
                    print(f"    {policy.label}: {seen}/{max(checkpoints)} frames "
                          f"({time.perf_counter() - began:.1f} s)", file=sys.stderr, flush=True)
    except (ConfigError, OutOfMemory) as exc:
        note = f"{policy.label} at chunks of {chunk_frames}: stopped after {seen} frames ({type(exc).__name__}: " \
               f"{str(exc).splitlines()[0]})"
    finally:
        session.close()  # levels 2 and 3 (recall) hold a writer thread and a temporary directory
        del session
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
    return rows, note


def _checkpoint_row(session, policy: PolicySpec, chunks: list[ChunkTiming], frames: int, chunk_frames: int,
                    decode_tokens: int, repeats: int, question: str) -> StreamRow:
    model = session.model
    ttfts, tpots, recalls, answers = [], [], [], []
    for _ in range(repeats):
        device_sync(model.device)  # the question's clock starts on an idle device
        start = time.perf_counter()
        answer = session.ask(question, stop_ids=())  # forced to `decode_tokens`: no token ends it early
        device_sync(model.device)
        answers.append((time.perf_counter() - start) * 1e3)
        # recall runs between the question and its prefill: the user waits for both
        recall_ms = (getattr(answer, "recall", None) or {}).get("recall_ms")
        recalls.append(recall_ms)
        ttfts.append(answer.ttft_ms + (recall_ms or 0.0))
        tpots.append(time_per_output_token_ms(answer.ttft_ms, answer.latency_ms, decode_tokens))
    evicting = [c for c in chunks if c.evicted]
    encode_total, maintain_total = sum(c.encode_ms for c in chunks), sum(c.maintain_ms for c in chunks)
    evicting_encode = sum(c.encode_ms for c in evicting)
    since_full = chunks[next((i for i, c in enumerate(chunks) if c.evicted), len(chunks)):]
    since_full_encode = sum(c.encode_ms for c in since_full)
    cuda = model.device.type == "cuda"
    return StreamRow(
        policy=policy.label, chunk_frames=chunk_frames, frames=frames,
        budget=None if policy.memory.policy == "full" else policy.memory.budget,
        cache_tokens=session.cache.num_tokens, peak_kv_mb=session.peak_cache_bytes / 2**20,
        peak_device_mb=torch.cuda.max_memory_allocated(model.device) / 2**20 if cuda else None,
        ttft_ms=statistics.median(ttfts), answer_ms=statistics.median(answers), tpot_ms=statistics.median(tpots) if decode_tokens >= 2 else None,
        recall_ms=statistics.median(recalls) if None not in recalls else None,
        decode_tokens=decode_tokens, encode_ms_per_chunk=encode_total / len(chunks),
        maintain_ms_per_chunk=statistics.fmean(c.maintain_ms for c in evicting) if evicting else 0.0,
        maintain_ratio=sum(c.maintain_ms for c in evicting) / evicting_encode if evicting else 0.0,
        amortised_maintain_ratio=sum(c.maintain_ms for c in since_full) / since_full_encode if evicting else 0.0,
        ingest_ms_per_evicting_chunk=statistics.fmean(c.encode_ms + c.maintain_ms for c in evicting) if evicting
        else None,
        ingest_fps=ingest_fps(sum(c.frames for c in chunks), encode_total, maintain_total))


# ---- suites --------------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    """Rows of a run (with ratios against `full`) and notes on what was skipped or stopped."""

    rows: list[StreamRow]
    notes: list[str]


def _warm_up(model, policy: PolicySpec, chunk_frames: int, decode_tokens: int, frame_px: int,
             question: str = BENCH_QUESTION) -> None:
    """Three evicting chunks and a question, unmeasured: first calls pay one-off costs."""
    measure_stream(model, _evicting_early(model, policy, chunk_frames), [3 * chunk_frames], chunk_frames=chunk_frames,
                   decode_tokens=decode_tokens, repeats=1, frame_px=frame_px, question=question)


def _evicting_early(model, policy: PolicySpec, chunk_frames: int) -> PolicySpec:
    """`policy` with its budget shrunk to one chunk, so that it evicts from the second chunk on."""
    memory = policy.memory
    if memory.policy != "full":
        memory = dataclasses.replace(memory, budget=min(memory.budget, max(1, model.tokens_per_frame * chunk_frames)))
    return dataclasses.replace(policy, memory=memory)


def run_sweep(model, policies: list[PolicySpec], lengths: list[int], chunk_sizes: list[int], *,
              decode_tokens: int = 16, repeats: int = 3, frame_px: int = 448, warmup: bool = True,
              progress: bool = False, on_stream: Callable[[SweepResult], None] | None = None,
              question: str = BENCH_QUESTION) -> SweepResult:
    """Every policy at every chunk size, measured at every stream length, after a warm-up per policy.

    Args:
        question: what is asked at every length (`measure_stream`).
        on_stream: called with the result so far after every stream (a run cut short keeps its rows).

    Returns:
        The `SweepResult`, rows ordered by chunk size, policy, length. A policy whose optional
        dependency is missing (`hermes+recall` without faiss) is skipped with a note.
    """
    notes = [p.note for p in policies if p.memory is None]
    runnable = [p for p in policies if p.memory is not None]

    def skip_if_missing(policy: PolicySpec, measure: Callable[[], tuple[list[StreamRow], str | None]]):
        # one missing optional package must not cost the rows of every other policy
        try:
            return measure()
        except ModuleNotFoundError as exc:
            if (exc.name or "hermes").partition(".")[0] == "hermes":
                raise  # our own module missing is a broken install, not an optional dependency
            notes.append(f"{policy.label}: skipped, it needs {exc.name or exc} (not installed here)")
            print(f"  {notes[-1]}", file=sys.stderr, flush=True)
            runnable.remove(policy)
            return [], None

    if warmup:
        for policy in list(runnable):
            skip_if_missing(policy, lambda: _warm_up(model, policy, chunk_sizes[0], decode_tokens, frame_px,
                                                     question))
    rows = []
    for chunk_frames in chunk_sizes:
        for policy in list(runnable):
            start = time.perf_counter()
            measured, note = skip_if_missing(policy, lambda: measure_stream(
                model, policy, lengths, chunk_frames=chunk_frames, decode_tokens=decode_tokens, repeats=repeats,
                frame_px=frame_px, progress=progress, question=question))
            rows += measured
            if note:
                notes.append(note)
            if progress:
                print(f"  {policy.label:<14} chunks of {chunk_frames:>2}: {len(measured)} lengths in "
                      f"{time.perf_counter() - start:6.1f} s", file=sys.stderr, flush=True)
            if on_stream is not None:
                add_ratios(rows)
                on_stream(SweepResult(rows, notes))
    add_ratios(rows)
    return SweepResult(rows, notes)


def add_ratios(rows: list[StreamRow]) -> None:
    """Fill the `*_vs_full` fields from the `full` row at the same chunk size and length, where there is one."""
    def ratio(value: float | None, reference: float | None) -> float | None:
        return value / reference if value is not None and reference else None

    full = {(r.chunk_frames, r.frames): r for r in rows if r.policy == "full"}
    for r in rows:
        ref = full.get((r.chunk_frames, r.frames))
        if ref is None:
            continue
        r.ttft_vs_full = ratio(r.ttft_ms, ref.ttft_ms)
        r.peak_kv_vs_full = ratio(r.peak_kv_mb, ref.peak_kv_mb)
        r.peak_device_vs_full = ratio(r.peak_device_mb, ref.peak_device_mb)
        r.ingest_fps_vs_full = ratio(r.ingest_fps, ref.ingest_fps)


# ratios against `full` that come from two streams: their min and max over repeats are reported beside the median
SPREAD_FIELDS = ("ttft_vs_full", "ingest_fps_vs_full")


def bench_memory(model, policies: list[PolicySpec], lengths: list[int], *, chunk_frames: int = 16,
                 stream_repeats: int = 3, progress: bool = False, question: str = BENCH_QUESTION) -> SweepResult:
    """`bench memory`: every policy at one chunk size, TTFT of a one-token answer, streamed
    `stream_repeats` times with the order reversed every other repeat (a change of load lands on both
    sides alike); ratios within each repeat, medians and spread (`SPREAD_FIELDS`) over repeats.

    Returns:
        The `SweepResult`; rows ordered by policy (as given), then length.
    """
    notes: list[str] = []
    repeats: list[list[StreamRow]] = []
    for r in range(stream_repeats):  # one sweep per repeat (warmed up before the first), ratios within each
        sweep = run_sweep(model, policies if r % 2 == 0 else policies[::-1], lengths, [chunk_frames],
                          decode_tokens=1, repeats=3, frame_px=32, warmup=r == 0, progress=progress,
                          question=question)
        notes += [note for note in sweep.notes if note not in notes]
        repeats.append(sweep.rows)
    order = {p.label: i for i, p in enumerate(policies)}
    return SweepResult(sorted(merge_repeats(repeats), key=lambda row: (order[row.policy], row.frames)), notes)


def merge_repeats(repeats: list[list[StreamRow]]) -> list[StreamRow]:
    """One row per (policy, chunk size, length): float fields the median over repeats, each
    `SPREAD_FIELDS` ratio also its min and max."""
    by_key: dict[tuple, list[StreamRow]] = {}
    for rows in repeats:
        for row in rows:
            by_key.setdefault((row.policy, row.chunk_frames, row.frames), []).append(row)
    merged = []
    for same in by_key.values():
        medians = {}
        for field in dataclasses.fields(StreamRow):
            values = [getattr(r, field.name) for r in same]
            if all(isinstance(v, float) for v in values):
                medians[field.name] = statistics.median(values)
        row = dataclasses.replace(same[0], **medians, stream_repeats=len(same))
        for name in SPREAD_FIELDS:
            values = [getattr(r, name) for r in same if getattr(r, name) is not None]
            if values:
                setattr(row, f"{name}_min", min(values))
                setattr(row, f"{name}_max", max(values))
        merged.append(row)
    return merged


# ---- `bench overhead`: what a policy costs over a baseline, paired chunk by chunk ------------------------


@dataclass
class OverheadRow:
    """`bench overhead`: per repeat, the median over chunks that evicted under both of policy / baseline
    ingest time, minus one; times in ms, medians over repeats of means over those chunks."""

    geometry: str
    policy: str
    baseline: str
    budget: int
    frames: int
    chunk_frames: int
    repeats: int
    paired_chunks: int  # chunks per repeat that evicted under both (the fewest over repeats)
    overhead_min: float
    overhead_median: float
    overhead_max: float
    encode_ms: float  # the policy's encode per paired chunk (its probe rides in the chunk's prefill)
    maintain_ms: float
    baseline_encode_ms: float
    baseline_maintain_ms: float


def paired_streams(model, specs: tuple[PolicySpec, PolicySpec], n_frames: int, *, chunk_frames: int,
                   frame_px: int, seed: int = 0) -> tuple[list[ChunkTiming], list[ChunkTiming]]:
    """Each session's `ChunkTiming`s for the same frames, chunk by chunk, the order flipped every chunk
    (load lands on both sides alike; going first or second costs both the same)."""
    sessions = [StreamingSession(model, spec.memory, (), chunk_frames=chunk_frames, max_new_tokens=1)
                for spec in specs]
    for session, spec in zip(sessions, specs):
        if spec.make_policy is not None:  # before any chunk: the cache holds the prefix alone
            session.memory = spec.make_policy(spec.memory, model)
    timers = [SyncedMaintainTimer(s) for s in sessions]
    timings: tuple[list[ChunkTiming], list[ChunkTiming]] = ([], [])
    frames = synthetic_frames(n_frames, side_px=frame_px, seed=seed)
    try:
        for i, (size, _) in enumerate(checkpointed_stream(n_frames, [n_frames], chunk_frames)):
            chunk = [next(frames) for _ in range(size)]
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                timings[k].append(timed_ingest(sessions[k], timers[k], chunk))
    finally:
        for s in sessions:
            s.close()
    return timings


class ProbeRowsFloor(SlidingPolicy):
    """`sliding`, with `hermes`'s pseudo-query riding in each evicting chunk's forward through the model's
    own attention kernel, recording nothing, cut after: the least any exact probe computes, since the
    pseudo-query's attention over the cache and the chunk, layer by layer, is what `hermes` scores with
    (docs/ARCHITECTURE.md, Performance)."""

    records_probe = False

    def __init__(self, cfg: MemoryConfig, model) -> None:
        super().__init__(cfg, model)
        self._hermes = HermesPolicy(dataclasses.replace(cfg, policy="hermes"), model)

    def probe_queries(self, cache, n_new: int) -> torch.Tensor | None:
        return self._hermes.probe_queries(cache, n_new)  # the same chunks, the same pseudo-query


def probe_floor_spec(baseline: PolicySpec) -> PolicySpec:
    """`baseline` (`sliding`) with `ProbeRowsFloor` in place of its policy: `bench overhead --floor`'s row."""
    return dataclasses.replace(baseline, label="pseudo-query rows alone (floor)", make_policy=ProbeRowsFloor)


def paired_overhead(model, policy: PolicySpec, baseline: PolicySpec, n_frames: int, *, chunk_frames: int = 16,
                    repeats: int = 3, frame_px: int = 32, seed: int = 0, warmup: bool = True,
                    geometry: str = "") -> OverheadRow:
    """`policy`'s whole ingest cost (encode with its probe, plus maintenance) over `baseline`'s.

    Args:
        policy, baseline: their `memory` not None, at one budget.
        repeats: paired streams; the overhead's min / median / max are over them.
        warmup: one short paired stream first, not counted.
        geometry: a label for the row.

    Raises:
        ConfigError: no chunk evicted under both (the stream does not outgrow the budget).
    """
    if warmup:
        paired_streams(model, tuple(_evicting_early(model, p, chunk_frames) for p in (policy, baseline)),
                       3 * chunk_frames, chunk_frames=chunk_frames, frame_px=frame_px, seed=seed)
    overheads, paired_counts, times = [], [], []
    for _ in range(repeats):
        ours, theirs = paired_streams(model, (policy, baseline), n_frames, chunk_frames=chunk_frames,
                                      frame_px=frame_px, seed=seed)
        pairs = [(a, b) for a, b in zip(ours, theirs) if a.evicted and b.evicted]
        if not pairs:
            raise ConfigError(f"no chunk of {n_frames} frames evicted under both {policy.label} and {baseline.label}: "
                              "lengthen the stream or lower the budget")
        overheads.append(statistics.median((a.encode_ms + a.maintain_ms) / (b.encode_ms + b.maintain_ms)
                                           for a, b in pairs) - 1.0)
        paired_counts.append(len(pairs))
        times.append([statistics.fmean(getattr(c, field) for c in side) for side in zip(*pairs)
                      for field in ("encode_ms", "maintain_ms")])
    encode, maintain, base_encode, base_maintain = (statistics.median(t[i] for t in times) for i in range(4))
    return OverheadRow(geometry=geometry, policy=policy.label, baseline=baseline.label, budget=policy.memory.budget,
                       frames=n_frames, chunk_frames=chunk_frames, repeats=repeats, paired_chunks=min(paired_counts),
                       overhead_min=min(overheads), overhead_median=statistics.median(overheads),
                       overhead_max=max(overheads), encode_ms=encode, maintain_ms=maintain,
                       baseline_encode_ms=base_encode, baseline_maintain_ms=base_maintain)


# ---- tables: `bench memory` and `bench sweep` print the same numbers the same way ------------------------

# (header, number format) per `StreamRow` field; "-" where a value is None
_COLUMNS = {
    "policy": ("policy", "{}"), "chunk_frames": ("chunk", "{}"), "frames": ("frames", "{}"),
    "cache_tokens": ("cache tokens", "{}"), "peak_kv_mb": ("peak KV MiB", "{:.1f}"),
    "peak_device_mb": ("peak device MiB", "{:.0f}"), "ttft_ms": ("TTFT ms", "{:.1f}"),
    "ttft_vs_full": ("TTFT vs full", "{:.2f}"), "answer_ms": ("answer ms", "{:.1f}"), "tpot_ms": ("TPOT ms", "{:.1f}"), "recall_ms": ("recall ms", "{:.1f}"),
    "encode_ms_per_chunk": ("encode ms/chunk", "{:.1f}"), "maintain_ms_per_chunk": ("maintain ms/chunk", "{:.1f}"),
    "maintain_ratio": ("maintain / encode", "{:.3f}"), "amortised_maintain_ratio": ("amortised", "{:.3f}"),
    "ingest_ms_per_evicting_chunk": ("encode + maintain ms (evicting)", "{:.1f}"),
    "ingest_fps": ("ingest fps", "{:.1f}"),
    "ingest_fps_vs_full": ("fps vs full", "{:.2f}"), "peak_kv_vs_full": ("KV vs full", "{:.3f}"),
}
# a ratio with its spread over repeats: "min / median / max" from `<field>_min`, `<field>`, `<field>_max`
_SPREAD_COLUMNS = {"ttft_vs_full_spread": ("TTFT vs full, min / median / max", "ttft_vs_full", "{:.2f}"),
                   "ingest_fps_vs_full_spread": ("fps vs full, min / median / max", "ingest_fps_vs_full", "{:.2f}")}
MEMORY_COLUMNS = ["policy", "frames", "cache_tokens", "peak_kv_mb", "peak_device_mb", "ttft_ms", "recall_ms", "ttft_vs_full_spread",
                  "encode_ms_per_chunk", "maintain_ms_per_chunk", "maintain_ratio", "amortised_maintain_ratio"]
SWEEP_COLUMNS = ["policy", "chunk_frames", "frames", "cache_tokens", "peak_kv_mb", "peak_device_mb", "ttft_ms",
                 "ttft_vs_full", "tpot_ms", "answer_ms", "recall_ms", "encode_ms_per_chunk", "maintain_ms_per_chunk",
                 "maintain_ratio", "amortised_maintain_ratio", "ingest_ms_per_evicting_chunk", "ingest_fps",
                 "ingest_fps_vs_full"]


def markdown_table(rows: list[StreamRow], columns: list[str] = SWEEP_COLUMNS) -> str:
    """The rows as a markdown table with `SWEEP_COLUMNS` or `MEMORY_COLUMNS`."""
    def cell(row: StreamRow, column: str) -> str:
        if column in _SPREAD_COLUMNS:
            _, name, fmt = _SPREAD_COLUMNS[column]
            return spread_cell([getattr(row, n) for n in (f"{name}_min", name, f"{name}_max")], fmt)
        value = getattr(row, column)
        return "-" if value is None else _COLUMNS[column][1].format(value)

    headers = [_SPREAD_COLUMNS[c][0] if c in _SPREAD_COLUMNS else _COLUMNS[c][0] for c in columns]
    return table(headers, [[cell(r, c) for c in columns] for r in rows], right=[c != "policy" for c in columns])


def overhead_table(rows: list[OverheadRow]) -> str:
    """`bench overhead`'s rows as a markdown table, one row per (geometry, policy)."""
    cells = [[r.geometry, r.policy, r.budget, r.frames, r.paired_chunks,
              spread_cell([r.overhead_min, r.overhead_median, r.overhead_max]),
              f"{r.encode_ms:.1f}", f"{r.maintain_ms:.1f}", f"{r.baseline_encode_ms:.1f}", f"{r.baseline_maintain_ms:.1f}"]
             for r in rows]
    baseline = rows[0].baseline if rows else "baseline"
    header = ["geometry", "policy", "budget", "frames", "paired chunks", f"over {baseline}, min / median / max",
              "encode ms", "maintain ms", f"{baseline} encode ms", f"{baseline} maintain ms"]
    return table(header, cells, right=[False, False] + [True] * (len(header) - 2))


def rows_as_dicts(rows: list[StreamRow]) -> list[dict]:
    return [dataclasses.asdict(r) for r in rows]


def rows_from_dicts(items: list[dict]) -> list[StreamRow]:
    """Rows read back from `rows_as_dicts` output (a sweep JSON's "rows")."""
    return [StreamRow(**item) for item in items]


def report_markdown(meta: dict, result: SweepResult, columns: list[str] = SWEEP_COLUMNS) -> str:
    """A self-describing markdown report: what ran where, the table, and the notes."""
    keys = ("model", "device", "device_name", "cpu_threads", "load_avg_1m", "dtype", "tokens_per_frame", "budget",
            "decode_tokens", "repeats", "frame_px", "torch", "transformers", "date", "command")
    lines = [f"- {k}: {meta[k]}" for k in keys if meta.get(k) is not None]
    lines += ["", markdown_table(result.rows, columns)]
    if result.notes:
        lines += [""] + [f"- note: {n}" for n in result.notes]
    return "\n".join(lines) + "\n"
