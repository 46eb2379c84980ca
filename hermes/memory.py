"""Memory policies for the working cache (level 1): what stays in device memory after each chunk.

Every policy sees the same `HermesCache` and keeps, after `maintain`, the prefix plus at most
`budget` visual entries in every layer (all layers the same length). They differ in what they keep:

- `full`: everything (no eviction; the reference for equivalence tests);
- `sliding`: the first `sink_tokens` visual tokens plus the most recent ones (StreamingLLM);
- `uniform`: evenly spaced frames over everything seen;
- (`recall-only`, ReKV-style, is not a policy of its own but `sliding` with `memory.recall` on: with no
  scores, every evicted token goes to levels 2-3 and questions search them; preset `recall-only`);
- `hermes`: the paper's per-layer importance, as its reference code computes it (docs/ARCHITECTURE.md, Memory): recency
  in shallow layers, the model's own attention from pseudo-queries in deep layers, a depth-weighted
  mix in between, smoothed from deep to shallow by token identity (our fix; by cache index, the
  reference's convention, with `memory.smoothing_match`), selected on the fresh probe; long-term layers
  keep `budget - 1` entries, a previous summary competing like any token, and append one new summary
  token of what they evict, placed right after the newest kept token. Our own variants are `memory.*`
  options (recency unit, accumulation, summary position, `previous_summary: fold`).

Every bounded policy evicts only when a chunk takes the cache past `budget`, and then to `budget`
(the reference) or, with `memory.evict_headroom` h (ours), to budget * (1 - h), so that the next
chunks fit without another eviction: for `hermes` that is one probe per several chunks instead of one
per chunk (the probe's forward is a fixed ~30 tokens, a large share of a small chunk's encode).

Positions: new tokens always take positions after the last one used, so eviction leaves gaps (lazy
re-indexing). A `hermes` chunk continues each layer after that layer's own largest position, as the
reference does (`memory.chunk_positions`: the model's forward places it after layer 0's, and
`maintain` moves each layer's copy by its difference); other policies keep the same tokens in every
layer, so one position serves all. When the next tokens would pass `max_position_embeddings`, every
layer's visual keys are compacted (consecutive positions for 1-D RoPE; for M-RoPE each axis ranked separately among the
kept coordinates, or whole frames packed back to back, `memory.mrope_compaction`, see
`hermes.positions`) by an exact RoPE delta (`make_room`); `reindex: eager` compacts after every
eviction instead. Every policy works with 1-D RoPE and M-RoPE models alike: positions are (A, T).

State: `maintain` returns what it evicted (`Evictions`) and keeps nothing of it for a later call;
the session hands it to the lower levels. What a policy carries between chunks (the `hermes`
policy's accumulated importance) is its `state_dict()`. A policy changes the cache only through
its layers' API (`hermes.cache.HermesLayer`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from hermes.cache import KIND_PREFIX, KIND_SUMMARY, HermesCache, HermesLayer, TokenEntries, to_device_no_sync
from hermes.config import MemoryConfig, preset_names
from hermes.errors import ConfigError
from hermes.model_protocol import CoreModel
from hermes.positions import GridStep, Run, compact, compact_per_axis
from hermes.probe import probe_attention
from hermes.rope import RotarySpec, rotate_keys
from hermes.scoring import (Summary, accumulate, combine_layer_scores, fold_summary, layer_bands, mean_position,
                            recency_rates, recency_scores, select_keep, smooth_deep_to_shallow)


@dataclass(frozen=True)
class Evictions:
    """What one `maintain()` took out of level 1: the lower levels' only input.

    (docs/ARCHITECTURE.md, State and who owns it.)

    Attributes:
        entries: per layer, copies of the visual tokens that left the layer (keys, values and
            metadata, in cache order); empty when nothing was evicted or copies were not asked for.
            A long-term layer's slot reused for its new summary, and a previous summary, are not among them.
        index: per layer, (n_l,) their cache indices before the eviction.
        scores: per layer, (n_l,) their importance in [0, 1] (ones when the policy does not score).
        length: tokens per layer before the eviction.
        position_epoch: the cache's `compactions` when they were evicted (the frame of their positions).
        summaries: layers that folded what they evicted into a summary token.
        compacted: whether positions were compacted after the eviction (`reindex: eager`).
        all_scores: (L, V) importance of every visual entry scored (None: the policy does not score).
        maintain_ms: time the maintenance took.
    """

    entries: tuple[TokenEntries, ...] = ()
    index: tuple[torch.Tensor, ...] = ()
    scores: tuple[torch.Tensor, ...] = ()
    length: int = 0
    position_epoch: int = 0
    summaries: tuple[int, ...] = ()
    compacted: bool = False
    all_scores: torch.Tensor | None = None
    maintain_ms: float = 0.0

    @property
    def evicted(self) -> bool:
        """Whether anything left level 1."""
        return bool(self.index)


@dataclass(frozen=True)
class Choice:
    """What a policy chose for one eviction: the entries to keep and, for HERMES, the summaries to write."""

    keep: torch.Tensor  # (L, K) visual cache indices to keep per layer, in their new order (summary slot included)
    scores: torch.Tensor | None = None  # (L, V) importance of every visual entry, if the policy scores
    summaries: tuple[tuple[int, Summary, torch.Tensor], ...] = ()  # (layer, summary, position (A,)) per layer


class MemoryPolicy:
    """The `full` policy, and what every policy shares: position management and timing.

    Args:
        cfg: the memory configuration.
        model: the adapter whose cache is managed (rotary scheme, layers, probe).
    """

    name = "full"

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        self.cfg = cfg
        self.model = model
        self.spec = RotarySpec.from_text_config(model.text_config)
        self.last_question: str | None = None

    def note_question(self, text: str) -> None:
        """A question was asked: `condition_on_question` makes the next probe's global pseudo-query
        quote it (not saved in `state_dict`: a resumed session conditions on its next question)."""
        self.last_question = text

    def compact(self, cache: HermesCache) -> None:
        """Compact level-1 positions (the cache counts it: lower-level records keep the old ones)."""
        compact_positions(cache, self.spec, self.cfg.mrope_compaction)

    def probe_queries(self, cache: HermesCache, n_new: int) -> torch.Tensor | None:
        """The pseudo-query the maintenance after a chunk of `n_new` tokens will probe with, asked
        before the chunk is prefilled so that it can ride in the chunk's forward
        (`hermes.probe.prefill_chunk`); its maps are then handed to `maintain`.

        Returns:
            (Q, hidden) embeddings, or None: this policy never probes (all but `hermes`), or the
            chunk leaves the cache within budget.
        """
        return None

    def maintain(self, cache: HermesCache, *, copy_evicted: bool = False,
                 probe: torch.Tensor | None = None) -> Evictions:
        """Bring the cache back within budget after a chunk (nothing to do for `full`).

        Args:
            cache: the working cache.
            copy_evicted: put copies of the evicted tokens into the result (the lower levels need them).
            probe: (L, Q, T) maps of the pseudo-query `probe_queries` gave for this chunk, taken in
                its prefill; None: the policy probes itself if it needs to.

        Returns:
            What was evicted (nothing, for `full`).
        """
        return Evictions(length=cache.num_tokens, position_epoch=cache.compactions)

    def check_lower_levels(self) -> None:
        """Raise `ConfigError` if this policy cannot run with levels 2-3 (every policy here can; see
        `hermes.baselines.NoLowerLevels`)."""

    # ---- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's scoring state carried between chunks (none for most policies)."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: state this policy does not keep.
        """
        if state:
            raise ValueError(f"memory policy {self.name} keeps no state, found {', '.join(sorted(state))}")

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
        positions = self.place_once(cache, layout)
        if cache.next_position + self.cfg.position_reserve <= limit:
            return positions
        cache.rewind(mark)  # nothing was appended yet: this only undoes the reservation
        self.compact(cache)
        start = cache.next_position
        positions = self.place_once(cache, layout)
        if cache.next_position > limit:
            raise ConfigError(f"{cache.num_tokens} cached tokens plus a chunk reaching {cache.next_position - start} "
                              f"positions exceed the model's {limit} positions: lower memory.budget or the chunk size")
        return positions

    def place_once(self, cache: HermesCache, layout: list[Run | GridStep]) -> torch.Tensor:
        """Reserve positions for a chunk's layout after the cache's next free position (no range check).

        Returns:
            (A, n) int64 positions the model's forward takes.
        """
        return cache.place(layout)


