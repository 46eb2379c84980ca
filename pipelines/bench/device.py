"""`hermes-video bench device`: what the model's device costs and buys, at a real geometry with random weights.

Sections (`--sections`); within one, A and B alternate in one run (ratios, not absolute times, are the result):

- preprocess: a chunk of random 1920x1080 frames through the adapter's `preprocess` on the host and on
  the device: host CPU seconds and wall ms per chunk, and the largest difference of the two outputs in
  8-bit levels (on a CPU "device" is the CPU: this measures the upload path's overhead, not a gain);
- decode: `--tokens` random cached visual tokens, then a question answered with `--decode-tokens` forced
  tokens, eager and `torch.compile`d (`--compile-modes`): TTFT and TPOT medians, whether the tokens equal
  eager's, the first answer's compile time, graphs compiled (a growing cache must not recompile per length);
- probe: the attention probe's transient memory against the KV cache it scores (on CUDA measured: peak
  allocated during the probe less allocated before it; on a CPU the bound `probe_transient_bytes`), and its time.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from hermes.pipelines.bench.common import device_sync, rows_table
from hermes.pipelines.bench.memory import forced_length_decoding


def bench_preprocess(model, chunk_frames: int, repeats: int) -> dict:
    """Host against device preprocessing of one chunk of 1080p frames (medians over `repeats`, after a warm-up)."""
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
    return {"chunk_frames": chunk_frames, "frame": "1920x1080", "repeats": repeats, **med,
            "host_cpu_s_device_over_host": med["device"]["cpu_s"] / max(med["host"]["cpu_s"], 1e-9),
            "wall_device_over_host": med["device"]["wall_ms"] / med["host"]["wall_ms"],
            "max_diff_8bit_levels": float((outputs["host"] - outputs["device"]).abs().max()) * 255 * min(model.std)}


def filled_cache(model, tokens: int):
    """A cache holding the prompt prefix and `tokens` random visual embeddings, prefilled in pieces of 1024
    (one prefill of everything would need a peak of its own)."""
    cache = model.new_cache()
    model.encode_prefix(cache)
    hidden = model.text_config.hidden_size
    for start in range(0, tokens, 1024):
        n = min(1024, tokens - start)
        gen = torch.Generator(device="cpu").manual_seed(start)
        embeds = (torch.randn(n, hidden, generator=gen) * 0.02).to(model.device, model.dtype)
        model.prefill(embeds, cache.allocate_positions(n), cache)
    return cache


def _answer(model, tokens: int, decode_tokens: int, step):
    cache = filled_cache(model, tokens)
    model.decode_step = step
    device_sync(model.device)
    out = model.generate_greedy(model.question_embeds("What is happening?"), cache, decode_tokens)
    device_sync(model.device)
    model.decode_step = None
    return out


def bench_decode(model, tokens: int, decode_tokens: int, repeats: int, modes: list[str]) -> dict:
    """Eager decode against each `torch.compile` mode in `modes`, alternated `repeats` times (see the module)."""
    from torch._dynamo.utils import counters

    from hermes.models.compiled_decode import compiled_decode_step

    steps = {"off": None}
    result = {"tokens": tokens, "decode_tokens": decode_tokens, "repeats": repeats, "modes": {}}
    with forced_length_decoding(model):
        for mode in modes:
            step = compiled_decode_step(model, mode)
            if step is None:
                result["modes"][mode] = {"status": "not compiled here (see the log line)"}
                continue
            counters.clear()
            start = time.perf_counter()
            _answer(model, tokens, decode_tokens, step)  # compiles
            result["modes"][mode] = {"first_answer_s": time.perf_counter() - start,
                                     "graphs_compiled": int(counters["stats"]["unique_graphs"])}
            steps[mode] = step
        runs = {name: [] for name in steps}
        counters.clear()  # from here on a compiled graph is a recompile (the counters are global, not per mode)
        for _ in range(repeats):
            for name, step in steps.items():
                runs[name].append(_answer(model, tokens, decode_tokens, step))
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


def bench_probe(model, tokens: int) -> dict:
    """The probe (both pseudo-queries, one pass) over a cache of `tokens` visual tokens: KV bytes, the probe's
    transient bytes, their ratio and the probe's time (the second of two calls: the first pays one-off costs)."""
    from hermes.config import MemoryConfig
    from hermes.probe import probe_attention, probe_transient_bytes

    cache = filled_cache(model, tokens)
    memory = MemoryConfig()
    queries = torch.cat([model.question_embeds(memory.local_query), model.question_embeds(memory.global_query)])
    kv_bytes = sum(k.nbytes + v.nbytes for k, v in cache.layer_tensors())
    cuda = model.device.type == "cuda"
    for _ in range(2):
        device_sync(model.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        probe_attention(model, cache, queries)
        device_sync(model.device)
        probe_ms = (time.perf_counter() - start) * 1e3
    transient = torch.cuda.max_memory_allocated() - before if cuda else probe_transient_bytes(
        model.num_layers, model.text_config.num_attention_heads, queries.shape[0], cache.num_tokens)
    return {"cached_tokens": cache.num_tokens, "kv_mib": kv_bytes / 2**20, "transient_mib": transient / 2**20,
            "transient": "measured" if cuda else "bound", "transient_over_kv": transient / kv_bytes,
            "probe_ms": probe_ms}


def device_tables(result: dict) -> str:
    """`bench device`'s sections as markdown tables, one per section run."""
    out = []
    if "preprocess" in result:
        p = result["preprocess"]
        out.append(rows_table([{"place": name, "host CPU s": round(p[name]["cpu_s"], 4),
                                "wall ms": round(p[name]["wall_ms"], 1)} for name in ("host", "device")]))
        out.append(f"device / host: host CPU {p['host_cpu_s_device_over_host']:.3f}, wall "
                   f"{p['wall_device_over_host']:.3f}; largest difference {p['max_diff_8bit_levels']:.2f} 8-bit levels")
    if "decode" in result:
        modes = result["decode"]["modes"]
        keys = ("ttft_ms", "tpot_ms", "tpot_vs_eager", "tokens_equal_eager", "first_answer_s", "graphs_compiled",
                "status")
        out.append(rows_table([{"mode": name, **{k: round(v, 3) if isinstance(v, float) else v
                                                 for k, v in row.items() if k in keys}}
                               for name, row in modes.items()]))
        out.append(f"recompiles during the repeats: {result['decode']['recompiles_during_repeats']}")
    if "probe" in result:
        out.append(rows_table([{"model": result["arch"], **{k: round(v, 3) if isinstance(v, float) else v
                                                            for k, v in result["probe"].items()}}]))
    return "\n\n".join(out)
