"""Levels 2 and 3 seen from level 1: what eviction keeps (`LowerLevels.capture`), what a question brings
back (`LowerLevels.recall`) and at which positions (docs/ARCHITECTURE.md, Memory, "Recall")."""

from __future__ import annotations

import functools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hermes.cache import KIND_PREFIX, KIND_RECALLED, HermesCache, to_device_no_sync
from hermes.config import MemoryConfig
from hermes.memory import Evictions
from hermes.model_protocol import CoreModel
from hermes.probe import question_queries
from hermes.recall_gate import frame_directions, frame_similarity, gate_hits, level1_similarity, recall_cap
from hermes.rope import RotarySpec, rotate_keys
from hermes.time_reference import time_reference
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.remote_level import remote_options
from hermes.tiers.s3 import parse_location
from hermes.tiers.fingerprint import kv_layout, make_fingerprint, weights_digest
from hermes.tiers.meaning import content_vector
from hermes.tiers.records import RECORD_FIELDS, LayerTokens, Record
from hermes.tiers.summarise import summarise


@dataclass
class RecallStats:
    """What one recall cost and brought back."""

    recall_ms: float = 0.0
    records: int = 0
    tokens: int = 0  # per layer

    def to_json(self) -> dict:
        return {"recall_ms": round(self.recall_ms, 3), "records": self.records, "tokens": self.tokens}


def fingerprint_for(model: CoreModel, cfg: MemoryConfig, with_weights: bool = True) -> dict:
    """What a memory directory must match: the model's cache geometry and weights, and the record format."""
    spec = RotarySpec.from_text_config(model.text_config)
    text = model.text_config
    dtype = str(getattr(model, "dtype", None) or getattr(text, "dtype", None) or "float32").replace("torch.", "")
    return make_fingerprint(model.name, model.family, text.num_hidden_layers, text.num_key_value_heads,
                            spec.head_dim, rope=spec.kind,
                            memory={"dram_dtype": cfg.dram_dtype, "summary_anchors": cfg.summary_anchors},
                            weights=weights_digest(model) if with_weights else None,
                            kv=kv_layout(spec, text.num_key_value_heads, dtype))


