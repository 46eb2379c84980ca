"""`model.compile_decode`: one decode step (`VLMAdapter.decode_logits`) through `torch.compile`, with
dynamic shapes since the cache grows a token per step. Fused kernels round differently, so greedy tokens
can differ at near ties: off by default. Where it cannot compile (no C++ compiler on a CPU, CUDA graphs off
CUDA) the step stays eager and one line says why."""

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
    """The adapter's `decode_logits` compiled for `mode`, or None (eager) for "off" or where it cannot.

    Args:
        mode: `model.compile_decode`: "off", "default" or "reduce-overhead".
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
