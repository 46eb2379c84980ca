"""The pseudo-query attention probe: how much the model itself attends to each cached token.

HERMES scores long-term importance by the attention generic "pseudo-queries" (e.g. "What is
happening in the video?") pay to each cached visual token. It must be the model's *true* attention:
the pseudo-query's hidden states go through every layer, and each layer's queries come from the
previous layer's output. (The reference implementation computes every layer's queries from the raw
token embeddings when the model runs SDPA or FlashAttention — a defect this module avoids by
construction.)

How: the pseudo-query is prefilled through the language model with the working cache, exactly as
a question would be, while every attention layer runs `probe_attention_forward` instead of its
usual kernel. That function receives the layer's real rotated queries and the full key/value
cache and computes attention eagerly, so the weights exist; it returns the same output the eager
kernel would. The cache is rewound afterwards: the probe leaves no trace.

What it costs (docs/ARCHITECTURE.md, Performance): nothing is copied to widen K/V. The queries are grouped against the
key heads (query head h reads key head h // G, as `repeat_interleave` would), so one batched matmul
per layer runs against the cache as it is stored; scores accumulate in float32 (on CUDA straight
from bf16/fp16 inputs, `out_dtype`; elsewhere one layer's keys are widened at a time). Each
layer's weights are reduced over heads inside the attention function to one (Q, T) map, written
into a preallocated (L, Q, T) device buffer; that buffer reaches the host in one transfer. The pass
stops inside the last layer once its map is written (its output is never read). So the
transient memory is at most one layer's (Hq, Q, T) scores plus the (L, Q, T) maps, not every layer's
weights at once. On CUDA all heads of a layer go in one batched kernel; on a CPU in blocks of KV
heads whose scores stay in cache (`kv_heads_per_block`).

`question_queries` is the cheap sibling used by recall: a pass with the model's own SDPA kernel
that stops inside the last layer once its rotated queries exist (no eager attention anywhere, no
last-layer attention or MLP).

`prefill_chunk` is how a chunk enters the cache. It computes only what the cache keeps: the last
layer's keys and values are cached before its attention runs, so the pass stops there (that layer's
attention, output projection and MLP, and the final norm, would only make hidden states nobody
reads). And when the chunk will evict (the policy says so before the chunk is encoded), the
pseudo-query rides in the same forward, after the chunk's tokens: its rows attend to the cache, the
chunk and themselves, exactly what a separate probe after the chunk would see, at the same
positions, so its maps are the same, and the probe costs its rows in the chunk's forward instead of
a forward of its own (on a GPU, where a 30-token forward costs about what reading the weights
costs, that is most of the probe). Its tokens are cut from the cache afterwards.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from transformers import AttentionInterface

from hermes.cache import CacheMark, HermesCache
from hermes.errors import ModelError
from hermes.model_protocol import CoreModel

# The forward kwarg that carries one pass's attention function down to every layer: an adapter selects,
# once at load, an implementation built by `hooked` (`hermes.models.attention`), which runs it instead of
# the model's own attention when a forward passes it (the probe's passes here, rekv's retrieval).
PASS_KWARG = "hermes_pass"
# Implementations whose chunk attention `prefill_chunk` reproduces (SDPA with an explicit mask); a model
# set to another (eager) is prefilled by its own path, and probed by a pass of its own.
INGEST_REPLACES = ("hermes_sdpa",)


def hooked(base):
    """An attention function (transformers' protocol) that runs `base`, or the function a forward passes
    as `hermes_pass` (`PASS_KWARG`) in its place, with the same arguments."""
    def attention(module, query, key, value, attention_mask, hermes_pass=None, **kwargs):
        return (hermes_pass or base)(module, query, key, value, attention_mask, **kwargs)

    attention.hermes_hooked = True
    return attention


def run_pass(model: CoreModel, embeds: torch.Tensor, positions: torch.Tensor, cache: HermesCache, attention,
             **model_kwargs) -> None:
    """`model.prefill` with `attention` (transformers' attention-function protocol) as every layer's attention.

    Raises:
        ModelError: the model's attention implementation is not one `hooked` built (nothing would run it).
    """
    implementation = model.text_config._attn_implementation
    if not getattr(AttentionInterface().get(implementation), "hermes_hooked", False):
        raise ModelError(f"the language model's attention {implementation!r} does not take hermes's passes: "
                         "select it with the adapter's `set_attention`")
    model.prefill(embeds, positions, cache, **{PASS_KWARG: attention}, **model_kwargs)


class _ProbeRecorder:
    """What one probe forward captures: head-mean weights of every layer, or one layer's queries.

    Args:
        num_layers: decoder layers L.
        cached: T, cache length before the probe (the columns kept).
        query_layer: the layer whose rotated queries `question_queries` wants (None: attention maps).
        probe_len: `prefill_chunk` only: pseudo-query tokens after the chunk's (0: no probe rides along).
    """

    def __init__(self, num_layers: int, cached: int, query_layer: int | None = None, probe_len: int = 0) -> None:
        self.num_layers = num_layers
        self.cached = cached
        self.query_layer = query_layer
        self.probe_len = probe_len
        self.maps: torch.Tensor | None = None  # (L, Q, T) float32 on the device, allocated by layer 0
        self.queries: torch.Tensor | None = None  # (Hq, Q, D) of `query_layer`
        self._built_once: dict[tuple, torch.Tensor] = {}

    def mask_once_per_pass(self, name: str, q_len: int, t_len: int, device: torch.device) -> torch.Tensor:
        """A mask every layer of this pass uses alike, built by the first layer that asks (`_MASKS[name]`)."""
        key = (name, q_len, t_len, device)
        mask = self._built_once.get(key)
        if mask is None:
            mask = self._built_once[key] = _MASKS[name](q_len, t_len, device)
        return mask


class _PassDone(Exception):
    """Raised inside the last layer a pass needs, once it has what it came for (caught by `_run`)."""


def _future_mask(q_len: int, device: torch.device) -> torch.Tensor:
    """(Q, Q) True above the diagonal: query i (cache index T + i) sees the cache and new tokens up to itself."""
    return torch.ones(q_len, q_len, dtype=torch.bool, device=device).triu(1)


def _visible_after_cache(q_len: int, t_len: int, device: torch.device) -> torch.Tensor:
    """(Q, T) True where query i, the i-th of Q new tokens after T - Q cached ones, may look: the cache, and
    the new tokens up to itself."""
    visible = torch.ones(q_len, t_len, dtype=torch.bool, device=device)
    visible[:, t_len - q_len:] = ~_future_mask(q_len, device)
    return visible


# the masks a pass's layers share (`_ProbeRecorder.mask_once_per_pass`), by name: (Q, T, device) -> mask
_MASKS = {"future": lambda q_len, t_len, device: _future_mask(q_len, device), "visible": _visible_after_cache}


def grouped_scores_fp32(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """Scaled scores of grouped queries against their key heads, accumulated in float32.

    Args:
        query: (B, Hq, Q, D) queries; Hq = G * Hkv, head h belonging to key head h // G.
        key: (B, Hkv, T, D) keys as cached (no copy is made to widen them over groups).
        scaling: the softmax scale.

    Returns:
        (B, Hkv, G * Q, T) float32 scores; row g * Q + i is query head (kv * G + g), token i.
    """
    b, hq, q_len, d = query.shape
    hkv, t_len = key.shape[1], key.shape[2]
    grouped = query.reshape(b * hkv, hq // hkv * q_len, d)  # heads of one group are adjacent
    keys_t = key.reshape(b * hkv, t_len, d).transpose(1, 2)  # (B*Hkv, D, T), a view
    # a power of two (1/sqrt(D) for D = 16, 64, ...) scales the few queries exactly, bit for bit as the many scores
    first = scaling if math.frexp(scaling)[0] == 0.5 else 1.0
    if key.dtype == torch.float32:
        scores = torch.bmm(grouped.float() * first, keys_t)
    elif key.is_cuda:  # tensor cores accumulate in fp32; out_dtype keeps that precision in the result
        scores = torch.bmm(grouped.to(key.dtype) * first, keys_t, out_dtype=torch.float32)
    else:  # no mixed-precision bmm on this device: widen this layer's keys only (transient)
        scores = torch.bmm(grouped.float() * first, keys_t.float())
    if first != scaling:
        scores.mul_(scaling)
    return scores.view(b, hkv, hq // hkv * q_len, t_len)


# On a CPU the probe's float32 scores go through the mask, softmax, the head sum and the output matmul;
# for every head at once they are 15 MB per layer at 32 heads x 29 queries x 4K tokens, streamed from
# memory at each step. In blocks of KV heads whose scores fit about one core's L2 they stay in cache:
# maintenance 162-179 -> 109-118 ms per evicting chunk at that size (benchmarks/RESULTS.md).
CPU_SCORE_BLOCK_BYTES = 2 << 20


def kv_heads_per_block(hkv: int, rows: int, t_len: int, device: torch.device) -> int:
    """KV heads whose (rows, T) float32 scores the probe computes at once: all of them on CUDA (one
    batched kernel each), else as many as fit `CPU_SCORE_BLOCK_BYTES` (at least one)."""
    if device.type == "cuda":
        return hkv
    return max(1, min(hkv, CPU_SCORE_BLOCK_BYTES // max(1, 4 * rows * t_len)))


def probe_attention_forward(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                            recorder: _ProbeRecorder | None = None, **kwargs):
    """Eager grouped attention that records its head-mean weights: the probe pass's attention.

    Args:
        module: the attention module (gives `layer_idx`).
        query: (B, Hq, Q, D) rotated queries of the tokens being prefilled (the pseudo-query).
        key, value: (B, Hkv, T, D) the layer's whole cache, the Q new tokens last.
        attention_mask: ignored: the mask is rebuilt here (all cached tokens visible, causal among
            the new ones), so the probe does not depend on which mask format a kernel expects.
        scaling: the softmax scale the model uses.
        recorder: where the pass records (None: nothing is recorded).

    Returns:
        (output (B, Q, Hq, D), None): the eager output; the weights stay in the recorder.

    Raises:
        _PassDone: in the last layer, once its map is recorded.
    """
    b, hq, q_len, d = query.shape
    hkv, t_len = key.shape[1], key.shape[2]
    groups = hq // hkv
    rec = recorder
    last = rec is not None and module.layer_idx == rec.num_layers - 1
    future = _future_mask(q_len, query.device) if rec is None else \
        rec.mask_once_per_pass("future", q_len, q_len, query.device)
    if rec is not None:
        if rec.maps is None:
            rec.maps = torch.zeros(rec.num_layers, q_len, rec.cached, dtype=torch.float32, device=query.device)
        head_sum = rec.maps[module.layer_idx]  # (Q, T): summed over query heads here, then divided
    # heads-major, as the grouped matmuls write it: (B * Hkv, G * Q, D); batch 1 writes it in place (`out=`)
    output = None if last else torch.empty(b * hkv, groups * q_len, d, dtype=value.dtype, device=value.device)
    step = kv_heads_per_block(hkv, b * groups * q_len, t_len, query.device)
    for h0 in range(0, hkv, step):  # blocks of KV heads; the query heads of each follow it
        h1 = min(h0 + step, hkv)
        scores = grouped_scores_fp32(query[:, h0 * groups:h1 * groups], key[:, h0:h1], scaling)
        scores = scores.view(b, h1 - h0, groups, q_len, t_len)
        scores[..., t_len - q_len:].masked_fill_(future, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, heads of the block, G, Q, T) float32
        if rec is not None:  # batch 0's query heads, cached columns only
            head_sum.add_(weights[0, ..., :rec.cached].sum(dim=(0, 1)))
        if output is not None:
            rows = weights.view(b * (h1 - h0), groups * q_len, t_len).to(value.dtype)
            values = value[:, h0:h1].reshape(b * (h1 - h0), t_len, d)
            if b == 1:
                torch.bmm(rows, values, out=output[h0:h1])
            else:
                blocks = output.view(b, hkv, groups * q_len, d)[:, h0:h1]
                blocks.copy_(torch.bmm(rows, values).view_as(blocks))
    if rec is not None:
        head_sum.div_(hq)
    if last:
        raise _PassDone  # the last layer's output (o_proj, MLP, norm) is never read
    return output.view(b, hq, q_len, d).transpose(1, 2), None


def queries_attention_forward(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                              recorder: _ProbeRecorder | None = None, **kwargs):
    """The model's SDPA kernel, except in the recorder's query layer, where it keeps the queries and stops.

    The mask is rebuilt as in `probe_attention_forward` (the cache visible, causal among the new tokens).

    Returns:
        (output (B, Q, Hq, D), None).

    Raises:
        _PassDone: in the query layer (nothing after it is needed).
    """
    rec = recorder
    if rec is not None and module.layer_idx == rec.query_layer:
        rec.queries = query[0]  # (Hq, Q, D), rotated at the pass's positions
        raise _PassDone
    q_len, t_len = query.shape[-2], key.shape[-2]
    visible = rec.mask_once_per_pass("visible", q_len, t_len, query.device) if rec is not None else None
    return _attend_after_cache(query, key, value, scaling, visible).transpose(1, 2).contiguous(), None


def _attend_after_cache(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                        visible: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA of new tokens placed after a cache: every cached token visible, causal among the new ones.

    Args:
        query: (1, Hq, Q, D) the new tokens' queries.
        key, value: (1, Hkv, T, D) the cache, the Q new tokens last.
        scaling: the softmax scale.
        visible: the (Q, T) mask `_visible_after_cache` builds, built once for a pass's layers (None: built here).

    Returns:
        (1, Hq, Q, D) the output as the model's SDPA computes it: on a CPU with grouped heads as
        they are (`enable_gqa`, as `hermes_sdpa`), elsewhere widened first, as transformers' `sdpa`
        does (CUDA's kernels that take a mask do not take grouped heads).
    """
    q_len, t_len = query.shape[-2], key.shape[-2]
    if visible is None:
        visible = _visible_after_cache(q_len, t_len, query.device)
    key, value = key.to(query.dtype), value.to(query.dtype)
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and query.device.type != "cpu":
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=visible, scale=scaling,
                                                            enable_gqa=query.shape[1] != key.shape[1])


def ingest_attention_forward(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                             recorder: _ProbeRecorder | None = None, **kwargs):
    """A chunk's attention, with the pseudo-query's rows after it when one rides along: `prefill_chunk`'s
    pass's attention.

    The chunk's rows attend as the model's SDPA does (the cache, and causally the chunk); the
    pseudo-query's rows as `probe_attention_forward` computes them (the cache, the chunk and
    causally themselves), recording their maps over the cache and the chunk. The last layer's cache
    update happened before this call, and nothing after it is needed: the pass stops there.

    Returns:
        (output (1, Q, Hq, D), None): the chunk's rows, then the pseudo-query's.

    Raises:
        _PassDone: in the last layer.
    """
    rec = recorder
    n_probe = rec.probe_len
    n_chunk = query.shape[-2] - n_probe
    probe_output = None
    if n_probe:  # raises _PassDone in the last layer, once its map is recorded
        probe_output, _ = probe_attention_forward(module, query[:, :, n_chunk:], key, value, None, scaling,
                                                 recorder=rec)
    if module.layer_idx == rec.num_layers - 1:
        raise _PassDone
    t_chunk = key.shape[-2] - n_probe  # the chunk's rows never see the pseudo-query after them
    visible = rec.mask_once_per_pass("visible", n_chunk, t_chunk, query.device)
    chunk_output = _attend_after_cache(query[:, :, :n_chunk], key[:, :, :t_chunk], value[:, :, :t_chunk], scaling,
                                       visible)  # (1, Hq, n, D)
    # both outputs land in one (1, n + Q, Hq, D) buffer: the one copy each needs to be token-major anyway
    output = torch.empty(1, n_chunk + n_probe, query.shape[1], query.shape[-1], dtype=chunk_output.dtype,
                         device=chunk_output.device)
    output[:, :n_chunk] = chunk_output.transpose(1, 2)
    if probe_output is not None:
        output[:, n_chunk:] = probe_output
    return output, None


def _run(model: CoreModel, cache: HermesCache, embeds: torch.Tensor, positions: torch.Tensor, attention,
         recorder: _ProbeRecorder, rewind_to: CacheMark | None, **model_kwargs) -> None:
    """Prefill `embeds` at `positions` with `attention` recording into `recorder`; then rewind
    the cache to `rewind_to` (None: keep what was appended)."""
    try:
        run_pass(model, embeds, positions, cache, partial(attention, recorder=recorder), **model_kwargs)
    except _PassDone:
        pass
    finally:
        if rewind_to is not None:
            cache.rewind(rewind_to)


def _run_after_cache(model: CoreModel, cache: HermesCache, embeds: torch.Tensor, attention,
                     recorder: _ProbeRecorder) -> torch.Tensor:
    """`_run` with `embeds` placed after everything cached, leaving no trace.

    Returns:
        (A, Q) positions the tokens took.
    """
    mark = cache.mark()
    positions = cache.allocate_positions(embeds.shape[0])
    _run(model, cache, embeds, positions, attention, recorder, mark)
    return positions


@torch.inference_mode()
def probe_attention(model: CoreModel, cache: HermesCache, embeds: torch.Tensor) -> torch.Tensor:
    """Attention each cached token receives from a pseudo-query, per layer, on the host.

    Args:
        model: a `VLMAdapter` (uses `prefill` and `text_config`).
        cache: the working `HermesCache`; unchanged on return.
        embeds: (Q, hidden) pseudo-query embeddings, placed after everything cached.

    Returns:
        (L, Q, T) float32 on the CPU (one transfer for all layers): the attention weight each
        pseudo-query token puts on each of the T cached tokens, averaged over heads (the
        pseudo-query's own tokens excluded). `probe[l]` is layer l's (Q, T) map.
    """
    recorder = _ProbeRecorder(model.text_config.num_hidden_layers, cache.num_tokens)
    _run_after_cache(model, cache, embeds, probe_attention_forward, recorder)
    return recorder.maps.cpu()


def probe_transient_bytes(num_layers: int, q_heads: int, q_len: int, cached: int) -> int:
    """Bytes the probe holds beyond the model's own activations, at most: one layer's float32 (Hq, Q, T)
    scores and weights (on a CPU only a block of heads' at a time), plus the (L, Q, T) float32 maps
    (the figure the bench reports)."""
    return 4 * (2 * q_heads * q_len * (cached + q_len) + num_layers * q_len * cached)


@torch.inference_mode()
def question_queries(model: CoreModel, cache: HermesCache, embeds: torch.Tensor,
                     layer: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated query vectors one layer computes for `embeds` placed after the cache.

    A queries-only pass: the layers before `layer` run the model's SDPA attention, and the pass
    stops inside `layer` as soon as its queries are rotated.

    Args:
        model: a `VLMAdapter`.
        cache: the working `HermesCache`; unchanged on return.
        embeds: (Q, hidden) embeddings (e.g. a question).
        layer: decoder layer index (negative counts from the end).

    Returns:
        (queries (Hq, Q, D) as rotated by the model, positions (A, Q) they were rotated at).
    """
    num_layers = model.text_config.num_hidden_layers
    recorder = _ProbeRecorder(num_layers, cache.num_tokens, query_layer=layer % num_layers)
    positions = _run_after_cache(model, cache, embeds, queries_attention_forward, recorder)
    return recorder.queries, positions


# What a chunk's prefill may carry besides its embeddings, and how it extends over a pseudo-query's
# tokens appended after the chunk's (Qwen3-VL's DeepStack: its mask marks the visual tokens; the
# features themselves are per visual token and stay as they are).
_RIDE_ALONG_KWARGS = {"visual_pos_masks": lambda mask, n: torch.nn.functional.pad(mask, (0, n), value=False),
                      "deepstack_visual_embeds": lambda features, n: features}


@torch.inference_mode()
def prefill_chunk(model: CoreModel, cache: HermesCache, embeds: torch.Tensor, positions: torch.Tensor,
                  probe_embeds: torch.Tensor | None = None, **model_kwargs) -> torch.Tensor | None:
    """Append a chunk's keys and values to the cache, with the pseudo-query's probe riding along if given.

    The pass computes what the cache keeps and stops inside the last layer (module docstring). With
    `probe_embeds`, the pseudo-query follows the chunk's tokens in the same forward and its maps are
    those `probe_attention` would return right after the chunk was prefilled; its tokens are then
    cut from the cache. A model whose attention is not SDPA (flash attention, eager), or whose chunk
    carries inputs this function does not know how to extend, runs its own prefill and a separate
    probe instead (the same results).

    Args:
        model: a `VLMAdapter`.
        cache: the working cache; grows by the chunk's n tokens (described by the caller, as after
            `model.prefill`).
        embeds: (n, hidden) the chunk's embeddings.
        positions: (A, n) their positions (placed in `cache`).
        probe_embeds: (Q, hidden) the pseudo-query the next maintenance needs, or None.
        **model_kwargs: the chunk's extra language-model inputs (`VisualChunk.model_kwargs`).

    Returns:
        With `probe_embeds`: (L, Q, T) float32 on the CPU, T the cache length with the chunk, as
        `probe_attention`; else None.
    """
    config = model.text_config
    if config._attn_implementation not in INGEST_REPLACES or set(model_kwargs) - set(_RIDE_ALONG_KWARGS):
        model.prefill(embeds, positions, cache, **model_kwargs)
        return None if probe_embeds is None else probe_attention(model, cache, probe_embeds)
    n_chunk = embeds.shape[0]
    n_probe = 0 if probe_embeds is None else probe_embeds.shape[0]
    after_chunk = CacheMark(cache.num_tokens + n_chunk, cache.next_position, cache.block)
    recorder = _ProbeRecorder(config.num_hidden_layers, cache.num_tokens + n_chunk, probe_len=n_probe)
    if n_probe:
        positions = torch.cat([positions, cache.allocate_positions(n_probe)], dim=1)
        embeds = torch.cat([embeds, probe_embeds.to(embeds.dtype)])
        model_kwargs = {k: _RIDE_ALONG_KWARGS[k](v, n_probe) for k, v in model_kwargs.items()}
    _run(model, cache, embeds, positions, ingest_attention_forward, recorder, after_chunk if n_probe else None,
         **model_kwargs)
    return recorder.maps.cpu() if n_probe else None
