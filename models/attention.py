"""The language model's attention: transformers' SDPA, with grouped key/value heads kept grouped on the CPU.

Every prefill hermes runs (a chunk, a question, a pseudo-query) attends from a block of new tokens to
the whole cache, so transformers builds an explicit causal mask, and its `sdpa` then copies every
layer's keys and values `num_key_value_groups` times (`repeat_kv`) because it hands grouped heads to
SDPA only without a mask (CUDA's flash kernel needs that). PyTorch's CPU kernel takes a mask and
grouped heads together, with the same arithmetic per query head: at 8 layers x 512 and a 4k-token
cache the copies were about a seventh of a question's prefill. `hermes_sdpa` therefore passes
`enable_gqa` on the CPU whenever a mask is given, and is transformers' `sdpa` everywhere else.

Both implementations an adapter selects at load (`use_hermes_attention`: `hermes_sdpa` for `sdpa`,
`hermes_eager` for `eager`) are `hermes.probe.hooked`: a forward may pass them a pass's own attention
(the probe's, rekv's retrieval) as a kwarg, and no config is rewritten for a pass.
"""

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
