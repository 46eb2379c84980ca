"""`bench day`'s measurement: a day of frames through two sessions side by side, measured per hour.

The measured policy (hermes-4k by default) gets a memory directory, `sliding` at the same budget none
(level 1 only: the baseline forgets what leaves its window). Each chunk goes to both, so the frames are
drawn once and both policies meet the same load; a second pass would double the time. Questions are asked
of both at their times. Per simulated hour it records the process's resident memory, the most each level
held at any chunk boundary (working cache, DRAM, disk) and the median time per chunk (docs/ARCHITECTURE.md,
Performance). The day itself, a synthetic camera and its night questions, is `hermes.datasets.day`'s.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hermes.config import MemoryConfig
from hermes.pipelines.frames import Frame
from hermes.prompt import OPTION_LETTERS

BASELINE = "sliding"


@dataclass(frozen=True)
class DayQuestion:
    """A multiple-choice question asked at `t_s`, and the age it tests (`label`: "now", "morning", "6 h").

    Attributes:
        age_h: simulated hours between what it asks about and the question.
        gt: index of the right option.
    """

    label: str
    age_h: float
    t_s: float
    text: str
    options: tuple[str, ...]
    gt: int


def rss_bytes() -> int:
    """This process's resident memory now (Linux `/proc/self/statm`), in bytes."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_bytes() -> dict[str, int] | None:
    """What the C heap holds now (glibc's `mallinfo2`, every arena): ``in_use`` (allocated, mmapped blocks
    included) and ``held_free`` (freed but kept from the system); None without glibc 2.33+.

    RSS counts both: a rise in RSS with `in_use` flat is the allocator keeping freed memory, not a leak.
    """
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {"in_use": info.uordblks + info.hblkhd, "held_free": info.fordblks}


@dataclass
class LevelMeter:
    """One session's hour: chunk times and the most each level held after any chunk."""

    chunk_ms: list[float] = field(default_factory=list)
    peaks: dict[str, int] = field(default_factory=dict)

    def add(self, ms: float, session) -> None:
        self.chunk_ms.append(ms)
        stats = session.memory_stats()
        now = {"hbm_bytes": stats["hbm_bytes"], "hbm_visual_tokens": session.cache.num_visual_tokens,
               "dram_bytes": stats["dram_bytes"], "disk_bytes": stats["disk_bytes"]}
        self.peaks = {k: max(v, self.peaks.get(k, 0)) for k, v in now.items()}

    def row(self) -> dict:
        return {**self.peaks, "chunk_ms": round(statistics.median(self.chunk_ms), 2) if self.chunk_ms else None}


@dataclass
class DayResult:
    """What `run_day` measured: `hours` rows and each policy's answers (label, age_h, correct)."""

    hours: list[dict] = field(default_factory=list)
    answers: dict[str, list[tuple[str, float, bool]]] = field(default_factory=dict)

    def accuracy_by_age(self) -> dict[str, list[dict]]:
        """Per policy, per age label (youngest first): questions, correct, accuracy and the mean actual age."""
        out = {}
        for policy, answers in self.answers.items():
            labels = sorted({label for label, _, _ in answers},
                            key=lambda lb: min(age for label, age, _ in answers if label == lb))
            rows = []
            for label in labels:
                mine = [(age, ok) for lb, age, ok in answers if lb == label]
                correct = sum(ok for _, ok in mine)
                rows.append({"age": label, "age_h": round(statistics.mean(a for a, _ in mine), 2),
                             "questions": len(mine), "correct": correct, "accuracy": round(correct / len(mine), 3)})
            out[policy] = rows
        return out


