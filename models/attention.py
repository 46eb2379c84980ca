"""The language model's attention (docs/ARCHITECTURE.md, Models): transformers' SDPA, except that on the
CPU a masked block attends with grouped key/value heads as they are (`enable_gqa`), without `repeat_kv`'s
per-layer copies (a seventh of a question's prefill at 8 layers x 512, 4k tokens).

Both implementations an adapter selects at load (`use_hermes_attention`: `hermes_sdpa` for `sdpa`,
`hermes_eager` for `eager`) are `hermes.probe.hooked`: a forward may pass them a pass's own attention
(the probe's, rekv's retrieval) as a kwarg, and no config is rewritten for a pass."""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

from hermes.probe import hooked

HERMES_SDPA = "hermes_sdpa"
HERMES_EAGER = "hermes_eager"
HOOKED = {"sdpa": HERMES_SDPA, "eager": HERMES_EAGER}  # what `use_hermes_attention` selects for each


def hermes_sdpa_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                  value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                  scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function protocol: query (B, Hq, Q, D), key and value (B, Hkv, T, D).

    Returns:
        ((B, Q, Hq, D) attention output, None).
    """
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups == 1 or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    # a given mask makes transformers' own call non-causal too: the same computation, minus the copies
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                              dropout_p=dropout, scale=scaling, enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


def use_hermes_attention(language_model, implementation: str | None = None) -> None:
    """Select the hooked implementation for `implementation` ("sdpa" or "eager"; None: the model's own)
    through transformers' public `set_attn_implementation` (others, flash attention, stay as they are)."""
    implementation = implementation or language_model.config._attn_implementation
    language_model.set_attn_implementation(HOOKED.get(implementation, implementation))


AttentionInterface.register(HERMES_SDPA, hooked(hermes_sdpa_attention_forward))
AttentionInterface.register(HERMES_EAGER, hooked(eager_attention_forward))
ALL_MASK_ATTENTION_FUNCTIONS.register(HERMES_SDPA, sdpa_mask)  # the mask `sdpa` gets
ALL_MASK_ATTENTION_FUNCTIONS.register(HERMES_EAGER, eager_mask)  # the mask `eager` gets
