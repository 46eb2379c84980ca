"""`model.compile_decode`: one decode step (`VLMAdapter.decode_logits`) through `torch.compile`.

The working cache grows by one token per step (`HermesCache` appends in place into a buffer with
room to spare, but its keys and values are views that grow by one token), so the step is compiled
with dynamic shapes: one graph serves every cache length (on a CPU, cpu-small,
one graph was compiled for a whole answer, no recompiles; `torch._dynamo.utils.counters` says so).
"reduce-overhead" adds CUDA graphs, which record one graph per new shape: with a growing cache that
is a recording per length, so whether it pays is what `hermes-video bench device` measures on a GPU.

Fused kernels round differently from eager ones, so a compiled step's logits are equal only within
float tolerance and greedy tokens can differ where two logits are nearly tied (they do on random
weights): the option is off by default and no preset adopts it.

On a CPU inductor needs a C++ compiler; without one, or on "reduce-overhead" off CUDA, the step
stays eager and one line says why.
"""

from __future__ import annotations

import logging
import shutil
from typing import Callable

import torch

log = logging.getLogger(__name__)


def compile_unavailable_reason(mode: str, device: torch.device) -> str | None:
    """Why `mode` cannot compile decode steps on `device` here, or None when it can."""
    if mode == "reduce-overhead" and device.type != "cuda":
        return f"mode reduce-overhead needs CUDA graphs, and the model is on {device}"
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        return "inductor needs a C++ compiler on a CPU, and none (g++, c++, clang++) is on PATH"
    return None


def compiled_decode_step(adapter, mode: str) -> Callable | None:
    """The adapter's `decode_logits` compiled for `mode`, or None (eager) for "off" or where it cannot compile.

    Args:
        adapter: a `VLMAdapter`.
        mode: `model.compile_decode`: "off", "default" or "reduce-overhead".

    Returns:
        The compiled step (compiles lazily, on the first decode), or None.
    """
    if mode == "off":
        return None
    reason = compile_unavailable_reason(mode, adapter.device)
    if reason is not None:
        log.warning("model.compile_decode=%s: decoding eagerly; %s", mode, reason)
        return None
    compiled = torch.compile(adapter.decode_logits, mode=mode, dynamic=True)

    def decode_step(token: torch.Tensor, position_ids: torch.Tensor, cache) -> torch.Tensor:
        # the compiled step appends by concatenation (`HermesLayer.update`); layers that still view an
        # append buffer (an eager prefill's) would meet it with other strides: one more graph
        cache.release_rooms()
        return compiled(token, position_ids, cache)

    return decode_step
