"""Memory policies for the working cache (level 1): what stays in device memory after each chunk.

Every policy sees the same `HermesCache` and keeps, after `maintain`, the prefix plus at most
`budget` visual entries in every layer (all layers the same length). They differ in what they keep:

- `full`: everything (no eviction; the reference for equivalence tests);
- `sliding`: the first `sink_tokens` visual tokens plus the most recent ones (StreamingLLM);
- `uniform`: evenly spaced frames over everything seen;
- (`recall-only`, ReKV-style, is not a policy of its own but `sliding` with `memory.recall` on: with no
  scores, every evicted token goes to levels 2-3 and questions search them; preset `recall-only`);
- `hermes`: the paper's per-layer importance, as its reference code computes it (DESIGN §3): recency
  in shallow layers, the model's own attention from pseudo-queries in deep layers, a depth-weighted
  mix in between, smoothed from deep to shallow by token identity, selected on the fresh probe;
  long-term layers fold what they evict into one summary token placed right after the newest kept
  token. Our own variants are `memory.*` options (recency unit, accumulation, summary position).

Positions: new tokens always take positions after the last one used, so eviction leaves gaps (lazy
re-indexing). When the next tokens would pass `max_position_embeddings`, every layer's visual keys
are compacted (consecutive positions for 1-D RoPE; for M-RoPE each axis ranked separately among the
kept coordinates, or whole frames packed back to back, `memory.mrope_compaction`, see
`hermes.positions`) by an exact RoPE delta (`make_room`); `reindex: eager` compacts after every
eviction instead. Every policy works with 1-D RoPE and M-RoPE models alike: positions are (A, T).
"""

from __future__ import annotations

import time

import torch

from hermes.cache import KIND_PREFIX, KIND_SUMMARY, HermesCache
from hermes.config import MemoryConfig, preset_names
from hermes.errors import ConfigError
from hermes.positions import GridStep, Run, compact, compact_per_axis
from hermes.probe import probe_attention
from hermes.rope import RotarySpec, rotate_keys
from hermes.scoring import (accumulate, combine_layer_scores, fold_summary, layer_bands, recency_rates,
                            recency_scores, select_keep, smooth_deep_to_shallow)


class MemoryPolicy:
    """The `full` policy, and what every policy shares: position management and timing.

    Args:
        cfg: the memory configuration.
        model: the adapter whose cache is managed (rotary scheme, layers, probe).
    """

    name = "full"

    def __init__(self, cfg: MemoryConfig, model) -> None:
        if cfg.reindex not in ("lazy", "eager"):
            raise ConfigError(f"memory.reindex must be 'lazy' or 'eager', found {cfg.reindex!r}")
        if cfg.mrope_compaction not in ("per_axis", "frame_blocks"):
            raise ConfigError(f"memory.mrope_compaction must be 'per_axis' or 'frame_blocks', "
                              f"found {cfg.mrope_compaction!r}")
        self.cfg = cfg
        self.model = model
        self.spec = RotarySpec.from_text_config(model.text_config)
        self.last_question: str | None = None
        self.last_maintain_ms = 0.0
        self.lower = None  # `hermes.lower.LowerLevels` when levels 2 and 3 are on (set by the session)

    def compact(self, cache: HermesCache) -> None:
        """Compact level-1 positions (and tell the lower levels, whose records keep the old ones)."""
        compact_positions(cache, self.spec, self.cfg.mrope_compaction)
        if self.lower is not None:
            self.lower.epoch += 1

    def maintain(self, cache: HermesCache) -> None:
        """Bring the cache back within budget after a chunk (nothing to do for `full`)."""
        self.last_maintain_ms = 0.0

    # ---- positions -----------------------------------------------------------------------------------

    def make_room(self, cache: HermesCache, n_new: int) -> None:
        """Compact positions if `n_new` more positions plus the answer reserve would pass the model's range."""
        limit = self.model.max_position_embeddings
        if cache.next_position + n_new + self.cfg.position_reserve > limit:
            self.compact(cache)
            if cache.next_position + n_new > limit:
                raise ConfigError(f"{cache.num_tokens} cached tokens plus {n_new} new positions exceed the model's "
                                  f"{limit} positions: lower memory.budget or the chunk size")

    def place(self, cache: HermesCache, layout: list[Run | GridStep]) -> torch.Tensor:
        """Positions for a chunk's layout, compacting first if they would pass the model's range.

        How far a chunk reaches depends on its layout (an M-RoPE block grows with stream time, not
        with its token count), so the layout is placed, and if it passes the range (with the answer
        reserve), the placement is undone, positions are compacted, and the layout placed again.

        Returns:
            (A, n) int64 positions (reserved in `cache`).

        Raises:
            ConfigError: the chunk does not fit even after compaction.
        """
        limit = self.model.max_position_embeddings
        mark = cache.mark()
        positions = cache.place(layout)
        if cache.next_position + self.cfg.position_reserve <= limit:
            return positions
        cache.rewind(mark)  # nothing was appended yet: this only undoes the reservation
        self.compact(cache)
        start = cache.next_position
        positions = cache.place(layout)
        if cache.next_position > limit:
            raise ConfigError(f"{cache.num_tokens} cached tokens plus a chunk reaching {cache.next_position - start} "
                              f"positions exceed the model's {limit} positions: lower memory.budget or the chunk size")
        return positions


