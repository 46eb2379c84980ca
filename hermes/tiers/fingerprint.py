"""Which model and memory settings made a memory directory (``fingerprint.json``), so that no other run
mixes into it: a different fingerprint is refused with a one-line `MemoryDirError` saying what differs.

It includes the KV layout and a SHA-256 of the weights, the digest cached by file identity
(docs/ARCHITECTURE.md, Memory, "Meaning, not only bytes").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from hermes.rope import RotarySpec
from hermes.tiers.errors import MemoryDirError
from hermes.tiers.files import cache_root, write_json_atomic

FORMAT = "hermes-memory/1"
FINGERPRINT = "fingerprint.json"


def make_fingerprint(model: str, family: str, num_layers: int, num_kv_heads: int, head_dim: int,
                     rope: str = "1d", memory: dict[str, Any] | None = None,
                     weights: str | None = None, kv: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fingerprint of a model and memory configuration, as JSON-able plain values.

    Args:
        rope: Rotary scheme ("1d", "mrope", ...; include the sections if they matter).
        memory: The memory settings records depend on (e.g. storage dtype, summary anchors).
        weights: `weights_digest` of the model (None: left out, for tests without a model).
        kv: `kv_layout` (None: left out).

    Returns:
        ``{"format", "model", "family", "num_layers", "num_kv_heads", "head_dim", "rope", "memory"}``
        plus ``"weights"`` and ``"kv"`` when given.
    """
    out = {"format": FORMAT, "model": model, "family": family, "num_layers": int(num_layers),
           "num_kv_heads": int(num_kv_heads), "head_dim": int(head_dim), "rope": rope, "memory": dict(memory or {})}
    if weights is not None:
        out["weights"] = weights
    if kv is not None:
        out["kv"] = dict(kv)
    return normalise(out)


def kv_layout(spec: RotarySpec, num_kv_heads: int, dtype: str) -> dict[str, Any]:
    """Everything that decides what a cached key or value means, beyond the weights.

    Args:
        spec: The rotary scheme (kind, base, M-RoPE sections and layout, the attention scaling).
        dtype: The cache's dtype name (``"float32"``, ``"bfloat16"``, ...).

    Returns:
        ``{"dtype", "num_kv_heads", "head_dim", "positions", "rope": {...}}``; ``positions`` names the
        scheme (keys cached rotated, at explicit positions of 1 or 3 axes).
    """
    return {"dtype": dtype, "num_kv_heads": int(num_kv_heads), "head_dim": int(spec.head_dim),
            "positions": f"rotated-keys/{spec.num_axes}-axis",
            "rope": {"kind": spec.kind, "theta": float(spec.theta),
                     "mrope_section": list(spec.mrope_section) if spec.mrope_section else None,
                     "mrope_interleaved": bool(spec.mrope_interleaved),
                     "attention_scaling": float(spec.attention_scaling)}}


def rotary_spec(fingerprint: dict[str, Any]) -> RotarySpec | None:
    """The rotary scheme a fingerprint's `kv_layout` names, or None if it has none (or a bad one)."""
    rope = (fingerprint.get("kv") or {}).get("rope")
    if not isinstance(rope, dict):
        return None
    try:
        return RotarySpec(head_dim=int(fingerprint["kv"]["head_dim"]), theta=float(rope["theta"]),
                          kind=str(rope["kind"]),
                          mrope_section=tuple(rope["mrope_section"]) if rope.get("mrope_section") else None,
                          attention_scaling=float(rope["attention_scaling"]),
                          mrope_interleaved=bool(rope["mrope_interleaved"]))
    except (KeyError, TypeError, ValueError):
        return None


def _cache_file() -> Path:
    return cache_root() / "weights-sha256.json"


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def files_digest(weight_files: list[Path]) -> str:
    """SHA-256 over the weight files' own SHA-256s, each cached by (path, size, mtime)."""
    cache_path = _cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    h, changed = hashlib.sha256(), False
    for path in sorted(weight_files, key=lambda p: p.name):
        st = path.stat()
        key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        if key not in cache:
            cache[key], changed = _hash_file(path), True
        h.update(f"{path.name}:{cache[key]}\n".encode())
    if changed:
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache_path, cache)
        except OSError:
            pass  # a read-only home only costs the hash again next time
    return h.hexdigest()


def tensors_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's state (names, dtypes, shapes and bytes), for models built in memory."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}|{flat.dtype}|{tuple(t.shape)}\n".encode())
        if flat.numel():
            h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def weights_digest(adapter) -> str:
    """``"sha256:<hex>"`` of the adapter's weights (``weights_dir`` files, else its tensors), once per load.
    """
    cached = getattr(adapter, "_weights_sha256", None)
    if cached is None:
        folder = getattr(adapter, "weights_dir", None)
        files = [p for p in Path(folder).glob("*") if p.suffix in (".safetensors", ".bin")] if folder else []
        cached = "sha256:" + (files_digest(files) if files else tensors_digest(adapter.model))
        adapter._weights_sha256 = cached
    return cached


def normalise(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint as it reads back from JSON (tuples become lists), so comparisons are fair."""
    return json.loads(json.dumps(fingerprint, sort_keys=True))


def describe(fp: dict[str, Any]) -> str:
    """A short human description, e.g. ``model 'x' (family y, 24 layers, head_dim 64)``."""
    bits = [f"family {fp['family']}" if "family" in fp else None,
            f"{fp['num_layers']} layers" if "num_layers" in fp else None,
            f"head_dim {fp['head_dim']}" if "head_dim" in fp else None]
    inner = ", ".join(b for b in bits if b)
    return f"model {fp.get('model', '?')!r}" + (f" ({inner})" if inner else "")


def check_or_create(directory: Path, fingerprint: dict[str, Any] | None, create: bool) -> dict[str, Any]:
    """Compare a directory's fingerprint with ours, or write ours into a new, empty directory.

    Args:
        directory: The memory directory (must exist).
        fingerprint: Ours; None accepts whatever the directory holds (inspection tools).
        create: Whether a directory without a fingerprint may be claimed (only if it is empty).

    Returns:
        The directory's fingerprint.

    Raises:
        MemoryDirError: The fingerprints differ, or the directory is not a memory directory.
    """
    path = directory / FINGERPRINT
    if not path.exists():
        others = [p.name for p in directory.iterdir() if p.name not in ("lock",)]
        if others or not create or fingerprint is None:
            raise MemoryDirError(
                f"{directory} is not a hermes memory directory (no {FINGERPRINT}"
                f"{', and it holds other files' if others else ''}); use an empty or new --memory-dir")
        write_json_atomic(path, normalise(fingerprint))
        return normalise(fingerprint)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MemoryDirError(f"{path} is unreadable ({exc}); use another --memory-dir") from exc
    return compare(directory, stored, fingerprint)


def compare(where: Path | str, stored: dict[str, Any], fingerprint: dict[str, Any] | None) -> dict[str, Any]:
    """`stored` if `fingerprint` is None or equal to it, else a `MemoryDirError` naming the differences."""
    if fingerprint is None:
        return stored
    ours = normalise(fingerprint)
    if stored != ours:
        keys = sorted(k for k in set(stored) | set(ours) if stored.get(k) != ours.get(k))
        raise MemoryDirError(
            f"memory directory {where} was made by {describe(stored)}, but this run uses {describe(ours)} "
            f"(they differ in: {', '.join(keys)}); use another --memory-dir")
    return stored