def move_entries(layer: HermesLayer, new_positions: torch.Tensor, spec: RotarySpec) -> None:
    """Give a layer's entries new positions, re-rotating the keys that move by the exact fp32 delta
    (keys that stay are untouched, bit for bit).

    Args:
        layer: the cache layer (every token described).
        new_positions: (A, T) int64 positions for its T entries.
        spec: the model's rotary scheme.
    """
    delta = new_positions - layer.positions  # (A, T)
    keys = None
    if bool((delta != 0).any()):
        old = rope_positions(layer.positions, spec).to(layer.keys.device)
        keys = rotate_keys(layer.keys, rope_positions(delta, spec).to(layer.keys.device), spec, positions=old)
    layer.move(new_positions, keys)


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
    the packed entries. The cache's `compactions` count goes up by one.
    """
    first = cache.layers[0]
    prefix = first.positions[:, first.kinds == KIND_PREFIX]  # (A, P): the prefix is the same in every layer
    origin = int(prefix.max()) + 1 if prefix.numel() else 0
    largest = None
    for layer in cache.layers:
        movable = layer.kinds != KIND_PREFIX  # (T,)
        if spec.kind == "mrope" and mrope == "per_axis":
            new_positions = compact_per_axis(layer.positions, movable, origin)  # (A, T)
        else:
            # a frame's grid moves as one (M-RoPE); 1-D entries move one by one
            groups = layer.frame_index if spec.kind == "mrope" else torch.arange(layer.positions.shape[-1])
            new_positions = compact(layer.positions, movable, groups, origin)
        move_entries(layer, new_positions, spec)
        if new_positions.numel():
            largest = max(largest if largest is not None else -1, int(new_positions.max()))
    cache.next_position = max(largest + 1, origin) if largest is not None else 0
    cache.block = None
    cache.compactions += 1


class BudgetPolicy(MemoryPolicy):
    """A policy that evicts to `budget` visual entries per layer; subclasses choose which."""

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        # visual entries an eviction keeps: the budget, less the headroom (`memory.evict_headroom`)
        self.keep_tokens = max(1, cfg.budget - int(round(cfg.evict_headroom * cfg.budget)))
        self.last_scores: torch.Tensor | None = None  # (L, V) of the last eviction, for inspection only

    def choose(self, cache: HermesCache, prefix_len: int, probe: torch.Tensor | None = None) -> Choice:
        """The visual entries to keep ((L, keep_tokens) cache indices per layer, in the order they are to
        stay: ascending, but for a slot reused for a summary), and their scores (`probe`: as `maintain` takes it)."""
        raise NotImplementedError

    def evicts_after(self, cache: HermesCache, n_new: int) -> bool:
        """Whether a chunk of `n_new` tokens will take the cache past the budget (so `maintain` evicts)."""
        return cache.num_tokens + n_new - cache.prefix_len > self.cfg.budget

    def maintain(self, cache: HermesCache, *, copy_evicted: bool = False,
                 probe: torch.Tensor | None = None) -> Evictions:
        start = time.perf_counter()
        prefix_len = cache.prefix_len
        length, epoch = cache.num_tokens, cache.compactions
        if not self.evicts_after(cache, 0):  # scoring runs only when eviction is needed
            return Evictions(length=length, position_epoch=epoch, maintain_ms=(time.perf_counter() - start) * 1e3)
        choice = self.choose(cache, prefix_len, probe)
        prefix = torch.arange(prefix_len).expand(choice.keep.shape[0], prefix_len)
        keep = torch.cat([prefix, choice.keep], dim=1)
        index, scores, entries = [], [], []
        host_scores = choice.scores.float().cpu() if choice.scores is not None else None  # one transfer
        for l, layer in enumerate(cache.layers):
            kept = torch.zeros(length, dtype=torch.bool)
            kept[keep[l]] = True
            gone = (~kept & (layer.kinds != KIND_PREFIX) & (layer.kinds != KIND_SUMMARY)).nonzero().squeeze(1)
            index.append(gone)
            scores.append(host_scores[l, gone - prefix_len] if host_scores is not None
                          else torch.ones(gone.shape[0]))
        if copy_evicted:  # every layer's evicted indices reach the device in one move
            on_device = to_device_no_sync(torch.cat(index), cache.layers[0].keys.device).split(
                [g.shape[0] for g in index])
            entries = [layer.entries(gone, dev) for layer, gone, dev in zip(cache.layers, index, on_device)]
        cache.select_(keep)
        self.write_summaries(cache, prefix_len, choice.summaries)
        if self.cfg.reindex == "eager":
            self.compact(cache)
        self.last_scores = choice.scores
        return Evictions(entries=tuple(entries), index=tuple(index), scores=tuple(scores), length=length,
                         position_epoch=epoch, summaries=tuple(layer for layer, _, _ in choice.summaries),
                         compacted=self.cfg.reindex == "eager", all_scores=choice.scores,
                         maintain_ms=(time.perf_counter() - start) * 1e3)

    def write_summaries(self, cache: HermesCache, prefix_len: int, summaries) -> None:
        """Write HERMES's summary tokens into the slots kept for them (nothing for other policies)."""


