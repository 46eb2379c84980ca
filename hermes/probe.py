"""The pseudo-query attention probe: how much the model itself attends to each cached token.

The probe is the model's true attention: the pseudo-query is prefilled through every layer with the
working cache (each layer's queries from the previous layer's output; the reference computes them
from the raw embeddings under SDPA/FlashAttention, a defect avoided here), every layer running
`probe_attention_forward`, which computes grouped attention eagerly in float32 and records head-mean
(Q, T) maps into one (L, Q, T) buffer; the pass stops inside the last layer and the cache is rewound.
`prefill_chunk` enters a chunk with the probe riding in its forward; `question_queries` is recall's
queries-only pass (docs/ARCHITECTURE.md, Memory and Models).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from transformers import AttentionInterface

from hermes.cache import CacheMark, HermesCache
from hermes.errors import ModelError
from hermes.model_protocol import CoreModel

# the forward kwarg that carries one pass's attention function to every layer (see `hooked`)
PASS_KWARG = "hermes_pass"
# implementations whose chunk attention `prefill_chunk` reproduces; others prefill and probe separately
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
        record: `prefill_chunk` only: False runs the riding tokens as the chunk's own and records nothing.
    """

    def __init__(self, num_layers: int, cached: int, query_layer: int | None = None, probe_len: int = 0,
                 record: bool = True) -> None:
        self.num_layers = num_layers
        self.cached = cached
        self.query_layer = query_layer
        self.probe_len = probe_len
        self.record = record
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
    """(Q, T) True where new token i (after T - Q cached) may look: the cache and new tokens up to itself."""
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


# CPU: blocks of KV heads whose float32 scores fit a core's L2 stay in cache through mask, softmax and
# matmul (all heads at 4K tokens are 15 MB a layer; maintenance 162-179 -> 109-118 ms, benchmarks/RESULTS.md)
CPU_SCORE_BLOCK_BYTES = 2 << 20


def kv_heads_per_block(hkv: int, rows: int, t_len: int, device: torch.device) -> int:
    """KV heads whose (rows, T) float32 scores are computed at once: all on CUDA, else those fitting `CPU_SCORE_BLOCK_BYTES`."""
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
        attention_mask: ignored: rebuilt here (the cache visible, causal among the new tokens).
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
    # (B * Hkv, G * Q, D), heads-major as the grouped matmuls write it
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
    """The model's SDPA (the mask rebuilt), except in the recorder's query layer: keep its queries and stop.

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
        (1, Hq, Q, D) as the model's SDPA computes it (CPU: grouped heads, `enable_gqa`; elsewhere widened
        first, as transformers' `sdpa`: CUDA's masked kernels take no grouped heads).
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
    """`prefill_chunk`'s attention: the chunk's rows as the model's SDPA, a riding pseudo-query's as
    `probe_attention_forward` (recording maps over cache and chunk); stops in the last layer.

    Returns:
        (output (1, Q, Hq, D), None): the chunk's rows, then the pseudo-query's.

    Raises:
        _PassDone: in the last layer.
    """
    rec = recorder
    n_probe = rec.probe_len if rec.record else 0  # unrecorded, riding tokens attend as the chunk's own rows
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
    # one (1, n + Q, Hq, D) buffer: the copy each needs to be token-major anyway
    output = torch.empty(1, n_chunk + n_probe, query.shape[1], query.shape[-1], dtype=chunk_output.dtype,
                         device=chunk_output.device)
    output[:, :n_chunk] = chunk_output.transpose(1, 2)
    if probe_output is not None:
        output[:, n_chunk:] = probe_output
    return output, None


def _run(model: CoreModel, cache: HermesCache, embeds: torch.Tensor, positions: torch.Tensor, attention,
         recorder: _ProbeRecorder, rewind_to: CacheMark | None, **model_kwargs) -> None:
    """Prefill `embeds` at `positions` with `attention` recording into `recorder`, then rewind to `rewind_to`."""
    try:
        run_pass(model, embeds, positions, cache, partial(attention, recorder=recorder), **model_kwargs)
    except _PassDone:
        pass
    finally:
        if rewind_to is not None:
            cache.rewind(rewind_to)


def _run_after_cache(model: CoreModel, cache: HermesCache, embeds: torch.Tensor, attention,
                     recorder: _ProbeRecorder) -> torch.Tensor:
    """`_run` with `embeds` placed after everything cached, leaving no trace; returns their (A, Q) positions."""
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
        (L, Q, T) float32 on the CPU: each pseudo-query token's head-mean weight on each cached token.
    """
    recorder = _ProbeRecorder(model.text_config.num_hidden_layers, cache.num_tokens)
    _run_after_cache(model, cache, embeds, probe_attention_forward, recorder)
    return recorder.maps.cpu()


