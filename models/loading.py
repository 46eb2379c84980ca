"""`load_model(name | cfg)`: the one way to a ready adapter, from a builtin model, a local directory or a
hub id resolved by `hermes.model_registry`; `make_adapter` wraps a model in hand, `build_random_model` a
random-weight one. Every failure is a one-line `ModelError` (exit 4); `trust_remote_code` stays off unless
the user turns it on."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from hermes.config import ModelConfig, build_config
from hermes.errors import ModelError
from hermes.model_registry import AUTO_MODEL, auto_model_name, model_entry, resolve_source
from hermes.models.base import VLMAdapter
from hermes.models.llava_onevision import LlavaOnevisionAdapter
from hermes.models.preprocess import read_normalisation
from hermes.models.qwen3_vl import Qwen3VLAdapter
from hermes.models.qwen_vl import Qwen25VLAdapter, QwenVLAdapter
from hermes.models.realsize import random_model
from hermes.models.smolvlm import SmolVLMAdapter

# transformers `model_type` -> adapter class.
ADAPTERS: dict[str, type[VLMAdapter]] = {
    "llava_onevision": LlavaOnevisionAdapter,
    "qwen2_vl": QwenVLAdapter,
    "qwen2_5_vl": Qwen25VLAdapter,
    "qwen3_vl": Qwen3VLAdapter,
    "smolvlm": SmolVLMAdapter,
}

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
    """Local directory of a hub checkpoint, downloaded unless HF_HUB_OFFLINE=1; a `ModelError` naming the
    fix (`hermes-video pull NAME`, or a local directory) when it is not there.
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


def resolve_auto(cfg: ModelConfig) -> ModelConfig:
    """`name: auto` made concrete for a `ModelConfig` built directly (`build_config` already resolves it)."""
    if cfg.name != AUTO_MODEL:
        return cfg
    entry = model_entry(auto_model_name(cfg.device))
    return dataclasses.replace(cfg, name=entry.name, family=entry.family, hub_id=entry.hub_id)


def load_model(model: str | ModelConfig, *, builder_options: dict[str, Any] | None = None) -> VLMAdapter:
    """Build the adapter for a model name or a resolved `ModelConfig`.

    Args:
        model: a registered name (`tiny-*`, `micro-*`, a preset), a hub id or a local directory, whose
            registry defaults then apply; or a resolved `ModelConfig` (`name: auto` picks by device).
        builder_options: extra keyword arguments of a builtin entry's builder (the micro model's
            `path=` to a freshly trained weights file).

    Returns:
        The adapter, with its model in eval mode on the resolved device and dtype.

    Raises:
        ModelError: unknown id, unsupported architecture, unavailable device, or a failed load.
    """
    cfg = build_config(model=model).model if isinstance(model, str) else model
    adapter = _load(resolve_auto(cfg), builder_options or {})
    apply_model_options(adapter, cfg)
    return adapter


def apply_model_options(adapter: VLMAdapter, cfg: ModelConfig) -> None:
    """Set what `cfg` says about decoding and preprocessing on a built adapter (the loader's one place for it)."""
    from hermes.models.compiled_decode import compiled_decode_step
    from hermes.models.preprocess import resolve_preprocess_device

    adapter.repetition_penalty = cfg.repetition_penalty
    adapter.preprocess_device = resolve_preprocess_device(cfg.preprocess_on, adapter.device)
    adapter.decode_step = compiled_decode_step(adapter, cfg.compile_decode)


def make_adapter(family: str, name: str, model, tokenizer, cfg: ModelConfig | None = None,
                 **options: Any) -> VLMAdapter:
    """Wrap a transformers model already in hand (a script that trains one) in its family's adapter.

    Args:
        cfg: device, dtype and system prompt (None: the defaults, on the CPU in fp32 unless set).
        options: the adapter's own keyword options (frame sizes).

    Raises:
        ModelError: no adapter for `family`.
    """
    if family not in ADAPTERS:
        raise ModelError(f"no adapter for family {family!r}; supported families: {', '.join(supported_families())}")
    cfg = cfg or ModelConfig()
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    adapter = ADAPTERS[family](name, model.to(device, dtype), tokenizer, device=device, dtype=dtype,
                               system_prompt=cfg.system_prompt, **options)
    apply_model_options(adapter, cfg)
    return adapter


def _build_builtin(name: str, cfg: ModelConfig, builder_options: dict[str, Any]) -> VLMAdapter:
    """A registered builtin model, built by its `builder` with its adapter options."""
    entry = model_entry(name)
    module, _, function = entry.builder.partition(":")
    build = getattr(importlib.import_module(module), function)
    model, tokenizer = build(seed=cfg.seed, **builder_options)
    return make_adapter(entry.family, name, model, tokenizer, cfg, **entry.adapter)


def build_random_model(arch: str, cfg: ModelConfig, *, num_layers: int | None = None,
                       vision_layers: int | None = None) -> VLMAdapter:
    """A random-weight model of `arch` (`hermes.models.realsize`) on `cfg`'s device, dtype, seed and system
    prompt: what the benches measure without a checkpoint.

    Raises:
        ModelError: unknown architecture, bad layer count, or an unavailable device.
    """
    device = resolve_device(cfg.device)
    family, name, model, tokenizer = random_model(arch, device, resolve_dtype(cfg.dtype, device), seed=cfg.seed,
                                                  num_layers=num_layers, vision_layers=vision_layers)
    return make_adapter(family, name, model, tokenizer, cfg)


def _load(cfg: ModelConfig, builder_options: dict[str, Any]) -> VLMAdapter:
    kind, source = resolve_source(cfg.name, cfg.hub_id)  # as the early check saw it
    if kind == "entry":
        return _build_builtin(source, cfg, builder_options)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    model_dir = Path(source) if kind == "dir" else _snapshot(source, cfg.name, cfg.revision)
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
