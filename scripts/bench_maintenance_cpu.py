"""HERMES maintenance cost against encode cost, on a CPU, at 16 and 196 visual tokens per frame.

`hermes-video bench memory/sweep` default to 16 visual tokens per frame so that `full` stays computable
over thousands of frames; real models put 196 tokens per frame (LLaVA-OneVision) in 16-frame chunks.
This script streams random frames through `hermes` on a small random LLaVA-OneVision (8 layers,
512 wide) at both geometries and chunks of 8 and 16 frames, one CPU thread, and prints each
chunk's mean encode time, mean maintenance time over the chunks that evicted, and their ratio
(the former target: maintenance at most 0.10 of encode; since the probe rides in the prefill the
target is the whole ingest over `sliding`'s, `hermes-video bench overhead`). It uses only APIs older than the probe
rewrite, so the same command measures an older checkout too (run it with that checkout's python).

    OMP_NUM_THREADS=1 python scripts/bench_maintenance_cpu.py [--quick]
    # ours: evict a quarter of the budget below it, at the default 4K budget for the small frames too
    OMP_NUM_THREADS=1 python scripts/bench_maintenance_cpu.py --budget-16 4096 --evict-headroom 0.25

`maintain/encode` is over the chunks that evicted; `amortised` over every chunk from the first
eviction on (what ingest pays on average: with `memory.evict_headroom`, chunks that fit run no probe).
The stream is long enough for about ten evictions at any headroom.

Where the probe runs moves time between the two columns: with `hermes.probe.prefill_chunk` (the
session's ingest since 2026-12-04) the pseudo-query rides in the chunk's own forward, so its cost is
inside `encode` and `maintain` is the scoring and eviction alone. So every row also gives
`ingest/chunk`, encode plus maintenance of a chunk that evicted, which compares across the two.
`--ingest plain,lean` measures both in one run, alternating: `plain` is the earlier ingest (the
model's own prefill through every layer, then the probe as a forward of its own in maintenance),
`lean` the current one; on a checkout without `prefill_chunk` only `plain` exists.
"""

import argparse
import math

import torch

import hermes.pipelines.session as session_module
from hermes.config import MemoryConfig, ModelConfig
from hermes.models.loading import make_adapter
from hermes.models.tiny import tiny_llava_onevision
from hermes.pipelines.bench.memory import measure_stream, resolve_policies

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--quick", action="store_true", help="half the stream lengths")
p.add_argument("--budget-16", type=int, default=512, help="budget at 16 tokens per frame (196: 4096)")
p.add_argument("--evict-headroom", type=float, default=0.0, help="memory.evict_headroom (0: the reference)")
p.add_argument("--tokens-per-frame", default="16,196", help="geometries to run: 16 and/or 196")
p.add_argument("--ingest", default="lean", help="ingest paths to measure, alternating: lean and/or plain")
args = p.parse_args()
torch.set_num_threads(1)
memory = MemoryConfig(evict_headroom=args.evict_headroom) if args.evict_headroom else MemoryConfig()
# image side px -> tokens per frame, and budget
GEOMETRIES = {tpf: geometry for tpf, geometry in {16: (28, args.budget_16), 196: (108, 4096)}.items()
              if str(tpf) in args.tokens_per_frame.split(",")}
lean_ingest = getattr(session_module, "prefill_chunk", None)


def plain_ingest(model, cache, embeds, positions, probe_embeds=None, **model_kwargs):
    """The ingest before `prefill_chunk`: the model's own prefill; maintenance then probes by itself."""
    model.prefill(embeds, positions, cache, **model_kwargs)


INGEST = {"lean": lean_ingest, "plain": plain_ingest}
paths = [name for name in args.ingest.split(",") if INGEST.get(name) is not None]
if lean_ingest is None:
    paths = ["plain"]  # an older checkout: its own ingest is the plain one
print(f"evict_headroom {args.evict_headroom}")
print("| tokens/frame | budget | chunk | frames | ingest | encode ms/chunk | maintain ms/chunk | maintain/encode "
      "| amortised | ingest ms/evicting chunk |")
print("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
for tpf, (side, budget) in GEOMETRIES.items():
    net, tokenizer = tiny_llava_onevision(seed=0, image_size=side, hidden_size=512, num_layers=8)
    model = make_adapter("llava_onevision", f"small-random-llava-onevision ({tpf} tokens/frame)", net, tokenizer,
                         ModelConfig(device="cpu", dtype="float32"))
    policy = resolve_policies("hermes", memory, budget=budget)[0]
    for chunk in (8, 16):
        # fill the budget, then about ten evictions (one per 1 + headroom * budget / chunk tokens chunks)
        per_eviction = 1 + math.ceil(args.evict_headroom * budget / (chunk * tpf))
        chunks = math.ceil(budget / (chunk * tpf)) + (5 if args.quick else 10) * per_eviction
        length = chunks * chunk
        for path in paths:
            if lean_ingest is not None:
                session_module.prefill_chunk = INGEST[path]
            measure_stream(model, policy, [2 * chunk], chunk_frames=chunk, decode_tokens=1, repeats=1, frame_px=32)
            rows, _ = measure_stream(model, policy, [length], chunk_frames=chunk, decode_tokens=1, repeats=1,
                                     frame_px=32)
            r = rows[-1]
            # older checkouts lack the last two
            amortised, ingest = (getattr(r, name, None) for name in ("amortised_maintain_ratio",
                                                                     "ingest_ms_per_evicting_chunk"))
            print(f"| {tpf} | {budget} | {chunk} | {length} | {path} | {r.encode_ms_per_chunk:.1f} | "
                  f"{r.maintain_ms_per_chunk:.1f} | {r.maintain_ratio:.3f} | "
                  f"{'-' if amortised is None else f'{amortised:.3f}'} | "
                  f"{'-' if ingest is None else f'{ingest:.1f}'} |", flush=True)
if lean_ingest is not None:
    session_module.prefill_chunk = lean_ingest
