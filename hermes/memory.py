"""Memory policies for the working cache (level 1): what stays in device memory after each chunk.

`MemoryPolicy` (`full`), `SlidingPolicy`, `UniformPolicy` and `HermesPolicy`; the registry of every
policy, baselines included, is `hermes.policies` (docs/ARCHITECTURE.md, Memory: the policy interface).
A bounded policy evicts only when a chunk takes the cache past `budget`, down to `budget` (the
reference) or, with `memory.evict_headroom` h (ours), to budget * (1 - h), so that `hermes` probes
once per several chunks. Positions keep their gaps until compaction near `max_position_embeddings`
(docs/ARCHITECTURE.md, Positions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hermes.cache import (KIND_PREFIX, KIND_SUMMARY, KIND_VISUAL, HermesCache, HermesLayer, TokenEntries,
                          to_device_no_sync)
from hermes.config import MemoryConfig
from hermes.errors import ConfigError
from hermes.model_protocol import CoreModel
from hermes.positions import GridStep, Run, compact, compact_per_axis
from hermes.probe import probe_attention
from hermes.prompt import format_prompt
from hermes.rope import RotarySpec, rotate_keys, rotate_rows_between
from hermes.scoring import (Summary, accumulate, combine_layer_scores, fold_summaries, layer_bands, mean_position,
                            recency_rates, recency_scores, select_keep, smooth_deep_to_shallow)


@dataclass(frozen=True)
class Evictions:
    """What one `maintain()` took out of level 1: the lower levels' only input (docs/ARCHITECTURE.md, State).

    Attributes:
        entries: per layer, copies of the visual tokens that left the layer (keys, values and
            metadata, in cache order); empty when nothing was evicted or copies were not asked for.
            A long-term layer's slot reused for its new summary, and a previous summary, are not among them.
        index: per layer, (n_l,) their cache indices before the eviction.
        scores: per layer, (n_l,) their importance in [0, 1] (ones when the policy does not score).
        length: tokens per layer before the eviction.
        position_epoch: the cache's `compactions` when they were evicted (the frame of their positions).
    """

    entries: tuple[TokenEntries, ...] = ()
    index: tuple[torch.Tensor, ...] = ()
    scores: tuple[torch.Tensor, ...] = ()
    length: int = 0
    position_epoch: int = 0

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
    """The `full` policy, and what every policy shares: position management and the session's hooks.

    Args:
        model: the adapter whose cache is managed (rotary scheme, layers, probe).
    """

    name = "full"
    records_probe = True  # False: the pseudo-query rides unrecorded (`bench overhead --floor`'s stand-in)

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
        """The pseudo-query to ride in the prefill of a chunk of `n_new` tokens (`hermes.probe.prefill_chunk`).

        Returns:
            (Q, hidden) embeddings, or None: this policy never probes (all but `hermes`), or the
            chunk leaves the cache within budget.
        """
        return None

    def maintain(self, cache: HermesCache, *, copy_evicted: bool = False,
                 probe: torch.Tensor | None = None) -> Evictions:
        """Bring the cache back within budget after a chunk (nothing to do for `full`).

        Args:
            copy_evicted: put copies of the evicted tokens into the result (the lower levels need them).
            probe: (L, Q, T) maps of the pseudo-query `probe_queries` gave for this chunk, taken in
                its prefill; None: the policy probes itself if it needs to.

        Returns:
            What was evicted (nothing, for `full`).
        """
        return Evictions(length=cache.num_tokens, position_epoch=cache.compactions)

    def keep_frames(self, frames: list) -> bool:
        """Whether the policy keeps a chunk's `Frame`s instead of having them encoded (default False)."""
        return False

    def question_embeds(self, model: CoreModel, question: str, options: Sequence[str] = ()) -> torch.Tensor:
        """(Q, hidden) embeddings of `question` and its `options` as this policy asks it (`format_prompt`)."""
        return model.question_embeds(format_prompt(question, options))

    def answer_cache(self, model: CoreModel, cache: HermesCache, question: str) -> HermesCache:
        """The cache a question is answered from (the working cache); the session rewinds what the answer appends."""
        return cache

    def check_lower_levels(self) -> None:
        """Raise `ConfigError` if this policy cannot run with levels 2-3 (`hermes.baselines.NoLowerLevels`)."""

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

    def _fits(self, cache: HermesCache, start: int, reach: int, *, compacted: bool = False) -> bool:
        """Whether `reach` positions from `start` stay within the model's range (before compaction with the
        answer reserve); after compaction (`compacted`) raise `ConfigError` if they do not."""
        limit = self.model.max_position_embeddings
        if start + reach + (0 if compacted else self.cfg.position_reserve) <= limit:
            return True
        if compacted:
            raise ConfigError(f"{cache.num_tokens} cached tokens plus {reach} new positions exceed the model's "
                              f"{limit} positions: lower memory.budget or the chunk size")
        return False

    def make_room(self, cache: HermesCache, n_new: int) -> None:
        """Compact positions if `n_new` more positions plus the answer reserve would pass the model's range."""
        if not self._fits(cache, cache.next_position, n_new):
            self.compact(cache)
            self._fits(cache, cache.next_position, n_new, compacted=True)

    def place(self, cache: HermesCache, layout: list[Run | GridStep]) -> torch.Tensor:
        """Positions for a chunk's layout, compacting first if they would pass the model's range.

        A chunk's reach depends on its layout (an M-RoPE block grows with stream time), so it is
        placed, and if it passes the range the placement is undone, positions compacted, and placed again.

        Returns:
            (A, n) int64 positions (reserved in `cache`).

        Raises:
            ConfigError: the chunk does not fit even after compaction.
        """
        mark = cache.mark()
        positions = self.place_once(cache, layout)
        if self._fits(cache, cache.next_position, 0):
            return positions
        cache.rewind(mark)  # nothing was appended yet: this only undoes the reservation
        self.compact(cache)
        start = cache.next_position
        positions = self.place_once(cache, layout)
        self._fits(cache, start, cache.next_position - start, compacted=True)
        return positions

    def place_once(self, cache: HermesCache, layout: list[Run | GridStep]) -> torch.Tensor:
        """Reserve positions for a chunk's layout after the cache's next free position (no range check).

        Returns:
            (A, n) int64 positions the model's forward takes.
        """
        return cache.place(layout)


