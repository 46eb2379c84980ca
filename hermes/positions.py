"""Where new tokens go, and where kept tokens move when positions are compacted (docs/ARCHITECTURE.md, Memory).

Every cached token has a rotary position with A axes: A = 1 for 1-D RoPE, A = 3 (temporal, height,
width) for M-RoPE (Qwen-VL). Positions are ``(A, n)`` int64 tensors throughout hermes.

Placing a chunk. An adapter describes the tokens it adds as a *layout*, a list of segments in
token order, and hermes turns the layout into positions:

- `Run(n)`: n tokens at consecutive positions, equal on every axis: text, and the visual tokens of
  1-D RoPE models (LLaVA-OneVision, SmolVLM2).
- `GridStep(h, w, t_s)`: one temporal step of an M-RoPE video grid of h x w merged patches. Steps
  that follow each other (no `Run` in between) form one *video block* that starts at the first free
  position ``s``: a token in row r, column c of step k sits at ``(s + dt_k, s + r, s + c)``. The
  temporal offset ``dt_k`` is the model's own rule: the step index k (Qwen2-VL; Qwen3-VL, where every
  step is its own block behind a timestamp) or ``int(tokens_per_second * (t_k - t_0))`` with stream
  timestamps (Qwen2.5-VL: absolute time; for frames sampled at a fixed rate this is transformers'
  ``k * second_per_grid_t * tokens_per_second``).
- After a block, the next free position is the largest position used on any axis, plus one (Qwen's
  reference `get_rope_index`, vLLM, transformers <= 5.2). transformers 5.24 (since 5.3, see
  huggingface/transformers#45381) continues at ``s + max(h, w)`` instead, ignoring the temporal
  axis; the two agree unless a block's temporal extent passes its spatial one (see the Qwen tests).

A block stays open across chunks until a `Run` is placed, so a video streamed chunk by chunk gets the
same positions as the whole video encoded in one pass. Questions are `Run`s, but the cache rewinds
them together with the open block, so the block resumes after the answer.

Compacting. Two rules, chosen by `memory.mrope_compaction` (they agree for 1-D RoPE):
`compact_per_axis` (the reference's, the default) ranks each axis separately among the kept
coordinates, so kept frames of one block keep sharing their height/width grid and their temporal
positions close up. `compact` packs the kept entries of one layer back to back after the prefix, in time
order. Entries move in *groups* (one token for 1-D RoPE; one frame for M-RoPE, whose tokens carry a
2-D layout): each group keeps its internal layout per axis (offsets from the group's per-axis
minimum) and is re-anchored at the packing cursor on every axis, like a fresh block. So 1-D
compaction gives consecutive positions; a Qwen3-VL frame (timestamp, grid, delimiters) moves as a
unit, by an equal delta on all axes while its timestamp is kept; a Qwen2-VL grid step keeps its
h/w layout and drops its temporal offset within the old block (it becomes a one-step block, the
layout Qwen-VL uses for single images). Temporal order is kept; time gaps are closed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Timestamps are floats; a product such as 2.0 * 1.5 may land a hair below an integer that the
# exact value reaches. This tolerance (far below one position) keeps such offsets on the integer.
_TIME_EPS = 1e-6


@dataclass(frozen=True)
class Run:
    """`n` tokens at consecutive positions, equal on every axis (text, or 1-D RoPE visual tokens)."""

    n: int


@dataclass(frozen=True)
class GridStep:
    """One temporal step of an M-RoPE video grid: `height` x `width` merged patches, row-major.

    Attributes:
        height, width: merged-patch grid (after the model's spatial merge).
        t_s: stream time of the step's first frame, in seconds.
        tokens_per_second: temporal positions per second of stream time (Qwen2.5-VL); None for the
            step-index rule (Qwen2-VL, Qwen3-VL).
    """

    height: int
    width: int
    t_s: float
    tokens_per_second: float | None = None

    @property
    def n(self) -> int:
        return self.height * self.width


@dataclass(frozen=True)
class VideoBlock:
    """The open M-RoPE video block: where it starts and how far it has grown."""

    start: int  # first position of the block (temporal, height and width origin)
    t0_s: float  # stream time of its first step
    steps: int  # grid steps placed in it so far


@dataclass(frozen=True)
class Placement:
    """Positions for a layout and the position state after it."""

    positions: torch.Tensor  # (A, n) int64
    next_position: int
    block: VideoBlock | None


def run_positions(start: int, n: int, num_axes: int) -> torch.Tensor:
    """(A, n) positions start, start+1, ... equal on every axis."""
    return torch.arange(start, start + n, dtype=torch.long).expand(num_axes, n).clone()


def grid_positions(start: int, t_offset: int, height: int, width: int) -> torch.Tensor:
    """(3, height * width) M-RoPE positions of one grid step, row-major, as transformers' `get_vision_position_ids`."""
    t = torch.full((height, width), start + t_offset, dtype=torch.long)
    h = (start + torch.arange(height, dtype=torch.long))[:, None].expand(height, width)
    w = (start + torch.arange(width, dtype=torch.long))[None, :].expand(height, width)
    return torch.stack([t, h, w]).reshape(3, -1)


def temporal_offset(step: GridStep, block: VideoBlock) -> int:
    """Temporal offset of `step` from its block's start (see the module docstring)."""
    if step.tokens_per_second is None:
        return block.steps
    return int(math.floor(step.tokens_per_second * (step.t_s - block.t0_s) + _TIME_EPS))


def place(layout: list[Run | GridStep], next_position: int, block: VideoBlock | None, num_axes: int) -> Placement:
    """Positions for `layout`, placed after everything so far.

    Args:
        layout: segments in token order.
        next_position: first free position (every axis).
        block: the open video block, or None.
        num_axes: 1 (1-D RoPE) or 3 (M-RoPE).

    Returns:
        The `Placement`: (A, n) positions, and the next free position and open block after them.

    Raises:
        ValueError: a `GridStep` for a 1-D RoPE model.
    """
    parts = []
    for segment in layout:
        if isinstance(segment, Run):
            parts.append(run_positions(next_position, segment.n, num_axes))
            next_position += segment.n
            block = None  # text ends a video block
            continue
        if num_axes != 3:
            raise ValueError("GridStep positions need M-RoPE (3 axes); 1-D RoPE models lay out frames as Runs")
        if block is None:
            block = VideoBlock(start=next_position, t0_s=segment.t_s, steps=0)
        grid = grid_positions(block.start, temporal_offset(segment, block), segment.height, segment.width)
        parts.append(grid)
        block = VideoBlock(block.start, block.t0_s, block.steps + 1)
        next_position = max(next_position, int(grid.max()) + 1)  # text continues after the largest position
    positions = torch.cat(parts, dim=1) if parts else torch.empty(num_axes, 0, dtype=torch.long)
    return Placement(positions, next_position, block)


def compact(positions: torch.Tensor, movable: torch.Tensor, group: torch.Tensor, origin: int) -> torch.Tensor:
    """New positions for one layer: movable groups packed back to back from `origin`, in time order.

    A group keeps its internal layout per axis (positions minus the group's per-axis minimum) and is
    anchored at the packing cursor on every axis; the cursor then moves past the group's largest
    position. Groups are ordered by their smallest temporal position (ties: group id).

    Args:
        positions: (A, T) int64 current positions.
        movable: (T,) bool, True for entries that may move (everything but the prefix).
        group: (T,) int64 group id of each entry (entries of one group move together).
        origin: first position the packed groups may use (after the prefix).

    Returns:
        (A, T) int64 new positions; entries that are not movable keep theirs.
    """
    out = positions.clone()
    idx = movable.nonzero().squeeze(1)  # (M,)
    if idx.numel() == 0:
        return out
    pos = positions[:, idx]  # (A, M)
    _, inv = torch.unique(group[idx], return_inverse=True)  # (M,) group slot, slots sorted by id
    num_groups = int(inv.max()) + 1
    axes = pos.shape[0]
    big = torch.iinfo(torch.long).max
    anchor = torch.full((axes, num_groups), big, dtype=torch.long)
    anchor = anchor.scatter_reduce(1, inv.expand(axes, -1), pos, reduce="amin")  # (A, G) per-axis minimum
    local = pos - anchor[:, inv]  # (A, M) >= 0: layout inside the group
    width = torch.zeros(num_groups, dtype=torch.long).scatter_reduce(0, inv, local.max(dim=0).values,
                                                                       reduce="amax") + 1  # (G,)
    order = torch.sort(anchor[0], stable=True).indices  # time order (stable: ties by group id)
    starts = torch.empty(num_groups, dtype=torch.long)
    starts[order] = origin + torch.cumsum(width[order], 0) - width[order]
    out[:, idx] = local + starts[inv]
    return out


def compact_per_axis(positions: torch.Tensor, movable: torch.Tensor, origin: int) -> torch.Tensor:
    """New positions for one layer: each axis ranked separately among the movable entries' coordinates.

    The reference's M-RoPE rule: on every axis, the distinct values the movable entries hold are
    replaced by their rank, counted from `origin` (entries sharing a value keep sharing it). Frames
    1, 3 and 4 of a block kept whole get temporal positions origin, origin + 1, origin + 2 and keep
    a shared height/width grid. For 1-D RoPE with distinct positions this is consecutive packing.

    Args:
        positions: (A, T) int64 current positions.
        movable: (T,) bool, True for entries that may move (everything but the prefix).
        origin: first position the packed entries may use (after the prefix).

    Returns:
        (A, T) int64 new positions; entries that are not movable keep theirs.
    """
    out = positions.clone()
    idx = movable.nonzero().squeeze(1)  # (M,)
    for axis in range(positions.shape[0]):
        _, rank = torch.unique(positions[axis, idx], sorted=True, return_inverse=True)
        out[axis, idx] = origin + rank
    return out
