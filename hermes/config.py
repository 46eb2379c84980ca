"""Typed configuration: one dataclass per section, YAML presets, `--set key=value` overrides.

The layers (dataclass defaults, a command's base, presets, `--config`, `--set`, the CLI's sugar flags)
and validation on construction: docs/ARCHITECTURE.md, Configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from hermes.errors import ConfigError, did_you_mean
from hermes.model_registry import (AUTO_MODEL, DEFAULT_MEMORY, ENTRY_KEYS, auto_model_name, entry_from_mapping,
                                   model_entry)
from hermes.presets import load_preset, preset_names, read_mapping


def ranged(default: Any, low: float | None, high: float | None = None, *, below: bool = False) -> Any:
    """A numeric field's default and its allowed range [low, high] (None: no bound; `below`: high excluded)."""
    return field(default=default, metadata={"range": (low, high, below)})


@dataclass
class ModelConfig:
    """Which vision-language model answers, and how it decodes."""

    name: str = "auto"  # preset name, hub id, local directory, builtin tiny-* or micro-*, or "auto" (see auto_model_name)
    # adapter family (transformers `model_type`); "" = taken from the preset or the checkpoint's config
    family: Literal["", "llava_onevision", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm"] = ""
    hub_id: str = ""  # checkpoint to load; "" = `name` itself
    revision: str = ""  # hub commit, branch or tag to load (as `hermes-video pull --revision` fetched); "" = main
    device: str = "auto"  # "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:1", ...
    dtype: Literal["auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on cuda, fp32 on cpu
    max_new_tokens: int = ranged(64, 1)  # answer length cap, in tokens
    system_prompt: str = "You are a helpful assistant."
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    trust_remote_code: bool = False  # never on by default: it runs code from the checkpoint
    seed: int = ranged(0, 0)  # seed of builtin tiny random models
    # greedy decoding divides a positive logit (multiplies a negative one) of every token already in the
    # answer by this, as HERMES' reference code does (1.1 there); 1.0 = plain greedy
    repetition_penalty: float = ranged(1.0, 1e-6)
    # where frames are resized and normalised: "host" (the CPU), "device" (uint8 frames uploaded), "auto"
    # (the device on CUDA when its resize agrees with the host's, hermes.models.preprocess). Host by default:
    # CUDA rounds float32 differently (one 8-bit level apart at times), and no GPU measurement exists yet
    preprocess_on: Literal["host", "device", "auto"] = "host"
    # decode steps through torch.compile, dynamic shapes: "default" (inductor) or "reduce-overhead" (plus CUDA
    # graphs). Off by default: the first answer pays the compile (~50 s on a CPU), and fused kernels round
    # differently, so the tokens may differ from eager's (hermes.models.compiled_decode)
    compile_decode: Literal["off", "default", "reduce-overhead"] = "off"

    def __post_init__(self) -> None:
        _validate_section(self, "model")
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            raise ConfigError(f"model.device: expected auto, cpu, cuda or cuda:N, found {self.device!r}")


@dataclass
class MemoryConfig:
    """How the KV cache is kept (docs/ARCHITECTURE.md, Memory, level 1). Defaults are the paper's."""

    # "full" (no eviction), "hermes", "sliding" (sink + recent), "uniform" (even frames), two baselines;
    # `run` without --memory takes the model's bounded preset instead (`default_memory_preset`)
    policy: Literal["full", "hermes", "sliding", "uniform", "recent-frames", "rekv", "dscache"] = "full"
    budget: int = ranged(4096, 1)  # visual tokens kept per layer in device memory (all but `full`)
    bands: tuple[float, ...] = ranged((0.1, 0.6, 0.3), 0.0, 1.0)  # sensory / working / long-term shares of layers
    recency_k: float = ranged(20.0, 0.0)  # forgetting rate of the recency score exp(-k * d), d in [0, 1]
    recency_k_fall: float = ranged(12.0, 0.0)  # k = recency_k - fall * p across the working band (0: one k)
    recency_unit: Literal["token", "frame"] = "token"  # d counts cache entries ("frame": a frame's tokens tie)
    w0: float = ranged(0.75, 0.0, 1.0)  # recency weight of the first working layer
    gamma: float = ranged(0.6, 0.0, 1.0)  # fall of the recency weight across the working band
    smoothing: tuple[float, ...] = ranged((0.1, 0.3, 0.4), 0.0, 1.0)  # deep-to-shallow lambda per band, as `bands`
    # smoothing_match, accumulation, summary_position, previous_summary, chunk_positions, mrope_compaction,
    # evict_headroom and recall_gate choose between the reference and ours: README.md, "Memory options"
    smoothing_match: Literal["token", "index"] = "token"
    accumulation: Literal["none", "sum", "ema"] = "none"
    accumulate_decay: float = ranged(0.5, 0.0, 1.0)  # `ema` only: weight of the previous value, in [0, 1)
    local_query: str = "What is happening right now?"  # pseudo-query probing recent detail (working layers)
    global_query: str = "What has happened in the video so far?"  # pseudo-query for long-term layers
    condition_on_question: bool = False  # use the last question asked as the global pseudo-query
    # how the pseudo-queries enter the probe: "question", wrapped as a question is asked (the image newline, the
    # text, the assistant turn's opening: ours, 29 tokens with the texts above), or "bare", the text's tokens
    # alone, as the reference's `pseudo_forward` tokenizes them (15): half the probe's rows (benchmarks/RESULTS.md)
    probe_text: Literal["question", "bare"] = "question"
    summary: bool = True  # long-term layers fold evicted tokens into one summary token
    summary_position: Literal["after_kept", "mean_evicted"] = "after_kept"
    previous_summary: Literal["candidate", "fold"] = "candidate"
    chunk_positions: Literal["per_layer", "shared"] = "per_layer"
    reindex: Literal["lazy", "eager"] = "lazy"  # compact positions near the model's limit ("lazy") or at every eviction
    position_reserve: int = ranged(1024, 1)  # positions kept free for a question and its answer
    mrope_compaction: Literal["per_axis", "frame_blocks"] = "per_axis"
    evict_headroom: float = ranged(0.0, 0.0, 1.0, below=True)  # fraction of `budget` freed below it at each eviction
    # ours (`hermes-plus`; README.md, "Memory options"), off by default: the reference's choices
    recent_keep: float = ranged(0.0, 0.0, 1.0, below=True)  # share of the budget kept as the newest visual tokens
    accumulation_bands: Literal["all", "longterm"] = "all"  # layers whose importance accumulates (with accumulation)
    recall_share: float = ranged(0.0, 0.0, 1.0, below=True)  # share of the budget level 1 leaves to recall (recall on)
    sink_tokens: int = ranged(4, 0)  # `sliding`: earliest visual tokens always kept (attention sinks; 0: none)
    recent_frames: int = ranged(4, 1)  # `recent-frames`: frames re-encoded fresh for each question (SimpleStream);
    # `dscache`: its instant cache holds one more (DSCache's frame_len + 1)
    recent_fps: float = ranged(1.0, 1e-6)  # `recent-frames`, `dscache`: their rate (frames/s), back from the newest
    past_stride: int = ranged(1, 1)  # `dscache`: every Nth past frame joins an answer (DSCache's ls_N; 1: all)
    # levels 2 and 3 (a memory directory or recall): evicted tokens scoring at least this are kept. 0 keeps
    # all (the byte budgets bound them): scores are min-max normalised, so evicted ones score near 0
    compress_threshold: float = ranged(0.0, 0.0, 1.0)
    dram_bytes: int = ranged(2 * 2**30, 0)  # level-2 budget (host memory; 0: records go straight to disk)
    dram_dtype: Literal["int8", "fp16"] = "int8"  # level-2 storage: "int8" (per-channel) or "fp16"
    disk_bytes: int = ranged(20 * 2**30, 1)  # level-3 budget (disk)
    summary_anchors: int = ranged(4, 1)  # tokens per layer a record keeps on disk (plus one mean token)
    recall: bool = False  # on: bring back the records most relevant to each question before answering
    recall_top_k: int = ranged(4, 1)  # records recalled per question
    # "question": what the question says about time decides (`hermes.time_reference`); the others compare similarities
    recall_gate: Literal["off", "above_frames", "above_level1", "question"] = "off"
    recall_gate_margin: float = ranged(0.0, -2.0, 2.0)  # similarity a hit must exceed level 1's by (the gate on)
    recall_max_ratio: float = ranged(0.0, 0.0)  # recalled tokens per layer <= this x level-1 visual tokens (0: no cap)
    checkpoint_every: int = ranged(8, 1)  # chunks between level-1 checkpoints (a file re-encodes the rest on --resume)
    # the same for a live source, whose frames cannot be read again: 1 loses at most the chunk in flight
    live_checkpoint_every: int = ranged(1, 1)
    # level 3 in an object store (--memory-dir s3://...): "" takes the AWS environment variables; credentials
    # come only from the environment and are never logged
    s3_endpoint: str = ""  # e.g. http://127.0.0.1:8333 for a local SeaweedFS or MinIO
    s3_region: str = ""  # "" : the environment's, else us-east-1
    s3_timeout_s: float = ranged(10.0, 0.01)  # connect and read timeout of one request to the store
    s3_retries: int = ranged(3, 1, 20)  # attempts per request before a one-line storage error (exit 3)
    s3_lease_s: float = ranged(60.0, 0.5)  # a writer's lease: another machine may take over this long after it stops
    s3_cache_dir: str = ""  # local read-through cache, index and checkpoint copies ("": ~/.cache/hermes-video/s3/...)
    s3_cache_bytes: int = ranged(2**30, 0)  # bound on the cached copies of segment objects

    def __post_init__(self) -> None:
        policies = typing.get_args(_hints(MemoryConfig)["policy"])
        if self.policy not in policies and self.policy in preset_names("memory"):  # `--set memory.policy=hermes-4k`
            raise ConfigError(f"memory.policy: expected one of {', '.join(policies)}, found {self.policy!r} "
                              f"({self.policy} is a memory preset, not a policy: use --memory {self.policy})")
        _validate_section(self, "memory")
        if abs(sum(self.bands) - 1.0) > 1e-6 or len(self.bands) != 3:
            raise ConfigError(f"memory.bands: expected three fractions summing to 1, found {list(self.bands)}")
        if len(self.smoothing) != 3:
            raise ConfigError(f"memory.smoothing: expected three values (sensory, working, long-term), found "
                              f"{list(self.smoothing)}")
        if self.accumulation == "ema" and not self.accumulate_decay < 1:  # 1 would never admit anything
            raise ConfigError(f"memory.accumulate_decay: expected below 1 with memory.accumulation=ema, found "
                              f"{self.accumulate_decay!r}")
        ignored = [f"memory.{name}={getattr(self, name)}" for name, default in _RECALL_ONLY.items()
                   if getattr(self, name) != default]
        if ignored and not self.recall:  # set but never read: say so rather than run without it
            raise ConfigError(f"{', '.join(ignored)} applies only with memory.recall=true: add --set "
                              f"memory.recall=true, or take a preset with recall (--memory hermes-plus)")


# recall's own settings, with the values that leave it as the reference would (read only with `recall` on)
_RECALL_ONLY = {"recall_gate": "off", "recall_share": 0.0, "recall_gate_margin": 0.0, "recall_max_ratio": 0.0}


@dataclass
class StreamConfig:
    """How frames are sampled and grouped into chunks."""

    fps: float = ranged(0.5, 1e-6)  # frames sampled per second of video (by timestamp)
    chunk_frames: int = ranged(16, 1)  # frames encoded in one forward (files)
    live_chunk_frames: int = ranged(4, 1)  # frames per forward for live input: smaller, so memory stays current
    backend: Literal["auto", "decord", "opencv"] = "auto"  # video file decoder

    def __post_init__(self) -> None:
        _validate_section(self, "stream")


@dataclass
class HermesConfig:
    """The whole resolved configuration, recorded with every answer and result."""

    model: ModelConfig = field(default_factory=ModelConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name}: expected a {cls.__name__}, found {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelConfig, "memory": MemoryConfig, "stream": StreamConfig}


_NUMBER_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


# The words YAML 1.1 reads as booleans (`true`/`false` aside, the only ones YAML 1.2 keeps).
_TRUE_WORDS = ("on", "yes", "y", "true")
_FALSE_WORDS = ("off", "no", "n", "false")


class _SetValueLoader(yaml.SafeLoader):
    """YAML for a `--set` value with YAML 1.2's booleans only: `off`, `no`, `on` stay words, so a string
    key (`memory.recall_gate=off`) takes them; a bool key reads them as booleans."""


_SetValueLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_SetValueLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                      list("tTfF"))


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """`value` checked against a field annotation (str, int, float, bool, `Literal`, a tuple of one).
    A numeric field takes a string that spells a number (PyYAML reads `1e-9` as a string)."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, found {value!r}")
        item_type = typing.get_args(annotation)[0]
        return tuple(_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if isinstance(value, bool):  # YAML 1.1 (a --config file) reads on/off, yes/no as booleans: the word allowed
            words = [w for w in (_TRUE_WORDS if value else _FALSE_WORDS) if w in allowed]
            value = words[0] if len(words) == 1 else value
        if isinstance(value, bool) or value not in allowed:
            names = [str(a) for a in allowed]
            raise ConfigError(f"{where}: expected one of {', '.join(names)}, found {value!r}"
                              f"{did_you_mean(str(value), names)}")
        return value
    target = {"str": str, "int": int, "float": float, "bool": bool}.get(str(annotation), annotation)
    if target is bool and isinstance(value, str) and value.lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.lower() in _TRUE_WORDS  # a --set word, which stays a word (`_SetValueLoader`)
    if target in (int, float) and isinstance(value, str) and _NUMBER_RE.match(value.strip()):
        number = float(value)
        value = int(number) if target is int and number.is_integer() and "." not in value else number
    if isinstance(value, bool) and target is not bool:
        raise ConfigError(f"{where}: expected {target.__name__}, found {value!r}")
    if target is int and isinstance(value, numbers.Integral):  # a NumPy integer too
        return int(value)
    if target is float and isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, found {value!r}")
        return float(value)
    if target is str and isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, target):
        return value
    raise ConfigError(f"{where}: expected {target.__name__}, found {value!r}")


def _check_range(key: str, value: Any, low: float | None, high: float | None, below: bool) -> None:
    for item in value if isinstance(value, tuple) else (value,):
        if (low is not None and item < low) or (high is not None and (item >= high if below else item > high)):
            want = f"at least {low:g}" if high is None else f"between {low:g} and {high:g}"
            if below:
                want = f"at least {low:g} and below {high:g}"
            elif low == 1 and high is None and isinstance(item, int):
                want = "a positive whole number"
            elif low == 1e-6:
                want = "a positive number"
            raise ConfigError(f"{key}: expected {want}, found {item!r}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _validate_section(section: Any, name: str) -> None:
    """Coerce every field of a section to its annotation and check its range (each `__post_init__`).

    Raises:
        ConfigError: the first bad field, as `name.field: expected ..., found ...`.
    """
    hints = _hints(type(section))
    for f in dataclasses.fields(section):
        key = f"{name}.{f.name}"
        value = _coerce(getattr(section, f.name), hints[f.name], key)
        if "range" in f.metadata:
            _check_range(key, value, *f.metadata["range"])
        setattr(section, f.name, value)


def _merge(tree: dict[str, dict[str, Any]], layer: dict[str, Any]) -> None:
    """Add a layer's values to `tree` (section -> key -> value), refusing keys no section has."""
    for section, values in layer.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config key {str(section)!r}{did_you_mean(str(section), list(SECTIONS))}")
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: expected a mapping, found {values!r}")
        names = [f.name for f in dataclasses.fields(SECTIONS[section])]
        for key, value in values.items():
            if key not in names:  # the whole key suggested, as it is typed after --set
                hint = did_you_mean(str(key), names, prefix=f"{section}.")
                raise ConfigError(f"unknown config key {f'{section}.{key}'!r}{hint}")
            tree[section][key] = value


def parse_set(item: str) -> dict[str, Any]:
    """Turn `"memory.budget=4096"` into `{"memory": {"budget": 4096}}` (value parsed as YAML).

    Raises:
        ConfigError: no `=`, or an empty key.
    """
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. model.max_new_tokens=32), found {item!r}")
    try:
        value = yaml.load(raw, Loader=_SetValueLoader) if raw.strip() else ""  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError:
        value = raw
    section, dot, name = key.strip().partition(".")  # sections are flat: one dot at most
    return {section: {name: value}} if dot else {section: value}