class SlidingPolicy(BudgetPolicy):
    """Attention sinks (the first visual tokens) plus a recent window."""

    name = "sliding"

    def choose(self, cache: HermesCache, prefix_len: int, probe: torch.Tensor | None = None) -> Choice:
        total, budget = cache.num_tokens, self.keep_tokens
        sink = min(self.cfg.sink_tokens, budget)
        keep = torch.cat([torch.arange(prefix_len, prefix_len + sink), torch.arange(total - (budget - sink), total)])
        return Choice(keep=keep.expand(cache.num_layers, -1))


class UniformPolicy(BudgetPolicy):
    """Whole frames, evenly spaced over everything kept so far (always including the newest)."""

    name = "uniform"

    def choose(self, cache: HermesCache, prefix_len: int, probe: torch.Tensor | None = None) -> Choice:
        frames = cache.layers[0].frame_index[prefix_len:]  # (V,) frame of each visual token
        kept_frames, per_frame = torch.unique(frames, return_counts=True)
        # tokens per frame as cached: fixed for LLaVA-OneVision, but size-dependent (and shared by the
        # two frames of a grid step, plus timestamps) for Qwen-VL, so measured (the largest frame)
        n_keep = max(1, self.keep_tokens // int(per_frame.max()))
        n_keep = min(n_keep, kept_frames.numel())
        pick = torch.linspace(0, kept_frames.numel() - 1, n_keep).round().long()
        chosen = torch.isin(frames, kept_frames[pick])
        keep = prefix_len + chosen.nonzero().squeeze(1)
        return Choice(keep=keep[-self.keep_tokens:].expand(cache.num_layers, -1))


class HermesPolicy(BudgetPolicy):
    """The paper's hierarchical importance: per-layer budgets, summary tokens in long-term layers.

    Defaults reproduce the reference code (docs/ARCHITECTURE.md, Memory) over any number of evictions, but
    for smoothing by token identity (our fix; `memory.smoothing_match`); `memory.recency_unit`,
    `memory.recency_k_fall`, `memory.accumulation`, `memory.summary_position`, `memory.previous_summary`
    and `memory.chunk_positions` select our variants.
    Its state between chunks is the importance carried across probes (`memory.accumulation`), per
    layer by token id (`state_dict`).
    """

    name = "hermes"

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        self.bands = layer_bands(model.num_layers, cfg.bands)
        self.rates = recency_rates(self.bands, cfg.recency_k, cfg.recency_k_fall).unsqueeze(1)  # (L, 1)
        self.longterm_band = torch.tensor([b == "longterm" for b in self.bands])[:, None]  # (L, 1)
        self.longterm = self.longterm_band[:, 0] & cfg.summary
        # ours: a previous summary is always folded into the new one, which takes the first visual slot; the
        # reference lets it compete and appends the new one (`choose` and `write_summaries` must agree)
        self.fold_previous = cfg.previous_summary == "fold"
        self._recency_by_count_memo: tuple[int, torch.Tensor | None] = (-1, None)  # (V, its (L, V) token recency)
        # per layer, (token ids (n,), importance (n,)) carried across probes (accumulation sum / ema)
        self._running: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * model.num_layers
        # the last pseudo-query by its texts, (local, global) -> (embeddings, local tokens): an evicting
        # chunk asks for it before its prefill (`probe_queries`) and again in maintenance (`_attention`)
        self._pseudo: tuple[tuple[str, str], torch.Tensor, int] | None = None
        # the last placed chunk (tokens, (L,) shift of each layer's copy from the forward's positions),
        # until `maintain` moves it (`memory.chunk_positions: per_layer`)
        self._chunk_shift: tuple[int, torch.Tensor] | None = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The carried importance: ``running.<l>.ids`` and ``running.<l>.scores`` for each layer that has it."""
        state = {}
        for layer, running in enumerate(self._running):
            if running is not None:
                state[f"running.{layer}.ids"], state[f"running.{layer}.scores"] = running
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        unknown = sorted(k for k in state if not (k.startswith("running.") and k.endswith((".ids", ".scores"))))
        if unknown:
            raise ValueError(f"memory policy hermes keeps no {', '.join(unknown)}")
        self._running = [(state[f"running.{l}.ids"], state[f"running.{l}.scores"]) if f"running.{l}.ids" in state
                         else None for l in range(len(self._running))]

    def _pseudo_query(self) -> tuple[torch.Tensor, int]:
        """The probe's pseudo-query: (local then global embeddings (Q, hidden), local tokens).

        One probe forward carries both pseudo-queries (one pass over the cache instead of two).
        """
        global_text = self.last_question if (self.cfg.condition_on_question and self.last_question) \
            else self.cfg.global_query
        texts = (self.cfg.local_query, global_text)
        if self._pseudo is None or self._pseudo[0] != texts:
            local = self.model.question_embeds(texts[0])
            self._pseudo = texts, torch.cat([local, self.model.question_embeds(global_text)]), local.shape[0]
        return self._pseudo[1], self._pseudo[2]

    def probe_queries(self, cache: HermesCache, n_new: int) -> torch.Tensor | None:
        return self._pseudo_query()[0] if self.evicts_after(cache, n_new) else None

    def place_once(self, cache: HermesCache, layout: list[Run | GridStep]) -> torch.Tensor:
        """`memory.chunk_positions: per_layer` (the reference's `encode_video_chunk`): the chunk is placed
        after layer 0's largest position, as a block of its own (M-RoPE), and layer l's copy is to sit
        `after[l] - after[0]` further on every axis, `after` being one past each layer's largest position.
        The model's forward takes one set of positions (layer 0's); `maintain` moves the other layers'
        copies (`settle_chunk`). The cache's next free position (text) comes after every layer's copy."""
        if self.cfg.chunk_positions == "shared":
            return super().place_once(cache, layout)
        after = cache.layer_next_positions()  # (L,)
        shift = after - after[0]
        before = cache.next_position
        cache.next_position, cache.block = int(after[0]), None
        positions = cache.place(layout)
        cache.next_position = max(cache.next_position + int(shift.max()), before)
        self._chunk_shift = (positions.shape[-1], shift)
        return positions

    def settle_chunk(self, cache: HermesCache) -> None:
        """Move each layer's copy of the last placed chunk (its newest entries) to that layer's own
        positions (`place_once`), keys re-rotated by the exact delta; nothing if no layer differs or no
        chunk is pending. `maintain` calls it first.

        Args:
            cache: the working cache, the placed chunk prefilled and recorded in it.
        """
        if self._chunk_shift is None:
            return
        n, shift = self._chunk_shift
        self._chunk_shift = None
        for layer, layer_shift in zip(cache.layers, shift.tolist()):
            if layer_shift:
                new_positions = layer.positions.clone()
                new_positions[:, -n:] += layer_shift
                move_entries(layer, new_positions, self.spec)

    def maintain(self, cache: HermesCache, *, copy_evicted: bool = False,
                 probe: torch.Tensor | None = None) -> Evictions:
        if probe is None and self._chunk_shift is not None and self.evicts_after(cache, 0):
            # probed before the chunk moves, as a probe riding in the chunk's forward sees it
            probe = self._probe(cache)
        self.settle_chunk(cache)
        return super().maintain(cache, copy_evicted=copy_evicted, probe=probe)

    def _probe(self, cache: HermesCache) -> torch.Tensor:
        """(L, Q, T) maps of the pseudo-query over the cache, from a probe pass of its own."""
        maps = probe_attention(self.model, cache, self._pseudo_query()[0])
        return torch.stack(list(maps)) if not isinstance(maps, torch.Tensor) else maps

    def _attention(self, cache: HermesCache, probe: torch.Tensor | None) -> torch.Tensor:
        """(L, T) pseudo-query attention per cached entry: this probe's, or carried across probes by id.

        `probe` is the maps of `probe_queries`' pseudo-query taken in the chunk's prefill; without
        it the probe runs here. Working layers average the local and global pseudo-queries'
        attention, long-term layers read the global one.
        """
        embeds, n_local = self._pseudo_query()
        if probe is None:
            probe = self._probe(cache)
        if probe.shape[1:] != (embeds.shape[0], cache.num_tokens):
            raise ValueError(f"probe maps of shape {tuple(probe.shape)} do not fit a pseudo-query of "
                             f"{embeds.shape[0]} tokens over {cache.num_tokens} cached tokens")
        maps = probe  # (L, Q, T) on the host
        local_mean, global_mean = maps[:, :n_local].mean(1), maps[:, n_local:].mean(1)  # (L, T) each
        fresh_rows = torch.where(self.longterm_band, global_mean, (local_mean + global_mean) / 2)  # (L, T)
        if self.cfg.accumulation == "none":  # the reference: this probe's rows, nothing carried (no loop over layers)
            return fresh_rows.float()
        rows = []
        for layer, fresh in enumerate(fresh_rows):
            ids = cache.layers[layer].token_ids
            running = accumulate(self._running[layer], fresh, ids, self.cfg.accumulation,
                                 self.cfg.accumulate_decay)
            if self.cfg.accumulation != "none":
                self._running[layer] = (ids, running)
            rows.append(running)
        return torch.stack(rows)

    def _recency(self, cache: HermesCache, prefix_len: int) -> torch.Tensor:
        """(L, V) recency of each visual entry: by cache index (reference) or by frame."""
        if self.cfg.recency_unit == "token":  # depends on the count alone, which chunks of one size repeat
            num = cache.num_tokens - prefix_len
            if self._recency_by_count_memo[0] != num:
                self._recency_by_count_memo = num, recency_scores(torch.arange(num).expand(cache.num_layers, num),
                                                                  k=self.rates)
            return self._recency_by_count_memo[1]
        frames = cache.frame_index[:, prefix_len:].float()  # (L, V); a summary's -1 counts as oldest
        newest = frames.max()
        return recency_scores(frames, newest=newest, k=self.rates,
                              span=(newest - frames.clamp(min=0).min()).clamp(min=1.0))

    def choose(self, cache: HermesCache, prefix_len: int, probe: torch.Tensor | None = None) -> Choice:
        budget = self.keep_tokens
        attention = self._attention(cache, probe)[:, prefix_len:]  # (L, V)
        scores = combine_layer_scores(self._recency(cache, prefix_len), attention, self.bands, self.cfg.w0,
                                      self.cfg.gamma)
        ids = cache.token_ids[:, prefix_len:]
        scores = torch.stack(smooth_deep_to_shallow(list(scores), list(ids), self.bands, self.cfg.smoothing,
                                                    match=self.cfg.smoothing_match))
        keep_rows, summaries = [None] * cache.num_layers, []
        plain = (~self.longterm).nonzero().squeeze(1).tolist()
        if plain:  # one batched selection over the layers without a summary
            for layer, row in zip(plain, select_keep(scores[plain], budget)):
                keep_rows[layer] = prefix_len + row
        longterm = self.longterm.nonzero().squeeze(1).tolist()
        if longterm:
            # long-term: budget - 1 entries plus a slot for the new summary of everything evicted. The reference
            # lets a previous summary compete like any token; with `fold` (ours) it scores -inf so it is never
            # kept: the stable selection then orders the other tokens as a selection among them alone would
            # (there are at least budget of them: eviction runs past budget)
            longterm_scores = scores[longterm]
            if self.fold_previous:
                is_summary = cache.kinds[longterm, prefix_len:] == KIND_SUMMARY  # (n, V)
                longterm_scores = longterm_scores.masked_fill(is_summary, -math.inf)
            kept_rows = select_keep(longterm_scores, budget - 1)
        for layer, kept in zip(longterm, kept_rows if longterm else ()):
            folded = torch.ones(scores.shape[1], dtype=torch.bool)
            folded[kept] = False  # evicted tokens (and summaries)
            target = self._summary_position(cache, layer, prefix_len, kept, folded)
            summaries.append((layer, self._fold(cache, layer, prefix_len + folded.nonzero().squeeze(1), target),
                              target))
            slot = prefix_len + folded.nonzero()[0]  # reused for the new summary in write_summaries
            order = [slot, prefix_len + kept] if self.fold_previous else [prefix_len + kept, slot]
            keep_rows[layer] = torch.cat(order)
        return Choice(keep=torch.stack(keep_rows), scores=scores, summaries=tuple(summaries))

    def _summary_position(self, cache: HermesCache, layer: int, prefix_len: int, kept: torch.Tensor,
                          folded: torch.Tensor) -> torch.Tensor:
        """(A,) position of a layer's new summary token (`memory.summary_position`).

        "after_kept": one past the largest position the layer keeps, prefix included, on any axis,
        and that on every axis (the reference). "mean_evicted": the count-weighted mean position of
        what the summary stands for, per axis.
        """
        positions = cache.layers[layer].positions  # (A, T)
        if self.cfg.summary_position == "after_kept":
            kept_positions = torch.cat([positions[:, :prefix_len], positions[:, prefix_len + kept]], dim=1)
            newest = int(kept_positions.max()) + 1 if kept_positions.numel() else 0
            return torch.full((positions.shape[0],), newest, dtype=torch.long)
        idx = prefix_len + folded.nonzero().squeeze(1)
        return mean_position(positions[:, idx], cache.layers[layer].counts[idx])

    def _fold(self, cache: HermesCache, layer: int, idx: torch.Tensor, target: torch.Tensor) -> Summary:
        folded = cache.layers[layer].entries(idx)
        return fold_summary(folded.keys, folded.values, folded.counts, rope_positions(folded.positions, self.spec),
                            rope_positions(target, self.spec), self.spec,
                            weighted=self.fold_previous)

    def write_summaries(self, cache: HermesCache, prefix_len: int, summaries) -> None:
        before = cache.next_position
        new_ids = cache.new_token_ids(len(summaries))
        slot = prefix_len if self.fold_previous else cache.num_tokens - 1  # as `choose` ordered it
        for (layer, summary, target), new_id in zip(summaries, new_ids.tolist()):
            cache.layers[layer].write(slot, summary.key[:, 0], summary.value[:, 0], target, new_id,
                                      KIND_SUMMARY, -1, int(summary.count))
            # text and a `shared` chunk come after every summary (a `per_layer` chunk after its layer's own)
            cache.next_position = max(cache.next_position, int(target.max()) + 1)
        if cache.next_position != before:  # M-RoPE: the next frames open a new block after the summary,
            cache.block = None  # not one inside the old block that would place them below it


POLICIES: dict[str, type[MemoryPolicy]] = {
    "full": MemoryPolicy, "sliding": SlidingPolicy, "uniform": UniformPolicy, "hermes": HermesPolicy,
}


def _baselines() -> None:
    """Register the baselines of hermes.baselines (they import this module, so they come last)."""
    from hermes.baselines.recent_frames import RecentFramesPolicy
    from hermes.baselines.rekv import ReKVPolicy

    POLICIES.update({"recent-frames": RecentFramesPolicy, "rekv": ReKVPolicy})


def build_policy(cfg: MemoryConfig, model: CoreModel) -> MemoryPolicy:
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
