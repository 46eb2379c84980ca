"""Position layouts: runs and M-RoPE grid steps placed as the models do; compaction packs groups in time order."""

import torch

from hermes.positions import GridStep, Run, compact, compact_per_axis, grid_positions, place


def test_runs_take_consecutive_positions_on_every_axis():
    placed = place([Run(3), Run(2)], next_position=5, block=None, num_axes=3)
    assert placed.positions.tolist() == [[5, 6, 7, 8, 9]] * 3
    assert placed.next_position == 10 and placed.block is None


def test_grid_steps_form_one_block_until_text_and_text_continues_after_the_largest_position():
    placed = place([GridStep(2, 3, 0.0), GridStep(2, 3, 1.0)], next_position=4, block=None, num_axes=3)
    t, h, w = placed.positions.tolist()
    assert t == [4] * 6 + [5] * 6  # step index (Qwen2-VL rule)
    assert h == [4, 4, 4, 5, 5, 5] * 2 and w == [4, 5, 6] * 4
    assert placed.next_position == 7  # largest position (w = 6) + 1
    # the block stays open across calls: a later chunk continues it
    later = place([GridStep(2, 3, 2.0)], placed.next_position, placed.block, num_axes=3)
    assert later.positions[0].tolist() == [6] * 6 and later.positions[2].tolist() == [4, 5, 6] * 2
    # text closes it: the next grid opens a new block after the text
    closed = place([Run(1), GridStep(1, 1, 3.0)], later.next_position, later.block, num_axes=3)
    assert closed.positions.tolist() == [[7, 8], [7, 8], [7, 8]]


def test_time_rule_places_steps_by_stream_seconds():
    steps = [GridStep(1, 2, t, tokens_per_second=2.0) for t in (10.0, 11.0, 11.5, 20.25)]
    placed = place(steps, next_position=0, block=None, num_axes=3)
    assert placed.positions[0].tolist() == [0, 0, 2, 2, 3, 3, 20, 20]  # int(2 * (t - 10))
    assert placed.next_position == 21


def test_one_d_compaction_gives_consecutive_ranks_in_position_order():
    positions = torch.tensor([[0, 1, 9, 4, 30, 12]])
    movable = torch.tensor([False, False, True, True, True, True])
    out = compact(positions, movable, torch.arange(6), origin=2)
    assert out.tolist() == [[0, 1, 3, 2, 5, 4]]


def test_mrope_compaction_keeps_each_group_layout_and_packs_groups():
    # a prefix token, then two frames of a Qwen2-VL block (2x2 grids) at temporal offsets 0 and 5
    positions = torch.tensor([[0, 10, 10, 10, 10, 15, 15, 15, 15],
                              [0, 10, 10, 11, 11, 10, 10, 11, 11],
                              [0, 10, 11, 10, 11, 10, 11, 10, 11]])
    movable = torch.tensor([False] + [True] * 8)
    groups = torch.tensor([-1, 0, 0, 0, 0, 2, 2, 2, 2])
    out = compact(positions, movable, groups, origin=1)
    assert out.tolist() == [[0, 1, 1, 1, 1, 3, 3, 3, 3],
                            [0, 1, 1, 2, 2, 3, 3, 4, 4],
                            [0, 1, 2, 1, 2, 3, 4, 3, 4]]


def test_per_axis_compaction_ranks_each_axis_among_the_kept_coordinates():
    """Frames 1, 3 and 4 of one block (4x4 grids, 4 temporal positions per step) kept whole, after a
    13-token prefix: the reference's rule gives t = 13, 14, 15 and one shared h/w grid at 13..16;
    packing frames as blocks gives each its own grid, t = 13, 17, 21."""
    start, prefix = 30, 13
    frames = [grid_positions(start, 4 * k, 4, 4) for k in (1, 3, 4)]
    positions = torch.cat([torch.arange(prefix).expand(3, prefix)] + frames, dim=1)  # (3, T)
    movable = torch.arange(positions.shape[1]) >= prefix
    group = torch.cat([torch.full((prefix,), -1)] + [torch.full((16,), k) for k in (1, 3, 4)])
    per_axis = compact_per_axis(positions, movable, prefix)
    assert torch.equal(per_axis[:, :prefix], positions[:, :prefix])
    t, h, w = per_axis[:, prefix:].reshape(3, 3, 16)  # (axis, frame, token)
    assert [sorted(set(row.tolist())) for row in t] == [[13], [14], [15]]
    assert all(torch.equal(h[k], h[0]) and torch.equal(w[k], w[0]) for k in range(3))
    assert sorted(set(h[0].tolist())) == [13, 14, 15, 16]
    blocks = compact(positions, movable, group, prefix)
    assert [int(blocks[0, prefix + 16 * k]) for k in range(3)] == [13, 17, 21]
    assert not torch.equal(blocks[1, prefix:prefix + 16], blocks[1, prefix + 16:prefix + 32])  # h shifted
