"""One registry of models: every name `--model` takes resolves here, and only here.

An entry is one YAML file in `configs/models/` (the file's name is the model's name):

    family: qwen2_vl                 # adapter family (transformers `model_type`)
    hub_id: Qwen/Qwen2-VL-2B-Instruct  # checkpoint on the Hugging Face hub; "" for a builtin model
    builder: hermes.models.tiny:tiny_qwen2_vl  # builtin only: `module:function(seed=...) -> (model, tokenizer)`
    adapter: {min_pixels: 12544}     # keyword options of the family's adapter (frame sizes)
    random_arch: qwen2.5-vl-7b       # the random-weight architecture of the same shapes (`bench --arch`)
    auto: cpu                        # `model.name: auto` picks this model on a machine without CUDA (or `cuda`)
    stream: {fps: 1.0}               # default stream settings (the rate the paper or model card uses)
    memory: hermes-4k                # default memory preset of `run` (bounded)
    dtype: float32                   # any other key is a `ModelConfig` default (dtype, max_new_tokens, ...)

A name that is no entry is a local checkpoint directory or a hub id (`org/name`); anything else is an
error with the closest entry's name. This module reads YAML only: the CLI resolves names before
torch is imported, and `hermes.models.loading.load_model` builds what an entry describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hermes.errors import ConfigError, ModelError, did_you_mean
from hermes.presets import load_preset, preset_names

AUTO_MODEL = "auto"  # `model.name` that picks an entry for the device (`auto_model_name`)
DEFAULT_MEMORY = "hermes-4k"  # the memory preset of a hub id or directory no entry names

# keys of an entry that are about the registry, not `ModelConfig` defaults
ENTRY_KEYS = ("builder", "adapter", "random_arch", "auto", "stream", "memory")


@dataclass(frozen=True)
class ModelEntry:
    """One registered model."""

    name: str
    family: str  # adapter family; "" would be read from the checkpoint
    hub_id: str = ""  # "" for a builtin model (built offline by `builder`)
    builder: str = ""  # "module:function" building (model, tokenizer) from a seed
    adapter: dict[str, Any] = field(default_factory=dict)  # the family adapter's keyword options
    random_arch: str = ""  # `hermes.models.realsize` architecture of the same shapes, "" none
    auto: Literal["", "cpu", "cuda"] = ""  # which device's `auto` this entry is
    stream: dict[str, Any] = field(default_factory=dict)  # default stream settings
    memory: str = DEFAULT_MEMORY  # default memory preset of `run`
    settings: dict[str, Any] = field(default_factory=dict)  # other `ModelConfig` defaults

    @property
    def builtin(self) -> bool:
        """Built offline (a tiny random or the trained micro model), nothing to download."""
        return bool(self.builder)

    def config_layer(self) -> dict[str, Any]:
        """The entry as a configuration layer: its model settings (with its name) and stream defaults."""
        layer: dict[str, Any] = {"model": {"name": self.name, "family": self.family, "hub_id": self.hub_id,
                                           **self.settings}}
        if self.stream:
            layer["stream"] = dict(self.stream)
        return layer


def entry_from_mapping(name: str, data: dict[str, Any], where: str) -> ModelEntry:
    """A `ModelEntry` from a preset's YAML mapping.

    Raises:
        ConfigError: a registry key of the wrong type.
    """
    data = dict(data)
    values = {key: data.pop(key) for key in ENTRY_KEYS if key in data}
    for key, kind in (("builder", str), ("random_arch", str), ("auto", str), ("memory", str),
                      ("adapter", dict), ("stream", dict)):
        if key in values and not isinstance(values[key], kind):
            raise ConfigError(f"{where}: {key} expects a {kind.__name__}, found {values[key]!r}")
    if values.get("auto", "") not in ("", "cpu", "cuda"):
        raise ConfigError(f"{where}: auto expects cpu or cuda, found {values['auto']!r}")
    return ModelEntry(name, family=data.pop("family", ""), hub_id=data.pop("hub_id", "") or "",
                      settings=data, **values)


def model_entry(name: str) -> ModelEntry | None:
    """The entry registered as `name`, or None (a hub id or a directory)."""
    if name not in preset_names("models"):
        return None
    return entry_from_mapping(name, load_preset("models", name), f"configs/models/{name}.yaml")


def entries() -> list[ModelEntry]:
    """Every entry, in name order."""
    return [model_entry(name) for name in preset_names("models")]


def entry_by_arch(arch: str) -> ModelEntry | None:
    """The entry whose random-weight architecture is `arch` (`bench --arch`), or None."""
    return next((e for e in entries() if e.random_arch == arch), None)


def auto_model_name(device: str = "auto") -> str:
    """The entry that `model.name: auto` stands for on `device` (the one marked `auto: cuda` or `auto: cpu`).

    With CUDA, LLaVA-OneVision-7B: the paper's main model, which the memory presets are calibrated on.
    Otherwise SmolVLM2-500M: the smallest preset with sensible video answers (Video-MME 42.2, MLVU
    47.3), 64 tokens per frame from a 93M-parameter vision tower: about a third of the compute and
    memory per frame of LLaVA-OneVision-0.5B (196 tokens from 400M; 44.0 / 50.3) on a CPU.
    """
    if device == "auto":
        import torch  # only here: the rest of the config layer must stay light

        cuda = torch.cuda.is_available()
    else:
        cuda = device.startswith("cuda")
    wanted = "cuda" if cuda else "cpu"
    return next(e.name for e in entries() if e.auto == wanted)


def is_hub_id(source: str) -> bool:
    """`org/name`: two non-empty parts, not a relative or absolute path."""
    parts = source.split("/")
    return len(parts) == 2 and all(parts) and not source.startswith((".", "/", "~"))


def resolve_source(name: str, hub_id: str = "") -> tuple[Literal["entry", "dir", "hub"], str]:
    """What a model name (or its configured `hub_id`) stands for, checked without loading anything.

    Args:
        name: `model.name`: an entry, a local checkpoint directory or a hub id.
        hub_id: `model.hub_id` when set (an entry's checkpoint, or the user's).

    Returns:
        ("entry", name) for a builtin entry; ("dir", path) for a local directory; ("hub", id) for a
        checkpoint on the hub (an entry's or one given as `org/name`).

    Raises:
        ModelError: neither, with the closest entry's name and what `--model` takes.
    """
    entry = model_entry(name)
    if entry is not None and entry.builtin:
        return "entry", name
    source = hub_id or name
    if Path(source).expanduser().is_dir():
        return "dir", str(Path(source).expanduser())
    if is_hub_id(source):
        return "hub", source
    known = preset_names("models")
    where = "local directory not found" if source.startswith((".", "/", "~")) else "unknown model"
    raise ModelError(f"{where} {source!r}{did_you_mean(source, known)}: use a preset ({', '.join(known)}), a hub "
                     f"id like org/name, or a local checkpoint directory")


def hub_id_of(model: str) -> str:
    """The hub id a name stands for (`smolvlm2-500m` -> `HuggingFaceTB/...`), or `model` itself if it is one.

    Raises:
        ModelError: a builtin entry (nothing to download), or a name that is neither an entry nor `org/name`.
    """
    entry = model_entry(model)
    if entry is not None:
        if not entry.hub_id:
            raise ModelError(f"{model!r} is builtin (shipped with the package): there is nothing to pull")
        return entry.hub_id
    if not is_hub_id(model):
        raise ModelError(f"unknown model {model!r}{did_you_mean(model, preset_names('models'))}: pull takes a preset "
                         f"(see `hermes-video models`) or a hub id like org/name")
    return model
