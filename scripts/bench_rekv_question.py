"""Time of one `rekv` question as the stream grows (host blocks accumulate), on the micro model.

Streams synthetic frames at 1 per second through `rekv` (a 64-token window, `recall_top_k` 16, chunks
of 4) and, at 100, 300 and 600 frames, asks three questions; prints the median time per question.
ReKV's retrieval scores every frame's representative key and loads only the frames it picks, so
the time should grow far slower than the number of blocks.

    python scripts/bench_rekv_question.py
"""

import statistics
import time

import torch

from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import load_model
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession
from hermes.pipelines.synthetic import make_frame

torch.set_num_threads(1)
model = load_model(ModelConfig(name="micro-llava-onevision", max_new_tokens=2))
frames = [Frame(index=i, t_s=float(i), rgb=make_frame(float(i), size=(64, 48), seed=5)) for i in range(600)]
session = StreamingSession(model, MemoryConfig(policy="rekv", budget=64, recall_top_k=16), frames, chunk_frames=4,
                           max_new_tokens=2)
print("| frames | host blocks | ms per question (median of 3) |")
print("|---:|---:|---:|")
for at in (100, 300, 599):
    session.advance(until_s=at)
    times_ms = []
    for _ in range(3):
        start = time.perf_counter()
        session.ask("What colour is the circle?", at=at)
        times_ms.append((time.perf_counter() - start) * 1e3)
    print(f"| {at} | {len(session.memory.blocks)} | {statistics.median(times_ms):.1f} |", flush=True)
