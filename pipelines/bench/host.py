"""`bench gc` and `bench ingest`: what a whole stream costs on the host, outside the model.

- `bench gc`: garbage-collector pauses in a long stream (`--frames` synthetic frames, 1 per second, through
  the micro model under `hermes` with recall, a question every 20 s), once with ``HERMES_GC_FREEZE=0`` and
  once with the start-up heap frozen (`hermes.pipelines.heap.freeze_startup_heap`, the default), each in a
  process of its own: collections per generation, their total pause, the worst pause and the wall time.
  A pause stops every thread of the process (ingest, the disk writer, answers).
- `bench ingest`: a 1920x1080 mp4 (25 fps, moving texture; written once) read, decoded, preprocessed,
  encoded and maintained under `hermes` on the cpu-small geometry in chunks of 8: frames per second of
  wall time from the first frame to the end of the last chunk, best of two runs.
"""

from __future__ import annotations

import time
from pathlib import Path

from hermes.pipelines.bench.common import collect_worker, spawn_worker

GC_HEAPS = (("collected (HERMES_GC_FREEZE=0)", "0"), ("frozen at open (default)", "1"))


def gc_worker(frames: int) -> dict:
    """One stream of `frames` frames with every collection's pause recorded (runs in a `spawn_worker` process)."""
    import gc

    from hermes.config import MemoryConfig, ModelConfig
    from hermes.models.loading import load_model
    from hermes.pipelines.frames import Frame
    from hermes.pipelines.session import StreamingSession
    from hermes.pipelines.synthetic import make_frame

    stream = [Frame(index=i, t_s=float(i), rgb=make_frame(float(i), size=(64, 48), seed=5)) for i in range(frames)]
    model = load_model(ModelConfig(name="micro-llava-onevision", max_new_tokens=4))
    session = StreamingSession(model, MemoryConfig(policy="hermes", budget=64, recall=True), stream, chunk_frames=4,
                               max_new_tokens=4)
    passes: dict[int, list] = {}
    started: dict[int, float] = {}
    worst = [0.0]

    def on_gc(phase, info):
        g = info["generation"]
        if phase == "start":
            started[g] = time.perf_counter()
            return
        pause = time.perf_counter() - started[g]
        count_total = passes.setdefault(g, [0, 0.0])
        count_total[0] += 1
        count_total[1] += pause
        worst[0] = max(worst[0], pause)

    gc.callbacks.append(on_gc)
    t0 = time.perf_counter()
    for at in range(20, frames, 20):
        session.advance(until_s=at)
        session.ask("What colour is the circle?", at=at)
    wall_s = time.perf_counter() - t0
    gc.callbacks.remove(on_gc)
    return {"wall_s": wall_s, "frozen": gc.get_freeze_count(),
            "passes": [passes.get(g, [0, 0.0]) for g in range(3)], "worst_pause_ms": worst[0] * 1e3}


def bench_gc(frames: int) -> list[dict]:
    """`gc_worker` with the heap collected, then frozen: one row each."""
    rows = []
    for label, freeze in GC_HEAPS:
        run = collect_worker(spawn_worker("host", "gc_worker", {"frames": frames}, env={"HERMES_GC_FREEZE": freeze}))
        rows.append({"heap": label, "frozen_objects": run["frozen"],
                     "passes": " / ".join(str(n) for n, _ in run["passes"]),
                     "pause_ms": " / ".join(f"{t * 1e3:.1f}" for _, t in run["passes"]),
                     "worst_pause_ms": round(run["worst_pause_ms"], 1), "wall_s": round(run["wall_s"], 1)})
    return rows


GC_COLUMNS = (("heap", "heap"), ("frozen_objects", "frozen objects"), ("passes", "gen-0 / gen-1 / gen-2 passes"),
              ("pause_ms", "their pause ms"), ("worst_pause_ms", "worst pause ms"), ("wall_s", "wall s"))


def write_1080p(path: Path, seconds: float = 12.0, fps: float = 25.0) -> None:
    """A 1920x1080 mp4 (OpenCV's mp4v) of a moving random texture: real inter-frame work for the decoder."""
    import cv2
    import numpy as np

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (1920, 1080))
    base = np.random.default_rng(0).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    for i in range(int(seconds * fps)):
        writer.write(np.roll(base, 8 * i, axis=1))
    writer.release()


def bench_ingest(video: Path, fps: float, runs: int = 2) -> dict:
    """Frames per second of `video` sampled at `fps` through `hermes` (budget 64, chunks of 8) on the
    cpu-small geometry, best of `runs`."""
    from hermes.config import MemoryConfig
    from hermes.pipelines.bench.reference import Geometry, geometry_model
    from hermes.pipelines.session import StreamingSession
    from hermes.pipelines.sources import open_source

    model, _ = geometry_model(Geometry(8, 512, 16))
    rates = []
    for _ in range(runs):
        source = open_source(str(video), fps=fps)
        session = StreamingSession(model, MemoryConfig(policy="hermes", budget=64), source, chunk_frames=8)
        start = time.perf_counter()
        session.advance()
        rates.append(len(session.encoded_t_s) / (time.perf_counter() - start))
        session.close()
        source.close()
    return {"video": str(video), "sampled_fps": fps, "frames": len(session.encoded_t_s),
            "best_frames_per_s": round(max(rates), 2), "runs": [round(r, 2) for r in rates]}
