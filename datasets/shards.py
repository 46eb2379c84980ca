"""Splitting one benchmark run over several processes, GPUs or machines, and merging the parts.

`--shard i/n` (1-based) keeps every n-th video (stream) starting at the i-th, in the loader's
order, so the shards of a run are disjoint, cover every video, and balance long and short
videos about evenly. Each shard writes its own results folder; `runner.merge_shards` reads their
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
