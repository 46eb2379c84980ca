"""The YAML presets shipped in `hermes.configs` (`models/`, `memory/`, `paper/`), read as dicts.

Both the configuration (`hermes.config`) and the model registry (`hermes.model_registry`) read them;
this module imports neither, so neither imports the other for it.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from hermes.errors import ConfigError, did_you_mean


def preset_names(kind: str) -> list[str]:
    """Names of the YAML presets of one kind ("models", "memory" or "paper"), sorted."""
    folder = resources.files("hermes.configs").joinpath(kind)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(kind: str, name: str) -> dict[str, Any]:
    """Read `configs/<kind>/<name>.yaml` as a dict.

    Raises:
        ConfigError: no such preset (with a did-you-mean), or the file is not a mapping.
    """
    names = preset_names(kind)
    if name not in names:
        raise ConfigError(f"unknown {kind} preset {name!r}{did_you_mean(name, names)}; available: {', '.join(names)}")
    text = resources.files("hermes.configs").joinpath(kind, f"{name}.yaml").read_text()
    return read_mapping(text, f"configs/{kind}/{name}.yaml")


def read_mapping(text: str, where: str) -> dict[str, Any]:
    """YAML text that must be a mapping (empty text: an empty one).

    Raises:
        ConfigError: not valid YAML, or not a mapping; `where` names the file.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys to values, found {type(data).__name__}")
    return data
