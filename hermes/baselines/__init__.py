"""Baselines that answer differently from a memory policy over one continuing cache (DESIGN §3).

They hold state of their own (recent-frames its newest frames, rekv its host blocks) that the
memory directory does not persist, so they refuse levels 2-3 (a memory directory, or recall)
instead of resuming a stream without it.
"""

from __future__ import annotations

from hermes.errors import ConfigError


class NoLowerLevels:
    """Mixin for a policy: setting `lower` (levels 2-3: --memory-dir or memory.recall) is refused."""

    name = "baseline"

    @property
    def lower(self):
        return None

    @lower.setter
    def lower(self, value) -> None:
        if value is not None:
            raise ConfigError(f"memory.policy={self.name} keeps its own state outside the memory levels: it cannot "
                              "run with --memory-dir or memory.recall=true")