def default_memory_preset(model_name: str) -> str:
    """The memory preset `run` and `serve` use when none is given: the model preset's own (`memory:`
    in its YAML), else `hermes-4k`, the paper's budget; bounded, never `full`."""
    entry = model_entry(model_name)
    return entry.memory if entry is not None else DEFAULT_MEMORY


def build_config(model: str | None = None, memory: str | None = None, config_file: str | Path | None = None,
                 overrides: list[str] | None = None, base: dict[str, Any] | None = None,
                 default_memory: bool = False) -> HermesConfig:
    """Resolve the configuration from presets, a YAML file and `key=value` overrides.

    The model's preset (with its `stream:` defaults) applies beneath the file and the overrides;
    `auto` becomes the preset `auto_model_name` picks for the configured device.

    Args:
        model: model preset name, hub id, local directory, builtin id or "auto"; None keeps the default.
        memory: memory preset name; None keeps `full`, or with `default_memory` the model's bounded
            preset (`default_memory_preset`).
        config_file: a YAML file of sections, a model or memory preset's own file, or a preset name.
        overrides: `section.key=value` strings, applied last.
        base: a command's own defaults as nested sections (the bench's `{"memory": {"budget": 512}}`),
            beneath every preset, file and override.
        default_memory: what `run`, `serve` and `hermes.open` ask for.

    Returns:
        The resolved, validated `HermesConfig`.

    Raises:
        ConfigError: unknown preset or key (with a suggestion), ill-typed or out-of-range value,
            unreadable file.
    """
    if memory is None and default_memory:
        memory = default_memory_preset(build_config(model, None, config_file, overrides, base).model.name)
    file = _read_config_file(config_file) if config_file is not None else {}
    sets = [parse_set(item) for item in overrides or []]
    # the model is named by, last one winning: the default, the file, --model, a `model.name=` override
    names = [ModelConfig.name, _model_name(file) or None, model] + [_model_name(layer) for layer in sets]
    name = [n for n in names if n is not None][-1]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"model.name: expected a model name, found {name!r}")
    layers = [file, *sets]
    cfg = _build_config(name, memory, base or {}, layers)
    if cfg.model.name == AUTO_MODEL:  # resolved after the file and overrides: they may set the device
        cfg = _build_config(auto_model_name(cfg.model.device), memory, base or {}, layers)
    return cfg


