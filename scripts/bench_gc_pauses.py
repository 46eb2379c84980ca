"""Garbage-collector pauses during a long stream, with and without the start-up heap frozen.

Streams `--frames` synthetic frames (1 per second) through the micro model under `hermes` with
recall, asking a question every 20 s, once with ``HERMES_GC_FREEZE=0`` and once with the default
(`hermes.pipelines.heap.freeze_startup_heap` on the session's open), each in its own process, and
prints per run: collections per generation, their total pause, the worst pause and the wall time.
A pause is stop-the-world for every thread of the process (ingest, the disk writer, answers).

    OMP_NUM_THREADS=1 python scripts/bench_gc_pauses.py [--frames 3000]
"""

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json, sys, time
import torch
torch.set_num_threads(1)
from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import load_model
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import make_frame

frames = [Frame(index=i, t_s=float(i), rgb=make_frame(float(i), size=(64, 48), seed=5)) for i in range(int(sys.argv[1]))]
model = load_model(ModelConfig(name="micro-llava-onevision", max_new_tokens=4))
session = StreamingSession(model, MemoryConfig(policy="hermes", budget=64, recall=True), frames, chunk_frames=4,
                           max_new_tokens=4)
passes, started, worst = {}, {}, 0.0
def on_gc(phase, info):
    global worst
    g = info["generation"]
    if phase == "start":
        started[g] = time.perf_counter()
    else:
        pause = time.perf_counter() - started[g]
        n, total = passes.get(g, (0, 0.0))
        passes[g] = (n + 1, total + pause)
        worst = max(worst, pause)
gc.callbacks.append(on_gc)
t0 = time.perf_counter()
for at in range(20, len(frames), 20):
    session.advance(until_s=at)
    session.ask("What colour is the circle?", at=at)
print(json.dumps({"wall_s": time.perf_counter() - t0, "frozen": gc.get_freeze_count(),
                  "passes": {g: [n, round(t * 1e3, 1)] for g, (n, t) in sorted(passes.items())},
                  "worst_pause_ms": round(worst * 1e3, 1)}))
"""

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--frames", type=int, default=3000)
args = parser.parse_args()
print("| heap | frozen objects | gen-0 / gen-1 / gen-2 passes | their pause ms | worst pause ms | wall s |")
print("|---|---:|---|---|---:|---:|")
for label, freeze in (("collected (HERMES_GC_FREEZE=0)", "0"), ("frozen at open (default)", "1")):
    out = subprocess.run([sys.executable, "-c", CHILD, str(args.frames)], capture_output=True, text=True,
                         env=dict(os.environ, HERMES_GC_FREEZE=freeze), check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    passes = [row["passes"].get(str(g), [0, 0.0]) for g in range(3)]
    print(f"| {label} | {row['frozen']} | {' / '.join(str(n) for n, _ in passes)} | "
          f"{' / '.join(str(t) for _, t in passes)} | {row['worst_pause_ms']} | {row['wall_s']:.1f} |", flush=True)
