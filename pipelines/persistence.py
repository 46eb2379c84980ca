"""Checkpoints of a streaming session in its memory directory, and resuming from them.

Levels 2 and 3 persist by themselves (`hermes.tiers`); what a session adds is level 1 (the working
cache: keys, values and per-token metadata), where the stream stands (timestamps of the frames
encoded, next position, next token id, the open M-RoPE block) and the memory policy's running
scores. They are saved atomically after the first chunk, every `memory.checkpoint_every` chunks
and when the session closes; `restore` rebuilds the session exactly as it was saved. A crash loses
no evicted memory (levels 2 and 3 are durable by themselves, see `hermes.tiers.directory`); from a
file, the frames after the last checkpoint are read and encoded again on ``--resume``.

Before anything is written, the cache's invariants are checked (`check_invariants`): every layer
holds equally many tokens, metadata and tensors agree in length, the tokens' frames are among those
encoded. A cache that fails is never checkpointed: the previous checkpoint stands.
"""

from __future__ import annotations

import dataclasses

import torch

from hermes.cache import METADATA
from hermes.errors import HermesError, UsageError
from hermes.positions import VideoBlock

CHECKPOINT = "session"


class InvariantError(HermesError):
    """The working cache failed a consistency check; it is not saved (exit code 1: a bug, not input)."""


def check_invariants(session) -> None:
    """Raise `InvariantError` if the working cache is not whole (e.g. a chunk failed half-way)."""
    cache = session.cache
    length = cache.kinds.shape[1]
    problems = []
    for layer, (keys, values) in enumerate(cache.layer_tensors()):
        if keys.shape[-2] != length or values.shape[-2] != length:
            problems.append(f"layer {layer} holds {keys.shape[-2]} keys / {values.shape[-2]} values, metadata {length}")
            break
    for name in METADATA:
        if getattr(cache, name).shape[-1] != length:
            problems.append(f"metadata {name!r} has {getattr(cache, name).shape[-1]} entries, not {length}")
    if length and int(cache.frame_index.max()) >= max(len(session.encoded_t_s), 1):
        problems.append(f"a token of frame {int(cache.frame_index.max())}, but {len(session.encoded_t_s)} frames "
                        f"encoded")
    if problems:
        raise InvariantError(f"not checkpointing a working cache that fails its invariants ({'; '.join(problems)}); "
                             f"the last checkpoint stands")


def save_session(session) -> None:
    """Write the session's level 1 and stream state to its memory directory, after checking it.

    The memory directory flushes both record stores first, so the checkpoint claims only what is
    durable (`hermes.tiers.directory.MemoryDirectory.save_checkpoint`).

    Raises:
        InvariantError: the cache is not whole; nothing is written.
    """
    check_invariants(session)
    cache, lower = session.cache, session.lower
    tensors: dict[str, torch.Tensor] = {}
    for layer, (keys, values) in enumerate(cache.layer_tensors()):
        tensors[f"keys.{layer}"] = keys.detach().to("cpu").contiguous()
        tensors[f"values.{layer}"] = values.detach().to("cpu").contiguous()
    for name in METADATA:
        tensors[f"meta.{name}"] = getattr(cache, name).contiguous()
    tensors["encoded_t_s"] = torch.tensor(session.encoded_t_s, dtype=torch.float64)
    for layer, running in enumerate(getattr(session.memory, "_running", []) or []):
        if running is not None:
            tensors[f"running.ids.{layer}"] = running[0].contiguous()
            tensors[f"running.scores.{layer}"] = running[1].contiguous()
    meta = {"next_position": cache.next_position, "next_token_id": cache._next_token_id,
            "block": dataclasses.asdict(cache.block) if cache.block is not None else None,
            "epoch": lower.epoch, "policy": session.memory.name, "frames": len(session.encoded_t_s)}
    lower.store.save_checkpoint(CHECKPOINT, tensors, meta)


def has_checkpoint(lower) -> bool:
    return any(c.get("name") == CHECKPOINT for c in lower.store.checkpoints())


def restore_session(session) -> None:
    """Load the saved level 1 and stream state into a freshly built session.

    Raises:
        UsageError: the directory holds no session checkpoint, or one of another memory policy.
    """
    lower = session.lower
    try:
        tensors, meta = lower.store.load_checkpoint(CHECKPOINT)
    except KeyError:
        raise UsageError(f"memory directory {lower.store.path} holds no session to resume; run without "
                         f"--resume to start one") from None
    if meta["policy"] != session.memory.name:
        raise UsageError(f"memory directory {lower.store.path} was written with memory policy {meta['policy']!r}, "
                         f"not {session.memory.name!r}; use the same --memory or another --memory-dir")
    cache = session.cache
    device = session.model.device
    for layer in range(cache.num_layers):
        keys = tensors[f"keys.{layer}"].to(device)
        values = tensors[f"values.{layer}"].to(device)
        target = cache.layers[layer]
        if not target.is_initialized:
            target.lazy_initialization(keys, values)
        target.keys, target.values = keys, values
    for name in METADATA:
        setattr(cache, name, tensors[f"meta.{name}"])
    cache.next_position = int(meta["next_position"])
    cache._next_token_id = int(meta["next_token_id"])
    cache.block = VideoBlock(**meta["block"]) if meta["block"] else None
    lower.epoch = int(meta["epoch"])
    session.encoded_t_s[:] = tensors["encoded_t_s"].tolist()
    running = getattr(session.memory, "_running", None)
    if running is not None:
        for layer in range(len(running)):
            if f"running.ids.{layer}" in tensors:
                running[layer] = (tensors[f"running.ids.{layer}"], tensors[f"running.scores.{layer}"])