def _model_name(layer: dict[str, Any]) -> Any:
    section = layer.get("model")
    return section.get("name") if isinstance(section, dict) else None


def _read_config_file(config_file: str | Path) -> dict[str, Any]:
    """The layers of `--config`: a YAML file of sections, a model preset's file, or a preset name."""
    path = Path(config_file)
    text = str(config_file)
    if not path.exists():
        if text in preset_names("paper"):  # a whole setting (model:, memory:, stream:), e.g. the paper's
            return load_preset("paper", text)
        entry = model_entry(text)
        if entry is not None:
            return entry.config_layer()
        if text in preset_names("memory"):
            return {"memory": load_preset("memory", text)}
        names = preset_names("paper") + preset_names("models") + preset_names("memory")
        raise ConfigError(f"config file not found: {path}{did_you_mean(text, names)}; --config takes a YAML file "
                          f"or a preset name ({', '.join(names)})")
    if path.is_dir():
        raise ConfigError(f"--config expects a YAML file, found a directory: {path}")
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; expected a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    data = read_mapping(raw, str(path))
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    if "model" not in data and set(data) & model_fields and set(data) <= model_fields | set(ENTRY_KEYS):
        # a model preset's own file (configs/models/*.yaml)
        return entry_from_mapping(path.stem, data, str(path)).config_layer()
    memory_fields = {f.name for f in dataclasses.fields(MemoryConfig)}
    if data and set(data) <= memory_fields:  # a memory preset's own file (configs/memory/*.yaml)
        return {"memory": data}
    return data


def _build_config(name: str, memory: str | None, base: dict[str, Any], layers: list[dict[str, Any]]) -> HermesConfig:
    tree: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    entry = model_entry(name)  # None: a hub id, a local directory or a builtin tiny model (the loader resolves it)
    for layer in [base, {"memory": load_preset("memory", memory)} if memory is not None else {},
                  entry.config_layer() if entry is not None else {}, *layers]:
        _merge(tree, layer)
    tree["model"]["name"] = name
    return HermesConfig(**{section: cls(**tree[section]) for section, cls in SECTIONS.items()})
