"""HERMES maintenance cost at the real token geometry, on a CPU.

`hermes-video bench memory/sweep` default to 16 visual tokens per frame so that `full` stays computable
over thousands of frames; at that size a chunk is only 128-256 tokens and the attention probe (a
pseudo-query forward of ~30 tokens) is a large fraction of it. Real models put 196 tokens per frame
(LLaVA-OneVision) in 16-frame chunks: 3136 tokens per chunk. This script measures `full` and `hermes`
(4K budget) at that geometry on a small random LLaVA-OneVision (8 layers, 512 wide), one CPU thread.

    OMP_NUM_THREADS=1 python scripts/bench_maintenance_cpu.py
"""

import torch

from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import make_adapter
from hermes.models.tiny import tiny_llava_onevision
from hermes.pipelines.bench import measure_stream, resolve_policies
from hermes.pipelines.bench_report import markdown_table

torch.set_num_threads(1)
net, tokenizer = tiny_llava_onevision(seed=0, image_size=108, hidden_size=512, num_layers=8)  # 196 tokens/frame
model = make_adapter("llava_onevision", "small-random-llava-onevision (196 tokens/frame)", net, tokenizer,
                     ModelConfig(device="cpu", dtype="float32"))
rows = []
for policy in resolve_policies("full,hermes", MemoryConfig(), budget=4096):
    measured, _ = measure_stream(model, policy, [32, 64, 96], chunk_frames=16, decode_tokens=1, repeats=3,
                                 frame_px=64)
    rows += measured
print(markdown_table(rows))
