"""The registry of memory policies: name -> class, for every policy including the baselines.

Everything that looks a policy up by name goes through `POLICIES` / `build_policy` (docs/ARCHITECTURE.md,
Memory: the policy interface); `hermes.memory` defines the base class and knows no subclass of another module.
"""

from __future__ import annotations

from hermes.baselines.dscache import DSCachePolicy
from hermes.baselines.recent_frames import RecentFramesPolicy
from hermes.baselines.rekv import ReKVPolicy
from hermes.config import MemoryConfig, preset_names
from hermes.errors import ConfigError
from hermes.memory import HermesPolicy, MemoryPolicy, SlidingPolicy, UniformPolicy
from hermes.model_protocol import CoreModel

POLICIES: dict[str, type[MemoryPolicy]] = {
    "full": MemoryPolicy, "sliding": SlidingPolicy, "uniform": UniformPolicy, "hermes": HermesPolicy,
    "recent-frames": RecentFramesPolicy, "rekv": ReKVPolicy, "dscache": DSCachePolicy,
}


def build_policy(cfg: MemoryConfig, model: CoreModel) -> MemoryPolicy:
    """The policy named by `cfg.policy`, for `model`.

    Raises:
        ConfigError: unknown policy name or invalid settings.
    """
    if cfg.policy not in POLICIES:
        # a preset name given as a policy (`memory.policy=recall-only`, `=hermes-4k`): point to --memory
        hint = f" ({cfg.policy} is a memory preset, not a policy: use --memory {cfg.policy})" \
            if cfg.policy in preset_names("memory") else ""
        raise ConfigError(f"unknown memory policy {cfg.policy!r}; available: {', '.join(POLICIES)}{hint}")
    return POLICIES[cfg.policy](cfg, model)