def rope_positions(positions: torch.Tensor, spec: RotarySpec) -> torch.Tensor:
    """Cache positions (A, T) in `hermes.rope`'s convention: (T,) for 1-D RoPE, (3, T) for M-RoPE."""
    return positions[0] if spec.kind == "1d" else positions


def compact_positions(cache: HermesCache, spec: RotarySpec, mrope: str = "frame_blocks") -> None:
    """Pack every layer's non-prefix entries back to back after the prefix, in time order.

    1-D RoPE: entries get consecutive positions (either rule). M-RoPE, `mrope`: "per_axis" ranks each
    axis separately among the kept coordinates (`hermes.positions.compact_per_axis`, the reference's
    rule and the `hermes` default through `memory.mrope_compaction`); "frame_blocks" moves each
    frame's entries together keeping their layout per axis (`hermes.positions.compact`), as a fresh
    one-step block. Keys are re-rotated by the exact fp32 delta; entries already in place are
    untouched (bit-identical). The open video block is closed: the next chunk starts a new one after
    the packed entries.
    """
    movable = cache.kinds != KIND_PREFIX  # (L, T)
    prefix = cache.positions[0][:, ~movable[0]]  # (A, P): the prefix is the same in every layer
    origin = int(prefix.max()) + 1 if prefix.numel() else 0
    tokens = torch.arange(cache.positions.shape[-1]).expand_as(movable)
    if spec.kind == "mrope" and mrope == "per_axis":
        new_positions = torch.stack([compact_per_axis(cache.positions[layer], movable[layer], origin)
                                     for layer in range(cache.num_layers)])  # (L, A, T)
    else:
        groups = cache.frame_index if spec.kind == "mrope" else tokens  # a frame's grid moves as one
        new_positions = torch.stack([compact(cache.positions[layer], movable[layer], groups[layer], origin)
                                     for layer in range(cache.num_layers)])  # (L, A, T)
    for layer, (keys, _) in enumerate(cache.layer_tensors()):
        delta = new_positions[layer] - cache.positions[layer]  # (A, T)
        if bool((delta != 0).any()):
            old = rope_positions(cache.positions[layer], spec).to(keys.device)
            cache.layers[layer].keys = rotate_keys(keys, rope_positions(delta, spec).to(keys.device), spec,
                                                   positions=old)
    cache.positions = new_positions
    cache.next_position = max(int(new_positions.max()) + 1, origin) if new_positions.numel() else 0
    cache.block = None


