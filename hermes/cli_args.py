"""What every subcommand's parser shares: one-line argparse errors, the configuration flags and the
table that maps each flag to the one config key it is sugar for. Only argparse (and the YAML presets,
for help lines) is imported here, so `--help` stays instant.

`--model`, `--memory`, `--config` and `--set` build the `HermesConfig`; every other flag that
configures is sugar for exactly one key (`CONFIG_FLAGS`), applied after every `--set`, so the flag
wins. Flags not in the table (`--ask`, `--output`, ...) say what to do, not how the model, memory or
stream behave.
"""

from __future__ import annotations

import argparse
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

    flag: str  # on the command line, e.g. "--fps"
    key: str  # the config key it sets, e.g. "stream.fps"
    help: str  # what it does (the help line adds "(sets KEY)")
    metavar: str | None = None
    type: type | None = None  # None: the text, read by the config layer as a YAML scalar and type-checked there

    @property
    def dest(self) -> str:
        """The argparse attribute ("--max-new-tokens" -> "max_new_tokens")."""
        return self.flag.lstrip("-").replace("-", "_")


# flag -> key: the whole list of flags that configure. A command adds the ones it takes
# (`add_config_options(p, flags=...)`); `config_from_args` turns them into `--set` items.
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


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, found {text!r}")
    return value


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
        model, config: whether the command takes --model and --config (the demo has a fixed model).
        memory_help: a whole help line for --memory instead of the generated one.
        flag_help: per-flag help lines that replace the table's (the key is still named).
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
        args: the namespace; reads `model`, `memory`, `config`, `set` and the config flags it has.
        default_memory: without --memory, start from the model's bounded preset
            (`default_memory_preset`) instead of the dataclass default (`full`), as `run` does.
        model, memory: used where the namespace has no --model / --memory (or gives None).
        base: the command's own defaults, beneath every preset, file and override
            (`build_config(base=...)`).
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
    """Refuse, before any work, an output path that cannot be written: a directory where a file is
    expected or the reverse, or a parent folder that is missing or read-only.

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
