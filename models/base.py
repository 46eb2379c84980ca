"""The model adapter interface (docs/ARCHITECTURE.md, Models) and what every family shares: prefill and greedy decoding.

An adapter wraps one Hugging Face vision-language model and tells hermes
- how a chunk of frames becomes token embeddings and their layout (`encode_chunk`: the visual tokens,
  plus any per-frame text such as timestamps, and how they take positions, see `hermes.positions`),
- the prompt around them (`prefix_text`, `question_embeds`),
- which rotary scheme the model uses (`rotary`) and the position ids it takes (`positions_for`),
- how to run the language model on embeddings with a cache (`prefill`).

Hermes drives the language model itself, token by token of its own layout, instead of calling
`generate()`: that is what lets it place every token at a position it chooses and keep the cache
(memory) across questions.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np
import torch

from hermes.cache import KIND_PREFIX, HermesCache, to_device_no_sync
from hermes.errors import ModelError
from hermes.models.attention import use_hermes_sdpa
from hermes.positions import GridStep, Run
from hermes.rope import RotarySpec


EOS_CHECK_EVERY = 8  # decoded tokens between the host's end-of-answer checks when nothing streams


@dataclass
class VisualChunk:
    """What one chunk of frames adds to the cache, in token order.

    Attributes:
        embeds: (n, hidden) input embeddings: the visual tokens and any per-frame text (timestamps,
            image delimiters) the model's own video prompt puts around them.
        layout: how the n tokens take rotary positions (`Run` / `GridStep` segments, in order).
        frame_index: (n,) int64 index within the chunk of the frame each token belongs to (for a grid
            step that covers two frames: the first of them).
        model_kwargs: extra language-model inputs for this prefill (Qwen3-VL's DeepStack features).
    """

    embeds: torch.Tensor
    layout: list[Run | GridStep]
    frame_index: torch.Tensor
    model_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    """A decoded answer and how long it took."""

    text: str
    token_ids: list[int]
    first_token_logits: torch.Tensor  # (V,) float32 logits that chose the first answer token
    ttft_ms: float  # question prefill until the first answer token is known
    latency_ms: float  # question prefill until the last answer token


def penalize_seen_no_sync(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Logits with every answered token made less likely: positive logits divided by `penalty`, negative
    ones multiplied (CTRL's rule, as HERMES' reference decoder and transformers apply it).

    Args:
        logits: (V,) float32 logits of the next token.
        seen: (V,) bool mask of the answer's tokens so far, on the logits' device (no host read).
        penalty: 1.0 leaves the values as they are.

    Returns:
        (V,) logits, a new tensor.
    """
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


class VLMAdapter(ABC):
    """One vision-language model family, as hermes needs to see it.

    Attributes:
        family: adapter family name (e.g. "llava_onevision").
        name: what the user asked for (preset, hub id, directory or builtin tiny id).
        model: the transformers model (eval mode).
        tokenizer: the tokenizer (`encode`, `decode`, `convert_tokens_to_ids`).
        device, dtype: where and in what precision the model runs.
        tokens_per_frame: visual tokens one frame becomes in the cache (where that depends on the
            frame size: at the size last encoded, per frame of a grid step).
        eos_token_ids: token ids that end an answer.
        repetition_penalty: greedy decoding's penalty on tokens already in the answer (1.0: none;
            `model.repetition_penalty`, set by the loader).
        preprocess_device: where frames are resized and normalised: None on the host, else the
            device the uint8 frames are uploaded to first (`model.preprocess_on`, set by the loader).
        decode_step: `decode_logits` compiled by `model.compile_decode` (set by the loader); None: eager.
    """

    family: str = ""
    tokens_per_frame: int = 0
    repetition_penalty: float = 1.0
    preprocess_device: torch.device | None = None
    decode_step: Callable[[torch.Tensor, torch.Tensor, HermesCache], torch.Tensor] | None = None

    def __init__(self, name: str, model, tokenizer, device: torch.device, dtype: torch.dtype,
                 system_prompt: str) -> None:
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.system_prompt = system_prompt
        self.eos_token_ids: set[int] = set()
        use_hermes_sdpa(self.text_config)  # no per-layer copies of grouped K/V heads (hermes.models.attention)

    # ---- what each family defines ----------------------------------------------------------------

    @property
    def language_model(self) -> torch.nn.Module:
        """The decoder stack (takes inputs_embeds, position_ids, cache); where most families keep it."""
        return self.model.model.language_model

    @property
    def text_config(self):
        """The language model's transformers config."""
        return self.model.config.text_config

    @abstractmethod
    def prefix_text(self) -> str:
        """Prompt text before the first visual token (system prompt and user turn opening)."""

    @abstractmethod
    def encode_frames(self, frames_rgb: list[np.ndarray]) -> torch.Tensor:
        """Turn frames into visual token embeddings (the model's own vision tower and projector).

        Args:
            frames_rgb: N frames, each (H, W, 3) uint8 RGB.

        Returns:
            (V, hidden) visual embeddings on the model's device and dtype, frame-major.
        """

    @torch.inference_mode()
    def encode_chunk(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        """Turn one chunk of frames into what the cache receives: embeddings and their layout.

        The default suits 1-D RoPE families whose frames are nothing but visual tokens
        (LLaVA-OneVision): `encode_frames`, one consecutive `Run`, `tokens_per_frame` per frame.

        Args:
            frames_rgb: N frames, each (H, W, 3) uint8 RGB, in time order.
            times_s: their stream timestamps in seconds.

        Returns:
            The `VisualChunk`.
        """
        embeds = self.encode_frames(frames_rgb)
        per_frame = embeds.shape[0] // len(frames_rgb)
        frame_index = torch.arange(len(frames_rgb)).repeat_interleave(per_frame)
        return VisualChunk(embeds, [Run(embeds.shape[0])], frame_index)

    @abstractmethod
    def question_embeds(self, prompt: str) -> torch.Tensor:
        """Embeddings that close the visual block and ask `prompt`, ending where the answer starts.

        Returns:
            (Q, hidden) embeddings.
        """

    # ---- frames as separate images (the `recent-frames` baseline: SimpleStream's input) ----------

    def images_prefix_text(self) -> str:
        """Prompt text before the first image when frames go in as separate images: the user turn's
        opening with no system turn (SimpleStream sends none). The default is ChatML's
        (LLaVA-OneVision, Qwen3-VL)."""
        return "<|im_start|>user\n"

    def encode_images(self, frames_rgb: list[np.ndarray], times_s: list[float]) -> VisualChunk:
        """Encode each frame as a separate image, laid out as the family's multi-image prompt.

        Args:
            frames_rgb: N frames, each (H, W, 3) uint8 RGB, in time order.
            times_s: their stream timestamps in seconds.

        Returns:
            The `VisualChunk` (`frame_index` names the image each token belongs to, delimiters included).

        Raises:
            NotImplementedError: the family has no image path.
        """
        raise NotImplementedError(f"model family {self.family!r} has no separate-image input")

    def images_question_embeds(self, prompt: str) -> torch.Tensor:
        """Embeddings that close `encode_images`' images and ask `prompt` after a newline, ending where
        the answer starts. The default is ChatML's (LLaVA-OneVision, Qwen3-VL).

        Returns:
            (Q, hidden) embeddings.
        """
        return self.embed_text(f"\n{prompt}<|im_end|>\n<|im_start|>assistant\n").to(self.dtype)

    # ---- shared --------------------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    @property
    def max_position_embeddings(self) -> int:
        return self.text_config.max_position_embeddings

    @cached_property
    def rotary(self) -> RotarySpec:
        """The language model's rotary scheme (1-D RoPE or M-RoPE with its sections)."""
        return RotarySpec.from_text_config(self.text_config)

    def new_cache(self) -> HermesCache:
        """An empty working cache shaped for this model's language model (1 or 3 position axes)."""
        return HermesCache(config=self.text_config, num_axes=self.rotary.num_axes)

    def known_token_ids(self, *tokens: str) -> set[int]:
        """Ids of the tokens among `tokens` that the tokenizer knows as single tokens."""
        ids = {self.tokenizer.convert_tokens_to_ids(t) for t in tokens}
        unk = getattr(self.tokenizer, "unk_token_id", None)
        return {i for i in ids if isinstance(i, int) and i >= 0 and i != unk}

    def letter_token_ids(self, letters: str) -> dict[int, str]:
        """The tokens an answer may start with to name each of `letters`: the letter alone and after a space.

        Byte-level BPE tokenizers spell a letter that opens a reply ("A") and one after a space (" A")
        as different tokens; both mean the same option.

        Args:
            letters: the offered option letters, e.g. "ABC".

        Returns:
            {token id: letter} for every spelling the tokenizer has as a single token.

        Raises:
            ModelError: a letter the tokenizer has no single token for (nothing could constrain it).
        """
        ids: dict[int, str] = {}
        for letter in letters:
            found = {spelled[0] for spelled in (self.tokenizer.encode(text, add_special_tokens=False)
                                                for text in (letter, " " + letter)) if len(spelled) == 1}
            if not found:
                raise ModelError(f"the tokenizer of {self.name} has no single token for option letter {letter!r}")
            ids.update(dict.fromkeys(found, letter))
        return ids

    def stop_on(self, *tokens: str) -> None:
        """Answers end at any of `tokens` or at the tokenizer's end-of-sequence token."""
        eos = self.tokenizer.eos_token_id
        self.eos_token_ids = self.known_token_ids(*tokens) | ({eos} if isinstance(eos, int) and eos >= 0 else set())

    def embed_text(self, text: str) -> torch.Tensor:
        """(n, hidden) input embeddings of `text`, tokenized without special-token additions."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.embed_ids(ids)

    def embed_ids(self, ids: list[int]) -> torch.Tensor:
        table = self.language_model.get_input_embeddings()
        return table(torch.tensor(ids, dtype=torch.long, device=self.device))

    def positions_for(self, positions: torch.Tensor) -> torch.Tensor:
        """Position ids in the shape the language model takes.

        Args:
            positions: (A, n) positions (a (n,) tensor is read as A = 1).

        Returns:
            (1, n) for 1-D RoPE; (3, 1, n) for M-RoPE (transformers' Qwen-VL text models take
            temporal/height/width rows this way and skip their own `get_rope_index`).
        """
        positions = positions.to(self.device)
        if positions.dim() == 1 or positions.shape[0] == 1:
            return positions.reshape(1, -1)
        return positions[:, None, :]

    @torch.inference_mode()
    def prefill(self, embeds: torch.Tensor, positions: torch.Tensor, cache: HermesCache,
                **model_kwargs: Any) -> torch.Tensor:
        """Run the language model on `embeds` at `positions`, appending their K/V to `cache`.

        Args:
            embeds: (n, hidden) input embeddings.
            positions: (A, n) int64 rotary positions.
            cache: the working cache; grows by n tokens in every layer.
            **model_kwargs: extra language-model inputs (e.g. a `VisualChunk.model_kwargs`).

        Returns:
            (n, hidden) final hidden states (after the last norm).
        """
        out = self.language_model(
            inputs_embeds=embeds[None].to(self.dtype),
            position_ids=self.positions_for(positions),
            cache=cache,
            use_cache=True,
            **model_kwargs,
        )
        return out.last_hidden_state[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, V) float32 logits from final hidden states."""
        return self.model.lm_head(hidden).float()

    def encode_prefix(self, cache: HermesCache, text: str | None = None) -> None:
        """Prefill the prompt prefix into an empty cache (the tokens every stream starts with).

        Args:
            cache: an empty working cache.
            text: the prefix text; None: `prefix_text()` (`images_prefix_text()` for separate images).
        """
        embeds = self.embed_text(self.prefix_text() if text is None else text)
        positions = cache.allocate_positions(embeds.shape[0])
        self.prefill(embeds, positions, cache)
        cache.record(positions, KIND_PREFIX)

    def decode_one_token_no_sync(self, token: torch.Tensor, cache: HermesCache) -> torch.Tensor:
        """One decode step: `token` appended to `cache` at the next position, without reading it on the host.

        Args:
            token: (1,) int64 on the model's device (the token just chosen).
            cache: the working cache; grows by one token in every layer.

        Returns:
            (V,) float32 logits of the next token, on the device.
        """
        position = to_device_no_sync(cache.allocate_positions(1), self.device)  # a plain `.to` stalls on CUDA
        step = self.decode_step or self.decode_logits
        return step(token, self.positions_for(position), cache)

    def decode_logits(self, token: torch.Tensor, position_ids: torch.Tensor, cache: HermesCache) -> torch.Tensor:
        """The language model's work in one decode step (what `model.compile_decode` compiles).

        Args:
            token: (1,) int64 on the device.
            position_ids: its position, as `positions_for` shapes it.
            cache: the working cache; grows by one token in every layer.

        Returns:
            (V,) float32 logits of the next token.
        """
        embeds = self.language_model.get_input_embeddings()(token)  # (1, hidden), what `embed_ids` gives
        # `prefill`'s call, with positions shaped by the caller: inside a compiled step, `positions_for`'s
        # `.to` of an inference tensor fails to trace ("Cannot set version_counter for inference tensor")
        out = self.language_model(inputs_embeds=embeds[None].to(self.dtype), position_ids=position_ids,
                                  cache=cache, use_cache=True)
        return self.logits(out.last_hidden_state[0, -1:])[0]

    @torch.inference_mode()
    def generate_greedy(self, prompt_embeds: torch.Tensor, cache: HermesCache, max_new_tokens: int,
                        on_text: Callable[[str], None] | None = None,
                        first_token_ids: list[int] | None = None) -> Generation:
        """Greedy-decode an answer after `prompt_embeds`, leaving question and answer in `cache`.

        The caller rewinds the cache afterwards (see `HermesCache.mark`/`rewind`). Chosen tokens stay
        on the device: the host reads them once for the first token (TTFT), then every
        `EOS_CHECK_EVERY` tokens to look for an end-of-answer token, or after every token while
        `on_text` streams. Steps decoded past an end-of-answer token before it is seen are dropped
        (at most `EOS_CHECK_EVERY - 1`; they are in `cache` until the rewind): the answer is token
        for token the one a step-by-step loop gives.

        Args:
            prompt_embeds: (Q, hidden) question embeddings placed after everything cached.
            cache: the working cache (extended in place).
            max_new_tokens: answer length cap.
            on_text: called with each new piece of the answer's text as tokens are chosen (a
                streaming client's tokens); the pieces join to the decoded answer before `.strip()`.
            first_token_ids: the only tokens the answer may start with (a multiple-choice question's
                letters, `letter_token_ids`); None: any token. `Generation.first_token_logits` stays
                the model's own, unrestricted.

        Returns:
            The decoded `Generation`.
        """
        start = time.perf_counter()
        hidden = self.prefill(prompt_embeds, cache.allocate_positions(prompt_embeds.shape[0]), cache)
        first_logits = self.logits(hidden[-1:])[0]
        if first_token_ids is None:
            token = first_logits.argmax().reshape(1)  # (1,) nothing to penalise before the first token
        else:
            allowed = torch.tensor(first_token_ids, device=first_logits.device)  # (k,)
            token = allowed[first_logits[allowed].argmax()].reshape(1)
        chosen_ids = [int(token)]  # the one read TTFT needs: the first token is known here
        ttft_ms = (time.perf_counter() - start) * 1e3
        chosen: list[torch.Tensor] = [token]  # (1,) device tensors: chosen_ids is their host copy so far
        penalty = self.repetition_penalty
        seen = torch.zeros_like(first_logits, dtype=torch.bool) if penalty != 1.0 else None  # (V,) answered tokens
        answer_len: int | None = None  # known once an end-of-answer token or the cap is seen
        sent = ""  # the text already handed to on_text (decoded as a whole: a token may be half a character)
        while True:
            if len(chosen) > len(chosen_ids):  # due (see the check below): one read for the whole window
                chosen_ids += torch.cat(chosen[len(chosen_ids):]).tolist()
            ended = next((i for i, t in enumerate(chosen_ids) if t in self.eos_token_ids), None)
            if ended is not None or len(chosen_ids) >= max_new_tokens:
                answer_len = min(n for n in (ended, max_new_tokens) if n is not None)
            if on_text is not None:
                text = self.tokenizer.decode(chosen_ids[:answer_len], skip_special_tokens=True)
                if text.startswith(sent) and len(text) > len(sent) and not text.endswith("\ufffd"):
                    on_text(text[len(sent):])
                    sent = text
            if answer_len is not None:
                break
            while True:  # decode until the host must look again
                if seen is not None:
                    seen.index_fill_(0, chosen[-1], True)
                logits = self.decode_one_token_no_sync(chosen[-1], cache)
                if seen is not None:
                    logits = penalize_seen_no_sync(logits, seen, penalty)
                chosen.append(logits.argmax().reshape(1))
                if on_text is not None or len(chosen) % EOS_CHECK_EVERY == 0 or len(chosen) >= max_new_tokens:
                    break
        ids = chosen_ids[:answer_len]
        latency_ms = (time.perf_counter() - start) * 1e3
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if on_text is not None and text.startswith(sent) and len(text) > len(sent):
            on_text(text[len(sent):])  # what was held back (an incomplete character at the end)
        text = text.strip()
        return Generation(text, ids, first_logits, ttft_ms, latency_ms)
