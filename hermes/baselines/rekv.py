"""`rekv`: ReKV's own retrieval (Di et al., ICLR 2025; github.com/Becomebright/ReKV), beside our
`recall-only` approximation (sliding + FAISS recall), so that our recall is compared with the real thing.

What ReKV does, read from its code (`model/attention/kv_cache_manager.py`, `rekv_attention.py`,
`model/llava_onevision_rekv.py`, `video_qa/base.py`):

* ingest: sliding-window attention. Each frame attends to the init tokens (the system prompt) and
  the last `n_local` tokens (default 15000); every frame's KV is kept (offloaded to host memory)
  as one *block* (block size = tokens per frame, 196 for LLaVA-OneVision).
* each block's representative key, per layer: the mean over the frame's tokens of its keys
  *before* RoPE, the grouped KV heads repeated to the query heads, flattened to (H * D).
* a question is first run alone (the bare question text, no template) to retrieve: in every layer
  its tokens' queries before RoPE, averaged over the tokens, score every block by a dot product
  (fp32); the top `retrieve_size` blocks (64) are taken, in time order (all of them when fewer).
  Each layer retrieves its own blocks, from the hidden states of layers below that attended to
  their own retrieved blocks. The retrieval pass's own KV is not kept.
* the answer is prefilled on init + the retrieved blocks, packed back to back (RoPE by position in
  that view), then decoded.

Here: the working cache (level 1) is the window: the prefix plus the newest whole frames within
`memory.budget` tokens (15000 in the `rekv` preset); frames that leave it are kept on the host with
their keys un-rotated and their representative keys, as ReKV keeps its blocks. A question runs the
retrieval pass with `rekv_attention` as every layer's attention (it picks that layer's blocks, and
attends over prefix + blocks + question at packed positions, as ReKV's pass does); the answer is
then generated on a fresh view holding the prefix and each layer's blocks at packed positions.
`memory.recall_top_k` is ReKV's `retrieve_size` (64 in the preset).

Documented differences: the window holds whole frames (ReKV's is token-exact, so a frame at its
edge may be half visible); window positions are the stream's (relative distances, which are all
RoPE sees, are the same) and InfLLM's fixed angle between queries and init tokens once the
window is full is not reproduced; 1-D RoPE models only (ReKV has no M-RoPE version).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from hermes.cache import KIND_PREFIX, KIND_VISUAL, HermesCache
from hermes.config import MemoryConfig
from hermes.errors import ConfigError
from hermes.baselines import NoLowerLevels
from hermes.memory import Evictions
from hermes.model_protocol import CoreModel
from hermes.rope import rotate_at, rotate_keys

REKV_ATTENTION = "hermes_rekv"


@dataclass
class Block:
    """One frame that left the window: its un-rotated keys and values in every layer, on the host."""

    frame: int
    keys: torch.Tensor  # (L, Hkv, n, D), before RoPE
    values: torch.Tensor  # (L, Hkv, n, D)
    rep: torch.Tensor  # (L, Hq * D) fp32: mean key over the frame's tokens, KV heads repeated


def representative(raw_keys: torch.Tensor, groups: int) -> torch.Tensor:
    """ReKV's block key: mean over tokens of un-rotated keys, KV heads repeated, flattened.

    Args:
        raw_keys: (L, Hkv, n, D) keys before RoPE.
        groups: query heads per KV head.

    Returns:
        (L, Hkv * groups * D) float32.
    """
    mean = raw_keys.float().mean(dim=2)  # (L, Hkv, D)
    return mean.repeat_interleave(groups, dim=1).flatten(1)


def top_blocks(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best blocks in time order (all blocks when there are at most k)."""
    if scores.numel() <= k:
        return torch.arange(scores.numel())
    return torch.sort(torch.topk(scores, k).indices).values


class _Retrieval:
    """What one retrieval pass needs per layer, and what it chose."""

    def __init__(self, policy: ReKVPolicy, cache: HermesCache, question_positions: torch.Tensor) -> None:
        self.policy, self.cache = policy, cache
        self.question_positions = question_positions  # (Q,) where the question's queries were rotated
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # layer -> (keys, values, frames)


_active: _Retrieval | None = None


