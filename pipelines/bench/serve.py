"""`hermes-video bench serve`: N synthetic live streams into one served model, against N `run` processes.

For each N (default 1, 2, 4, 8), in fresh processes so that peak memory means something:

- *serve*: one process, one model, the serve scheduler and N streams, each a synthetic camera
  (`SyntheticCamera`: the demo's moving shapes, stamped by a live clock, through the stream's pump
  and drop policy, as a camera is); every stream is asked a question every `ask_every_s`;
- *run*: N processes, each its own model and `run`'s live loop (`hermes.pipelines.interactive.run_live`,
  what `run --ask-every` does on a camera) over the same camera.

Per N it reports the sustained fps per stream (frames encoded / seconds streamed; mean over
streams), frames dropped, question latency p50/p95 (request to answer, serve only: `run` answers
inline), peak RSS, and the ratios serve/run for fps and memory (the N run processes' RSS summed)
measured in the same invocation. Both sides run with the same torch thread count.
"""

from __future__ import annotations

import threading
import time

from hermes.pipelines.bench.common import collect_worker, spawn_worker
from hermes.pipelines.frames import Frame
from hermes.pipelines.sources import FrameSource


class SyntheticCamera(FrameSource):
    """A live source of the synthetic picture at `fps`, stamped by its own clock (never waits for the consumer)."""

    live = True

    def __init__(self, fps: float, seed: int = 0, size=(160, 120)) -> None:
        super().__init__()
        self.fps, self.seed, self.size = fps, seed, size
        self._opened = time.monotonic()
        self._stop = threading.Event()

    def __iter__(self):
        from hermes.pipelines.synthetic import make_frame

        index = 0
        while not self._stop.is_set():
            due = index / self.fps
            if self._stop.wait(max(0.0, due - self.now_s())):
                return
            t_s = self.now_s()
            self._stats.frames_read += 1
            yield Frame(t_s, make_frame(t_s, self.size, self.seed), index)
            index += 1

    def now_s(self) -> float:
        return time.monotonic() - self._opened

    def request_stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()

    def describe(self) -> str:
        return f"synthetic camera ({self.fps:g} fps)"


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _config(model_name: str, memory: str, fps: float, max_new_tokens: int):
    from hermes.config import build_config
    from hermes.pipelines.interactive import check_live_memory

    cfg = build_config(model=model_name, memory=memory, overrides=[f"stream.fps={fps}",
                                                                  f"model.max_new_tokens={max_new_tokens}"])
    cfg.memory = check_live_memory(cfg.memory, True, True)
    return cfg


def serve_worker(model_name: str, memory: str, streams: int, fps: float, seconds: float, ask_every_s: float,
                 max_new_tokens: int) -> dict:
    """One serve process: `streams` cameras into one model, each asked every `ask_every_s`."""
    from hermes.models.loading import load_model
    from hermes.pipelines.asked import Question
    from hermes.pipelines.serve.scheduler import Scheduler
    from hermes.pipelines.serve.stream import Stream

    cfg = _config(model_name, memory, fps, max_new_tokens)
    model = load_model(cfg.model)
    scheduler = Scheduler(model)
    opened = []
    for i in range(streams):
        stream = Stream(f"cam{i}", f"cam{i}", cfg, "synthetic", None, max_pending=2 * cfg.stream.live_chunk_frames)
        scheduler.open(stream, resume=False).result()
        stream.start(SyntheticCamera(fps, seed=i), scheduler.wake, None)
        opened.append(stream)
    latencies: list[float] = []
    started = time.monotonic()
    next_ask = started + ask_every_s
    while time.monotonic() - started < seconds:
        time.sleep(max(0.0, min(next_ask, started + seconds) - time.monotonic()))
        if time.monotonic() >= next_ask:
            futures = [(time.monotonic(), scheduler.ask(s, Question("What is moving?"))) for s in opened]
            for asked_at, future in futures:
                future.result()
                latencies.append((time.monotonic() - asked_at) * 1e3)
            next_ask += ask_every_s
    elapsed = time.monotonic() - started
    encoded = [s.counters.frames_encoded for s in opened]
    dropped = [s.counters.frames_dropped for s in opened]
    scheduler.shutdown()
    return {"fps_per_stream": sum(encoded) / len(encoded) / elapsed, "min_fps": min(encoded) / elapsed,
            "dropped": sum(dropped), "latencies_ms": latencies, "rss_mib": peak_rss_mib()}


