"""Golden data for `tests/hermes/test_golden.py`: HERMES' reference functions run once on seeded inputs.

    /work/ref/venv/bin/python scripts/golden_reference.py /work/ref/HERMES --out tests/hermes/golden

The checkout is the authors' code (haowei-freesky/HERMES at 8d699b1, via the fork gdace829/HERMES); it
runs in its own environment (`pip install torch==2.13.0 transformers==4.57.1 logzero safetensors`),
imports nothing from hermes and has none of its code copied: its functions run on stand-ins carrying
only the attributes they read. One safetensors file per geometry (1-D RoPE, LLaVA-OneVision-like;
M-RoPE, Qwen2.5-VL-like) holds a first eviction's maps, scores (captured at `torch.topk`), keep indices
and shrinks, and a stream (docs/ARCHITECTURE.md, Memory, "Fidelity over many chunks") of `CHUNKS`
chunks: per chunk c its keys and values (`chunk<c>.keys`, rotated at the recorded positions
`chunk<c>.placed`), an eviction's maps, scores and keep indices, and the cache after it (`.cache_keys`,
`.cache_values`, `.cache_positions`, `.ids`: each entry's stream index, a summary of chunk c as -(c + 1)).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

LAYERS = 10  # bands: sensory 0, working 1-6, long-term 7-9 (int(0.1 L), int(0.7 L))
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 16
PREFIX, QUERY = 4, 3  # system-prompt tokens; pseudo-query tokens
BUDGET = 48  # visual tokens kept per layer (kv_size)
THETA = 10000.0
MROPE_SECTION = (2, 3, 3)  # pairs per (t, h, w) axis; sums to HEAD_DIM / 2
CHUNKS = 14  # chunks of the stream
STREAM_1D = 16  # tokens per chunk, 1-D (one run)
GRID_STEPS, GRID_SIDE = 2, 4  # M-RoPE chunk: 2 grid steps of 4 x 4 merged patches (1 fps, 2 tokens per second)


class TableRope(torch.nn.Module):
    """The rotary module API the LLaVA reference calls (transformers 4.45: ``forward(x, seq_len)`` ->
    cos/sin tables of shape (seq_len, D)), for the standard RoPE frequencies."""

    def __init__(self, dim: int, base: float) -> None:
        super().__init__()
        self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    def forward(self, x, seq_len=None):
        t = torch.arange(seq_len, dtype=torch.int64).float()
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def stand_in(cls, names: list[str], **attrs):
    """An object whose methods `names` are `cls`'s own functions and whose attributes are `attrs`."""
    holder = type(f"RefStandIn_{cls.__name__}", (), {n: cls.__dict__[n] for n in names})
    obj = holder()
    obj.__dict__.update(attrs)
    return obj


def attention_maps(gen: torch.Generator, total: int) -> torch.Tensor:
    """(3 kinds, L, 1, H, Q, total + Q) softmax rows: local, global, mixed pseudo-query attention."""
    logits = 3.0 * torch.randn(3, LAYERS, 1, HEADS, QUERY, total + QUERY, generator=gen)
    return torch.softmax(logits, dim=-1)


def capture_topk_scores(module, run):
    """Run `run()` while recording every score row the module passes to `torch.topk` (in call order)."""
    rows = []
    original = torch.topk

    def recording(score, k, *args, **kwargs):
        rows.append(score.detach().clone())
        return original(score, k, *args, **kwargs)

    module.torch.topk = recording  # the module's `torch` is torch itself: patched for this call only
    try:
        result = run()
    finally:
        module.torch.topk = original
    return result, rows


def prune(cls, module, attn: torch.Tensor, kv_cache, llava: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores (L, V), keep (L, budget) visual indices) of the reference's `prune_kv_cache_by_attention`."""
    names = ["prune_kv_cache_by_attention", "allocate_budget_by_depth"]
    attrs = dict(device=torch.device("cpu"), visual_start_idx=PREFIX, num_layers=LAYERS,
                 short_term_threshold=int(LAYERS * 0.1), long_term_threshold=int(LAYERS * (1 - 0.3)),
                 kv_cache=kv_cache)
    if llava:
        names.append("_get_cache_seq_len_per_layer")
        attrs["token_activity_cache"] = [None] * LAYERS
    obj = stand_in(cls, names, **attrs)
    lists = [[attn[kind, layer] for layer in range(LAYERS)] for kind in range(3)]
    keep, rows = capture_topk_scores(module, lambda: obj.prune_kv_cache_by_attention(*lists, num_keep=BUDGET))
    padded = torch.full((LAYERS, BUDGET), -1, dtype=torch.long)  # visual indices; -1 pads long-term rows
    for layer, row in enumerate(keep):
        if row[:PREFIX] != list(range(PREFIX)):
            raise SystemExit(f"layer {layer}: the reference did not keep the prefix")
        padded[layer, :len(row) - PREFIX] = torch.tensor(row[PREFIX:]) - PREFIX
    return torch.stack(rows), padded


