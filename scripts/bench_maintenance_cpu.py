"""HERMES maintenance cost against encode cost, on a CPU, at 16 and 196 visual tokens per frame.

`hermes-video bench memory/sweep` default to 16 visual tokens per frame so that `full` stays computable
over thousands of frames; real models put 196 tokens per frame (LLaVA-OneVision) in 16-frame chunks.
This script streams random frames through `hermes` on a small random LLaVA-OneVision (8 layers,
512 wide) at both geometries and chunks of 8 and 16 frames, one CPU thread, and prints each
chunk's mean encode time, mean maintenance time over the chunks that evicted, and their ratio
(the issue's target: maintenance at most 0.10 of encode). It uses only APIs older than the probe
rewrite, so the same command measures an older checkout too (run it with that checkout's python).

    OMP_NUM_THREADS=1 python scripts/bench_maintenance_cpu.py [--quick]
"""

import sys

import torch

from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import make_adapter
from hermes.models.tiny import tiny_llava_onevision
from hermes.pipelines.bench import measure_stream, resolve_policies

torch.set_num_threads(1)
QUICK = "--quick" in sys.argv
# (image side px -> tokens per frame, budget, stream length per chunk size)
GEOMETRIES = {16: (28, 512, {8: 96, 16: 128}), 196: (108, 4096, {8: 48, 16: 64})}
print("| tokens/frame | chunk | encode ms/chunk | maintain ms/chunk | maintain/encode |")
print("|---:|---:|---:|---:|---:|")
for tpf, (side, budget, lengths) in GEOMETRIES.items():
    net, tokenizer = tiny_llava_onevision(seed=0, image_size=side, hidden_size=512, num_layers=8)
    model = make_adapter("llava_onevision", f"small-random-llava-onevision ({tpf} tokens/frame)", net, tokenizer,
                         ModelConfig(device="cpu", dtype="float32"))
    policy = resolve_policies("hermes", MemoryConfig(), budget=budget)[0]
    for chunk, length in lengths.items():
        length = length // 2 if QUICK else length
        measure_stream(model, policy, [2 * chunk], chunk_frames=chunk, decode_tokens=1, repeats=1, frame_px=32)
        rows, _ = measure_stream(model, policy, [length], chunk_frames=chunk, decode_tokens=1, repeats=1,
                                 frame_px=32)
        r = rows[-1]
        print(f"| {tpf} | {chunk} | {r.encode_ms_per_chunk:.1f} | {r.maintain_ms_per_chunk:.1f} | "
              f"{r.maintain_ratio:.3f} |", flush=True)
