"""Baselines that answer differently from a memory policy over one continuing cache (docs/ARCHITECTURE.md, Memory).

They hold state of their own (recent-frames its newest frames, rekv its host blocks) that the
memory directory does not persist, so they refuse levels 2-3 (a memory directory, or recall; the
session calls `check_lower_levels`) instead of resuming a stream without it.
"""

from __future__ import annotations

from hermes.errors import ConfigError
from hermes.memory import MemoryPolicy


class NoLowerLevels(MemoryPolicy):
    """Base of a baseline whose state lives outside the memory levels: levels 2-3 are refused, and it
    has no state dict (nothing of it could be resumed)."""

    name = "baseline"

    def check_lower_levels(self) -> None:
        raise ConfigError(f"memory.policy={self.name} keeps its own state outside the memory levels: it cannot "
                          "run with --memory-dir or memory.recall=true")

    def state_dict(self):
        self.check_lower_levels()

    def load_state_dict(self, state) -> None:
        self.check_lower_levels()
