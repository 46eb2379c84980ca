"""Typed configuration: one dataclass per component, YAML presets, `--set key=value` overrides.

The resolved configuration is a `HermesConfig` with three sections (`model`, `memory`, `stream`).
It is built in this order, each step overriding the one before:

1. the dataclass defaults below;
2. the model preset (`configs/models/<name>.yaml`) and memory preset (`configs/memory/<name>.yaml`);
3. a user YAML file (`--config FILE`) with the same nested layout as `HermesConfig.to_dict()`;
4. `--set section.key=value` overrides (values parsed as YAML scalars).

Unknown keys are errors with a did-you-mean suggestion, and values are checked against the field
types, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from hermes.errors import ConfigError


AUTO_MODEL = "auto"  # `model.name` that picks a preset for the device (`auto_model_name`)
AUTO_MODEL_CPU = "smolvlm2-500m"
AUTO_MODEL_CUDA = "llava-onevision-7b"


@dataclass
class ModelConfig:
    """Which vision-language model answers, and how it decodes."""

    name: str = "auto"  # preset name, hub id, local directory, builtin tiny-* or micro-*, or "auto" (see auto_model_name)
    family: str = ""  # adapter family; "" = taken from the preset or the checkpoint's config
    hub_id: str = ""  # checkpoint to load; "" = `name` itself
    device: str = "auto"  # "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:1", ...
    dtype: str = "auto"  # "auto" (bf16 on cuda, fp32 on cpu), "float32", "bfloat16", "float16"
    max_new_tokens: int = 64  # answer length cap, in tokens
    system_prompt: str = "You are a helpful assistant."
    attn_implementation: str = "sdpa"  # "sdpa" or "eager"
    trust_remote_code: bool = False  # never on by default: it runs code from the checkpoint
    seed: int = 0  # seed of builtin tiny random models
    # Greedy decoding divides a positive logit (multiplies a negative one) of every token already in the
    # answer by this, as HERMES' reference code does (1.1 there); 1.0 = plain greedy.
    repetition_penalty: float = 1.0


@dataclass
class MemoryConfig:
    """How the KV cache is kept (DESIGN §3, level 1). Defaults are the paper's."""

    policy: str = "full"  # "full" (no eviction), "hermes", "sliding" (sink + recent), "uniform" (even frames)
    budget: int = 4096  # visual tokens kept per layer in device memory (all but `full`)
    bands: tuple[float, ...] = (0.1, 0.6, 0.3)  # sensory / working / long-term fractions of the layers
    recency_k: float = 20.0  # forgetting rate of the recency score exp(-k * d), d in [0, 1]
    recency_k_fall: float = 12.0  # fall of the forgetting rate across the working band, k = recency_k - fall * p (0: one k)
    recency_unit: Literal["token", "frame"] = "token"  # d counts cache entries ("frame": a frame's tokens tie)
    w0: float = 0.75  # recency weight of the first working layer
    gamma: float = 0.6  # fall of the recency weight across the working band
    smoothing: tuple[float, ...] = (0.1, 0.3, 0.4)  # deep-to-shallow lambda for sensory / working / long-term
    # Attention that selection reads: "none" = this probe's alone (the reference), "sum" = a running
    # sum over probes, "ema" = decay * previous + (1 - decay) * new, a token starting at its first probe.
    accumulation: Literal["none", "sum", "ema"] = "none"
    accumulate_decay: float = 0.5  # `ema` only: weight of the previous value, in [0, 1)
    local_query: str = "What is happening right now?"  # pseudo-query probing recent detail (working layers)
    global_query: str = "What has happened in the video so far?"  # pseudo-query for long-term layers
    condition_on_question: bool = False  # use the last question asked as the global pseudo-query
    summary: bool = True  # long-term layers fold evicted tokens into one summary token
    # where the summary token sits: right after the newest kept token (the reference; M-RoPE: max over
    # the axes + 1 on every axis) or at the count-weighted mean position of what it folds, per axis
    summary_position: Literal["after_kept", "mean_evicted"] = "after_kept"
    reindex: str = "lazy"  # "lazy": compact positions only near max_position_embeddings; "eager": after every eviction
    position_reserve: int = 1024  # positions kept free for a question and its answer
    # M-RoPE compaction: rank each axis separately among the kept coordinates (the reference), or pack
    # every frame as its own block keeping its layout (1-D RoPE: both give consecutive positions)
    mrope_compaction: Literal["per_axis", "frame_blocks"] = "per_axis"
    sink_tokens: int = 4  # `sliding`: earliest visual tokens always kept (attention sinks)
    # Levels 2 (host memory) and 3 (disk + FAISS): active with a memory directory or with recall on.
    # Evicted tokens scoring at least this (0..1) are kept compressed, the rest dropped. 0 keeps them all
    # (the byte budgets below bound them): scores are min-max normalised over every cached token, so
    # the tokens a policy evicts score near 0, and at 0.3 a 4K budget kept nearly nothing to recall.
    compress_threshold: float = 0.0
    dram_bytes: int = 2 * 2**30  # level-2 budget (host memory)
    dram_dtype: str = "int8"  # level-2 storage: "int8" (per-channel) or "fp16"
    disk_bytes: int = 20 * 2**30  # level-3 budget (disk)
    summary_anchors: int = 4  # tokens per layer a record keeps when it moves to disk (plus one mean token)
    recall: bool = False  # on: bring back the records most relevant to each question before answering
    recall_top_k: int = 4  # records recalled per question
    checkpoint_every: int = 8  # chunks between checkpoints of level 1 in a memory directory