def run_day(model, memory: MemoryConfig, label: str, frames: Iterable[Frame], questions: list[DayQuestion], *,
            hour_s: int, chunk_frames: int, memory_dir: str | Path,
            on_hour: Callable[[dict], None] = lambda row: None) -> DayResult:
    """Stream `frames` through `memory` (with `memory_dir`) and `sliding` (none) side by side, asking
    `questions` of both at their times.

    Args:
        label: the measured policy's name in the result (e.g. hermes@4096).
        frames: one frame a second, frame `i` at `t = i` s, drawn as needed.
        questions: by time.
        memory_dir: an empty folder (or s3:// prefix) for the measured policy's levels 2-3 and checkpoints.
        on_hour: receives each hour's row as soon as the hour is streamed.

    Returns:
        The `DayResult`; each hour row holds `hour`, `frames` (so far), `rss_bytes`, `heap_in_use_bytes` and
        `heap_free_bytes` (`malloc_bytes`; None without glibc), the measured policy's
        `hbm_bytes`, `hbm_visual_tokens`, `dram_bytes`, `disk_bytes` (the hour's most) and `chunk_ms`
        (median), and the same under `sliding`.
    """
    from hermes.pipelines.session import StreamingSession

    sessions = {label: StreamingSession(model, memory, (), chunk_frames=chunk_frames, memory_dir=memory_dir),
                BASELINE: StreamingSession(model, MemoryConfig(policy="sliding", budget=memory.budget), (),
                                           chunk_frames=chunk_frames)}
    result = DayResult(answers={name: [] for name in sessions})
    meters = {name: LevelMeter() for name in sessions}
    pending = list(questions)
    chunk: list[Frame] = []
    seen = 0

    def ingest() -> None:
        if not chunk:
            return
        for name, session in sessions.items():
            start = time.perf_counter()
            session.ingest(chunk)
            meters[name].add((time.perf_counter() - start) * 1e3, session)
        chunk.clear()

    try:
        for frame in frames:
            while pending and pending[0].t_s <= frame.t_s:  # its moment: the partial chunk first
                ingest()
                ask_all(sessions, pending.pop(0), result)
            chunk.append(frame)
            seen += 1
            if len(chunk) == chunk_frames or seen % hour_s == 0:  # a chunk never spans two hours
                ingest()
            if seen % hour_s == 0:
                heap = malloc_bytes() or {}
                row = {"hour": seen // hour_s, "frames": seen, "rss_bytes": rss_bytes(),
                       "heap_in_use_bytes": heap.get("in_use"), "heap_free_bytes": heap.get("held_free"),
                       **meters[label].row(), BASELINE: meters[BASELINE].row()}
                result.hours.append(row)
                meters = {name: LevelMeter() for name in sessions}
                on_hour(row)
        for q in pending:  # after the last frame
            ask_all(sessions, q, result)
    finally:
        for session in sessions.values():
            session.close()
    return result


def ask_all(sessions: dict, q: DayQuestion, result: DayResult) -> None:
    """Ask every session `q` and note whether each answered the right option's letter."""
    for name, session in sessions.items():
        answer = session.ask(q.text, q.options, at=q.t_s)
        result.answers[name].append((q.label, q.age_h, answer.answer == OPTION_LETTERS[q.gt]))


HOUR_COLUMNS = (("hour", "hour"), ("frames", "frames"), ("rss_mib", "RSS MiB"), ("heap_mib", "C heap in use MiB"),
                ("heap_free_mib", "held free MiB"), ("hbm_kib", "working KiB"),
                ("dram_mib", "DRAM MiB"), ("disk_mib", "disk MiB"), ("chunk_ms", "ms/chunk"),
                ("sliding_ms", "sliding ms/chunk"))


def hour_cells(row: dict) -> dict:
    """A `hours` row in the table's units (MiB, KiB)."""
    mib = lambda n: None if n is None else round(n / 2**20, 1)  # noqa: E731
    return {"hour": row["hour"], "frames": row["frames"], "rss_mib": mib(row["rss_bytes"]),
            "heap_mib": mib(row["heap_in_use_bytes"]), "heap_free_mib": mib(row["heap_free_bytes"]),
            "hbm_kib": round(row["hbm_bytes"] / 2**10), "dram_mib": round(row["dram_bytes"] / 2**20, 2),
            "disk_mib": round(row["disk_bytes"] / 2**20, 2), "chunk_ms": row["chunk_ms"],
            "sliding_ms": row[BASELINE]["chunk_ms"]}


def accuracy_table(accuracy: dict[str, list[dict]]) -> str:
    """Accuracy by age, one row per age label and a column per policy (correct / asked)."""
    from hermes.markdown import table

    policies = list(accuracy)
    ages = [r["age"] for r in accuracy[policies[0]]]
    cells = {(p, r["age"]): f"{r['accuracy'] * 100:.0f} % ({r['correct']}/{r['questions']})"
             for p in policies for r in accuracy[p]}
    mean_age = {r["age"]: r["age_h"] for r in accuracy[policies[0]]}
    return table(["asked about", "mean age h", *policies],
                 [[age, mean_age[age], *(cells[(p, age)] for p in policies)] for age in ages])
