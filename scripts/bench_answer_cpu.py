"""Time of one answer at a full 4K cache on a CPU: the whole answer (prefill and decode) and its TTFT.

Streams 320 random frames (16 tokens each) through `hermes` at a 4K budget on cpu-small's geometry (a
random LLaVA-OneVision, 8 layers x 512, 32 query / 16 KV heads), then asks one warm-up question and
five timed ones of 32 new tokens each; prints the medians. One torch thread. It uses only APIs older
than the in-place cache appends, so the same command measures an older checkout (run it with that
checkout on `PYTHONPATH`).

    OMP_NUM_THREADS=1 python scripts/bench_answer_cpu.py
"""

import statistics
import time

import numpy as np
import torch

from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import make_adapter
from hermes.models.tiny import tiny_llava_onevision
from hermes.pipelines.frames import Frame
from hermes.pipelines.session import StreamingSession

torch.set_num_threads(1)
net, tokenizer = tiny_llava_onevision(seed=0, image_size=28, hidden_size=512, num_layers=8)
model = make_adapter("llava_onevision", "cpu-small geometry", net, tokenizer, ModelConfig(device="cpu", dtype="float32"))
rng = np.random.default_rng(0)
frames = [Frame(float(i), rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), i) for i in range(320)]
session = StreamingSession(model, MemoryConfig(policy="hermes", budget=4096), frames, chunk_frames=16,
                           max_new_tokens=32)
start = time.perf_counter()
session.advance(until_s=320)
ingest_s = time.perf_counter() - start
session.ask("What is happening?", at=320)  # warm-up
answer_ms, ttft_ms = [], []
for _ in range(5):
    start = time.perf_counter()
    answer = session.ask("What is happening in the video now?", at=320)
    answer_ms.append((time.perf_counter() - start) * 1e3)
    ttft_ms.append(answer.ttft_ms)
print(f"cached tokens {session.cache.num_tokens}, ingest {ingest_s:.1f} s; answer of 32 tokens: "
      f"{statistics.median(answer_ms):.0f} ms, TTFT {statistics.median(ttft_ms):.1f} ms (medians of 5)")
