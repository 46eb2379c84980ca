"""The working KV cache (memory level 1) as hermes's own object.

`HermesCache` is a transformers `DynamicCache` (so every supported model attends to it unchanged)
that also records, for each cached token, what hermes needs to manage memory: its rotary position,
a stable id, what kind of token it is (prefix or visual) and which frame it came from. Keys are
stored already rotated, as the model wrote them.

Answering a question appends question and answer tokens to the cache; `mark()` and `rewind()`
take them out again, so after an answer the cache holds exactly what it held before, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

KIND_PREFIX = 0  # system prompt tokens: never scored, never evicted
KIND_VISUAL = 1  # frame tokens: what memory policies manage


@dataclass(frozen=True)
class CacheMark:
    """A point to rewind the cache to: its length and next free position when marked."""

    length: int
    next_position: int


class HermesCache(DynamicCache):
    """A `DynamicCache` whose tokens carry positions, ids, kinds and frame indices.

    The metadata is shared by every layer: all layers hold the same tokens in the same order, which
    keeps the library's attention masks valid (DESIGN §3 invariant).

    Attributes:
        positions: (T,) int64 rotary position of each cached token.
        token_ids: (T,) int64 stable id of each token (never reused), for matching across layers.
        kinds: (T,) int8 `KIND_PREFIX` or `KIND_VISUAL`.
        frame_index: (T,) int64 index of the sampled frame a visual token came from (-1 otherwise).
        next_position: first free rotary position; new tokens are placed from here on.
    """

    def __init__(self, config=None) -> None:
        super().__init__(config=config)
        self.positions = torch.empty(0, dtype=torch.long)
        self.token_ids = torch.empty(0, dtype=torch.long)
        self.kinds = torch.empty(0, dtype=torch.int8)
        self.frame_index = torch.empty(0, dtype=torch.long)
        self.next_position = 0
        self._next_token_id = 0

    # ---- bookkeeping -------------------------------------------------------------------------

    def allocate_positions(self, n: int) -> torch.Tensor:
        """Reserve the next `n` rotary positions and return them as a (n,) int64 tensor."""
        start = self.next_position
        self.next_position += n
        return torch.arange(start, start + n, dtype=torch.long)

    def record(self, positions: torch.Tensor, kind: int, frame_index: torch.Tensor | None = None) -> None:
        """Record metadata for tokens the model has just appended to every layer.

        Args:
            positions: (n,) positions the tokens were encoded at.
            kind: `KIND_PREFIX` or `KIND_VISUAL`.
            frame_index: (n,) frame of each token; None for non-visual tokens.
        """
        n = positions.numel()
        ids = torch.arange(self._next_token_id, self._next_token_id + n, dtype=torch.long)
        self._next_token_id += n
        frames = frame_index if frame_index is not None else torch.full((n,), -1, dtype=torch.long)
        self.positions = torch.cat([self.positions, positions.to("cpu", torch.long)])
        self.token_ids = torch.cat([self.token_ids, ids])
        self.kinds = torch.cat([self.kinds, torch.full((n,), kind, dtype=torch.int8)])
        self.frame_index = torch.cat([self.frame_index, frames.to("cpu", torch.long)])

    # ---- answering without leaving a trace ----------------------------------------------------

    def mark(self) -> CacheMark:
        """Remember the current state so that `rewind` can return to it."""
        return CacheMark(length=self.get_seq_length(), next_position=self.next_position)

    def rewind(self, mark: CacheMark) -> None:
        """Drop every token appended after `mark` (question and answer tokens), in every layer.

        Tokens before the mark are untouched: their tensors are sliced, never recomputed.
        """
        for layer in self.layers:
            if layer.is_initialized and layer.keys.shape[-2] > mark.length:
                layer.keys = layer.keys[..., : mark.length, :]
                layer.values = layer.values[..., : mark.length, :]
        self.positions = self.positions[: mark.length]
        self.token_ids = self.token_ids[: mark.length]
        self.kinds = self.kinds[: mark.length]
        self.frame_index = self.frame_index[: mark.length]
        self.next_position = mark.next_position

    # ---- sizes ----------------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Tokens per layer (every layer holds the same number)."""
        return self.get_seq_length()

    @property
    def num_visual_tokens(self) -> int:
        return int((self.kinds == KIND_VISUAL).sum())

    def nbytes(self) -> int:
        """Bytes held by keys and values over all layers."""
        total = 0
        for layer in self.layers:
            if layer.is_initialized:
                total += layer.keys.numel() * layer.keys.element_size()
                total += layer.values.numel() * layer.values.element_size()
        return total

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) per layer, each (B, H, T, D); for inspection and tests."""
        return [(layer.keys, layer.values) for layer in self.layers if layer.is_initialized]
