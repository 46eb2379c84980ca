"""The working KV cache (memory level 1) as hermes's own object.

`HermesCache` is a transformers `DynamicCache` (so every supported model attends to it unchanged)
that also records, for each cached token, what hermes needs to manage memory: its rotary position,
a stable id, what kind of token it is (prefix or visual) and which frame it came from. Keys are
stored already rotated, as the model wrote them.

Positions have A axes (1 for 1-D RoPE, 3 for M-RoPE): the cache hands out positions for text
(`allocate_positions`) and for a chunk's layout (`place`, see `hermes.positions`), and remembers the
first free position and the open M-RoPE video block.

Answering a question appends question and answer tokens to the cache; `mark()` and `rewind()`
take them out again, so after an answer the cache holds exactly what it held before, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from hermes.positions import GridStep, Run, VideoBlock, place, run_positions

KIND_PREFIX = 0  # system prompt tokens: never scored, never evicted
KIND_VISUAL = 1  # frame tokens: what memory policies manage
KIND_SUMMARY = 2  # a long-term layer's fold of evicted visual tokens

METADATA = ("positions", "token_ids", "kinds", "frame_index", "counts")


@dataclass(frozen=True)
class CacheMark:
    """A point to rewind the cache to: its length, next free position and open video block when marked."""

    length: int
    next_position: int
    block: VideoBlock | None = None


class HermesCache(DynamicCache):
    """A `DynamicCache` whose tokens carry positions, ids, kinds, frames and counts, per layer.

    Every layer holds the same *number* of tokens (which keeps the library's attention masks
    valid, DESIGN §3), but memory policies may keep different tokens in different layers, so the
    metadata is (L, T) (positions (L, A, T)): row l describes layer l's tokens in cache order.

    Args:
        config: the language model's config (number of layers).
        num_axes: position axes, 1 for 1-D RoPE, 3 for M-RoPE.

    Attributes:
        positions: (L, A, T) int64 rotary position each cached key was rotated to.
        token_ids: (L, T) int64 stable id of each token (never reused), for matching across layers.
        kinds: (L, T) int8 `KIND_PREFIX`, `KIND_VISUAL` or `KIND_SUMMARY`.
        frame_index: (L, T) int64 index of the sampled frame a visual token came from (-1 otherwise).
        counts: (L, T) int64 tokens each entry stands for (1; more for a summary token).
        next_position: first free rotary position (every axis); new tokens are placed from here on.
        block: the open M-RoPE video block that the next grid step continues, or None.
    """

    def __init__(self, config, num_axes: int = 1) -> None:
        super().__init__(config=config)
        self.num_layers = config.num_hidden_layers
        self.num_axes = num_axes
        empty = torch.empty(self.num_layers, 0, dtype=torch.long)
        self.positions = torch.empty(self.num_layers, num_axes, 0, dtype=torch.long)
        self.token_ids = empty
        self.kinds = empty.to(torch.int8)
        self.frame_index = empty
        self.counts = empty
        self.next_position = 0
        self.block: VideoBlock | None = None
        self._next_token_id = 0

    # ---- bookkeeping -------------------------------------------------------------------------

    def allocate_positions(self, n: int) -> torch.Tensor:
        """Reserve the next `n` positions for text (equal on every axis) and return them as (A, n) int64.

        Text ends an open video block (a question rewound later restores it).
        """
        positions = run_positions(self.next_position, n, self.num_axes)
        self.next_position += n
        self.block = None
        return positions

    def place(self, layout: list[Run | GridStep]) -> torch.Tensor:
        """Reserve positions for a chunk's layout (see `hermes.positions.place`).

        Returns:
            (A, n) int64 positions, n = the layout's token count.
        """
        placement = place(layout, self.next_position, self.block, self.num_axes)
        self.next_position, self.block = placement.next_position, placement.block
        return placement.positions

    def record(self, positions: torch.Tensor, kind: int, frame_index: torch.Tensor | None = None) -> None:
        """Record metadata for tokens the model has just appended to every layer.

        Args:
            positions: (A, n) positions the tokens were encoded at.
            kind: `KIND_PREFIX` or `KIND_VISUAL`.
            frame_index: (n,) frame of each token; None for non-visual tokens.
        """
        n = positions.shape[-1]
        positions = positions.to("cpu", torch.long).reshape(self.num_axes, n)
        rows = lambda t: t.to("cpu").reshape(1, n).expand(self.num_layers, n)  # noqa: E731
        ids = torch.arange(self._next_token_id, self._next_token_id + n, dtype=torch.long)
        self._next_token_id += n
        frames = frame_index if frame_index is not None else torch.full((n,), -1, dtype=torch.long)
        self.positions = torch.cat([self.positions, positions.expand(self.num_layers, -1, -1)], dim=2)
        self.token_ids = torch.cat([self.token_ids, rows(ids)], dim=1)
        self.kinds = torch.cat([self.kinds, rows(torch.full((n,), kind, dtype=torch.int8))], dim=1)
        self.frame_index = torch.cat([self.frame_index, rows(frames.long())], dim=1)
        self.counts = torch.cat([self.counts, rows(torch.ones(n, dtype=torch.long))], dim=1)

    def new_token_ids(self, n: int) -> torch.Tensor:
        """`n` fresh ids (for tokens a policy creates, such as summary tokens)."""
        ids = torch.arange(self._next_token_id, self._next_token_id + n, dtype=torch.long)
        self._next_token_id += n
        return ids

    def select_(self, keep: torch.Tensor) -> None:
        """Keep, in each layer l, the tokens at cache indices `keep[l]` (in that order).

        Args:
            keep: (L, K) int64 cache indices; the same K for every layer.
        """
        for layer, (keys_l, values_l) in enumerate(self.layer_tensors()):
            idx = keep[layer].to(keys_l.device)
            self.layers[layer].keys = keys_l.index_select(-2, idx)
            self.layers[layer].values = values_l.index_select(-2, idx)
        for name in METADATA:
            data = getattr(self, name)
            index = keep[:, None, :].expand(-1, data.shape[1], -1) if data.dim() == 3 else keep
            setattr(self, name, data.gather(-1, index))

    def append_tokens_(self, layer: int, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                       kind: int, frame_index: torch.Tensor) -> None:
        """Append ready-made K/V (e.g. recalled from a lower level) to one layer.

        Call for every layer with the same number of tokens, then `finish_append_()`.

        Args:
            layer: the layer.
            keys, values: (H, m, D) already rotated at `positions`.
            positions: (A, m) their positions.
            kind: what they are (a `KIND_*`).
            frame_index: (m,) the frames they came from.
        """
        target = self.layers[layer]
        target.keys = torch.cat([target.keys, keys[None].to(target.keys.dtype)], dim=-2)
        target.values = torch.cat([target.values, values[None].to(target.values.dtype)], dim=-2)
        pending = getattr(self, "_pending_rows", {})
        pending[layer] = (positions.long().cpu(), frame_index.long().cpu(), kind)
        self._pending_rows = pending

    def finish_append_(self) -> None:
        """Extend the metadata for the tokens `append_tokens_` added to every layer."""
        pending = self.__dict__.pop("_pending_rows", {})
        if len(pending) != self.num_layers:
            raise ValueError(f"append_tokens_ was called for {len(pending)} of {self.num_layers} layers")
        m = pending[0][0].shape[-1]
        positions = torch.stack([pending[layer][0] for layer in range(self.num_layers)])  # (L, A, m)
        frames = torch.stack([pending[layer][1] for layer in range(self.num_layers)])  # (L, m)
        kinds = torch.tensor([[pending[layer][2]] * m for layer in range(self.num_layers)], dtype=torch.int8)
        ids = self.new_token_ids(m).expand(self.num_layers, m)
        self.positions = torch.cat([self.positions, positions], dim=-1)
        self.token_ids = torch.cat([self.token_ids, ids], dim=1)
        self.kinds = torch.cat([self.kinds, kinds.reshape(self.num_layers, m)], dim=1)
        self.frame_index = torch.cat([self.frame_index, frames], dim=1)
        self.counts = torch.cat([self.counts, torch.ones(self.num_layers, m, dtype=torch.long)], dim=1)

    # ---- answering without leaving a trace ----------------------------------------------------

    def mark(self) -> CacheMark:
        """Remember the current state so that `rewind` can return to it."""
        return CacheMark(length=self.get_seq_length(), next_position=self.next_position, block=self.block)

    def rewind(self, mark: CacheMark) -> None:
        """Drop every token appended after `mark` (question and answer tokens), in every layer.

        Tokens before the mark are untouched: their tensors are sliced, never recomputed.
        """
        for layer in self.layers:
            if layer.is_initialized and layer.keys.shape[-2] > mark.length:
                layer.keys = layer.keys[..., : mark.length, :]
                layer.values = layer.values[..., : mark.length, :]
        for name in METADATA:
            setattr(self, name, getattr(self, name)[..., : mark.length])
        self.next_position = mark.next_position
        self.block = mark.block

    # ---- sizes ----------------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Tokens per layer (every layer holds the same number)."""
        return self.get_seq_length()

    @property
    def num_visual_tokens(self) -> int:
        """Visual tokens per layer (summary tokens excluded)."""
        return int((self.kinds[0] == KIND_VISUAL).sum()) if self.kinds.shape[1] else 0

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
