"""``hermes-video memory inspect | verify | repair DIR``: each returns the exit code (verify and repair 0
when the directory verifies, else 1); errors are a `hermes.errors.HermesError` printed on one line."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from hermes.errors import UsageError
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.fingerprint import FINGERPRINT
from hermes.tiers.remote_level import RemoteOptions
from hermes.tiers.s3 import S3Location, parse_location


def open_readonly(directory: str) -> MemoryDirectory:
    """A memory directory opened read-only (no lock, no repairs), or a one-line error; an ``s3://`` stream
    is reached through the AWS environment variables and read through a temporary cache.
    """
    location = parse_location(directory)
    if isinstance(location, S3Location):
        cache = tempfile.TemporaryDirectory(prefix="hermes-memory-inspect-")
        store = MemoryDirectory(location, None, 0, 0, readonly=True, remote=RemoteOptions(cache_dir=cache.name))
        store._inspect_cache = cache  # removed with the object, after close
        return store
    path = Path(directory)
    if not (path / FINGERPRINT).is_file():
        raise UsageError(f"{directory} is not a memory directory (no {FINGERPRINT}); expected what "
                         f"`hermes-video run ... --memory-dir DIR` writes")
    return MemoryDirectory(path, None, 0, 0, readonly=True)


def inspect_command(directory: str, records: int | None, as_json: bool) -> int:
    """Print what the directory holds (records, time spans, sizes, index state, checkpoints)."""
    store = open_readonly(directory)
    try:
        report = store.inspect(max_records=records)
    finally:
        store.close(spill_dram=False)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    for key, value in report.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"  {json.dumps(item, default=str)}")
        else:
            print(f"{key}: {json.dumps(value, default=str)}")
    return 0


def verify_command(directory: str, as_json: bool = False) -> int:
    """Check every checksum and every source of truth against the others.

    Args:
        directory: A memory directory or ``s3://bucket/prefix``.
        as_json: Print `MemoryDirectory.verify_report` as one JSON object, with ``directory`` and
            ``repair`` (the fixing command, or null) added; its keys are stable.

    Returns:
        0 when every check holds, 1 when anything is damaged, duplicated or disagrees.
    """
    store = open_readonly(directory)
    try:
        report = store.verify_report() if as_json else None
        ok, messages = (report["ok"], []) if report is not None else store.verify()
    finally:
        store.close(spill_dram=False)
    fix = None if ok else f"hermes-video memory repair {directory}"
    if report is not None:
        print(json.dumps({"directory": directory, **report, "repair": fix}, indent=2, default=str))
        return 0 if ok else 1
    for message in messages:
        print(message)
    if ok:
        print(f"{directory}: all checksums hold")
    else:
        print(f"{directory}: problems found; `{fix}` rebuilds what can be rebuilt and moves the rest (duplicates "
              f"included) to {directory}/quarantine", file=sys.stderr)
    return 0 if ok else 1


def repair_command(directory: str) -> int:
    """Repair the directory (`hermes.tiers.repair`), print each step, then verify it."""
    from hermes.tiers.repair import repair

    if isinstance(parse_location(directory), S3Location):
        raise UsageError(f"{directory}: repair works on local memory directories; an object store's objects are "
                         f"immutable and `memory verify` names any damaged one (never served)")
    open_readonly(directory).close(spill_dram=False)  # the same one-line error for a folder that is not ours
    report = repair(directory)
    for line in report.actions:
        print(line)
    for line in report.unfixable:
        print(f"not recoverable: {line}")
    print(f"records kept: {', '.join(f'{k} {v}' for k, v in report.records.items())}")
    return verify_command(directory)