def move_entries(layer: HermesLayer, new_positions: torch.Tensor, spec: RotarySpec) -> None:
    """Give a (fully described) layer's T entries (A, T) `new_positions`, moved keys turned by the exact delta."""
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
    """Pack every layer's non-prefix entries back to back after the prefix, in time order, and close the
    open video block. M-RoPE `mrope`: "per_axis" ranks each axis separately (the reference's rule),
    "frame_blocks" moves each frame's grid as one (`hermes.positions`).
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
    cache.compacted(max(largest + 1, origin) if largest is not None else 0)


class BudgetPolicy(MemoryPolicy):
    """A policy that evicts to `budget` visual entries per layer; subclasses choose which."""

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        # level 1's share of the budget: with recall, `memory.recall_share` of it is left to recalled tokens,
        # so that an answer's device memory stays within the budget
        self.level1_budget = max(1, cfg.budget - int(round(cfg.recall_share * cfg.budget))) if cfg.recall \
            else cfg.budget
        # visual entries an eviction keeps: level 1's budget, less the headroom (`memory.evict_headroom`)
        self.keep_tokens = max(1, self.level1_budget - int(round(cfg.evict_headroom * self.level1_budget)))
        self.last_scores: torch.Tensor | None = None  # (L, V) of the last eviction, for inspection only

    def choose(self, cache: HermesCache, prefix_len: int, probe: torch.Tensor | None = None) -> Choice:
        """The visual entries to keep ((L, keep_tokens) cache indices per layer, in the order they are to
        stay: ascending, but for a slot reused for a summary), and their scores (`probe`: as `maintain` takes it)."""
        raise NotImplementedError

    def evicts_after(self, cache: HermesCache, n_new: int) -> bool:
        """Whether a chunk of `n_new` tokens will take the cache past the budget (so `maintain` evicts)."""
        return cache.num_tokens + n_new - cache.prefix_len > self.level1_budget

    def maintain(self, cache: HermesCache, *, copy_evicted: bool = False,
                 probe: torch.Tensor | None = None) -> Evictions:
        prefix_len = cache.prefix_len
        length, epoch = cache.num_tokens, cache.compactions
        if not self.evicts_after(cache, 0):  # scoring runs only when eviction is needed
            return Evictions(length=length, position_epoch=epoch)
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
                         position_epoch=epoch)

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

    Defaults reproduce the reference code but for smoothing by token identity (docs/ARCHITECTURE.md,
    Memory); its state is the importance carried across probes, per layer by token id.
    """

    name = "hermes"

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        self.bands = layer_bands(model.num_layers, cfg.bands)
        self.rates = recency_rates(self.bands, cfg.recency_k, cfg.recency_k_fall).unsqueeze(1)  # (L, 1)
        self.longterm_band = torch.tensor([b == "longterm" for b in self.bands])[:, None]  # (L, 1)
        self.longterm = self.longterm_band[:, 0] & cfg.summary
        # bands run shallow to deep, so the layers that write summaries are the last ones, from this layer on
        self.first_summary_layer = int(self.longterm.nonzero()[0]) if bool(self.longterm.any()) else model.num_layers
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
        """(local then global embeddings (Q, hidden), local tokens): both ride in one probe pass."""
        global_text = self.last_question if (self.cfg.condition_on_question and self.last_question) \
            else self.cfg.global_query
        texts = (self.cfg.local_query, global_text)
        if self._pseudo is None or self._pseudo[0] != texts:
            embed = self.model.question_embeds if self.cfg.probe_text == "question" else \
                lambda text: self.model.embed_text(text).to(self.model.dtype)
            local = embed(texts[0])
            self._pseudo = texts, torch.cat([local, embed(global_text)]), local.shape[0]
        return self._pseudo[1], self._pseudo[2]

    def probe_queries(self, cache: HermesCache, n_new: int) -> torch.Tensor | None:
        return self._pseudo_query()[0] if self.evicts_after(cache, n_new) else None

    def place_once(self, cache: HermesCache, layout: list[Run | GridStep]) -> torch.Tensor:
        """`chunk_positions: per_layer` (the reference's `encode_video_chunk`): placed after layer 0's largest
        position; layer l's copy is to sit ``after[l] - after[0]`` further (`settle_chunk` moves it)."""
        if self.cfg.chunk_positions == "shared":
            return super().place_once(cache, layout)
        after = cache.layer_next_positions()  # (L,)
        shift = after - after[0]
        positions = cache.place(layout, start=int(after[0]), beyond=int(shift.max()))
        self._chunk_shift = (positions.shape[-1], shift)
        return positions

    def settle_chunk(self, cache: HermesCache) -> None:
        """Move each layer's copy of the last placed chunk to that layer's own positions (`place_once`),
        keys re-rotated by the exact delta; `maintain` calls it first."""
        if self._chunk_shift is None:
            return
        n, shift = self._chunk_shift
        self._chunk_shift = None
        moving = shift.nonzero().squeeze(1).tolist()
        if not moving:
            return
        layers = [cache.layers[l] for l in moving]
        end = layers[0].num_described
        old = torch.stack([layer.positions[:, end - n:end] for layer in layers])  # (m, A, n)
        new = old + shift[moving][:, None, None]
        keys = torch.stack([layer.keys[0, :, end - n:end] for layer in layers])  # (m, H, n, D)
        for layer, turned, positions in zip(layers, rotate_rows_between(keys, old, new, self.spec), new):
            layer.move_tail(positions, turned[None])

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
        """(L, T) pseudo-query attention per entry (carried across probes by id): working layers average
        the local and global pseudo-queries, long-term layers read the global one."""
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
            if self.cfg.accumulation_bands == "longterm" and not bool(self.longterm_band[layer]):
                rows.append(fresh.float())  # working and sensory layers read the present: a fresh probe
                continue
            ids = cache.layers[layer].token_ids
            running = accumulate(self._running[layer], fresh, ids, self.cfg.accumulation,
                                 self.cfg.accumulate_decay)
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
        if self.cfg.recent_keep > 0:  # the newest visual tokens stay in every layer, whatever they score
            scores = scores.masked_fill(self._newest(cache, prefix_len, round(self.cfg.recent_keep * budget)), math.inf)
        keep_rows, summaries = [None] * cache.num_layers, []
        first = self.first_summary_layer  # the layers with a summary are the deepest ones: two row slices
        if first:  # one batched selection over the layers without a summary
            for layer, row in enumerate(select_keep(scores[:first], budget)):
                keep_rows[layer] = prefix_len + row
        longterm = list(range(first, cache.num_layers))
        if longterm:
            # long-term: budget - 1 entries plus a slot for the new summary of everything evicted. The reference
            # lets a previous summary compete like any token; with `fold` (ours) it scores -inf so it is never
            # kept: the stable selection then orders the other tokens as a selection among them alone would
            # (there are at least budget of them: eviction runs past budget)
            longterm_scores = scores[first:]
            if self.fold_previous:
                is_summary = cache.kinds[first:, prefix_len:] == KIND_SUMMARY  # (n, V)
                longterm_scores = longterm_scores.masked_fill(is_summary, -math.inf)
            kept = prefix_len + select_keep(longterm_scores, budget - 1)  # (n, budget - 1) cache indices
            # every long-term layer folds the same number F of entries: its evicted tokens (and summaries)
            folded = torch.ones(len(longterm), cache.num_tokens, dtype=torch.bool)
            folded[:, :prefix_len] = False
            gone = folded.scatter_(1, kept, False).nonzero()[:, 1].view(len(longterm), -1)  # (n, F), ascending
            positions = torch.stack([cache.layers[layer].positions for layer in longterm])  # (n, A, T)
            folded_at = positions.gather(2, gone[:, None].expand(-1, positions.shape[1], -1))  # (n, A, F)
            folded_counts = torch.stack([cache.layers[layer].counts for layer in longterm]).gather(1, gone)  # (n, F)
            targets = self._summary_positions(prefix_len, positions, kept, folded_at, folded_counts)  # (n, A)
            new = self._fold(cache, longterm, gone, folded_at, folded_counts, targets)
            slot = gone[:, :1]  # reused for the new summary in write_summaries
            rows = torch.cat([slot, kept] if self.fold_previous else [kept, slot], dim=1)
            for i, layer in enumerate(longterm):
                keep_rows[layer] = rows[i]
                summaries.append((layer, Summary(new.key[i], new.value[i], new.count[i]), targets[i]))
        return Choice(keep=torch.stack(keep_rows), scores=scores, summaries=tuple(summaries))

    def _newest(self, cache: HermesCache, prefix_len: int, n: int) -> torch.Tensor:
        """(L, V) bool: each layer's `n` newest visual entries (ids grow with encode order; summaries excluded)."""
        ids = cache.token_ids[:, prefix_len:]
        visual = cache.kinds[:, prefix_len:] == KIND_VISUAL
        n = min(n, int(visual.sum(1).min()))
        if n <= 0:
            return torch.zeros_like(visual)
        threshold = ids.masked_fill(~visual, -1).topk(n, dim=1).values[:, -1:]  # (L, 1) the n-th newest id
        return visual & (ids >= threshold)

    def _summary_positions(self, prefix_len: int, positions: torch.Tensor, kept: torch.Tensor,
                           folded_at: torch.Tensor, folded_counts: torch.Tensor) -> torch.Tensor:
        """(n, A) position of each layer's new summary: "after_kept" one past the largest kept position on any
        axis, on every axis (the reference); "mean_evicted" the count-weighted mean of what it folds."""
        num_axes = positions.shape[1]
        if self.cfg.summary_position == "after_kept":
            kept_positions = torch.cat([positions[..., :prefix_len],
                                        positions.gather(2, kept[:, None].expand(-1, num_axes, -1))], dim=2)
            newest = kept_positions.amax(dim=(1, 2)) + 1 if kept_positions.numel() else torch.zeros(len(kept))
            return newest.long()[:, None].repeat(1, num_axes)
        return mean_position(folded_at, folded_counts)

    def _fold(self, cache: HermesCache, layers: list[int], gone: torch.Tensor, folded_at: torch.Tensor,
              folded_counts: torch.Tensor, targets: torch.Tensor) -> Summary:
        """Each of `layers`' entries at (n, F) cache indices `gone` folded into one summary at (n, A) `targets`."""
        on_device = to_device_no_sync(gone, cache.layers[0].keys.device)
        keys = torch.stack([cache.layers[layer].keys[0].index_select(-2, idx) for layer, idx in zip(layers, on_device)])
        values = torch.stack([cache.layers[layer].values[0].index_select(-2, idx)
                              for layer, idx in zip(layers, on_device)])
        return fold_summaries(keys, values, folded_counts, folded_at, targets, self.spec, weighted=self.fold_previous)

    def write_summaries(self, cache: HermesCache, prefix_len: int, summaries) -> None:
        slot = prefix_len if self.fold_previous else cache.num_tokens - 1  # as `choose` ordered it
        for layer, summary, target in summaries:
            # text and a `shared` chunk come after every summary (a `per_layer` chunk after its layer's own)
            cache.write_summary(layer, slot, summary.key[:, 0], summary.value[:, 0], target, int(summary.count))

