"""Builtin tiny random models: the real architectures at toy sizes, built offline and seeded.

They exercise every code path of an adapter (vision tower, projector, pooling, decoder, cache)
in well under a second on a CPU, and say nothing about answer quality. The tokenizer is a
byte-level one built in code (256 byte tokens plus the chat special tokens), so nothing is ever
downloaded.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: every UTF-8 byte is a token, plus the Qwen2 chat special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    return wrapped


def tiny_llava_onevision(seed: int = 0):
    """A random LLaVA-OneVision with 196 visual tokens per frame, like the real one.

    SigLIP: 108 px input in 4 px patches = a 27x27 grid, pooled 2x2 to 14x14 = 196 tokens.
    Qwen2: 4 layers, 4 query heads over 2 KV heads of 16 dims.

    Args:
        seed: torch seed for the random weights; the same seed gives the same model.

    Returns:
        (model, tokenizer), the model in fp32 eval mode on the CPU.
    """
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    tokenizer = byte_tokenizer()
    config = LlavaOnevisionConfig(
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=108, patch_size=4, num_channels=3,
        ),
        text_config=dict(
            model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tokenizer),
            max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=False,
        ),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    return model, tokenizer


TINY_BUILDERS = {
    "tiny-llava-onevision": ("llava_onevision", tiny_llava_onevision),
}