def keep_lists(keep: torch.Tensor) -> list[list[int]]:
    """Cache indices (prefix included) per layer, as the reference's shrink takes them."""
    return [list(range(PREFIX)) + [PREFIX + i for i in row if i >= 0] for row in keep.tolist()]


def one_d() -> dict[str, torch.Tensor]:
    import inference.llavaov_hermes as llava_mod
    import inference.qwenvl_hermes as qwen_mod

    gen = torch.Generator().manual_seed(1001)
    total = PREFIX + 80  # visual tokens
    attn = attention_maps(gen, total)
    keys = torch.randn(LAYERS, 1, KV_HEADS, total, HEAD_DIM, generator=gen)
    values = torch.randn(LAYERS, 1, KV_HEADS, total, HEAD_DIM, generator=gen)
    positions = torch.arange(total) + 7 * (torch.arange(total) >= PREFIX)  # a gap after the prefix, as lazy re-indexing leaves
    kv = [(keys[l].clone(), values[l].clone()) for l in range(LAYERS)]
    qwen_scores, qwen_keep = prune(qwen_mod.QwenVL_Hermes, qwen_mod, attn, kv, llava=False)
    llava_scores, llava_keep = prune(llava_mod.LlavaOneVision_Hermes, llava_mod, attn, kv, llava=True)
    out = {"attention": attn, "keys": keys, "values": values, "positions": positions,
           "qwen_scores": qwen_scores, "qwen_keep": qwen_keep, "llava_scores": llava_scores, "llava_keep": llava_keep}
    rope = TableRope(HEAD_DIM, THETA)
    lm = types.SimpleNamespace(rotary_emb=rope, config=types.SimpleNamespace(
        hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, max_position_embeddings=32768))
    for mode, streaming in (("lazy", True), ("eager", False)):
        obj = stand_in(llava_mod.LlavaOneVision_Hermes,
                       ["_shrink_positions_and_rerotate_keys", "_get_cache_seq_len_per_layer", "_sanitize_keep_indices"],
                       device=torch.device("cpu"), kv_cache=[(k.clone(), v.clone()) for k, v in kv], num_layers=LAYERS,
                       _position_ids_cache=[positions.clone() for _ in range(LAYERS)], streaming=streaming,
                       long_term_threshold=int(LAYERS * (1 - 0.3)), language_model=lm)
        obj._shrink_positions_and_rerotate_keys(keep_lists(qwen_keep))
        out[f"{mode}_keys"] = torch.stack([k for k, _ in obj.kv_cache])
        if streaming:  # compaction moves keys only: the offline values are the streaming ones
            out[f"{mode}_values"] = torch.stack([v for _, v in obj.kv_cache])
        out[f"{mode}_positions"] = torch.stack(obj._position_ids_cache)
    return out


def mrope_positions(chunks: int, steps: int, height: int, width: int) -> torch.Tensor:
    """(3, PREFIX + visual) positions: the prefix as text, then `chunks` video chunks as the Qwen reference
    places them (each a block one past the largest position so far, 4 temporal positions per step).
    """
    import inference.qwenvl_hermes as qwen_mod

    vision = types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=2)
    parts = [torch.arange(PREFIX, dtype=torch.float32).expand(3, PREFIX)]
    for _ in range(chunks):
        offset = int(torch.cat(parts, dim=1).max()) + 1
        parts.append(qwen_mod.get_qwen2_5_vl_position_ids([steps, 2 * height, 2 * width], steps * height * width,
                                                          offset=offset, vision_config=vision, sample_fps=1))
    return torch.cat(parts, dim=1)