class LowerLevels:
    """Level 2 and 3 for one session.

    Args:
        cfg: memory configuration (thresholds, budgets, recall).
        model: the adapter (rotary scheme, probe).
        directory: a folder or ``s3://bucket/prefix``; None uses a temporary directory removed at `close`.
        read_only: follow a stream another process writes (recall only; nothing is stored).
    """

    def __init__(self, cfg: MemoryConfig, model: CoreModel, directory: str | Path | None,
                 read_only: bool = False) -> None:
        self.cfg = cfg
        self.model = model
        self.spec = RotarySpec.from_text_config(model.text_config)
        self._tmp = None if directory is not None else tempfile.TemporaryDirectory(prefix="hermes-memory-")
        path = parse_location(directory) if directory is not None else Path(self._tmp.name)
        # a temporary directory is never reopened: no weights hash (a first hash of large files takes a while)
        fingerprint = fingerprint_for(model, cfg, with_weights=directory is not None)
        self.store = MemoryDirectory(path, fingerprint, cfg.dram_bytes, cfg.disk_bytes,
                                     dram_dtype=cfg.dram_dtype,
                                     summarise_fn=functools.partial(summarise, anchors_per_layer=cfg.summary_anchors,
                                                                    spec=self.spec),
                                     durable_dram=directory is not None,  # a temporary directory needs no log
                                     readonly=read_only, remote=remote_options(cfg))
        self.last_vector: torch.Tensor | None = None  # the last question's search vector, for prefetching
        # (start, end) stream seconds of each record this session stored, for recall by time (a resumed or
        # followed stream's older records are found by similarity only)
        self.spans: dict[int, tuple[float, float]] = {}
        self.frame_times: list[float] = []  # the session's frame times (s) by frame index, as `capture` last saw them
        # after a resume: the evictions (frames encoded when each ran) whose records the directory already
        # holds, committed after the checkpoint and before the stream stopped; see `note_resumed`
        self._stored_evictions: set[int] = set()

    def note_resumed(self, frames: int) -> None:
        """The stream resumed from a checkpoint at `frames` frames and re-encodes the frames after it: the
        same tokens are evicted again, so an eviction whose record the directory holds is not stored twice.
        """
        self._stored_evictions = {seen for seen in self.store.evictions_since_checkpoints() if seen > frames}

    # ---- eviction ------------------------------------------------------------------------------------

    def capture(self, evictions: Evictions, frame_times_s: list[float]) -> None:
        """Store the evicted tokens worth keeping as one record.

        Args:
            evictions: what `maintain()` evicted, with copies of the tokens (``copy_evicted=True``).
            frame_times_s: timestamps of the frames encoded so far (the session's), for the record's span.
        """
        if not evictions.evicted:
            return
        self.frame_times = frame_times_s
        frames_seen = len(frame_times_s)  # identifies this eviction within the stream
        if frames_seen in self._stored_evictions:  # stored before a stop; the stream is encoding it again
            self._stored_evictions.discard(frames_seen)
            return
        counts = torch.tensor([index.shape[0] for index in evictions.index])  # (L,) evicted per layer
        # every layer keeps equally many of its best: recall splices equally many into every layer, and a
        # per-layer threshold on min-max normalised scores would leave some layers empty
        m = max(int((scores >= self.cfg.compress_threshold).sum()) for scores in evictions.scores)
        m = min(m, int(counts.min()))
        if m == 0:
            return
        per_layer = {name: [] for name in ("keys", "values", *RECORD_FIELDS)}
        for index, scores, entries in zip(evictions.index, evictions.scores, evictions.entries):
            # ranked over the whole layer as it was (-1 where nothing was evicted), so that ties fall as they did
            ranked = torch.full((evictions.length,), -1.0)
            ranked[index] = scores
            chosen = torch.zeros(evictions.length, dtype=torch.bool)
            chosen[ranked.topk(m).indices] = True
            pick = chosen[index].nonzero().squeeze(1)  # positions within the evicted entries, in cache order
            dev_pick = pick.to(entries.keys.device)
            per_layer["keys"].append(entries.keys.index_select(-2, dev_pick))
            per_layer["values"].append(entries.values.index_select(-2, dev_pick))
            per_layer["scores"].append(scores[pick])
            for name in ("positions", "token_ids", "frame_index", "counts"):
                per_layer[name].append(getattr(entries, name)[..., pick])
        frames = torch.cat(per_layer["frame_index"])
        first, last = int(frames.min()), int(frames.max())
        embedding = content_vector(per_layer["keys"][-1], per_layer["positions"][-1], self.spec,
                                   counts=per_layer["counts"][-1]) \
            if per_layer["keys"][-1].shape[-2] else None
        record = Record.build(self.store.new_record_id(), **per_layer, t_start_s=frame_times_s[first],
                              t_end_s=frame_times_s[last], frame_start=first, frame_end=last + 1,
                              embedding=embedding)
        record.epoch, record.frames_seen = evictions.position_epoch, frames_seen
        self.store.add(record)
        self.spans[record.record_id] = (record.t_start_s, record.t_end_s)
        if self.last_vector is not None:  # warm the prefetch cache for a follow-up on the same topic
            self.store.prefetch(rid for rid, _ in self.store.search(self.last_vector, self.cfg.recall_top_k))

    # ---- answering -----------------------------------------------------------------------------------

    def question_vector(self, cache: HermesCache, question_embeds: torch.Tensor) -> torch.Tensor:
        """The search vector of a question: its last-layer queries' content, per key head (a queries-only pass)."""
        queries, positions = question_queries(self.model, cache, question_embeds, layer=-1)
        groups = queries.shape[0] // self.model.text_config.num_key_value_heads
        return content_vector(queries, positions, self.spec, groups=groups)

    def recall(self, cache: HermesCache, question_embeds: torch.Tensor, question: str = "",
               now_s: float | None = None) -> RecallStats:
        """Splice the records most relevant to a question into `cache` (the caller rewinds them); every layer
        gets equally many tokens, so the cache stays rectangular for the attention mask.

        Args:
            question_embeds: (Q, hidden) the question as the model reads it.
            question: its bare text (`memory.recall_gate: question` reads it).
            now_s: the stream time of the question (for "N minutes ago").
        """
        start = time.perf_counter()
        if len(self.store.index) == 0 and len(self.store.dram) == 0:  # nothing below level 1: no pass, no search
            return RecallStats(recall_ms=(time.perf_counter() - start) * 1e3)
        hits, when = self._chosen(cache, question_embeds, question, now_s)
        if not hits:
            return RecallStats(recall_ms=(time.perf_counter() - start) * 1e3)
        keys0, _ = cache.layer_tensors()[0]
        # as stored (int8 codes, on the host): ranked by their metadata, only the kept tokens dequantized
        records = self.store.fetch([rid for rid, _ in hits], dequantize=False)
        records.sort(key=lambda r: r.t_start_s)  # time order
        n = recall_cap(cache, min(sum(r.layers[layer].num_tokens for r in records) for layer in range(cache.num_layers)),
                       self.cfg)
        if n == 0:
            return RecallStats(recall_ms=(time.perf_counter() - start) * 1e3, records=len(records))
        deltas = self._shifts(cache, records)  # (R,) position shift of each record, in time order
        # per layer, its candidates: every record's tokens, in time order
        per_layer = [[record.layers[layer] for record in records] for layer in range(cache.num_layers)]
        frames = [torch.cat([t.frame_index for t in tokens]) for tokens in per_layer]  # (C_l,) per layer
        if when is None:  # the importance each token was evicted with
            priorities = [torch.cat([t.scores for t in tokens]).float() for tokens in per_layer]
        else:  # nearness to the time asked about, for every layer's candidates at once
            times_s = torch.tensor(self.frame_times, dtype=torch.float64)  # (frames,) by index
            every = torch.cat(frames)
            priority = time_priority(times_s, every, when)
            if when[1] == "start" and max(f.shape[0] for f in frames) > n:  # the cap must choose
                # what first happened before a still opening, read from the first layer's values: a frame's
                # content there owes nothing to its position or to the frames before it
                first = frames[0].shape[0]
                opening = change_priority(torch.cat([t.dequantized("values") for t in per_layer[0]], dim=1),
                                          frames[0], priority[:first])
                priority = by_frame_of(frames[0], opening, every, priority)
            priorities = torch.split(priority, [f.shape[0] for f in frames])
        tops = best_in_time_order(priorities, n)  # (L, n) candidate indices per layer
        tops_on_device = to_device_no_sync(tops, keys0.device)  # one move for every layer
        # K/V go to the device as stored (int8: a quarter of the bytes); the kept rows are dequantized there
        on_device = [record.kv_to(keys0.device, non_blocking=True) for record in records]
        keys, values = (torch.empty(cache.num_layers, rows.shape[0], n, rows.shape[-1], device=keys0.device)
                        for rows in (records[0].layers[0].keys, records[0].layers[0].values))  # (L, H, n, D)
        positions, frame_index = [], []
        for layer, (tokens, frames_l, top) in enumerate(zip(per_layer, frames, tops)):
            record_of = torch.repeat_interleave(torch.arange(len(tokens)),
                                                torch.tensor([t.num_tokens for t in tokens]))[top]  # (n,)
            moved = [record.layers[layer] for record in on_device]
            chosen_rows(moved, tops_on_device[layer], record_of, "keys", out=keys[layer])
            chosen_rows(moved, tops_on_device[layer], record_of, "values", out=values[layer])
            at = torch.cat([t.positions.reshape(-1, t.num_tokens) for t in tokens], dim=1)[:, top]  # (A, n)
            positions.append((at, deltas[record_of].expand_as(at)))
            frame_index.append(frames_l[top])
        keys, values = keys.to(keys0.dtype), values.to(keys0.dtype)
        spliced = {"keys": list(keys), "values": list(values), "positions": [at + shift for at, shift in positions],
                   "frame_index": frame_index}
        for layer, (at, shift) in enumerate(positions):
            if bool(shift.any()):  # records of an older position epoch move before level 1
                one_d = self.spec.kind == "1d"
                spliced["keys"][layer] = rotate_keys(keys[layer], (shift[0] if one_d else shift).to(keys.device),
                                                     self.spec, positions=(at[0] if one_d else at).to(keys.device))
        cache.append(spliced["keys"], spliced["values"], spliced["positions"], KIND_RECALLED, spliced["frame_index"])
        elapsed = (time.perf_counter() - start) * 1e3
        return RecallStats(recall_ms=elapsed, records=len(records), tokens=n)

    def _chosen(self, cache: HermesCache, question_embeds: torch.Tensor, question: str,
                now_s: float | None) -> tuple[list[tuple[int, float]], tuple[float, str] | None]:
        """(record id, score) of the records to splice, and the time they are chosen around, if any.

        Under `recall_gate: question` (`hermes.time_reference`): nothing for the present; the records
        around t = 0 for the start, around now - N for "N ago", around where X was seen for "before /
        after X" ((time s, side): the splice then prefers the tokens nearest that time on that side);
        otherwise the records nearest the question's vector that pass the gate (best first).
        """
        k = self.cfg.recall_top_k
        ref = time_reference(question) if self.cfg.recall_gate == "question" else None
        if ref is not None and ref.kind == "present":
            return [], None
        when = None
        if ref is not None and not self.spans:  # no record of this session's yet (a resumed stream): by similarity
            ref = None
        elif ref is not None and ref.kind == "start":
            when = (self.frame_times[0] if self.frame_times else 0.0, "start")
        elif ref is not None and ref.kind == "ago" and now_s is not None:
            when = (now_s - ref.seconds_ago, "near")
        if when is None:
            self.last_vector = self.question_vector(cache, question_embeds)
            hits = self.store.search(self.last_vector, k)
            seen_at = self._seen_at(cache, hits) if ref is not None and ref.kind in ("before", "after") else None
            if seen_at is None:
                return gate_hits(hits, cache, self.last_vector, self.spec, self.cfg), None
            when = (seen_at, ref.kind)
        target = when[0]
        # records whose span is nearest the time, the narrower first: with scored eviction a record may span long
        near = sorted(self.spans, key=lambda rid: (max(self.spans[rid][0] - target, target - self.spans[rid][1], 0.0),
                                                   self.spans[rid][1] - self.spans[rid][0]))
        return [(rid, 1.0) for rid in near[:k]], when

    def _seen_at(self, cache: HermesCache, hits: list[tuple[int, float]]) -> float | None:
        """The stream time (s) of the frame whose content best matches the question's vector (`last_vector`),
        among the frames of the `hits` records and of level 1; None without a frame."""
        records = self.store.fetch([rid for rid, _ in hits], dequantize=False)  # only the last layer is read
        candidates = [frame_similarity(r.layers[-1].dequantized("keys").to(getattr(torch, r.source_dtype)),
                                       r.layers[-1].positions.reshape(-1, r.layers[-1].num_tokens),
                                       r.layers[-1].frame_index, self.last_vector, self.spec) for r in records]
        candidates.append(level1_similarity(cache, self.last_vector, self.spec, per_frame=True))
        frames = torch.cat([f for f, _ in candidates])
        if frames.numel() == 0 or not self.frame_times:
            return None
        best = int(frames[torch.cat([sims for _, sims in candidates]).argmax()])
        return self.frame_times[min(best, len(self.frame_times) - 1)]

    @staticmethod
    def _shifts(cache: HermesCache, records: list[Record]) -> torch.Tensor:
        """(R,) how far each record (in time order) moves: 0 in level 1's position epoch; a record of an older
        epoch (before a compaction) is placed, newest first, to end just before the previous one (level 1's
        oldest visual position for the newest)."""
        first_layer = cache.layers[0]
        visual = first_layer.kinds != KIND_PREFIX
        shift_to = int(first_layer.positions[0, visual].min()) if bool(visual.any()) else cache.next_position
        deltas = [0] * len(records)
        for i in reversed(range(len(records))):
            record = records[i]
            if record.epoch != cache.compactions:
                last = max(int(layer.positions[0].max()) for layer in record.layers if layer.num_tokens)
                deltas[i] = shift_to - 1 - last
                shift_to = min(int(layer.positions[0].min()) for layer in record.layers if layer.num_tokens) + deltas[i]
        return torch.tensor(deltas, dtype=torch.long)

    # ---- lifecycle -----------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        s = self.store.stats()
        return {"dram_bytes": int(s["dram_bytes"]), "disk_bytes": int(s["disk_bytes"]),
                "disk_records": int(s["disk_records"])}

    def close(self) -> None:
        """Flush and close the directory (DRAM is written to disk); remove it if temporary."""
        self.store.close()
        if self._tmp is not None:
            self._tmp.cleanup()


