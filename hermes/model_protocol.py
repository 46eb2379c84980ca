"""What the core needs of a model; it never imports `hermes.models` (docs/ARCHITECTURE.md, Layout).
Adapters (`hermes.models.base.VLMAdapter`) satisfy these protocols structurally; tests pass stand-ins."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from hermes.cache import HermesCache
    from hermes.positions import GridStep, Run


class ChunkLike(Protocol):
    """One encoded chunk of frames (`hermes.models.base.VisualChunk`)."""

    embeds: torch.Tensor  # (n, hidden)
    layout: list[Run | GridStep]  # how the n tokens take rotary positions
    frame_index: torch.Tensor  # (n,) frame within the chunk of each token
    model_kwargs: dict[str, Any]


class CoreModel(Protocol):
    """A vision-language model as the memory core uses it.

    Attributes:
        name: the model's name (for messages and the memory directory's fingerprint).
        text_config: the language model's transformers config (layers, heads, rotary settings).
        max_position_embeddings: rotary positions the model supports.
        device: where the cache's keys and values live.
    """

    name: str
    family: str
    device: torch.device

    @property
    def text_config(self) -> Any: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def max_position_embeddings(self) -> int: ...

    def new_cache(self) -> HermesCache:
        """An empty working cache shaped for the model."""

    def encode_prefix(self, cache: HermesCache, text: str | None = None) -> None:
        """Prefill the system prefix (or `text`) into an empty cache."""

    def encode_chunk(self, frames_rgb: Sequence[Any], times_s: Sequence[float]) -> ChunkLike:
        """Turn frames (RGB arrays) at `times_s` into what the cache receives."""

    def prefill(self, embeds: torch.Tensor, positions: torch.Tensor, cache: HermesCache,
                **model_kwargs: Any) -> torch.Tensor:
        """Run the language model on `embeds` (n, hidden) at `positions` (A, n), appending to `cache`."""

    def question_embeds(self, prompt: str) -> torch.Tensor:
        """(Q, hidden) embeddings of a question in the model's chat template."""

    def embed_text(self, text: str) -> torch.Tensor:
        """(n, hidden) embeddings of bare text."""

    def images_prefix_text(self) -> str:
        """The prompt's opening before frames fed as separate images (no system turn)."""

    def encode_images(self, frames_rgb: Sequence[Any], times_s: Sequence[float]) -> ChunkLike:
        """Turn frames into separate images, laid out as the model's multi-image prompt."""

    def images_question_embeds(self, prompt: str) -> torch.Tensor:
        """(Q, hidden) embeddings closing `encode_images`' images and asking `prompt`."""