def probe_transient_bytes(num_layers: int, q_heads: int, q_len: int, cached: int) -> int:
    """Most bytes the probe holds beyond the model's activations: one layer's float32 (Hq, Q, T) scores and
    weights plus the (L, Q, T) maps."""
    return 4 * (2 * q_heads * q_len * (cached + q_len) + num_layers * q_len * cached)


@torch.inference_mode()
def question_queries(model: CoreModel, cache: HermesCache, embeds: torch.Tensor,
                     layer: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated queries `layer` computes for `embeds` after the cache (a pass that stops there).

    Args:
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


# a chunk's extra inputs and how each extends over a riding pseudo-query (Qwen3-VL's DeepStack)
_RIDE_ALONG_KWARGS = {"visual_pos_masks": lambda mask, n: torch.nn.functional.pad(mask, (0, n), value=False),
                      "deepstack_visual_embeds": lambda features, n: features}


@torch.inference_mode()
def prefill_chunk(model: CoreModel, cache: HermesCache, embeds: torch.Tensor, positions: torch.Tensor,
                  probe_embeds: torch.Tensor | None = None, *, record: bool = True,
                  **model_kwargs) -> torch.Tensor | None:
    """Append a chunk's keys and values to the cache (stopping inside the last layer), with the
    pseudo-query riding along if given: its maps are `probe_attention`'s after the chunk, its tokens
    cut after. Other attention kernels or unknown inputs prefill and probe separately (the same results).

    Args:
        cache: the working cache; grows by the chunk's n tokens (described by the caller, as after
            `model.prefill`).
        embeds: (n, hidden) the chunk's embeddings.
        positions: (A, n) their positions (placed in `cache`).
        probe_embeds: (Q, hidden) the pseudo-query the next maintenance needs, or None.
        record: False: the pseudo-query rides through the chunk's own attention kernel and nothing is
            recorded (returns None): the least any exact probe computes (`bench overhead --floor`).
        **model_kwargs: the chunk's extra language-model inputs (`VisualChunk.model_kwargs`).

    Returns:
        With `probe_embeds`: (L, Q, T) float32 on the CPU, T the cache length with the chunk, as
        `probe_attention`; else None.
    """
    config = model.text_config
    if config._attn_implementation not in INGEST_REPLACES or set(model_kwargs) - set(_RIDE_ALONG_KWARGS):
        model.prefill(embeds, positions, cache, **model_kwargs)
        return None if probe_embeds is None or not record else probe_attention(model, cache, probe_embeds)
    n_chunk = embeds.shape[0]
    n_probe = 0 if probe_embeds is None else probe_embeds.shape[0]
    after_chunk = CacheMark(cache.num_tokens + n_chunk, cache.next_position, cache.block)
    recorder = _ProbeRecorder(config.num_hidden_layers, cache.num_tokens + n_chunk, probe_len=n_probe, record=record)
    if n_probe:
        positions = torch.cat([positions, cache.allocate_positions(n_probe)], dim=1)
        embeds = torch.cat([embeds, probe_embeds.to(embeds.dtype)])
        model_kwargs = {k: _RIDE_ALONG_KWARGS[k](v, n_probe) for k, v in model_kwargs.items()}
    _run(model, cache, embeds, positions, ingest_attention_forward, recorder, after_chunk if n_probe else None,
         **model_kwargs)
    return recorder.maps.cpu() if n_probe and record else None