def chosen_rows(tokens: list[LayerTokens], top: torch.Tensor, record_of: torch.Tensor, field: str,
                out: torch.Tensor) -> None:
    """Write into `out` (H, n, D) the keys or values of the candidates at `top` among one layer's tokens of
    several stored records (in order), dequantized after choosing: the work grows with the n rows kept, not
    with every candidate.

    Args:
        tokens: the records' layer, K/V (and int8 scales) on `out`'s device.
        top: (n,) indices into the records' tokens laid end to end, ascending, on that device.
        record_of: (n,) which record each chosen token is in, on the host (each record's chosen tokens are a run).
    """
    runs = torch.bincount(record_of, minlength=len(tokens)).tolist()  # chosen tokens per record
    start, first = 0, 0  # first: the record's first token among the candidates
    for t, taken in zip(tokens, runs):
        if taken:
            rows = getattr(t, field).index_select(1, top[start:start + taken] - first)  # (H, taken, D)
            scale = t.scale(field)
            if scale is not None:
                torch.mul(rows, scale, out=out[:, start:start + taken])
            else:
                out[:, start:start + taken].copy_(rows)
        start, first = start + taken, first + t.num_tokens


def time_priority(times_s: torch.Tensor, frame_index: torch.Tensor, when: tuple[float, str]) -> torch.Tensor:
    """(m,) how much each token is wanted near `when` = (time s, side): minus its distance in seconds;
    on "before" / "after" a token on the other side counts twice as far ("near" and "start": either side alike).

    Args:
        times_s: (frames,) float64 stream time of each frame by index.
        frame_index: (m,) each token's frame.
    """
    offset = times_s[frame_index.clamp(0, times_s.numel() - 1)] - when[0]  # (m,) seconds after the time asked about
    if when[1] == "before":
        offset = torch.where(offset > 0, 2 * offset, -offset)
    elif when[1] == "after":
        offset = torch.where(offset < 0, -2 * offset, offset)
    return -offset.abs().float()


