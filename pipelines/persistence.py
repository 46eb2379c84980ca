"""Checkpoints of a streaming session in its memory directory, and resuming from them.

docs/ARCHITECTURE.md, Memory (persistence) and State and who owns it. The session's state dict
(level 1, the policy's scores, the timestamps encoded) is checked (`check_invariants`), then saved as
one checkpoint named ``session``: its tensors as tensors, its other values with ``state_format``,
``policy`` and ``frames`` as metadata. ``state_format`` 1 (level-1 metadata stacked over layers) is converted on
load; a later format is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from hermes.cache import METADATA
from hermes.errors import HermesError, UsageError

CHECKPOINT = "session"
STATE_FORMAT = 2  # 2: state dicts of cache layers, policy and session (1: stacked level-1 metadata)


class InvariantError(HermesError):
    """The working cache failed a consistency check; it is not saved (exit code 1: a bug, not input)."""


def check_invariants(session) -> None:
    """Raise `InvariantError` if the working cache is not whole (e.g. a chunk failed half-way)."""
    cache = session.cache
    length = cache.num_tokens
    problems = []
    for index, layer in enumerate(cache.layers):
        keys, values = layer.num_tokens, layer.values.shape[-2] if layer.is_initialized else 0
        if keys != length or values != length:
            problems.append(f"layer {index} holds {keys} keys / {values} values, layer 0 {length}")
        problems += [f"layer {index} metadata {name!r} has {getattr(layer, name).shape[-1]} entries, not {keys}"
                     for name in METADATA if getattr(layer, name).shape[-1] != keys]
        if problems:
            break
    newest = max((int(layer.frame_index.max()) for layer in cache.layers if layer.frame_index.numel()), default=-1)
    if newest >= max(len(session.encoded_t_s), 1):
        problems.append(f"a token of frame {newest}, but {len(session.encoded_t_s)} frames encoded")
    if problems:
        raise InvariantError(f"not checkpointing a working cache that fails its invariants ({'; '.join(problems)}); "
                             f"the last checkpoint stands")


def save_session(session, wait: bool = True) -> None:
    """Write the session's state dict to its memory directory, after checking it.

    The disk writer saves the snapshot once both record stores have caught up, so the checkpoint
    claims only what is durable (`MemoryDirectory.save_checkpoint`).

    Args:
        session: The streaming session.
        wait: Return once the checkpoint is durable (False: it lands while the next chunk encodes).

    Raises:
        InvariantError: the cache is not whole; nothing is written.
    """
    check_invariants(session)
    state = session.state_dict()
    tensors = {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}
    meta = {name: value for name, value in state.items() if not isinstance(value, torch.Tensor)}
    meta.update(state_format=STATE_FORMAT, frames=len(session.encoded_t_s))
    session.lower.store.save_checkpoint(CHECKPOINT, tensors, meta, wait=wait)


def has_checkpoint(lower) -> bool:
    """Whether the memory directory of `lower` holds a session checkpoint."""
    return any(c.get("name") == CHECKPOINT for c in lower.store.checkpoints())


def restore_session(session) -> None:
    """Load the saved state dict into a freshly built session.

    Raises:
        UsageError: the directory holds no session checkpoint, one of another memory policy, or one
            of a later state format.
    """
    lower = session.lower
    try:
        tensors, meta = lower.store.load_checkpoint(CHECKPOINT)
    except KeyError:
        raise UsageError(f"memory directory {lower.store.location} holds no session to resume; run without "
                         f"--resume to start one") from None
    version = meta.get("state_format", 1)
    if version not in (1, STATE_FORMAT):
        raise UsageError(f"memory directory {lower.store.location} holds a session of state format {version}, newer "
                         f"than this version reads ({STATE_FORMAT}); resume it with the version that wrote it")
    if meta["policy"] != session.memory.name:
        raise UsageError(f"memory directory {lower.store.location} was written with memory policy {meta['policy']!r}, "
                         f"not {session.memory.name!r}; use the same --memory or another --memory-dir")
    if version == 1:
        state = from_format_1(tensors, meta)
    else:  # the directory's own entries (how far the stores reached, ...) are not the session's
        state = {**{k: v for k, v in meta.items() if k not in ("state_format", "frames", "store")}, **tensors}
    session.load_state_dict(state)
    lower.note_resumed(len(session.encoded_t_s))  # records committed after the checkpoint are not made twice


def from_format_1(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """A session state dict from a format-1 checkpoint (``meta.<field>`` stacked over layers,
    ``keys.<l>``, ``values.<l>``, ``running.ids.<l>``, ``running.scores.<l>``, ``epoch``)."""
    num_layers = sum(1 for name in tensors if name.startswith("keys."))
    state: dict[str, Any] = {"policy": meta["policy"], "encoded_t_s": tensors["encoded_t_s"],
                             "cache.next_position": meta["next_position"],
                             "cache.next_token_id": meta["next_token_id"],
                             "cache.block": meta["block"], "cache.compactions": meta["epoch"]}
    for layer in range(num_layers):
        state[f"cache.layers.{layer}.keys"] = tensors[f"keys.{layer}"]
        state[f"cache.layers.{layer}.values"] = tensors[f"values.{layer}"]
        for name in METADATA:
            state[f"cache.layers.{layer}.{name}"] = tensors[f"meta.{name}"][layer]
        if f"running.ids.{layer}" in tensors:
            state[f"policy.running.{layer}.ids"] = tensors[f"running.ids.{layer}"]
            state[f"policy.running.{layer}.scores"] = tensors[f"running.scores.{layer}"]
    return state
