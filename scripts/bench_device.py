"""Preprocessing on the host vs on the model's device, and decode with vs without `model.compile_decode`.

Two sections, A and B alternated within one run (ratios, not absolute times, are the result):

- preprocess: a chunk of random 1920x1080 uint8 frames through the adapter's `preprocess` with
  `model.preprocess_on` host and device: host CPU seconds (`time.process_time`) and wall ms per chunk,
  and the largest difference of the two outputs in 8-bit levels (on a CPU "device" is the CPU: the
  same kernels, so this measures the upload path's overhead, not a gain).
- decode: a cache of `--tokens` random visual tokens, then a question answered with `--decode-tokens`
  forced tokens, eager and compiled (`--compile-modes`); TTFT and TPOT medians, whether the tokens
  equal eager's, the compile time of the first answer, graphs compiled (a growing cache must not
  recompile per length).

    OMP_NUM_THREADS=1 python scripts/bench_device.py --arch cpu-small --device cpu --output /tmp/d.json
    python scripts/bench_device.py --arch llava-ov-7b --device cuda --dtype bfloat16 --tokens 4096
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

from hermes.config import ModelConfig
from hermes.models.compiled_decode import compiled_decode_step
from hermes.models.loading import build_random_model
from hermes.pipelines.bench import device_sync
from hermes.pipelines.bench_cli import write_json_output


def bench_preprocess(model, chunk_frames: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8) for _ in range(chunk_frames)]
    places = {"host": None, "device": model.device}
    times = {name: {"cpu_s": [], "wall_ms": []} for name in places}
    outputs = {}
    for _ in range(repeats + 1):  # the first round warms up
        for name, where in places.items():
            model.preprocess_device = where
            device_sync(model.device)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            out = model.preprocess(frames)
            device_sync(model.device)
            times[name]["cpu_s"].append(time.process_time() - cpu0)
            times[name]["wall_ms"].append((time.perf_counter() - wall0) * 1e3)
            outputs[name] = (out[0] if isinstance(out, tuple) else out).float().cpu()
    model.preprocess_device = None
    med = {name: {k: statistics.median(v[1:]) for k, v in t.items()} for name, t in times.items()}
    std = min(model.std)
    return {"chunk_frames": chunk_frames, "frame": "1920x1080", "repeats": repeats, **med,
            "host_cpu_s_device_over_host": med["device"]["cpu_s"] / max(med["host"]["cpu_s"], 1e-9),
            "wall_device_over_host": med["device"]["wall_ms"] / med["host"]["wall_ms"],
            "max_diff_8bit_levels": float((outputs["host"] - outputs["device"]).abs().max()) * 255 * std}


def answer(model, tokens: int, decode_tokens: int, step):
    cache = model.new_cache()
    model.encode_prefix(cache)
    hidden = model.text_config.hidden_size
    for start in range(0, tokens, 1024):
        n = min(1024, tokens - start)
        gen = torch.Generator(device="cpu").manual_seed(start)
        embeds = (torch.randn(n, hidden, generator=gen) * 0.02).to(model.device, model.dtype)
        model.prefill(embeds, cache.allocate_positions(n), cache)
    model.decode_step = step
    device_sync(model.device)
    out = model.generate_greedy(model.question_embeds("What is happening?"), cache, decode_tokens,
                                stop_ids=())  # forced length: every answer decodes `decode_tokens` tokens
    device_sync(model.device)
    model.decode_step = None
    return out


def bench_decode(model, tokens: int, decode_tokens: int, repeats: int, modes: list[str]) -> dict:
    from torch._dynamo.utils import counters

    steps = {"off": None}
    result = {"tokens": tokens, "decode_tokens": decode_tokens, "repeats": repeats, "modes": {}}
    for mode in modes:
        step = compiled_decode_step(model, mode)
        if step is None:
            result["modes"][mode] = {"status": "not compiled here (see the log line)"}
            continue
        counters.clear()
        start = time.perf_counter()
        answer(model, tokens, decode_tokens, step)  # compiles
        result["modes"][mode] = {"first_answer_s": time.perf_counter() - start,
                                 "graphs_compiled": int(counters["stats"]["unique_graphs"])}
        steps[mode] = step
    runs = {name: [] for name in steps}
    counters.clear()  # from here on a compiled graph is a recompile (the counters are global, not per mode)
    for _ in range(repeats):
        for name, step in steps.items():
            runs[name].append(answer(model, tokens, decode_tokens, step))
    eager = runs["off"][0].token_ids
    for name, gens in runs.items():
        row = result["modes"].setdefault(name, {})
        row["ttft_ms"] = statistics.median(g.ttft_ms for g in gens)
        row["tpot_ms"] = statistics.median((g.latency_ms - g.ttft_ms) / (decode_tokens - 1) for g in gens)
        row["tokens_equal_eager"] = all(g.token_ids == eager for g in gens)
        if name != "off":
            row["tpot_vs_eager"] = row["tpot_ms"] / result["modes"]["off"]["tpot_ms"]
    result["recompiles_during_repeats"] = int(counters["stats"]["unique_graphs"])  # every compiled mode together
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="cpu-small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-layers", type=int, help="language-model layers (widths unchanged)")
    parser.add_argument("--sections", default="preprocess,decode")
    parser.add_argument("--chunk-frames", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1024, help="cached visual tokens before the question")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile-modes", default="default,reduce-overhead")
    parser.add_argument("--output", metavar="FILE")
    args = parser.parse_args()
    model = build_random_model(args.arch, ModelConfig(device=args.device, dtype=args.dtype), num_layers=args.num_layers)
    result = {"arch": args.arch, "device": str(model.device), "dtype": str(model.dtype),
              "num_layers": model.num_layers, "torch": torch.__version__}
    sections = args.sections.split(",")
    if "preprocess" in sections:
        result["preprocess"] = bench_preprocess(model, args.chunk_frames, args.repeats)
        write_json_output(args.output, result)
    if "decode" in sections:
        result["decode"] = bench_decode(model, args.tokens, args.decode_tokens, args.repeats,
                                        [m for m in args.compile_modes.split(",") if m])
    write_json_output(args.output, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
