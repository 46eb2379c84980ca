"""Shrinking a record before it goes to disk: a few anchor tokens per layer plus one mean token
(docs/ARCHITECTURE.md, Memory, "Level 2, host memory, and level 3, disk")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from hermes.rope import RotarySpec
from hermes.scoring import fold_summary, mean_position, select_keep
from hermes.tiers.records import LayerTokens, Record

RotateFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``rotate(keys (H, T, D) fp32, old_positions (A, T), new_positions (A, T)) -> keys at new``."""


def summarise(record: Record, anchors_per_layer: int = 4, *, spec: RotarySpec | None = None,
              rotate: RotateFn | None = None) -> Record:
    """Summarise a record to `anchors_per_layer` anchors plus one count-weighted mean token per layer.

    Args:
        record: Any record (int8 records are dequantised first; the result is float32).
        anchors_per_layer: Highest-scoring tokens kept as they are in each layer (>= 0).
        spec: The model's rotary scheme, to re-rotate keys exactly (`hermes.rope.rotate_between`).
        rotate: Alternatively, a function moving keys between positions (`RotateFn`).

    Returns:
        A new record with ``kind="summary"``, the same id, time span, value and embedding, and
        float32 K/V on the record's device.

    Raises:
        ValueError: Neither or both of `spec` and `rotate` given, or a negative anchor count.
    """
    if (spec is None) == (rotate is None):
        raise ValueError("summarise needs exactly one of spec= (a RotarySpec) or rotate= (a function)")
    if anchors_per_layer < 0:
        raise ValueError(f"anchors_per_layer must be >= 0, got {anchors_per_layer}")
    if not record.layers:
        return dataclasses.replace(record, kind="summary")
    dense = record.dequantize(record.layers[0].keys.device, torch.float32)
    layers = [_summarise_layer(layer, anchors_per_layer, spec, rotate) for layer in dense.layers]
    return dataclasses.replace(dense, layers=layers, kind="summary")


def _summarise_layer(layer: LayerTokens, k: int, spec: RotarySpec | None, rotate: RotateFn | None) -> LayerTokens:
    n = layer.num_tokens
    if n <= k:
        return layer
    anchors = select_keep(layer.scores, k)  # (k,) ascending: time order
    rest_mask = torch.ones(n, dtype=torch.bool)
    rest_mask[anchors] = False
    rest = rest_mask.nonzero().squeeze(1)  # (m,) folded into the mean token
    counts = layer.counts[rest]  # (m,) int64
    positions = layer.positions[:, rest]  # (A, m)
    weights = counts.double() / counts.sum()
    target = mean_position(positions, counts)  # (A,) mean position per axis
    dev = layer.keys.device
    keys, values = layer.keys.index_select(-2, rest.to(dev)), layer.values.index_select(-2, rest.to(dev))
    if spec is not None:
        pos_arg = positions[0] if spec.kind == "1d" else positions
        summary = fold_summary(keys, values, counts, pos_arg, target.tolist(), spec)
    else:
        at_target = target[:, None].expand_as(positions)
        moved = rotate(keys.float(), positions, at_target)
        # the keys are already at the target, so fold_summary's own rotation is the identity (zero
        # delta) under any spec of the right shape: it is reused only for the count-weighted means
        ident = _identity_spec(keys.shape[-1], positions.shape[0])
        pos_arg = at_target[0] if ident.kind == "1d" else at_target
        summary = fold_summary(moved, values, counts, pos_arg, target.tolist(), ident)
    mean_score = (layer.scores[rest].double() * weights).sum().float().reshape(1)

    def cat(mean: torch.Tensor, anchored: torch.Tensor) -> torch.Tensor:
        return torch.cat([mean, anchored], dim=-1)  # the mean token first, then the anchors

    return LayerTokens(
        keys=torch.cat([summary.key.float(), layer.keys.index_select(-2, anchors.to(dev))], dim=-2),
        values=torch.cat([summary.value.float(), layer.values.index_select(-2, anchors.to(dev))], dim=-2),
        positions=cat(target[:, None], layer.positions[:, anchors]),
        token_ids=cat(torch.tensor([-1]), layer.token_ids[anchors]),
        frame_index=cat(torch.tensor([-1]), layer.frame_index[anchors]),
        scores=cat(mean_score, layer.scores[anchors]),
        counts=cat(summary.count.reshape(1).long(), layer.counts[anchors]),
    )


def _identity_spec(head_dim: int, num_axes: int) -> RotarySpec:
    """A rotary spec of the right shape for `fold_summary` when keys need no rotation."""
    if num_axes == 1:
        return RotarySpec(head_dim=head_dim)
    return RotarySpec(head_dim=head_dim, kind="mrope", mrope_section=(head_dim // 2, 0, 0))
