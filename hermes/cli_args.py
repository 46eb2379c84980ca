"""What every subcommand's parser shares: one-line argparse errors, typed argparse checkers, and the
configuration flags with `CONFIG_FLAGS`, the table of flags that are sugar for one config key each
(applied after every `--set`, so the flag wins). Only argparse and YAML are imported: `--help` stays instant.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.errors import UsageError
from hermes.presets import preset_names  # YAML only: --help stays instant

PROG = "hermes-video"
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ConfigFlag:
    """A flag that is sugar for one config key."""

    flag: str  # e.g. "--fps"
    key: str  # e.g. "stream.fps"
    help: str  # the help line adds "(sets KEY)"
    metavar: str | None = None
    type: type | None = None  # None: the text, type-checked by the config layer

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


# every flag that configures; a command adds the ones it takes (`add_config_options(p, flags=...)`)
CONFIG_FLAGS: dict[str, ConfigFlag] = {f.flag: f for f in (
    ConfigFlag("--device", "model.device", "auto, cpu, cuda or cuda:N"),
    ConfigFlag("--dtype", "model.dtype", "weights dtype: auto (bf16 on CUDA, fp32 on CPU), bfloat16, float16, float32"),
    ConfigFlag("--max-new-tokens", "model.max_new_tokens", "answer length cap", "N"),
    ConfigFlag("--fps", "stream.fps", "frames sampled per second", "F"),
    ConfigFlag("--chunk-frames", "stream.chunk_frames", "frames encoded per forward", "N"),
    ConfigFlag("--budget", "memory.budget", "visual tokens per layer for bounded policies", "N", int),
)}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: a usage error is a `UsageError` (exit 2), not a usage dump."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _argparse_type(convert, ok, expected: str):
    """An argparse type: `convert(text)`, refused unless `ok(value)`, with the error "expected EXPECTED"."""

    def check(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, found {text!r}")
        return value

    check.__doc__ = f"argparse type: {expected}."
    return check


positive_int = _argparse_type(int, lambda v: v >= 1, "a positive whole number")
positive_float = _argparse_type(float, lambda v: 0 < v < math.inf, "a positive number")
port_number = _argparse_type(int, lambda v: 1 <= v <= 65535, "a TCP port 1-65535")


def parse_int_list(text: str, flag: str) -> list[int]:
    """`"64,128"` as `[64, 128]`.

    Raises:
        UsageError: not comma-separated integers, or one below 1.
    """
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} expects comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} expects positive integers, found {text!r}")
    return values


def add_common_options(p: argparse.ArgumentParser, top: bool = False) -> None:
    """--debug and --log-level, accepted before and after the subcommand."""
    default = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--debug", action="store_true", help="show tracebacks", **default)
    p.add_argument("--log-level", choices=LOG_LEVELS, help="log messages at this level and above on stderr "
                   "(default: warning; debug also shows OpenCV/FFmpeg messages)", **default)


def add_config_options(p: argparse.ArgumentParser, *, flags: tuple[str, ...] = ("--device",),
                       memory_default: str = "the model's bounded preset, hermes-4k for every shipped model",
                       model: bool = True, config: bool = True, memory_help: str | None = None,
                       flag_help: dict[str, str] | None = None) -> None:
    """The configuration surface of a command: --model, --memory, --config, --set and its sugar flags.

    Args:
        flags: the `CONFIG_FLAGS` this command takes.
        memory_default: what --memory defaults to, for its help line.
        model, config: whether the command takes --model and --config.
        memory_help, flag_help: help lines instead of the generated ones.
    """
    if model:
        p.add_argument("--model", help="auto (the default: smolvlm2-500m without CUDA, llava-onevision-7b with it), "
                                       f"a preset ({', '.join(preset_names('models'))}), a hub id like org/name, "
                                       "or a local checkpoint directory (sets model.name)")
    p.add_argument("--memory", metavar="PRESET", help=memory_help or f"memory preset "
                   f"({', '.join(preset_names('memory'))}; default: {memory_default})")
    if config:
        p.add_argument("--config", metavar="FILE", help="YAML file with model:, memory:, stream: sections, or a "
                                                        "preset name: a paper setting (paper-llava-onevision-7b, "
                                                        "paper-qwen2.5-vl-7b), a model or a memory preset")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one config key, e.g. --set model.max_new_tokens=32 (repeatable)")
    for flag in flags:
        spec = CONFIG_FLAGS[flag]
        text = (flag_help or {}).get(flag, spec.help)
        p.add_argument(flag, dest=spec.dest, metavar=spec.metavar, type=spec.type, help=f"{text} (sets {spec.key})")


def config_from_args(args: argparse.Namespace, *, default_memory: bool = False, model: str | None = None,
                     memory: str | None = None, base: dict[str, Any] | None = None, extra: list[str] | None = None):
    """The resolved configuration of a command from its parsed flags (checked, nothing loaded).

    Args:
        args: reads `model`, `memory`, `config`, `set` and the config flags it has.
        default_memory, base: as `build_config`'s.
        model, memory: used where the namespace gives none.
        extra: `KEY=VALUE` items applied before the `--set` items (a command's fixed choices).

    Raises:
        ConfigError: any configuration error, in one line.
    """
    from hermes.config import build_config

    overrides = [*(extra or []), *(getattr(args, "set", None) or [])]
    overrides += [f"{spec.key}={getattr(args, spec.dest)}" for spec in CONFIG_FLAGS.values()
                  if getattr(args, spec.dest, None) is not None]  # after every --set: the flag wins
    return build_config(getattr(args, "model", None) or model, getattr(args, "memory", None) or memory,
                        getattr(args, "config", None), overrides, base, default_memory=default_memory)


def memory_chosen(args: argparse.Namespace) -> bool:
    """Whether the user chose the memory (--memory, --config or a `memory.policy` override)."""
    return bool(getattr(args, "memory", None) or getattr(args, "config", None)
                or any(s.startswith("memory.policy") for s in getattr(args, "set", None) or []))


def check_output_path(path: str | None, flag: str, *, directory: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written (a directory where a file is
    expected or the reverse, a parent folder missing or read-only).

    Raises:
        UsageError: naming the flag and what is wrong.
    """
    if not path:
        return
    target = Path(path)
    if directory:
        if target.exists() and not target.is_dir():
            raise UsageError(f"{flag} expects a directory, found a file: {path}")
    elif target.is_dir():
        raise UsageError(f"{flag} expects a file, found a directory: {path}")
    parent = target if directory and target.exists() else target.parent
    while not parent.exists() and directory and parent != parent.parent:
        parent = parent.parent  # a directory output is created with its parents
    if not parent.is_dir():
        raise UsageError(f"{flag}: folder {parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag}: folder {parent} is not writable")
