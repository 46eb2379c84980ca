"""Restored records checked for meaning, not only bytes: their shapes and dtype against the directory's KV
layout, and their search embedding recomputed from their own last-layer keys (docs/ARCHITECTURE.md, Memory,
"Meaning, not only bytes")."""

from __future__ import annotations

from typing import Any

import torch

from hermes.rope import RotarySpec, rotate_between
from hermes.tiers.fingerprint import rotary_spec
from hermes.tiers.records import Record

# Cosine of a record's stored embedding with the recomputed one below which it means something else: on
# the tiny model's summarised int8 records 0.99999 and up as written (flat frames too), 0.73 to 0.9 under
# another rotary base, 0.25 at most with key heads swapped (ARCHITECTURE.md).
EMBEDDING_MIN_COSINE = 0.9


def content_vector(vectors: torch.Tensor, positions: torch.Tensor, spec: RotarySpec, groups: int = 1,
                   counts: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of `vectors` rotated back to position 0, per key head, flattened and L2-normalised.

    Args:
        vectors: (H, n, D) keys or queries as the model rotated them.
        positions: (A, n) the positions they were rotated at.
        groups: query heads per key head (queries are averaged within their group).
        counts: (n,) tokens each vector stands for, its weight in the mean; None: one each. A summarised
            record's mean token stands for all it folded, so its vector is its record's as made.

    Returns:
        (H / groups * D,) float32 vector on the host.
    """
    pos = positions[0] if spec.kind == "1d" else positions
    at_zero = rotate_between(vectors.float(), pos.to(vectors.device), torch.zeros_like(pos).to(vectors.device), spec)
    if counts is None:
        mean = at_zero.mean(dim=1)  # (H, D)
    else:
        weights = counts.to(at_zero.device, torch.float32)
        mean = (at_zero * (weights / weights.sum())[None, :, None]).sum(dim=1)  # (H, D)
    mean = mean.view(-1, groups, mean.shape[-1]).mean(dim=1)  # (H / groups, D)
    return torch.nn.functional.normalize(mean.reshape(-1), dim=0).to("cpu", torch.float32)


def meaning_problem(record: Record, fingerprint: dict[str, Any]) -> str | None:
    """Why `record` cannot mean what the directory's model would read in it, or None when it checks out.

    Args:
        record: As stored (any storage form).
        fingerprint: The directory's fingerprint; one without a ``kv`` layout says too little: None.

    Returns:
        A one-line reason naming the record, or None.
    """
    kv = fingerprint.get("kv")
    if not isinstance(kv, dict):
        return None
    rid = record.record_id
    layers = fingerprint.get("num_layers")
    if isinstance(layers, int) and len(record.layers) != layers:
        return f"record {rid}: {len(record.layers)} layers, the directory's model has {layers}"
    heads, head_dim = kv.get("num_kv_heads", fingerprint.get("num_kv_heads")), fingerprint.get("head_dim")
    axes = {"rotated-keys/1-axis": 1, "rotated-keys/3-axis": 3}.get(kv.get("positions"))
    for index, layer in enumerate(record.layers):
        h, _, d = layer.keys.shape
        if isinstance(heads, int) and h != heads:
            return f"record {rid}: layer {index} has {h} key heads, the directory's layout {heads}"
        if isinstance(head_dim, int) and d != head_dim:
            return f"record {rid}: layer {index} has head size {d}, the directory's layout {head_dim}"
        if axes is not None and layer.positions.shape[0] != axes:
            return f"record {rid}: layer {index} has {layer.positions.shape[0]}-axis positions, the layout {axes}"
    if kv.get("dtype") and record.source_dtype != kv["dtype"]:
        return f"record {rid}: keys of dtype {record.source_dtype}, the directory's layout {kv['dtype']}"
    spec = rotary_spec(fingerprint)
    if spec is None or record.embedding is None or not record.layers or not record.layers[-1].num_tokens:
        return None
    last = record.layers[-1]
    keys = last.keys.float() * last.key_scale if last.key_scale is not None else last.keys.float()  # int8: q * s
    stored = record.embedding.reshape(-1).float()
    cosine = -1.0  # the best of the two below
    # count-weighted, as records are made: a summarised record's mean token stands for every token it
    # folded; records made before weighted every token alike (alike but for level-1 summary tokens)
    for counts in (last.counts, None):
        again = content_vector(keys.cpu(), last.positions, spec, counts=counts)
        if again.numel() != stored.numel():
            return f"record {rid}: a {stored.numel()}-d embedding, its keys give {again.numel()}-d"
        cosine = max(cosine, float(torch.nn.functional.cosine_similarity(again, stored, dim=0)))
        if cosine >= EMBEDDING_MIN_COSINE:
            return None
    return (f"record {rid}: its embedding recomputed from its keys disagrees with the stored one (cosine "
            f"{cosine:.2f} < {EMBEDDING_MIN_COSINE}): written or read under another KV layout")