def best_in_time_order(priorities: list[torch.Tensor], n: int) -> torch.Tensor:
    """(L, n) the indices of each layer's `n` highest priorities, ascending (candidates are in time order).

    Args:
        priorities: per layer, (C_l,) one per candidate token, C_l >= n.
    """
    if all(p.shape[0] == n for p in priorities):  # every candidate fits: no ranking
        return torch.arange(n).expand(len(priorities), n)
    if len({p.shape[0] for p in priorities}) == 1:  # the usual case: one ranking for every layer
        return torch.sort(torch.topk(torch.stack(priorities), n, dim=1).indices, dim=1).values
    return torch.stack([torch.sort(torch.topk(p, n).indices).values for p in priorities])


def by_frame_of(known_frames: torch.Tensor, known: torch.Tensor, frame_index: torch.Tensor,
                nearness: torch.Tensor) -> torch.Tensor:
    """(m,) `known`'s priority of each token's frame (a frame's tokens alike in `known`); a frame it does not
    rank comes after every frame it does, nearest first.

    Args:
        known_frames, known: (k,) frames and their tokens' priorities, as `change_priority` returned them.
        frame_index, nearness: (m,) the tokens to rank, and their `time_priority`.
    """
    frames, slot = torch.unique(known_frames, return_inverse=True)
    by_frame = torch.empty(frames.numel()).scatter_(0, slot, known.float())
    at = torch.searchsorted(frames, frame_index).clamp(max=frames.numel() - 1)
    unranked = float(known.min()) - 1.0 + (nearness.float() - float(nearness.max()))  # below every ranked frame
    return torch.where(frames[at] == frame_index, by_frame[at], unranked)


