"""Named, atomic checkpoints of tensors plus JSON metadata inside a memory directory: a crash leaves the
previous checkpoint of a name or the new one, whole (docs/ARCHITECTURE.md, Memory, "Checkpoints")."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_bytes

from hermes.tiers.codec import tensors_to_safetensors
from hermes.tiers.errors import MemoryDirError
from hermes.tiers.files import (
    fsync_dir,
    read_exact,
    sha256,
    write_bytes_atomic,
    write_json_atomic,
)

CHECKPOINTS = "checkpoints"
CHECKPOINT_FORMAT = "hermes-checkpoint/2"  # /2: the metadata is checksummed too
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"checkpoint name must be letters, digits, '_' or '-' (at most 100), got {name!r}")


def save_checkpoint(directory: Path, name: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Save tensors and metadata under `name`, atomically replacing any previous checkpoint of that name.

    Args:
        name: Letters, digits, '_' and '-'.
        tensors: Tensors by name (any device; copied to the host).
        meta: JSON-able metadata.

    Raises:
        ValueError: Bad name, or metadata that is not JSON-able.
    """
    check_name(name)
    meta_json = json.loads(json.dumps(meta))  # fail before touching the disk if meta is not JSON-able
    folder = directory / CHECKPOINTS
    folder.mkdir(exist_ok=True)
    host, seen = {}, set()
    for key, t in tensors.items():
        h = t.detach().to("cpu").contiguous()
        ptr = h.untyped_storage().data_ptr()
        host[key] = h.clone() if ptr in seen and h.numel() else h  # safetensors refuses shared storage
        seen.add(ptr)
    data = tensors_to_safetensors(host)
    digest = sha256(data)
    file = f"{name}.{digest[:16]}.safetensors"
    old = read_info(folder / f"{name}.json")
    write_bytes_atomic(folder / file, data)
    write_json_atomic(folder / f"{name}.json", {"format": CHECKPOINT_FORMAT, "name": name, "file": file,
                                                "sha256": digest, "bytes": len(data), "meta": meta_json,
                                                "meta_sha256": meta_digest(name, file, digest, meta_json),
                                                "created_unix": time.time()})
    if old and old.get("file") not in (None, file):
        (folder / old["file"]).unlink(missing_ok=True)
        fsync_dir(folder)


def snapshot(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Host copies of `tensors` and a deep copy of `meta` that later changes to the originals never reach:
    the cheap half of a save, for the caller's thread, so `save_checkpoint` can run on another.

    Raises:
        ValueError: Metadata that is not JSON-able (before anything is queued).
    """
    meta_copy = json.loads(json.dumps(meta))
    return {key: t.detach().to("cpu", copy=True) for key, t in tensors.items()}, meta_copy


def meta_digest(name: str, file: str, digest: str, meta: dict[str, Any]) -> str:
    """SHA-256 binding a checkpoint's metadata to its name and tensor file (canonical JSON)."""
    return sha256(json.dumps([name, file, digest, meta], sort_keys=True, separators=(",", ":")).encode())


def load_checkpoint(directory: Path, name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors on the host, meta)`` of a checkpoint, after checking its checksum.

    Raises:
        KeyError: No checkpoint of that name.
        MemoryDirError: Its files are unreadable or fail the checksum.
    """
    check_name(name)
    folder = directory / CHECKPOINTS
    info = read_info(folder / f"{name}.json")
    if info is None:
        raise KeyError(f"no checkpoint {name!r} in {directory}")
    path = folder / str(info.get("file", ""))
    try:
        data = read_exact(path, 0, int(info["bytes"]))
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise MemoryDirError(f"checkpoint {name!r} in {directory} is unreadable ({exc}){_way_out(directory)}") from exc
    if info.get("format") != CHECKPOINT_FORMAT or len(data) != info["bytes"] or sha256(data) != info.get("sha256"):
        raise MemoryDirError(f"checkpoint {name!r} in {directory} ({path.name}) fails its sha256 checksum"
                             f"{_way_out(directory)}")
    if not isinstance(info.get("meta"), dict) or \
            meta_digest(name, str(info["file"]), str(info["sha256"]), info["meta"]) != info.get("meta_sha256"):
        raise MemoryDirError(f"checkpoint {name!r} in {directory}: its metadata fails its sha256 checksum (edited "
                             f"or damaged){_way_out(directory)}")
    return load_bytes(data), info["meta"]


def _way_out(directory: Path) -> str:
    return (f"; `hermes-video memory repair {directory}` moves it to quarantine (the stream then starts afresh), "
            f"or use another --memory-dir")


def list_checkpoints(directory: Path) -> list[dict[str, Any]]:
    """``[{name, bytes, created_unix, meta_keys}]`` of the checkpoints, by name."""
    out = []
    for path in sorted((directory / CHECKPOINTS).glob("*.json")):
        info = read_info(path)
        if info is not None:
            out.append({"name": info.get("name", path.stem), "bytes": info.get("bytes"),
                        "created_unix": info.get("created_unix"), "meta_keys": sorted(info.get("meta") or {})})
    return out


def verify_checkpoints(directory: Path) -> list[str]:
    """Problems found by loading every checkpoint (checksums); empty when all are intact."""
    problems = []
    for path in sorted((directory / CHECKPOINTS).glob("*.json")):
        try:
            load_checkpoint(directory, path.stem)
        except (MemoryDirError, KeyError, ValueError) as exc:
            problems.append(str(exc))
    return problems


def clean(directory: Path) -> list[str]:
    """Delete tensor files no checkpoint names (left by a crash mid-save); returns their names."""
    folder = directory / CHECKPOINTS
    if not folder.exists():
        return []
    named = {(read_info(p) or {}).get("file") for p in folder.glob("*.json")}
    removed = [p.name for p in folder.iterdir()
               if p.name.endswith(".tmp") or (p.suffix == ".safetensors" and p.name not in named)]
    for name in removed:
        (folder / name).unlink(missing_ok=True)
    if removed:
        fsync_dir(folder)
    return removed


def read_info(path: Path) -> dict | None:
    try:
        return parse_info(path.read_bytes())
    except OSError:
        return None


def parse_info(data: bytes) -> dict | None:
    """A checkpoint's metadata from its bytes, or None if they are not a JSON object."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
