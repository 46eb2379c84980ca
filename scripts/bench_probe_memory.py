"""The attention probe's transient memory against the KV cache it scores, at a model's real geometry.

Fills a working cache with `--tokens` random visual embeddings (plus the prompt prefix), then runs
the HERMES probe (both pseudo-queries, one pass) and reports: the KV cache's bytes, the probe's
transient bytes (on CUDA measured: peak allocated during the probe minus allocated before it; on a
CPU the bound `hermes.probe.probe_transient_bytes`), their ratio, and the probe's time.

    python scripts/bench_probe_memory.py --arch llava-ov-7b --device cuda --dtype bfloat16 --tokens 7232
    OMP_NUM_THREADS=1 python scripts/bench_probe_memory.py --arch cpu-small --device cpu --tokens 1024
"""

import argparse
import time

import torch

from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import build_random_model
from hermes.probe import probe_attention, probe_transient_bytes

parser = argparse.ArgumentParser()
parser.add_argument("--arch", default="cpu-small")
parser.add_argument("--device", default="cpu")
parser.add_argument("--dtype", default="float32")
parser.add_argument("--tokens", type=int, default=4096 + 3136, help="cached visual tokens (default: 4K budget + a chunk)")
args = parser.parse_args()
model = build_random_model(args.arch, ModelConfig(device=args.device, dtype=args.dtype))
cache = model.new_cache()
model.encode_prefix(cache)
hidden = model.text_config.hidden_size
for start in range(0, args.tokens, 1024):  # in pieces: one prefill of everything would need its own peak
    n = min(1024, args.tokens - start)
    embeds = torch.randn(n, hidden, device=model.device, dtype=model.dtype) * 0.02
    model.prefill(embeds, cache.allocate_positions(n), cache)
memory = MemoryConfig()
queries = torch.cat([model.question_embeds(memory.local_query), model.question_embeds(memory.global_query)])
kv_bytes = sum(k.nbytes + v.nbytes for k, v in cache.layer_tensors())
cuda = model.device.type == "cuda"
for _ in range(2):  # the first call pays one-off costs
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    maps = probe_attention(model, cache, queries)
    if cuda:
        torch.cuda.synchronize()
    probe_ms = (time.perf_counter() - start) * 1e3
transient = torch.cuda.max_memory_allocated() - before if cuda else probe_transient_bytes(
    model.num_layers, model.text_config.num_attention_heads, queries.shape[0], cache.num_tokens)
print(f"| model | cached tokens | KV cache MiB | probe transient MiB ({'measured' if cuda else 'bound'}) | "
      f"transient / KV | probe ms |")
print("|---|---:|---:|---:|---:|---:|")
print(f"| {args.arch} | {cache.num_tokens} | {kv_bytes / 2**20:.1f} | {transient / 2**20:.1f} | "
      f"{transient / kv_bytes:.3f} | {probe_ms:.1f} |")
assert maps.shape == (model.num_layers, queries.shape[0], cache.num_tokens)
