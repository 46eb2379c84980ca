"""Getting checkpoints onto the machine without torch: `hermes-video pull MODEL` (huggingface_hub's
`snapshot_download`, into the Hugging Face cache or `--local-dir`) and `hermes-video models`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hermes.errors import ModelError
from hermes.model_registry import entries, hub_id_of

# What a checkpoint needs to load: configs, weights, tokenizer and processor files, chat templates.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


def pull(model: str, revision: str | None = None, local_dir: str | None = None, progress: bool = True) -> Path:
    """Download a checkpoint (the files `load_model` reads) and return its local directory.

    Args:
        model: a model preset name or a hub id.
        revision: a commit hash, branch or tag to pin; None is the default branch.
        local_dir: a plain folder to download into (then `--model DIR` loads it); None is the cache.

    Raises:
        ModelError: unknown name, no network (or HF_HUB_OFFLINE set), unknown revision, or any other
            failed download, in one line.
    """
    hub_id = hub_id_of(model)
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    (enable_progress_bars if progress else disable_progress_bars)()
    try:
        path = snapshot_download(hub_id, revision=revision, local_dir=local_dir, allow_patterns=ALLOW_PATTERNS)
    except Exception as exc:  # the hub raises many types (HTTP, offline, not found): all one line here
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        offline = " HF_HUB_OFFLINE is set: unset it to download;" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise ModelError(f"cannot download {hub_id!r}{f' at revision {revision!r}' if revision else ''}: "
                         f"{type(exc).__name__}{f' ({detail})' if detail else ''};{offline} check the id, "
                         f"the revision and your network") from None
    return Path(path)


@dataclass(frozen=True)
class ModelRow:
    """One row of `hermes-video models`."""

    name: str  # preset name, or the hub id of a cached checkpoint no preset names
    hub_id: str  # "" for builtin models
    family: str
    on_disk_bytes: int | None  # None: not in the cache; 0 for builtin models


def cache_folder() -> Path:
    """The Hugging Face hub cache, read from the environment now (`HF_HUB_CACHE`, then `HF_HOME/hub`)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_repos(cache_dir: str | Path | None = None) -> dict[str, int]:
    """Model repositories in the Hugging Face cache (default `cache_folder()`) and their size on disk."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache_dir = cache_dir or cache_folder()
    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return {}
    except ValueError as exc:  # the cache path is a file
        raise ModelError(f"cannot read the Hugging Face cache {cache_dir}: {exc} (check HF_HUB_CACHE)") from None
    return {repo.repo_id: repo.size_on_disk for repo in info.repos if repo.repo_type == "model"}


def list_models(cache_dir: str | Path | None = None) -> list[ModelRow]:
    """Every model preset (builtin ones first), then cached checkpoints that no preset names."""
    cached = cached_repos(cache_dir)
    rows = []
    for entry in entries():
        size = 0 if not entry.hub_id else cached.pop(entry.hub_id, None)
        rows.append(ModelRow(entry.name, entry.hub_id, entry.family, size))
    rows.sort(key=lambda e: (e.hub_id != "", e.name))
    rows += [ModelRow(hub_id, hub_id, "", size) for hub_id, size in sorted(cached.items())]
    return rows


def format_models(entries: list[ModelRow]) -> str:
    """The `models` table: name, family, checkpoint, where it is."""
    rows = [("MODEL", "FAMILY", "CHECKPOINT", "ON DISK")]
    for e in entries:
        if not e.hub_id:
            where = "builtin"
        elif e.on_disk_bytes is None:
            where = f"no: hermes-video pull {e.name}"
        else:
            where = f"yes, {e.on_disk_bytes / 2**30:.2f} GiB" if e.on_disk_bytes >= 2**27 else \
                f"yes, {e.on_disk_bytes / 2**20:.1f} MiB"
        rows.append((e.name, e.family or "-", e.hub_id or "-", where))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)
