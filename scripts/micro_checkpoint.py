"""A resumable training checkpoint for `train_micro.py` (`--checkpoint DIR`): everything a run needs to go
on exactly where it stopped, so that a run longer than one sitting (issue 37 allows 4 hours a seed) can be
paused and resumed, and a killed run loses at most the steps since its last checkpoint.

One checkpoint is two files in DIR:
- `step-NNNNNNN.safetensors`: the model's, the auxiliary head's and AdamW's tensors, and torch's RNG state;
- `checkpoint.json`: the commit record, written atomically after the tensors. It names the tensors file
  and its sha256, and holds the run's arguments, its progress (step, stage, running averages, curve), and
  the training generator's state.

Loading verifies the checksum and refuses a record written by other arguments. Nothing is unpickled: the
tensors are safetensors, the rest JSON. A stale tensors file (one no record names: a crash between the
two writes) is removed by the next save; the one the record names is never removed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hermes.tiers.files import sha256, write_bytes_atomic, write_json_atomic

RECORD = "checkpoint.json"
FORMAT = 1  # bumped when the record's meaning changes: an old record is then refused, not misread


class CheckpointError(Exception):
    """A checkpoint that cannot be read (missing, of another format, damaged); the message is one line."""

    exit_code = 3  # a source error (README, "Errors and exit codes")


class CheckpointMismatch(CheckpointError):
    """A checkpoint written by other arguments than this run's."""

    exit_code = 2  # a usage error: the arguments are what is wrong


@dataclass
class Progress:
    """Where a training run is: what the loop carries from one step to the next."""

    step: int = 0  # steps done, over all stages
    stage: str | None = None  # the stage in progress (None: between stages)
    stage_first: int = 0  # its first step
    loss_ema: float | None = None  # running averages, reset at each stage's start
    letter_acc_ema: float = 0.0
    aux_acc_ema: dict[str, float] = field(default_factory=dict)  # not reset: the auxiliary targets span stages
    stage_steps: dict[str, int] = field(default_factory=dict)  # steps per stage (a --max-seconds cap lowers one)
    stage_log: list[dict] = field(default_factory=list)  # finished stages: steps, elapsed_s
    curve: list[dict] = field(default_factory=list)  # the validation curve so far
    elapsed_s: float = 0.0  # training wall time over every sitting


def tensors_of(model: torch.nn.Module, aux_head: torch.nn.Module | None,
               opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """(tensors by name, the optimizer's param groups without their tensors)."""
    out = {f"model.{k}": v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if aux_head is not None:
        out |= {f"aux_head.{k}": v.detach().contiguous().clone() for k, v in aux_head.state_dict().items()}
    opt_state = opt.state_dict()
    for index, slots in opt_state["state"].items():
        out |= {f"optimizer.{index}.{k}": v.detach().contiguous().clone() for k, v in slots.items()}
    out["rng.torch"] = torch.get_rng_state()
    return out, opt_state["param_groups"]


def save_checkpoint(directory: Path, args: dict, progress: Progress, rng: np.random.Generator,
                    model: torch.nn.Module, aux_head: torch.nn.Module | None, opt: torch.optim.Optimizer) -> Path:
    """Write a checkpoint of the run into `directory` (created); returns the record's path.

    Args:
        args: the run's arguments that must match on resume (`resume_args`' input).
        rng: the training draw's generator, at this step.
    """
    from safetensors.torch import save

    directory.mkdir(parents=True, exist_ok=True)
    tensors, groups = tensors_of(model, aux_head, opt)
    name = f"step-{progress.step:07d}.safetensors"
    data = save(tensors)
    write_bytes_atomic(directory / name, data)
    record = {"format": FORMAT, "tensors": name, "sha256": sha256(data), "args": args,
              "progress": dataclasses.asdict(progress), "rng": rng.bit_generator.state, "param_groups": groups}
    write_json_atomic(directory / RECORD, record)
    for old in directory.glob("step-*.safetensors"):  # earlier checkpoints, and any a crash left unnamed
        if old.name != name:
            old.unlink()
    return directory / RECORD


def has_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds a checkpoint record."""
    return (directory / RECORD).is_file()


def read_record(directory: Path) -> dict:
    """The checkpoint record of `directory`.

    Raises:
        CheckpointError: the record is unreadable or of another format.
    """
    try:
        record = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint record {directory / RECORD} is unreadable ({exc})") from None
    if record.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {directory} has format {record.get('format')}, this script reads {FORMAT}")
    return record


def read_tensors(directory: Path, record: dict) -> dict[str, torch.Tensor]:
    """The tensors `record` names, by name, verified against its sha256.

    Raises:
        CheckpointError: the tensors file is missing or fails its checksum (it is left in place).
    """
    from safetensors.torch import load

    path = directory / record["tensors"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint tensors {path} are unreadable ({exc.strerror})") from None
    if sha256(data) != record["sha256"]:
        raise CheckpointError(f"checkpoint tensors {path} fail their checksum (sha256 {sha256(data)[:16]}..., "
                              f"recorded {record['sha256'][:16]}...): the file is damaged; it was left in place")
    return load(data)


def part(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix` (e.g. "model."), the prefix dropped."""
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_checkpoint(directory: Path, args: dict, defaults: dict, rng: np.random.Generator, model: torch.nn.Module,
                    aux_head: torch.nn.Module | None, opt: torch.optim.Optimizer) -> Progress:
    """Restore a run from `directory` into `model`, `aux_head`, `opt`, `rng` and torch's RNG.

    Args:
        args: this invocation's arguments; they must equal the record's.
        defaults: the arguments' defaults: one the record does not name (added to the script after the
            checkpoint was written) matches at its default.

    Returns:
        The run's progress at the checkpoint.

    Raises:
        CheckpointError: as `read_record` and `read_tensors`; CheckpointMismatch: the record was written by
            other arguments (found before the tensors are read).
    """
    record = read_record(directory)
    recorded = {**{k: v for k, v in defaults.items() if k in args}, **record["args"]}
    differ = sorted(k for k in set(args) | set(recorded) if args.get(k) != recorded.get(k))
    if differ:
        shown = ", ".join(f"--{k.replace('_', '-')} {recorded.get(k)} (now {args.get(k)})" for k in differ[:3])
        raise CheckpointMismatch(f"checkpoint {directory} was written by other arguments: {shown}; rerun with its "
                              f"arguments or give another --checkpoint folder")
    tensors = read_tensors(directory, record)
    model.load_state_dict(part(tensors, "model."), strict=True)
    if aux_head is not None:
        aux_head.load_state_dict(part(tensors, "aux_head."), strict=True)
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in part(tensors, "optimizer.").items():
        index, slot = key.split(".", 1)
        slots.setdefault(int(index), {})[slot] = value
    opt.load_state_dict({"state": slots, "param_groups": record["param_groups"]})
    torch.set_rng_state(tensors["rng.torch"])
    rng.bit_generator.state = record["rng"]
    return Progress(**record["progress"])
