"""Builtin tiny random models (``tiny-<family>`` in `configs/models/`): the real architectures at toy
sizes, built offline and seeded, running every code path of an adapter in well under a second on a CPU; one
byte-level BPE tokenizer trained in code serves them all."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>",
                  # Qwen-VL
                  "<|vision_start|>", "<|vision_end|>", "<|video_pad|>", "<|image_pad|>",
                  # SmolVLM2
                  "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]

# What the tiny tokenizer learns its merges from (prompts' words and templates), so that prompts take about
# as many tokens as with a real BPE vocabulary rather than one per byte.
TOKENIZER_CORPUS = """<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is happening right now? What has happened in the video so far? What shapes are on screen?
Which colour appeared first? What happened at the end? Answer with the option's letter from the given
choices directly. A. B. C. D. E. red green blue yellow orange purple black white grey circle square
triangle star object moving left right up down top bottom how many times did the appear before after
first last one two three four five six seven eight nine ten zero describe scene camera person
<|im_end|>
<|im_start|>assistant
<0.3 seconds> <1.8 seconds> <12.5 seconds>
User: You are provided the following series of frames from a video.
Frame from 00:01: Frame from 00:12:<end_of_utterance>
Assistant:
"""


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained in code (deterministic, offline, ~500 tokens); any text
    encodes, and the chat special tokens are single tokens.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator([TOKENIZER_CORPUS], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])


def tiny_llava_onevision(seed: int = 0, image_size: int = 108, hidden_size: int = 64, num_layers: int = 4,
                         head_dim: int = 16):
    """A random LLaVA-OneVision with 196 visual tokens per frame, like the real one.

    SigLIP: 108 px input in 4 px patches = a 27x27 grid, pooled 2x2 to 14x14 = 196 tokens.

    Args:
        seed: torch seed for the random weights; the same seed gives the same model.
        image_size: vision input side in pixels (a multiple of 4); 28 gives 16 tokens per frame.
        hidden_size: language model width (heads of `head_dim` dims, half as many KV heads).

    Returns:
        (model, tokenizer), the model in fp32 eval mode on the CPU.
    """
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    tokenizer = tiny_tokenizer()
    config = LlavaOnevisionConfig(**tiny_llava_onevision_config(tokenizer, image_size, hidden_size, num_layers,
                                                                head_dim))
    torch.manual_seed(seed)
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    return model, tokenizer


def tiny_llava_onevision_config(tokenizer, image_size: int = 108, hidden_size: int = 64, num_layers: int = 4,
                                head_dim: int = 16) -> dict:
    """The `LlavaOnevisionConfig` keyword arguments of `tiny_llava_onevision`, as plain JSON-able data
    (`bench reference` builds the same geometry under the reference's transformers from them)."""
    return dict(
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=image_size, patch_size=4, num_channels=3,
        ),
        text_config=dict(
            model_type="qwen2", hidden_size=hidden_size, intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers, num_attention_heads=hidden_size // head_dim,
            num_key_value_heads=max(1, hidden_size // (2 * head_dim)), vocab_size=len(tokenizer),
            max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=False,
        ),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        tie_word_embeddings=False,
    )


def _tiny_text(tokenizer, **extra) -> dict:
    """A 4-layer decoder config of 64 dims: 4 query heads over 2 KV heads of 16 dims."""
    ids = dict(bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"), eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=len(tokenizer), max_position_embeddings=32768,
                tie_word_embeddings=False, **ids, **extra)


def _qwen_token_ids(tokenizer) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


def tiny_qwen2_vl(seed: int = 0):
    """A random Qwen2-VL: 14 px patches, 2x2 merge, two-frame grid steps; M-RoPE sections (2, 3, 3), the
    real (16, 24, 24) ratio over 8 frequency pairs. Returns (model, tokenizer), fp32 eval on the CPU.
    """
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = tiny_tokenizer()
    config = Qwen2VLConfig(
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        text_config=_tiny_text(tokenizer, rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                                               mrope_section=[2, 3, 3])),
        **_qwen_token_ids(tokenizer))
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config).eval(), tokenizer


def tiny_qwen2_5_vl(seed: int = 0):
    """A random Qwen2.5-VL: as `tiny_qwen2_vl`, plus window attention (56 px windows, the last layer
    full) and 2 temporal positions per second. Returns (model, tokenizer), fp32 eval on the CPU.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = tiny_tokenizer()
    config = Qwen2_5_VLConfig(
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2,
                           window_size=56, fullatt_block_indexes=[1]),
        text_config=_tiny_text(tokenizer, rope_parameters=dict(rope_type="default", rope_theta=1000000.0,
                                                               mrope_section=[2, 3, 3])),
        **_qwen_token_ids(tokenizer))
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval(), tokenizer


def tiny_qwen3_vl(seed: int = 0):
    """A random Qwen3-VL: 16 px patches, DeepStack from vision layer 0, interleaved M-RoPE sections
    (4, 2, 2), the real (24, 20, 20) ratio. Returns (model, tokenizer), fp32 eval on the CPU.
    """
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tokenizer = tiny_tokenizer()
    config = Qwen3VLConfig(
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[0]),
        text_config=_tiny_text(tokenizer, rope_parameters=dict(rope_type="default", rope_theta=5000000.0,
                                                               mrope_section=[4, 2, 2], mrope_interleaved=True)),
        **_qwen_token_ids(tokenizer))
    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(config).eval(), tokenizer


def tiny_smolvlm2(seed: int = 0):
    """A random SmolVLM2: 128 px frames in 4 px patches, pixel shuffle 4x to 64 tokens per frame (the
    real 512 px / 16 px / 4x geometry), Llama decoder with 1-D RoPE. Returns (model, tokenizer).
    """
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    tokenizer = tiny_tokenizer()
    config = SmolVLMConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=128, patch_size=4),
        text_config=dict(model_type="llama", **_tiny_text(tokenizer, rope_theta=100000.0)),
        scale_factor=4, image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    return SmolVLMForConditionalGeneration(config).eval(), tokenizer
