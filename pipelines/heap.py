"""Keep Python's garbage collector off the heap a stream starts with.

Why: CPython's collection of its oldest generation walks every tracked object, and once torch,
transformers and a model are loaded that is about 400,000 of them. On the micro model one such pass
took 123 ms, in the middle of a 3,000-frame stream (`hermes-video bench gc`), and while it runs
it holds the GIL: ingest, the disk writer and answers all stop. The objects alive when the first
stream opens (libraries, the model, the memory directory's index) live as long as the process, and
what the hot loop allocates is freed by reference counting, so such a pass finds nothing to free.
`freeze_startup_heap` moves them to the permanent generation (`gc.freeze`), as vLLM and SGLang do
after start-up; everything allocated later is collected as before.

Cost: a reference cycle among the frozen objects that later becomes garbage is never reclaimed (the
start-up heap bounds it). ``HERMES_GC_FREEZE=0`` turns it off.
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
