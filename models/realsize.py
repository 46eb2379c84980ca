"""Random-weight models at the published sizes, built on the device in seconds, for performance work.

Allocated on the `meta` device, materialised once on the target (`to_empty`) and initialised there,
so a 7B model costs one allocation and one device-side fill. The configs are the hub ``config.json``
values; `cpu-small` is `bench memory`'s CPU model. The tokenizer is the builtin tiny one, whose ids
are all below every vocabulary size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hermes.errors import ModelError

if TYPE_CHECKING:  # torch is imported where models are built: the CLI lists `arch_names()` before any command
    import torch

# SigLIP-so400m/14 at 384 px as LLaVA-OneVision ships it (26 of its 27 layers, no pooling head).
SIGLIP_SO400M = dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304, num_hidden_layers=26,
                     num_attention_heads=16, image_size=384, patch_size=14, vision_use_head=False)

# Qwen2-7B(-Instruct): the text model of LLaVA-OV-7B and, with M-RoPE, of Qwen2.5-VL-7B.
QWEN2_7B_TEXT = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False)

QWEN2_0_5B_TEXT = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=True)

QWEN2_5_VL_7B_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2,
                            window_size=112, fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu")


def _llava_config(text: dict, vocab_size: int, max_positions: int):
    def build(num_layers: int | None, vision_layers: int | None):
        from transformers import LlavaOnevisionConfig

        text_cfg = dict(model_type="qwen2", **text, vocab_size=vocab_size, max_position_embeddings=max_positions,
                        rope_theta=1000000.0)
        vision_cfg = dict(SIGLIP_SO400M)
        if num_layers is not None:
            text_cfg["num_hidden_layers"] = num_layers
        if vision_layers is not None:
            vision_cfg["num_hidden_layers"] = vision_layers
        return LlavaOnevisionConfig(vision_config=vision_cfg, text_config=text_cfg, vision_feature_layer=-1,
                                    vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
                                    image_token_index=151646, video_token_index=151647,
                                    tie_word_embeddings=text["tie_word_embeddings"])
    return build


def _qwen2_5_vl_7b_config(num_layers: int | None, vision_layers: int | None):
    from transformers import Qwen2_5_VLConfig

    text = dict(QWEN2_7B_TEXT, vocab_size=152064, max_position_embeddings=128000,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0, mrope_section=[16, 24, 24]))
    vision = dict(QWEN2_5_VL_7B_VISION)
    if num_layers is not None:
        text["num_hidden_layers"] = num_layers
    if vision_layers is not None:
        vision["depth"] = vision_layers
        # keep the window/full pattern where it fits, and the last layer full as in the published model
        vision["fullatt_block_indexes"] = sorted({i for i in vision["fullatt_block_indexes"] if i < vision_layers}
                                                 | {vision_layers - 1})
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=151655, video_token_id=151656,
                            vision_start_token_id=151652, vision_end_token_id=151653, tie_word_embeddings=False)


# architecture -> config(num_layers, vision_layers) (None keeps the published depth). Which model each
# one mirrors (its family and hub id) is the registry's `random_arch:` (configs/models/*.yaml). 152128:
# Qwen2-7B's 152064 plus `<image>` and `<video>`, padded to a multiple of 64 by the conversion script.
ARCH_CONFIGS: dict[str, Callable] = {
    "llava-ov-7b": _llava_config(QWEN2_7B_TEXT, vocab_size=152128, max_positions=32768),
    "llava-ov-0.5b": _llava_config(QWEN2_0_5B_TEXT, vocab_size=152000, max_positions=32768),
    "qwen2.5-vl-7b": _qwen2_5_vl_7b_config,
}

CPU_SMALL = "cpu-small"


def arch_names() -> list[str]:
    """Every name `random_model` takes: the registered models' `random_arch`, then `cpu-small` (no torch)."""
    from hermes.model_registry import entries

    return [e.random_arch for e in entries() if e.random_arch] + [CPU_SMALL]


def random_config(arch: str, *, num_layers: int | None = None, vision_layers: int | None = None):
    """The transformers config of `arch`, optionally with fewer language-model or vision layers.

    Raises:
        ModelError: unknown architecture, or a layer count below 1.
    """
    from hermes.model_registry import entry_by_arch

    if arch not in ARCH_CONFIGS or entry_by_arch(arch) is None:
        raise ModelError(f"unknown random architecture {arch!r}; available: {', '.join(arch_names())}")
    for name, value in (("num_layers", num_layers), ("vision_layers", vision_layers)):
        if value is not None and value < 1:
            raise ModelError(f"{name} must be at least 1, found {value}")
    return ARCH_CONFIGS[arch](num_layers, vision_layers)


def materialise_random(model_class, config, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Build `model_class(config)` with random weights directly on `device`, in eval mode.

    `init_weights` is transformers' own init, which also recomputes the rotary `inv_freq` and vision
    position-id buffers that `to_empty` leaves undefined.
    """
    import torch

    with torch.device("meta"):
        model = model_class._from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.to_empty(device=device)
    torch.manual_seed(seed)  # seeds the CUDA generators too
    with torch.no_grad():
        model.init_weights()
    return model.eval()


def random_model(arch: str, device: torch.device, dtype: torch.dtype, *, num_layers: int | None = None,
                 vision_layers: int | None = None, seed: int = 0):
    """A random-weight model of `arch` built on `device` without downloads; `hermes.models.loading.
    build_random_model` wraps it in its family's adapter.

    Args:
        arch: "llava-ov-7b", "llava-ov-0.5b", "qwen2.5-vl-7b" (published sizes) or "cpu-small".
        device: where the weights live.
        dtype: weight dtype.
        num_layers: language-model depth override (None: the published depth); widths never change.
        vision_layers: vision-tower depth override (None: the published depth).

    Returns:
        (family, name, model, tokenizer): the adapter family, a name like "random llava-ov-7b", the model
        in eval mode on `device`, and the builtin tiny tokenizer.

    Raises:
        ModelError: unknown architecture or invalid override.
    """
    from hermes.model_registry import entry_by_arch
    from hermes.models.tiny import tiny_llava_onevision, tiny_tokenizer

    if arch == CPU_SMALL:
        # 28 px frames in 4 px patches: a 7 x 7 grid pooled to 4 x 4 = 16 tokens per frame
        model, tokenizer = tiny_llava_onevision(seed=seed, image_size=28, hidden_size=512, num_layers=num_layers or 8)
        return "llava_onevision", "random cpu-small (512 wide)", model.to(device, dtype), tokenizer
    config = random_config(arch, num_layers=num_layers, vision_layers=vision_layers)
    from transformers import AutoModelForImageTextToText

    model_class = AutoModelForImageTextToText._model_mapping[type(config)]
    model = materialise_random(model_class, config, device, dtype, seed)
    depth = "" if num_layers is None and vision_layers is None else \
        f" ({config.text_config.num_hidden_layers} text layers)"
    return entry_by_arch(arch).family, f"random {arch}{depth}", model, tiny_tokenizer()