def change_priority(values: torch.Tensor, frame_index: torch.Tensor, nearness: torch.Tensor) -> torch.Tensor:
    """(m,) what a question about the start of a stream wants first: the opening frame, then, nearest first,
    the frames that no longer look like it (what first happened), then the frames that still do (a still
    opening such as an empty scene or a title card would otherwise fill the splice). A frame no longer looks
    like the opening when it differs from it by more than consecutive frames differ on average here.

    Args:
        values: (H, m, D) the candidate tokens' values: content without rotation, comparable across positions.
        frame_index: (m,) each token's frame.
        nearness: (m,) `time_priority`'s (a frame's tokens alike).

    Returns:
        (m,) priority, higher first; a frame's tokens alike.
    """
    frames, token_frame, directions = frame_directions(values.permute(1, 0, 2).reshape(values.shape[1], -1),
                                                       frame_index)  # (F,), (m,), (F, H * D)
    frame_nearness = torch.full((frames.shape[0],), -torch.inf).scatter_reduce(0, token_frame, nearness.float(),
                                                                               reduce="amax")
    order = torch.argsort(frame_nearness, descending=True, stable=True)  # nearest first
    signature = directions[order]  # nearest first
    consecutive = 1.0 - (signature[1:] * signature[:-1]).sum(1)  # (F - 1,) cosine distances
    departed = 1.0 - signature @ signature[0] > (consecutive.mean() if consecutive.numel() else 0.0)  # (F,)
    departed[0] = True  # the opening frame itself comes first
    span = float(frame_nearness.max() - frame_nearness[torch.isfinite(frame_nearness)].min()) + 1.0
    rank = frame_nearness[order] - span * (~departed).float()  # still frames below every departed one
    rank[0] = rank.max() + 1.0
    return torch.empty(frames.shape[0]).scatter_(0, order, rank)[token_frame]