def run_worker(model_name: str, memory: str, fps: float, seconds: float, ask_every_s: float,
               max_new_tokens: int) -> dict:
    """One `run` process on one camera: its own model and `run`'s live loop with `--ask-every`."""
    from hermes.models.loading import load_model
    from hermes.pipelines.asked import Question
    from hermes.pipelines.interactive import QuestionSchedule, run_live
    from hermes.pipelines.session import StreamingSession

    cfg = _config(model_name, memory, fps, max_new_tokens)
    model = load_model(cfg.model)
    session = StreamingSession(model, cfg.memory, (), chunk_frames=cfg.stream.live_chunk_frames,
                               max_new_tokens=cfg.model.max_new_tokens)
    camera = SyntheticCamera(fps)  # a slow consumer gets the frames it missed at once: fps is what it encoded
    stop = threading.Timer(seconds, camera.request_stop)
    stop.start()
    started = time.monotonic()
    run_live(session, camera, clock=camera.now_s, pace=False,
             schedule=QuestionSchedule((), ask_every_s, [Question("What is moving?")]), inbox=None,
             on_answer=lambda answer, question: None, chunk_frames=cfg.stream.live_chunk_frames)
    elapsed = time.monotonic() - started
    return {"fps_per_stream": len(session.encoded_t_s) / elapsed, "rss_mib": peak_rss_mib()}


def _percentile(values: list[float], q: float) -> float | None:
    from hermes.pipelines.serve.metrics import percentile

    return round(percentile(values, q), 1) if values else None


def bench_serve(model_name: str, memory: str, counts: list[int], *, fps: float, seconds: float,
                ask_every_s: float, max_new_tokens: int, threads: int, progress=None) -> list[dict]:
    """The rows of `bench serve`, one per stream count (see the module docstring).

    Args:
        model_name, memory: the model and memory preset both sides use.
        counts: stream counts N.
        fps: each camera's frame rate; seconds: how long each side streams.
        ask_every_s: the question period per stream; max_new_tokens: answer length cap.
        threads: torch threads of every process (serve's one and each run process).
        progress: called with a line per finished measurement.

    Returns:
        One dict per N: streams, serve_fps, run_fps, fps_ratio, serve_min_fps, dropped, latency p50/p95,
        serve_rss_mib, run_rss_mib (summed), memory_ratio.
    """
    rows = []
    common = {"model_name": model_name, "memory": memory, "fps": fps, "seconds": seconds,
              "ask_every_s": ask_every_s, "max_new_tokens": max_new_tokens}
    for n in counts:
        served = collect_worker(spawn_worker("serve", "serve_worker", {**common, "streams": n}, threads=threads))
        runs = [collect_worker(p) for p in [spawn_worker("serve", "run_worker", common, threads=threads)
                                            for _ in range(n)]]
        run_fps = sum(r["fps_per_stream"] for r in runs) / n
        run_rss = sum(r["rss_mib"] for r in runs)
        row = {"streams": n, "serve_fps": round(served["fps_per_stream"], 2), "run_fps": round(run_fps, 2),
               "fps_ratio": round(served["fps_per_stream"] / run_fps, 2) if run_fps else None,
               "serve_min_fps": round(served["min_fps"], 2), "dropped": served["dropped"],
               "latency_p50_ms": _percentile(served["latencies_ms"], 0.5),
               "latency_p95_ms": _percentile(served["latencies_ms"], 0.95),
               "serve_rss_mib": round(served["rss_mib"]), "run_rss_mib": round(run_rss),
               "memory_ratio": round(served["rss_mib"] / run_rss, 3)}
        rows.append(row)
        if progress is not None:
            progress(f"N={n}: serve {row['serve_fps']} fps/stream, run {row['run_fps']} fps/stream, "
                     f"memory {row['serve_rss_mib']} vs {row['run_rss_mib']} MiB")
    return rows


SERVE_COLUMNS = (("streams", "N"), ("serve_fps", "serve fps/stream"), ("serve_min_fps", "min"),
                 ("run_fps", "run fps/stream"), ("fps_ratio", "fps serve/run"), ("dropped", "dropped"),
                 ("latency_p50_ms", "question p50 ms"), ("latency_p95_ms", "p95 ms"),
                 ("serve_rss_mib", "serve RSS MiB"), ("run_rss_mib", "N x run RSS MiB"),
                 ("memory_ratio", "memory serve/run"))