@dataclass
class StreamConfig:
    """How frames are sampled and grouped into chunks."""

    fps: float = 0.5  # frames sampled per second of video (by timestamp)
    chunk_frames: int = 16  # frames encoded in one forward (files)
    live_chunk_frames: int = 4  # frames per forward for live input: smaller, so memory stays current
    backend: str = "auto"  # video file decoder: "auto", "decord", "opencv"


@dataclass
class HermesConfig:
    """The whole resolved configuration, recorded with every answer and result."""

    model: ModelConfig = field(default_factory=ModelConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Presets


def preset_names(kind: str) -> list[str]:
    """Names of the YAML presets of one kind ("models" or "memory"), sorted."""
    folder = resources.files("hermes.configs").joinpath(kind)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(kind: str, name: str) -> dict[str, Any]:
    """Read `configs/<kind>/<name>.yaml` as a dict.

    Raises:
        ConfigError: no such preset (with a did-you-mean), or the file is not a mapping.
    """
    names = preset_names(kind)
    if name not in names:
        raise ConfigError(f"unknown {kind} preset {name!r}{_suggest(name, names)}; available: {', '.join(names)}")
    text = resources.files("hermes.configs").joinpath(kind, f"{name}.yaml").read_text()
    return _read_mapping(text, f"configs/{kind}/{name}.yaml")


def _read_mapping(text: str, where: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys to values, found {type(data).__name__}")
    return data


# --------------------------------------------------------------------------------------------
# Applying nested dicts and dotted overrides to the dataclasses, with type checks


def _suggest(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Check `value` against a field annotation (str, int, float, bool, or a tuple of one of them)."""
    if typing.get_origin(annotation) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, found {value!r}")
        item_type = typing.get_args(annotation)[0]
        return tuple(_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if typing.get_origin(annotation) is Literal:
        if value not in typing.get_args(annotation):
            choices = ", ".join(repr(c) for c in typing.get_args(annotation))
            raise ConfigError(f"{where}: expected one of {choices}, found {value!r}")
        return value
    target = {"str": str, "int": int, "float": float, "bool": bool}.get(str(annotation), annotation)
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, target) and not (target is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{where}: expected {target.__name__}, found {value!r}")


def _apply(obj: Any, data: dict[str, Any], where: str) -> None:
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(f"unknown config key {path!r}{_suggest(str(key), names)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a mapping, found {value!r}")
            _apply(current, value, path)
        else:
            setattr(obj, key, _coerce(value, hints[key], path))


def parse_set(item: str) -> dict[str, Any]:
    """Turn `"memory.budget=4096"` into `{"memory": {"budget": 4096}}` (value parsed as YAML).

    Raises:
        ConfigError: no `=`, or an empty key.
    """
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. model.max_new_tokens=32), found {item!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    nested: dict[str, Any] = {}
    node = nested
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return nested


def auto_model_name(device: str = "auto") -> str:
    """The model preset that `model.name: auto` stands for on `device`.

    With CUDA (device "auto" on a machine that has it, or "cuda[:N]"), LLaVA-OneVision-7B: the paper's
    main model, whose results the memory presets are calibrated on. Otherwise SmolVLM2-500M: the
    smallest preset whose video answers are sensible (Video-MME 42.2, MLVU 47.3), at 64 tokens per
    frame from a 93M-parameter vision tower, against LLaVA-OneVision-0.5B's 196 tokens from a 400M
    one (44.0 / 50.3): about a third of the compute and memory per frame on a CPU.
    """
    if device == "auto":
        import torch  # only here: the rest of the config layer must stay light

        cuda = torch.cuda.is_available()
    else:
        cuda = device.startswith("cuda")
    return AUTO_MODEL_CUDA if cuda else AUTO_MODEL_CPU


def build_config(
    model: str | None = None,
    memory: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
) -> HermesConfig:
    """Resolve the configuration from presets, a YAML file and `key=value` overrides.

    A model preset may carry a `stream:` section (the frame rate its paper or model card uses); it
    applies before the file and the overrides. `model.name: auto` (the default) becomes the preset
    `auto_model_name` picks for the configured device, and the configuration is resolved again
    with it, so the result names the model actually loaded.

    Args:
        model: model preset name, hub id, local directory, builtin `tiny-*` id or "auto"; None keeps
            the default.
        memory: memory preset name (`configs/memory/`); None keeps the default.
        config_file: a YAML file with `model:`, `memory:`, `stream:` sections.
        overrides: `section.key=value` strings, applied last.

    Returns:
        The resolved, type-checked `HermesConfig`.

    Raises:
        ConfigError: unknown preset or key (with a suggestion), ill-typed value, unreadable file.
    """
    cfg = _build_config(model, memory, config_file, overrides)
    if cfg.model.name == AUTO_MODEL:  # resolved after the file and overrides: they may set the device
        name = auto_model_name(cfg.model.device)
        cfg = _build_config(name, memory, config_file, overrides)
        cfg.model.name = name
    return cfg


def _build_config(model, memory, config_file, overrides) -> HermesConfig:
    cfg = HermesConfig()
    if memory is not None:
        _apply(cfg.memory, load_preset("memory", memory), "memory")
    name = model if model is not None else cfg.model.name
    if name in preset_names("models"):
        preset = load_preset("models", name)
        stream = preset.pop("stream", None)
        _apply(cfg.model, preset, "model")
        if stream is not None:
            _apply(cfg, {"stream": stream}, "")
    # anything else is a hub id, a local directory or a builtin tiny model: the loader resolves it
    cfg.model.name = name
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        _apply(cfg, _read_mapping(path.read_text(), str(path)), "")
    for item in overrides or []:
        _apply(cfg, parse_set(item), "")
    return cfg