class BudgetPolicy(MemoryPolicy):
    """A policy that evicts to `budget` visual entries per layer; subclasses choose which."""

    def __init__(self, cfg: MemoryConfig, model) -> None:
        super().__init__(cfg, model)
        if cfg.budget < 1:
            raise ConfigError(f"memory.budget must be at least 1 visual token, found {cfg.budget}")
        self.last_scores: torch.Tensor | None = None  # (L, V) importance of the last scoring, if the policy scores

    def choose(self, cache: HermesCache, prefix_len: int) -> torch.Tensor:
        """(L, budget) cache indices of the visual entries to keep, ascending, per layer."""
        raise NotImplementedError

    def maintain(self, cache: HermesCache) -> None:
        start = time.perf_counter()
        prefix_len = int((cache.kinds[0] == KIND_PREFIX).sum())
        if cache.num_tokens - prefix_len > self.cfg.budget:  # scoring runs only when eviction is needed
            keep = self.choose(cache, prefix_len)
            prefix = torch.arange(prefix_len).expand(keep.shape[0], prefix_len)
            keep = torch.cat([prefix, keep], dim=1)
            if self.lower is not None:
                self.lower.capture(cache, keep, self.last_scores, prefix_len)
            cache.select_(keep)
            self.after_select(cache, prefix_len)
            if self.cfg.reindex == "eager":
                self.compact(cache)
        self.last_maintain_ms = (time.perf_counter() - start) * 1e3

    def after_select(self, cache: HermesCache, prefix_len: int) -> None:
        """Hook for policies that rewrite kept entries (HERMES writes its summary tokens here)."""


class SlidingPolicy(BudgetPolicy):
    """Attention sinks (the first visual tokens) plus a recent window."""

    name = "sliding"

    def choose(self, cache: HermesCache, prefix_len: int) -> torch.Tensor:
        total, budget = cache.num_tokens, self.cfg.budget
        sink = min(self.cfg.sink_tokens, budget)
        keep = torch.cat([torch.arange(prefix_len, prefix_len + sink), torch.arange(total - (budget - sink), total)])
        return keep.expand(cache.num_layers, -1)


