"""Turn a `ModelConfig` into a ready adapter: builtin tiny model, local directory or hub id.

Every failure is a `ModelError` (exit code 4) naming what was asked for and how to fix it.
`trust_remote_code` stays off unless the user turns it on: it would run code from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from pathlib import Path

import torch

from hermes.config import AUTO_MODEL, ModelConfig, auto_model_name, load_preset, preset_names
from hermes.errors import ConfigError, ModelError
from hermes.models.base import VLMAdapter
from hermes.models.llava_onevision import LlavaOnevisionAdapter
from hermes.models.micro import MICRO_NAME, load_micro
from hermes.models.preprocess import read_normalisation
from hermes.models.qwen3_vl import Qwen3VLAdapter
from hermes.models.qwen_vl import Qwen25VLAdapter, QwenVLAdapter
from hermes.models.smolvlm import SmolVLMAdapter
from hermes.models.tiny import TINY_BUILDERS

# transformers `model_type` -> adapter class.
ADAPTERS: dict[str, type[VLMAdapter]] = {
    "llava_onevision": LlavaOnevisionAdapter,
    "qwen2_vl": QwenVLAdapter,
    "qwen2_5_vl": Qwen25VLAdapter,
    "qwen3_vl": Qwen3VLAdapter,
    "smolvlm": SmolVLMAdapter,
}

# Builtin ids -> (family, build(seed=...) -> (model, tokenizer), adapter options): the random tiny
# models and the trained micro model, all offline.
BUILTIN_MODELS = {**TINY_BUILDERS, MICRO_NAME: ("llava_onevision", load_micro, {})}


def supported_families() -> list[str]:
    return sorted(ADAPTERS)


def resolve_device(device: str) -> torch.device:
    """`"auto"` is the first CUDA device when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ModelError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} requested but CUDA is not available: use --device cpu")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`"auto"` is bf16 on CUDA and fp32 on the CPU (CPU bf16 matmuls are slow and lossy)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ModelError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return table[dtype]


def _family_of(model_dir: Path) -> str:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{model_dir} has no config.json: not a transformers checkpoint")
    model_type = json.loads(config_path.read_text()).get("model_type", "")
    if model_type not in ADAPTERS:
        raise ModelError(
            f"unsupported model architecture {model_type!r} in {model_dir}; "
            f"supported families: {', '.join(supported_families())}"
        )
    return model_type


def _snapshot(hub_id: str, name: str, revision: str = "") -> Path:
    """Local directory of a hub checkpoint (downloading it unless HF_HUB_OFFLINE=1).

    Raises:
        ModelError: not in the cache while offline, or the download failed; the message names the
            command that fixes it (`hermes-video pull NAME`, online) or a local directory.
    """
    from huggingface_hub import snapshot_download

    from hermes.models.hub import ALLOW_PATTERNS

    try:
        return Path(snapshot_download(hub_id, revision=revision or None, allow_patterns=ALLOW_PATTERNS))
    except Exception as exc:  # the hub raises many types; all mean "cannot get this checkpoint"
        pin = f" --revision {revision}" if revision else ""
        if os.environ.get("HF_HUB_OFFLINE"):
            raise ModelError(f"model {hub_id!r} is not on this machine (HF_HUB_OFFLINE is set): run "
                             f"`hermes-video pull {name}{pin}` while online, or pass --model DIR (a local "
                             f"checkpoint directory)") from None
        raise ModelError(f"cannot download model {hub_id!r}: {type(exc).__name__}; check the id and your network, "
                         f"or run `hermes-video pull {name}{pin}` where the hub is reachable and copy the cache "
                         f"(or pass --model DIR)") from None


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/"))


def resolve_auto(cfg: ModelConfig) -> ModelConfig:
    """`name: auto` made concrete: the preset `auto_model_name` picks for the device, its checkpoint.

    `build_config` already resolves `auto`; this covers a `ModelConfig` built directly.
    """
    if cfg.name != AUTO_MODEL:
        return cfg
    name = auto_model_name(cfg.device)
    preset = load_preset("models", name)
    return dataclasses.replace(cfg, name=name, family=preset.get("family", ""), hub_id=preset.get("hub_id", ""))


def load_model(cfg: ModelConfig) -> VLMAdapter:
    """Build the adapter for `cfg`: a builtin model (`tiny-*`, `micro-*`), a local directory or a hub id.

    Args:
        cfg: the resolved model configuration (`name: auto` picks a preset for the device).

    Returns:
        The adapter, with its model in eval mode on the resolved device and dtype.

    Raises:
        ModelError: unknown id, unsupported architecture, unavailable device, or a failed load.
    """
    if cfg.repetition_penalty <= 0:
        raise ConfigError(f"model.repetition_penalty must be positive, found {cfg.repetition_penalty}")
    adapter = _load(resolve_auto(cfg))
    adapter.repetition_penalty = cfg.repetition_penalty
    return adapter


def build_random_model(arch: str, cfg: ModelConfig, *, num_layers: int | None = None,
                       vision_layers: int | None = None) -> VLMAdapter:
    """A random-weight model of `arch` (`hermes.models.realsize`) on `cfg`'s device and dtype, with its
    seed and system prompt: what the benches measure without a checkpoint.

    Raises:
        ModelError: unknown architecture, bad layer count, or an unavailable device.
    """
    from hermes.models.realsize import build_random

    device = resolve_device(cfg.device)
    adapter = build_random(arch, device, resolve_dtype(cfg.dtype, device), num_layers=num_layers,
                           vision_layers=vision_layers, seed=cfg.seed, system_prompt=cfg.system_prompt)
    adapter.repetition_penalty = cfg.repetition_penalty
    return adapter


def _load(cfg: ModelConfig) -> VLMAdapter:
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.name in BUILTIN_MODELS:
        family, build, options = BUILTIN_MODELS[cfg.name]
        model, tokenizer = build(seed=cfg.seed)
        return ADAPTERS[family](cfg.name, model.to(device, dtype), tokenizer, device=device, dtype=dtype,
                                system_prompt=cfg.system_prompt, **options)

    source = cfg.hub_id or cfg.name
    if Path(source).expanduser().is_dir():  # as the early check (models/hub.py) reads it
        model_dir = Path(source).expanduser()
    elif _looks_like_hub_id(source):
        model_dir = _snapshot(source, cfg.name, cfg.revision)
    else:
        known = preset_names("models")
        close = difflib.get_close_matches(source, known, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelError(
            f"unknown model {source!r}{hint}: use a preset ({', '.join(known)}), a hub id like "
            f"org/name, or a local checkpoint directory"
        )
    family = _family_of(model_dir)
    if cfg.family and cfg.family != family:
        raise ModelError(f"model {source!r} is a {family} checkpoint but the config says family {cfg.family!r}")

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=cfg.trust_remote_code)
        model = AutoModelForImageTextToText.from_pretrained(
            model_dir, dtype=dtype, attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot load model from {model_dir}: {first_line}") from None
    normalisation = read_normalisation(model_dir)  # None: the family's default
    extra = dict(zip(("mean", "std"), normalisation)) if normalisation else {}
    adapter = ADAPTERS[family](source, model.to(device), tokenizer, device=device, dtype=dtype,
                               system_prompt=cfg.system_prompt, **extra)
    adapter.weights_dir = model_dir  # memory directories fingerprint these files' hash (hermes.tiers.fingerprint)
    return adapter
