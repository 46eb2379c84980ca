"""The first stream's open freezes the start-up heap (once), and later garbage is still collected.

Each case runs in its own process: a freeze is process-wide, and the test process keeps it off
(``HERMES_GC_FREEZE=0`` in conftest) so that no test freezes objects another one frees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json, weakref
from hermes.config import ModelConfig
from hermes.models.loading import load_model
from hermes.pipelines.session import StreamingSession

model = load_model(ModelConfig(name="tiny-llava-onevision", max_new_tokens=2))
before = gc.get_freeze_count()
first = StreamingSession(model, "sliding")
after_first = gc.get_freeze_count()
second = StreamingSession(model, "sliding")
after_second = gc.get_freeze_count()
tracked = {id(o) for o in gc.get_objects()}

class Node:
    pass

a, b = Node(), Node()  # a cycle made after the freeze: only the collector can free it
a.other, b.other = b, a
alive = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "after_first": after_first, "after_second": after_second,
                  "model_tracked": id(model) in tracked, "session_tracked": id(first) in tracked,
                  "late_cycle_freed": alive() is None}))
"""


def _run(freeze: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HERMES_GC_FREEZE"}
    if freeze is not None:
        env["HERMES_GC_FREEZE"] = freeze
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_first_session_freezes_the_heap_once_and_later_cycles_are_still_collected():
    got = _run(None)  # the default
    assert got["before"] == 0 and got["after_first"] > 10_000  # torch, transformers and the model
    assert got["after_second"] == got["after_first"]  # once per process
    assert not got["model_tracked"]  # the collector no longer walks the model
    assert got["late_cycle_freed"]


def test_hermes_gc_freeze_0_leaves_the_collector_as_it_was():
    got = _run("0")
    assert got["after_first"] == got["after_second"] == 0
    assert got["model_tracked"] and got["session_tracked"] and got["late_cycle_freed"]