class UniformPolicy(BudgetPolicy):
    """Whole frames, evenly spaced over everything kept so far (always including the newest)."""

    name = "uniform"

    def choose(self, cache: HermesCache, prefix_len: int) -> torch.Tensor:
        frames = cache.frame_index[0, prefix_len:]  # (V,) frame of each visual token
        kept_frames, per_frame = torch.unique(frames, return_counts=True)
        # tokens per frame as cached: fixed for LLaVA-OneVision, but size-dependent (and shared by the
        # two frames of a grid step, plus timestamps) for Qwen-VL, so measured (the largest frame)
        n_keep = max(1, self.cfg.budget // int(per_frame.max()))
        n_keep = min(n_keep, kept_frames.numel())
        pick = torch.linspace(0, kept_frames.numel() - 1, n_keep).round().long()
        chosen = torch.isin(frames, kept_frames[pick])
        keep = prefix_len + chosen.nonzero().squeeze(1)
        return keep[-self.cfg.budget:].expand(cache.num_layers, -1)


class HermesPolicy(BudgetPolicy):
    """The paper's hierarchical importance: per-layer budgets, summary tokens in long-term layers.

    Defaults reproduce the reference code (DESIGN §3, fidelity rule); `memory.recency_unit`,
    `memory.recency_k_fall`, `memory.accumulation` and `memory.summary_position` select our variants.
    """

    name = "hermes"

    def __init__(self, cfg: MemoryConfig, model) -> None:
        super().__init__(cfg, model)
        if len(cfg.bands) != 3 or len(cfg.smoothing) != 3:
            raise ConfigError("memory.bands and memory.smoothing need three values: sensory, working, long-term")
        for name, choices in (("recency_unit", ("token", "frame")), ("accumulation", ("none", "sum", "ema")),
                              ("summary_position", ("after_kept", "mean_evicted"))):
            if getattr(cfg, name) not in choices:
                raise ConfigError(f"memory.{name} must be one of {', '.join(choices)}, found {getattr(cfg, name)!r}")
        if cfg.accumulation == "ema" and not 0.0 <= cfg.accumulate_decay < 1.0:
            raise ConfigError(f"memory.accumulate_decay must be in [0, 1) for ema, found {cfg.accumulate_decay}")
        self.bands = layer_bands(model.num_layers, cfg.bands)
        self.rates = recency_rates(self.bands, cfg.recency_k, cfg.recency_k_fall).unsqueeze(1)  # (L, 1)
        self.longterm = torch.tensor([b == "longterm" for b in self.bands]) & cfg.summary
        self._running: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * model.num_layers
        self._summaries: dict[int, tuple] = {}  # layer -> (key, value, count, position) to write after select

    def _attention(self, cache: HermesCache) -> torch.Tensor:
        """(L, T) pseudo-query attention per cached entry: this probe's, or carried across probes by id.

        One probe forward carries both pseudo-queries, local then global (one pass over the cache
        instead of two): working layers average both, long-term layers read the global one.
        """
        global_text = self.last_question if (self.cfg.condition_on_question and self.last_question) \
            else self.cfg.global_query
        local = self.model.question_embeds(self.cfg.local_query)
        weights = probe_attention(self.model, cache, torch.cat([local, self.model.question_embeds(global_text)]))
        n_local = local.shape[0]
        rows = []
        for layer, band in enumerate(self.bands):
            w = weights[layer]  # (Q, T)
            fresh = w[n_local:].mean(0) if band == "longterm" else (w[:n_local].mean(0) + w[n_local:].mean(0)) / 2
            ids = cache.token_ids[layer]
            running = accumulate(self._running[layer], fresh.cpu(), ids, self.cfg.accumulation,
                                 self.cfg.accumulate_decay)
            if self.cfg.accumulation != "none":
                self._running[layer] = (ids, running)
            rows.append(running)
        return torch.stack(rows)

    def _recency(self, cache: HermesCache, prefix_len: int) -> torch.Tensor:
        """(L, V) recency of each visual entry: by cache index (reference) or by frame."""
        if self.cfg.recency_unit == "token":
            num = cache.num_tokens - prefix_len
            return recency_scores(torch.arange(num).expand(cache.num_layers, num), k=self.rates)
        frames = cache.frame_index[:, prefix_len:].float()  # (L, V); a summary's -1 counts as oldest
        newest = frames.max()
        return recency_scores(frames, newest=newest, k=self.rates,
                              span=(newest - frames.clamp(min=0).min()).clamp(min=1.0))

    def choose(self, cache: HermesCache, prefix_len: int) -> torch.Tensor:
        budget = self.cfg.budget
        attention = self._attention(cache)[:, prefix_len:]  # (L, V)
        scores = combine_layer_scores(self._recency(cache, prefix_len), attention, self.bands, self.cfg.w0,
                                      self.cfg.gamma)
        ids = cache.token_ids[:, prefix_len:]
        scores = torch.stack(smooth_deep_to_shallow(list(scores), list(ids), self.bands, self.cfg.smoothing))
        self.last_scores = scores
        is_summary = cache.kinds[:, prefix_len:] == KIND_SUMMARY
        keep_rows = []
        self._summaries = {}
        for layer in range(cache.num_layers):
            if not bool(self.longterm[layer]):
                keep_rows.append(prefix_len + select_keep(scores[layer], budget))
                continue
            # long-term: budget - 1 tokens plus the summary slot, which absorbs everything evicted
            candidates = (~is_summary[layer]).nonzero().squeeze(1)
            kept = candidates[select_keep(scores[layer, candidates], budget - 1)]
            folded = torch.ones(scores.shape[1], dtype=torch.bool)
            folded[kept] = False  # evicted tokens and the previous summary
            target = self._summary_position(cache, layer, prefix_len, kept, folded)
            self._summaries[layer] = (self._fold(cache, layer, prefix_len + folded.nonzero().squeeze(1), target),
                                      target)
            slot = prefix_len + folded.nonzero()[0]  # reused for the new summary in after_select
            keep_rows.append(torch.cat([slot, prefix_len + kept]))
        return torch.stack(keep_rows)

    def _summary_position(self, cache: HermesCache, layer: int, prefix_len: int, kept: torch.Tensor,
                          folded: torch.Tensor) -> torch.Tensor:
        """(A,) position of a layer's new summary token (`memory.summary_position`).

        "after_kept": one past the largest position the layer keeps, prefix included, on any axis,
        and that on every axis (the reference). "mean_evicted": the count-weighted mean position of
        what the summary stands for, per axis.
        """
        positions = cache.positions[layer]  # (A, T)
        if self.cfg.summary_position == "after_kept":
            kept_positions = torch.cat([positions[:, :prefix_len], positions[:, prefix_len + kept]], dim=1)
            newest = int(kept_positions.max()) + 1 if kept_positions.numel() else 0
            return torch.full((positions.shape[0],), newest, dtype=torch.long)
        idx = prefix_len + folded.nonzero().squeeze(1)
        counts = cache.counts[layer, idx]
        return torch.round((positions[:, idx].double() * counts).sum(dim=1) / counts.sum()).long()

    def _fold(self, cache: HermesCache, layer: int, idx: torch.Tensor, target: torch.Tensor):
        keys, values = cache.layer_tensors()[layer]
        dev_idx = idx.to(keys.device)
        positions = cache.positions[layer][:, idx]  # (A, n)
        return fold_summary(keys[0].index_select(-2, dev_idx), values[0].index_select(-2, dev_idx),
                            cache.counts[layer, idx], rope_positions(positions, self.spec),
                            rope_positions(target, self.spec), self.spec)

    def after_select(self, cache: HermesCache, prefix_len: int) -> None:
        before = cache.next_position
        new_ids = cache.new_token_ids(len(self._summaries))
        for (layer, (summary, target)), new_id in zip(self._summaries.items(), new_ids):
            keys, values = cache.layer_tensors()[layer]
            keys[0, :, prefix_len] = summary.key[:, 0]
            values[0, :, prefix_len] = summary.value[:, 0]
            cache.positions[layer, :, prefix_len] = target
            cache.kinds[layer, prefix_len] = KIND_SUMMARY
            cache.frame_index[layer, prefix_len] = -1
            cache.counts[layer, prefix_len] = int(summary.count)
            cache.token_ids[layer, prefix_len] = new_id
            # what comes next is placed after the summary, as the reference continues each layer after it
            cache.next_position = max(cache.next_position, int(target.max()) + 1)
        if cache.next_position != before:  # M-RoPE: the next frames open a new block after the summary,
            cache.block = None  # not one inside the old block that would place them below it
        self._summaries = {}


POLICIES: dict[str, type[MemoryPolicy]] = {
    "full": MemoryPolicy, "sliding": SlidingPolicy, "uniform": UniformPolicy, "hermes": HermesPolicy,
}


def _baselines() -> None:
    """Register the baselines of hermes.baselines (they import this module, so they come last)."""
    from hermes.baselines.recent_frames import RecentFramesPolicy
    from hermes.baselines.rekv import ReKVPolicy

    POLICIES.update({"recent-frames": RecentFramesPolicy, "rekv": ReKVPolicy})


def build_policy(cfg: MemoryConfig, model) -> MemoryPolicy:
    """The policy named by `cfg.policy`, for `model`.

    Raises:
        ConfigError: unknown policy name or invalid settings.
    """
    if "recent-frames" not in POLICIES:
        _baselines()
    if cfg.policy not in POLICIES:
        # a preset name given as a policy (`memory.policy=recall-only`, `=hermes-4k`): point to --memory
        hint = f" ({cfg.policy} is a memory preset, not a policy: use --memory {cfg.policy})" \
            if cfg.policy in preset_names("memory") else ""
        raise ConfigError(f"unknown memory policy {cfg.policy!r}; available: {', '.join(POLICIES)}{hint}")
    return POLICIES[cfg.policy](cfg, model)
