"""Splitting one benchmark run over several processes, GPUs or machines, and merging the parts.

`--shard i/n` (1-based) keeps every n-th video (stream) starting at the i-th, in the loader's
order, so the shards of a run are disjoint, cover every video, and balance long and short
videos about evenly. Each shard writes its own results folder; `merge_shards` reads their
`samples.jsonl` files, checks that they are shards of one run (same benchmark, config,
protocol; shard numbers 1..n each present once), and writes one folder whose `summary.json`
and `report.md` are computed over all questions exactly as a single run would compute them.
Under `torchrun`, `shard_from_env` takes i/n from RANK / WORLD_SIZE.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence, TypeVar

from hermes.errors import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """Read "i/n" (1 <= i <= n), or "auto" for torchrun's RANK / WORLD_SIZE.

    Raises:
        UsageError: For anything else.
    """
    if text == "auto":
        shard = shard_from_env()
        if shard is None:
            raise UsageError("--shard auto needs RANK and WORLD_SIZE in the environment (as torchrun sets them)")
        return shard
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise UsageError(f"expected --shard i/n with 1 <= i <= n (e.g. 2/4) or auto, found {text!r}")
    return Shard(int(match.group(1)), int(match.group(2)))


def shard_from_env(environ=os.environ) -> Shard | None:
    """The shard of this rank under torchrun (RANK / WORLD_SIZE), or None outside it."""
    rank, world = environ.get("RANK"), environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    return Shard(int(rank) + 1, int(world))


def select_shard(records: Sequence[T], shard: Shard | None) -> list[T]:
    """The records (videos) of one shard: every `count`-th from the `index`-th; all without a shard."""
    if shard is None:
        return list(records)
    return list(records[shard.index - 1:: shard.count])


def merge_shards(parts: Sequence[str], output: str, data_root: str, progress: bool = False) -> dict:
    """Merge the results folders of the shards of one run into `output`.

    The parts' samples are copied into `output` under the run's manifest (without a shard),
    then the summary is computed over every selected question by the same code as a single
    run (`run_eval` with nothing left to answer: no model is loaded).

    Args:
        parts: The shards' results folders (each with run.json and samples.jsonl).
        output: The merged results folder (created; must not hold results yet).
        data_root: The benchmark's folder, to read the questions (the denominator).
        progress: Unused (no question is answered); kept for symmetry with `run_eval`.

    Returns:
        The merged summary.

    Raises:
        UsageError: A part is not a results folder, parts of different runs, a shard missing
            or given twice, or `output` already holds results.
    """
    import json
    import tempfile
    from pathlib import Path

    from hermes.config import build_config

    from .results import MANIFEST_FILE, SampleLog, _read_samples
    from .runner import run_eval

    manifests, samples = [], {}
    for part in parts:
        folder = Path(part).expanduser()
        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"eval merge: {folder} is not a results folder ({MANIFEST_FILE}: {exc})") from None
        manifests.append(manifest)
        if (folder / "samples.jsonl").is_file():
            samples.update(_read_samples(folder / "samples.jsonl")[0])
    shards = [m.get("shard") for m in manifests]
    if any(s is None for s in shards):
        raise UsageError("eval merge: every part must be a --shard run; "
                         f"{parts[shards.index(None)]} is a whole run")
    parsed = [parse_shard(s) for s in shards]
    count = parsed[0].count
    if sorted(p.index for p in parsed) != list(range(1, count + 1)) or any(p.count != count for p in parsed):
        found = ", ".join(shards)
        raise UsageError(f"eval merge: expected shards 1/{count} .. {count}/{count} once each, found {found}")
    base = {k: v for k, v in manifests[0].items() if k != "shard"}
    for part, manifest in zip(parts, manifests):
        if {k: v for k, v in manifest.items() if k != "shard"} != base:
            raise UsageError(f"eval merge: {part} is a shard of a different run (benchmark, config or protocol differ)")
    with SampleLog.open(output, {**base, "shard": None}, resume=False) as log:
        for sample in samples.values():
            log.append(sample)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        json.dump({k: base["config"][k] for k in ("model", "memory", "stream")}, handle)  # JSON is YAML
    cfg = build_config(model=base["config"]["model"]["name"], config_file=handle.name)
    Path(handle.name).unlink()
    return run_eval(base["benchmark"], data_root, cfg, output_dir=output, resume=True, progress=False,
                    protocol=base.get("protocol", "official"), parser_variant=base.get("parser_variant"),
                    answer_missing=False, tasks=base.get("tasks"), limit=base.get("limit"),
                    limit_questions=base.get("limit_questions"))
