"""Keep Python's garbage collector off the heap a stream starts with (docs/ARCHITECTURE.md, Memory).

An oldest-generation pass over the ~400,000 objects of torch, transformers and a model took 123 ms on
the micro model, holding the GIL mid-stream, and found nothing to free: those objects live as long as
the process. `gc.freeze` moves them to the permanent generation once, as vLLM and SGLang do; a cycle
among them that later becomes garbage is never reclaimed. ``HERMES_GC_FREEZE=0`` turns it off.
"""

from __future__ import annotations

import gc
import os

_done = False


def freeze_startup_heap() -> bool:
    """Collect once, then freeze every object alive now; once per process, on the first stream's open.

    Returns:
        True when this call froze the heap; False when an earlier call did, or ``HERMES_GC_FREEZE=0``.
    """
    global _done
    if _done or os.environ.get("HERMES_GC_FREEZE", "1") == "0":
        return False
    gc.collect()  # today's garbage goes first: what is frozen is never collected
    gc.freeze()
    _done = True
    return True