def rekv_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """One layer of ReKV's retrieval pass: choose this layer's blocks with the question's own
    queries, then attend over prefix + blocks + question at packed positions.

    Args: as transformers' eager attention (query (B, Hq, Q, D) rotated at the question's cache
    positions; key/value (B, Hkv, T, D) the layer's cache with the question last).

    Returns:
        (output (B, Q, Hq, D), None).
    """
    state = _active
    layer = module.layer_idx
    policy, spec = state.policy, state.policy.spec
    q_len = query.shape[-2]
    q_pos = state.question_positions.to(query.device)
    raw_q = rotate_keys(query[0], -q_pos, spec, positions=q_pos)  # (Hq, Q, D) before RoPE
    q_vec = raw_q.float().mean(dim=1).flatten()  # (Hq * D)
    sel_k, sel_v, picked = policy.retrieve(state.cache, layer, q_vec, key.device)  # (Hkv, m, D) raw
    m = sel_k.shape[1]
    prefix_len = int((state.cache.layers[layer].kinds == KIND_PREFIX).sum())
    packed = torch.arange(prefix_len, prefix_len + m + q_len, device=key.device)
    sel_k = rotate_at(sel_k, packed[:m], spec)
    q_rot = rotate_at(raw_q, packed[m:], spec)  # (Hq, Q, D)
    new_k = key[0, :, -q_len:]
    new_k = rotate_keys(new_k, packed[m:] - q_pos, spec, positions=q_pos)
    full_k = torch.cat([key[0, :, :prefix_len], sel_k.to(key.dtype), new_k], dim=1)  # (Hkv, P+m+Q, D)
    full_v = torch.cat([value[0, :, :prefix_len], sel_v.to(value.dtype), value[0, :, -q_len:]], dim=1)
    state.views[layer] = (sel_k, sel_v, picked)
    groups = module.num_key_value_groups
    full_k, full_v = full_k.repeat_interleave(groups, dim=0), full_v.repeat_interleave(groups, dim=0)
    scores = torch.matmul(q_rot.float(), full_k.float().transpose(1, 2)) * scaling  # (Hq, Q, T)
    t_len = full_k.shape[1]
    future = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).triu(1)
    scores[..., t_len - q_len:] = scores[..., t_len - q_len:].masked_fill(future, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    output = torch.matmul(weights.to(full_v.dtype), full_v)  # (Hq, Q, D)
    return output.transpose(0, 1)[None].contiguous().to(query.dtype), None


AttentionInterface.register(REKV_ATTENTION, rekv_attention)


class ReKVPolicy(NoLowerLevels):
    """A window of whole frames in device memory, every frame kept on the host, ReKV retrieval per question."""

    name = "rekv"
    reencodes = False
    answers_from_view = True

    def __init__(self, cfg: MemoryConfig, model: CoreModel) -> None:
        super().__init__(cfg, model)
        if self.spec.kind != "1d":
            raise ConfigError("memory.policy=rekv needs a 1-D RoPE model (ReKV's retrieval is defined for those); "
                              f"{getattr(model, 'name', 'this model')} uses M-RoPE")
        self.blocks: list[Block] = []
        self.groups = model.text_config.num_attention_heads // model.text_config.num_key_value_heads
        self.last_retrieved: list[list[int]] = []  # per layer: the frames the last question retrieved

    # ---- ingest: a window of whole frames; what leaves it becomes a host block ----

    def _raw(self, cache: HermesCache, layer: int, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        entries = cache.layers[layer].entries(idx)
        pos = entries.positions[0].to(entries.keys.device)
        return rotate_keys(entries.keys, -pos, self.spec, positions=pos), entries.values

    def maintain(self, cache: HermesCache, *, copy_evicted: bool = False,
                 probe: torch.Tensor | None = None) -> Evictions:
        """Move the oldest whole frames beyond the window to host blocks (`copy_evicted` is not needed:
        rekv keeps what it evicts itself and runs without lower levels; it never probes)."""
        start = time.perf_counter()
        prefix_len = cache.prefix_len
        length, epoch = cache.num_tokens, cache.compactions
        frames = cache.layers[0].frame_index[prefix_len:]
        index: tuple[torch.Tensor, ...] = ()
        if frames.numel() > self.cfg.budget:
            order, counts = torch.unique_consecutive(frames, return_counts=True)
            kept = int((counts.flip(0).cumsum(0) <= self.cfg.budget).sum())  # newest whole frames that fit
            n_evict = int(counts[: len(order) - kept].sum())
            for f, n, first in zip(order[: len(order) - kept].tolist(), counts.tolist(),
                                   (counts.cumsum(0) - counts).tolist()):
                idx = torch.arange(prefix_len + first, prefix_len + first + n)
                raw = [self._raw(cache, layer, idx) for layer in range(cache.num_layers)]
                keys = torch.stack([k for k, _ in raw]).cpu()
                self.blocks.append(Block(f, keys, torch.stack([v for _, v in raw]).cpu(),
                                         representative(keys, self.groups)))
            keep = torch.cat([torch.arange(prefix_len), torch.arange(prefix_len + n_evict, cache.num_tokens)])
            cache.select_(keep.expand(cache.num_layers, -1))
            index = (torch.arange(prefix_len, prefix_len + n_evict),) * cache.num_layers
        return Evictions(index=index, scores=tuple(torch.ones(i.shape[0]) for i in index), length=length,
                         position_epoch=epoch, maintain_ms=(time.perf_counter() - start) * 1e3)

    # ---- answer ----

    def _window(self, cache: HermesCache, layer: int):
        own = cache.layers[layer]
        prefix_len = int((own.kinds == KIND_PREFIX).sum())
        # the described tokens, not all cached: inside the retrieval pass the question's K/V are appended
        idx = torch.arange(prefix_len, own.num_described)
        frames = own.frame_index[prefix_len:]
        return idx, frames

    def retrieve(self, cache: HermesCache, layer: int, q_vec: torch.Tensor, device) -> tuple[torch.Tensor, ...]:
        """One layer's `recall_top_k` frames for a question, as ReKV retrieves them: the host blocks
        and window frames whose representative keys best match the question's mean query.

        Only the chosen frames' keys and values are gathered (ReKV loads only the blocks it
        retrieves), so a question costs the window and k blocks, not every frame of the stream.

        Args:
            q_vec: (Hq * D) float32 on `device`: the question's queries before RoPE, averaged over tokens.

        Returns:
            (keys (Hkv, m, D) before RoPE, values (Hkv, m, D), frames (k,)): the chosen frames in
            time order, m = k x tokens per frame.

        Raises:
            ConfigError: Frames of different sizes (a block must be one frame's tokens).
        """
        idx, frames = self._window(cache, layer)
        order = [b.frame for b in self.blocks]
        sizes = {int(b.keys.shape[2]) for b in self.blocks}
        reps = [torch.stack([b.rep[layer] for b in self.blocks]).to(device)] if self.blocks else []  # one move
        window_k = window_v = None
        if idx.numel():
            window_k, window_v = self._raw(cache, layer, idx)  # (Hkv, n, D), un-rotated once for both uses
            window_frames, counts = torch.unique_consecutive(frames, return_counts=True)
            sizes |= set(counts.tolist())
            order += window_frames.tolist()
        if len(sizes) > 1:
            raise ConfigError(f"rekv needs the same number of tokens in every frame (a block), found {sorted(sizes)}")
        per_frame = sizes.pop()
        if window_k is not None:  # (F_window, Hq * D): the window's frames as blocks of per_frame tokens
            hkv, n, d = window_k.shape
            reps.append(representative(window_k.reshape(hkv, n // per_frame, per_frame, d).transpose(0, 1),
                                       self.groups))
        pick = top_blocks(torch.cat(reps) @ q_vec, self.cfg.recall_top_k).tolist()
        keys, values = [], []
        for i in pick:
            if i < len(self.blocks):
                keys.append(self.blocks[i].keys[layer].to(device))
                values.append(self.blocks[i].values[layer].to(device))
            else:
                start = (i - len(self.blocks)) * per_frame
                keys.append(window_k[:, start:start + per_frame])
                values.append(window_v[:, start:start + per_frame])
        return torch.cat(keys, dim=1), torch.cat(values, dim=1), torch.tensor(order)[pick]

    def answer_cache(self, model: CoreModel, cache: HermesCache, question: str) -> HermesCache:
        """Run ReKV's retrieval pass for `question` and return the answer view (prefix + each layer's blocks)."""
        global _active
        if cache.num_visual_tokens == 0 and not self.blocks:
            return cache
        embeds = model.embed_text(question)  # the bare question: the session passes its `query`
        config = model.text_config
        previous = config._attn_implementation
        mark = cache.mark()
        positions = cache.allocate_positions(embeds.shape[0])
        _active = _Retrieval(self, cache, positions[0])
        try:
            config._attn_implementation = REKV_ATTENTION
            model.prefill(embeds, positions, cache)
            views = _active.views
        finally:
            config._attn_implementation = previous
            _active = None
            cache.rewind(mark)
        view = model.new_cache()
        model.encode_prefix(view)
        prefix_len = view.num_tokens
        keys, values, positions, frame_index = [], [], [], []
        for layer in range(view.num_layers):
            k, v, frames = views[layer]
            m = k.shape[1]
            per_frame = m // max(1, frames.numel())
            keys.append(k)
            values.append(v)
            positions.append(torch.arange(prefix_len, prefix_len + m)[None])
            frame_index.append(frames.repeat_interleave(per_frame))
        view.append(keys, values, positions, KIND_VISUAL, frame_index)
        view.next_position = prefix_len + int(views[0][0].shape[1])
        self.last_retrieved = [views[layer][2].tolist() for layer in range(view.num_layers)]
        return view
