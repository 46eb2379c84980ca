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
cache, computes attention eagerly (so the weights exist), keeps the weights, and returns the same
output the eager kernel would. The cache is rewound afterwards: the probe leaves no trace.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from hermes.cache import HermesCache
from hermes.model_protocol import CoreModel

PROBE_ATTENTION = "hermes_probe"


class _ProbeRecorder:
    """Per-layer attention weights (and rotated queries) captured during one probe forward."""

    def __init__(self) -> None:
        self.weights: dict[int, torch.Tensor] = {}
        self.queries: dict[int, torch.Tensor] = {}


_recorder: _ProbeRecorder | None = None


def probe_attention_forward(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                            **kwargs):
    """Eager attention that records its weights; registered as the `hermes_probe` implementation.

    Args:
        module: the attention module (gives `layer_idx`, `num_key_value_groups`).
        query: (B, Hq, Q, D) rotated queries of the tokens being prefilled (the pseudo-query).
        key, value: (B, Hkv, T, D) the layer's whole cache, the Q new tokens last.
        attention_mask: ignored: the mask is rebuilt here (all cached tokens visible, causal among
            the new ones), so the probe does not depend on which mask format a kernel expects.
        scaling: the softmax scale the model uses.

    Returns:
        (output (B, Q, Hq, D), weights (B, Hq, Q, T)) as transformers' eager attention does.
    """
    groups = module.num_key_value_groups
    key = key.repeat_interleave(groups, dim=1)  # (B, Hq, T, D)
    value = value.repeat_interleave(groups, dim=1)
    q_len, t_len = query.shape[-2], key.shape[-2]
    scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scaling  # (B, Hq, Q, T)
    # Query i sits at cache index t_len - q_len + i: it sees everything up to itself.
    future = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).triu(1)
    scores[..., t_len - q_len:] = scores[..., t_len - q_len:].masked_fill(future, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if _recorder is not None:
        _recorder.weights[module.layer_idx] = weights
        _recorder.queries[module.layer_idx] = query[0]  # (Hq, Q, D), rotated at the probe's positions
    output = torch.matmul(weights.to(value.dtype), value).transpose(1, 2).contiguous()
    return output, weights.to(query.dtype)


AttentionInterface.register(PROBE_ATTENTION, probe_attention_forward)


def _probe(model: CoreModel, cache: HermesCache, embeds: torch.Tensor) -> tuple[_ProbeRecorder, torch.Tensor, int]:
    """Prefill `embeds` through every layer with the recording attention, then rewind the cache.

    Returns:
        (recorder, positions (A, Q) the probe tokens took, cache length before the probe).
    """
    global _recorder
    config = model.text_config
    previous = config._attn_implementation
    mark = cache.mark()
    recorder = _recorder = _ProbeRecorder()
    try:
        config._attn_implementation = PROBE_ATTENTION
        positions = cache.allocate_positions(embeds.shape[0])
        model.prefill(embeds, positions, cache)
    finally:
        config._attn_implementation = previous
        _recorder = None
        cache.rewind(mark)
    return recorder, positions, mark.length


@torch.inference_mode()
def probe_attention(model: CoreModel, cache: HermesCache, embeds: torch.Tensor) -> list[torch.Tensor]:
    """Attention each cached token receives from a pseudo-query, per layer.

    Args:
        model: a `VLMAdapter` (uses `prefill` and `text_config`).
        cache: the working `HermesCache`; unchanged on return.
        embeds: (Q, hidden) pseudo-query embeddings, placed after everything cached.

    Returns:
        One (Q, T) float32 tensor per layer: the attention weight each pseudo-query token puts on
        each of the T cached tokens, averaged over heads (the pseudo-query's own tokens excluded).
    """
    recorder, _, cached = _probe(model, cache, embeds)
    return [recorder.weights[i][0, :, :, :cached].mean(dim=0) for i in range(len(recorder.weights))]


@torch.inference_mode()
def probe_queries(model: CoreModel, cache: HermesCache, embeds: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated query vectors one layer computes for `embeds` placed after the cache.

    Args:
        model: a `VLMAdapter`.
        cache: the working `HermesCache`; unchanged on return.
        embeds: (Q, hidden) embeddings (e.g. a question).
        layer: decoder layer index (negative counts from the end).

    Returns:
        (queries (Hq, Q, D) as rotated by the model, positions (A, Q) they were rotated at).
    """
    recorder, positions, _ = _probe(model, cache, embeds)
    return recorder.queries[layer % len(recorder.queries)], positions
