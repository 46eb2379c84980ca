"""Where new tokens go, and where kept tokens move when positions are compacted (docs/ARCHITECTURE.md, Positions).

Positions are ``(A, n)`` int64: A = 1 for 1-D RoPE, 3 (temporal, height, width) for M-RoPE. An
adapter describes a chunk as a layout: `Run(n)`, consecutive positions equal on every axis (text,
1-D RoPE frames), or `GridStep(h, w, t_s)`, one temporal step of an M-RoPE grid. Consecutive steps
form one video block from its first free position s: row r, column c of step k sits at
``(s + dt_k, s + r, s + c)``, ``dt_k`` the model's rule (the step index for Qwen2-VL and Qwen3-VL,
``int(tokens_per_second * (t_k - t_0))`` for Qwen2.5-VL). After a block the next free position is the
largest used on any axis plus one (Qwen's `get_rope_index`, vLLM, transformers <= 5.2; transformers
5.3+ continues at ``s + max(h, w)``, huggingface/transformers#45381, which differs only when a block's
temporal extent passes its spatial one). A block stays open across chunks until a `Run`, so
streaming equals one pass; a rewound question reopens it.

Compaction (`memory.mrope_compaction`; the rules agree for 1-D RoPE): `compact_per_axis` (the
reference's) ranks each axis separately; `compact` packs groups (a token for 1-D, a frame for M-RoPE)
back to back, each keeping its layout per axis, re-anchored like a fresh block. Both keep temporal
order and close time gaps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# keeps float products of timestamps (2.0 * 1.5) that land a hair below an integer on it
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
    """Temporal offset of `step` from its block's start (the model's rule, module docstring)."""
    if step.tokens_per_second is None:
        return block.steps
    return int(math.floor(step.tokens_per_second * (step.t_s - block.t0_s) + _TIME_EPS))


def place(layout: list[Run | GridStep], next_position: int, block: VideoBlock | None, num_axes: int) -> Placement:
    """Positions for `layout`, placed after everything so far.

    Args:
        next_position: first free position (every axis).
        block: the open video block, or None.

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
    """New positions for one layer: movable groups, each keeping its layout per axis, packed back to back
    from `origin` in order of their smallest temporal position (ties: group id).

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
    """New positions for one layer, the reference's M-RoPE rule: on every axis the movable entries'
    distinct values are replaced by their rank from `origin` (shared values stay shared).

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