def mrope() -> dict[str, torch.Tensor]:
    import inference.qwenvl_hermes as qwen_mod
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    gen = torch.Generator().manual_seed(2002)
    positions = mrope_positions(chunks=3, steps=2, height=4, width=4)  # 3 chunks x 2 steps x 16 tokens
    total = positions.shape[1]
    attn = attention_maps(gen, total)
    keys = torch.randn(LAYERS, 1, KV_HEADS, total, HEAD_DIM, generator=gen)
    values = torch.randn(LAYERS, 1, KV_HEADS, total, HEAD_DIM, generator=gen)
    kv = [(keys[l].clone(), values[l].clone()) for l in range(LAYERS)]
    scores, keep = prune(qwen_mod.QwenVL_Hermes, qwen_mod, attn, kv, llava=False)
    out = {"attention": attn, "keys": keys, "values": values, "positions": positions.long(),
           "qwen_scores": scores, "qwen_keep": keep}
    config = Qwen2_5_VLTextConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                  num_key_value_heads=KV_HEADS, rope_theta=THETA, max_position_embeddings=32768,
                                  rope_scaling={"type": "mrope", "mrope_section": list(MROPE_SECTION)})
    lm = types.SimpleNamespace(rotary_emb=Qwen2_5_VLRotaryEmbedding(config=config), config=config)
    for mode, streaming in (("lazy", True), ("eager", False)):
        obj = stand_in(qwen_mod.QwenVL_Hermes,
                       ["_shrink_positions_and_rerotate_keys", "_get_cache_seq_len_per_layer", "_sanitize_keep_indices"],
                       device=torch.device("cpu"), kv_cache=[(k.clone(), v.clone()) for k, v in kv], num_layers=LAYERS,
                       _position_ids_cache=[positions.clone() for _ in range(LAYERS)], streaming=streaming,
                       long_term_threshold=int(LAYERS * (1 - 0.3)), language_model=lm, visual_start_idx=PREFIX,
                       _mrope_section=list(MROPE_SECTION))
        obj._shrink_positions_and_rerotate_keys(keep_lists(keep))
        out[f"{mode}_keys"] = torch.stack([k for k, _ in obj.kv_cache])
        if streaming:
            out[f"{mode}_values"] = torch.stack([v for _, v in obj.kv_cache])
        out[f"{mode}_positions"] = torch.stack(obj._position_ids_cache).round().long()
    return out


class StandInLM:
    """The language model `encode_video_chunk` calls: appends the chunk's keys/values to every layer;
    carries the rotary module and config the shrink reads.
    """

    def __init__(self, rotary_emb, config) -> None:
        self.rotary_emb, self.config = rotary_emb, config
        self.model = types.SimpleNamespace(layers=[])  # the LLaVA file looks for per-layer rotary modules here
        self.chunk: tuple[torch.Tensor, torch.Tensor] | None = None  # (L, 1, KV, n, D) each

    def __call__(self, inputs_embeds=None, past_key_values=None, **kwargs):
        keys, values = self.chunk
        cache = [(torch.cat([k, keys[l]], dim=2), torch.cat([v, values[l]], dim=2))
                 for l, (k, v) in enumerate(past_key_values)]
        return types.SimpleNamespace(past_key_values=cache)


class StandInVideo:
    """The processor and vision tower `encode_video_chunk` calls: pixels are never read, only the grid."""

    def __init__(self, grid: list[int], tokens: int) -> None:
        self.grid, self.tokens = grid, tokens
        self.video_processor = self  # the LLaVA file's `processor.video_processor(...)`

    def __call__(self, *args, **kwargs):
        out = {"pixel_values_videos": torch.zeros(1), "video_grid_thw": torch.tensor([self.grid])}
        return types.SimpleNamespace(to=lambda *a: out, pixel_values_videos=torch.zeros(1))

    def features(self, *args):
        return torch.zeros(1, self.tokens, HEADS * HEAD_DIM)


