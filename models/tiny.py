"""Builtin tiny random models: the real architectures at toy sizes, built offline and seeded.

They exercise every code path of an adapter (vision tower, projector, pooling, decoder, cache)
in well under a second on a CPU, and say nothing about answer quality. The tokenizer is a small
byte-level BPE trained in code on a fixed text, so nothing is ever downloaded.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]

# Text the tiny tokenizer learns its merges from: the chat template, pseudo-queries and the words of
# the demo and synthetic questions, so that prompts take about as many tokens as with a real BPE
# vocabulary (a byte-per-token vocabulary would make every prompt several times longer).
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
"""


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained in code (deterministic, offline, ~500 tokens).

    Any text encodes (unknown words fall back to bytes); the chat special tokens are single tokens.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator([TOKENIZER_CORPUS], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])


def tiny_llava_onevision(seed: int = 0, image_size: int = 108, hidden_size: int = 64, num_layers: int = 4):
    """A random LLaVA-OneVision with 196 visual tokens per frame, like the real one.

    SigLIP: 108 px input in 4 px patches = a 27x27 grid, pooled 2x2 to 14x14 = 196 tokens.
    Qwen2: 4 layers, 4 query heads over 2 KV heads of 16 dims.

    Args:
        seed: torch seed for the random weights; the same seed gives the same model.
        image_size: vision input side in pixels (a multiple of 4); 108 gives 196 tokens per frame,
            28 gives 16 (for CPU benchmarks over thousands of frames).
        hidden_size: language model width (heads of 16 dims: hidden_size // 16 query heads, half as many KV heads).
        num_layers: language model depth.

    Returns:
        (model, tokenizer), the model in fp32 eval mode on the CPU.
    """
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    tokenizer = tiny_tokenizer()
    config = LlavaOnevisionConfig(
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=image_size, patch_size=4, num_channels=3,
        ),
        text_config=dict(
            model_type="qwen2", hidden_size=hidden_size, intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers, num_attention_heads=hidden_size // 16,
            num_key_value_heads=max(1, hidden_size // 32), vocab_size=len(tokenizer),
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