def stream(mrope: bool) -> dict[str, torch.Tensor]:
    """The reference over `CHUNKS` chunks of one synthetic stream."""
    import inference.llavaov_hermes as llava_mod
    import inference.qwenvl_hermes as qwen_mod

    gen = torch.Generator().manual_seed(4004 if mrope else 3003)
    cls = qwen_mod.QwenVL_Hermes if mrope else llava_mod.LlavaOneVision_Hermes
    tokens = GRID_STEPS * GRID_SIDE ** 2 if mrope else STREAM_1D
    video = StandInVideo([GRID_STEPS, 2 * GRID_SIDE, 2 * GRID_SIDE], tokens)
    if mrope:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

        config = Qwen2_5_VLTextConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                      num_key_value_heads=KV_HEADS, rope_theta=THETA, max_position_embeddings=32768,
                                      rope_scaling={"type": "mrope", "mrope_section": list(MROPE_SECTION)})
        lm = StandInLM(Qwen2_5_VLRotaryEmbedding(config=config), config)
        names = ["encode_video_chunk", "_ensure_dynamic_cache", "_get_next_global_offset_per_layer",
                 "_build_position_ids_3d_for_vision", "_append_position_ids_layer_explicit"]
        prefix_positions = torch.arange(PREFIX, dtype=torch.float32).expand(3, PREFIX).clone()
        extra = dict(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=2,
                                                                                      tokens_per_second=2)),
                     sample_fps=1, visual_start_idx=PREFIX, _mrope_section=list(MROPE_SECTION))
    else:
        config = types.SimpleNamespace(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                       max_position_embeddings=32768)
        lm = StandInLM(TableRope(HEAD_DIM, THETA), config)
        names = ["encode_video_chunk", "_get_next_start_pos_per_layer", "_set_rotary_required_len",
                 "_build_position_ids", "_append_position_ids", "_append_position_ids_layer"]
        prefix_positions = torch.arange(PREFIX)
        extra = {}
    prefix_keys = torch.randn(LAYERS, 1, KV_HEADS, PREFIX, HEAD_DIM, generator=gen)
    prefix_values = torch.randn(LAYERS, 1, KV_HEADS, PREFIX, HEAD_DIM, generator=gen)
    obj = stand_in(cls, names + ["_shrink_positions_and_rerotate_keys", "_get_cache_seq_len_per_layer",
                                 "_sanitize_keep_indices"],
                   device=torch.device("cpu"), dtype=torch.float32, num_layers=LAYERS, streaming=True,
                   long_term_threshold=int(LAYERS * (1 - 0.3)), language_model=lm, processor=video,
                   get_video_features=video.features, _layer_position_ids={}, total_processed_frames=0,
                   kv_cache=[(prefix_keys[l].clone(), prefix_values[l].clone()) for l in range(LAYERS)],
                   _position_ids_cache=[prefix_positions.clone() for _ in range(LAYERS)], **extra)
    ids = [list(range(PREFIX)) for _ in range(LAYERS)]
    out = {"prefix.keys": prefix_keys, "prefix.values": prefix_values}
    for c in range(CHUNKS):
        keys = torch.randn(LAYERS, 1, KV_HEADS, tokens, HEAD_DIM, generator=gen)
        values = torch.randn(LAYERS, 1, KV_HEADS, tokens, HEAD_DIM, generator=gen)
        lm.chunk = keys, values
        obj.encode_video_chunk(torch.zeros(GRID_STEPS if mrope else 1, 3, 8, 8))
        placed = torch.stack([p[..., -tokens:] for p in obj._position_ids_cache])  # (L, tokens) or (L, 3, tokens)
        out.update({f"chunk{c}.keys": keys, f"chunk{c}.values": values,
                    f"chunk{c}.placed": placed.round().long() if mrope else placed})
        for row in ids:
            row.extend(range(PREFIX + c * tokens, PREFIX + (c + 1) * tokens))
        total = len(ids[0])
        if total - PREFIX > BUDGET:
            attn = attention_maps(gen, total)
            scores, keep = prune(qwen_mod.QwenVL_Hermes, qwen_mod, attn, obj.kv_cache, llava=False)
            rows = keep_lists(keep)
            obj._shrink_positions_and_rerotate_keys(rows)
            for l in range(LAYERS):
                ids[l] = [ids[l][i] for i in rows[l]] + ([-(c + 1)] if l >= obj.long_term_threshold else [])
            out.update({f"chunk{c}.attention": attn, f"chunk{c}.scores": scores, f"chunk{c}.keep": keep})
        if any(len(row) != k.shape[2] for row, (k, _) in zip(ids, obj.kv_cache)):
            raise SystemExit(f"chunk {c}: entry ids and cache lengths disagree")
        positions = torch.stack(list(obj._position_ids_cache))
        out.update({f"chunk{c}.cache_keys": torch.stack([k for k, _ in obj.kv_cache]),
                    f"chunk{c}.cache_values": torch.stack([v for _, v in obj.kv_cache]),
                    f"chunk{c}.cache_positions": positions.round().long() if mrope else positions,
                    f"chunk{c}.ids": torch.tensor(ids)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkout", type=Path, help="a checkout of the reference (the folder holding inference/)")
    p.add_argument("--out", type=Path, default=Path("tests/hermes/golden"))
    args = p.parse_args(argv)
    sys.path.insert(0, str(args.checkout.resolve()))
    import transformers

    meta = {"layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "prefix": PREFIX,
            "query": QUERY, "budget": BUDGET, "theta": THETA, "mrope_section": list(MROPE_SECTION),
            "transformers": transformers.__version__, "torch": torch.__version__}
    stream_meta = dict(meta, chunks=CHUNKS, stream_1d_tokens=STREAM_1D, grid_steps=GRID_STEPS, grid_side=GRID_SIDE,
                       tokens_per_second=2, sample_fps=1)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, build, settings in (("reference_1d", one_d, meta), ("reference_mrope", mrope, meta),
                                  ("reference_stream_1d", lambda: stream(mrope=False), stream_meta),
                                  ("reference_stream_mrope", lambda: stream(mrope=True), stream_meta)):
        tensors = {k: v.contiguous() for k, v in build().items()}
        save_file(tensors, args.out / f"{name}.safetensors", metadata={"settings": json.dumps(settings)})
        shown = ', '.join(f'{k} {tuple(v.shape)}' for k, v in list(tensors.items())[:12])
        print(f"wrote {args.out / name}.safetensors: {shown}{', ...' if len(tensors) > 12 else ''} ({len(tensors)} tensors)")
    try:
        commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "(checkout is not a git work tree)"
    print(f"reference checkout {args.checkout} at {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
