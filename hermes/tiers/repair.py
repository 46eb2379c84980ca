"""``hermes-video memory repair DIR``: rebuild what a damaged memory directory's files still hold, deleting
nothing, reporting every step (docs/ARCHITECTURE.md, Memory, "Repair")."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hermes.tiers import checkpoint
from hermes.tiers.codec import scan_segment
from hermes.tiers.directory import MemoryDirectory
from hermes.tiers.disk import LOCK
from hermes.tiers.errors import MemoryDirError, storage_error
from hermes.tiers.files import lock_directory, read_exact, sha256, write_bytes_atomic
from hermes.tiers.fingerprint import FINGERPRINT
from hermes.tiers.index import INDEX, INDEX_META
from hermes.tiers.meaning import meaning_problem
from hermes.tiers.manifest import MANIFEST, SEGMENTS, SUFFIX, WAL, Entry, del_line, header_line, replay
from hermes.tiers.recovery import Quarantine
from hermes.tiers.records import identity

@dataclass
class RepairReport:
    """What `repair` did: ``actions`` (one line each), the records kept, and what it could not fix."""

    actions: list[str] = field(default_factory=list)
    records: dict[str, int] = field(default_factory=dict)  # kept per store: {"disk": n, "dram": m}
    unfixable: list[str] = field(default_factory=list)


@dataclass
class StorePlan:
    """One store's manifest as `rebuild_store` rebuilt it from the segments, before it is written."""

    directory: Path
    label: str  # "" for level 3, "dram/" for level 2's log
    entries: list[Entry]
    deleted: set[int]
    next_id: int
    identities: dict[int, tuple]  # id -> `records.identity` of each readable record that has one


def rebuild_store(directory: Path, quarantine: Quarantine, report: RepairReport, label: str) -> StorePlan:
    """Rebuild one store's manifest from its segments (written by `write_store`); cuts unreadable tails
    and copies unreadable records into quarantine."""
    segdir, path = directory / SEGMENTS, directory / MANIFEST
    prefix = label.replace("/", "-")  # quarantine names: dram-manifest.jsonl beside manifest.jsonl
    try:
        fingerprint = json.loads((directory / FINGERPRINT).read_text())
    except (OSError, ValueError):
        fingerprint = {}  # a log without its own copy: shapes are checked against nothing
    old = replay(path.read_bytes()) if path.exists() else replay(b"")
    # segments the old manifest emptied on purpose (a drop line, or every record deleted)
    dropped = {s for s in old.segments_named if s in old.extents and not old.by_segment.get(s)}
    entries: list[Entry] = []
    seen: set[int] = set()
    corrupt: set[int] = set()
    identities: dict[int, tuple] = {}
    next_id = old.next_id

    def leave_out(rid: int, data: bytes, why: str) -> None:
        corrupt.add(rid)
        bad = directory / f"record-{rid}{SUFFIX}"
        write_bytes_atomic(bad, data)
        report.actions.append(f"{label}{why}; left out, its bytes copied to {quarantine.move(bad, prefix)}")

    for seg in sorted(segdir.glob(f"*{SUFFIX}")) if segdir.exists() else []:
        if seg.name in dropped:
            report.actions.append(f"{label}{SEGMENTS}/{seg.name}: dropped by the manifest; moved to "
                                  f"{quarantine.move(seg, prefix)}")
            continue
        data = seg.read_bytes()
        named = {e.offset: e for e in old.entries.values() if e.segment == seg.name}
        found, end = scan_segment(data, {off: e.length for off, e in named.items()})
        for offset, length, record in found:
            digest = sha256(data[offset:offset + length])
            if record is None:  # unparseable where the old manifest names a record: keep the line, delete it
                entry = named[offset]
                leave_out(entry.record_id, data[offset:offset + length], f"record {entry.record_id}: unreadable")
                entries.append(entry)
                seen.add(entry.record_id)
                continue
            known = old.entries.get(record.record_id)
            next_id = max(next_id, record.record_id + 1)
            if known is not None and (known.segment, known.offset) == (seg.name, offset) and known.sha256 != digest:
                leave_out(record.record_id, data[offset:offset + length],
                          f"record {record.record_id}: fails its checksum")
                # named and then deleted, so the segment stays fully described; its bytes are in quarantine
                entries.append(Entry.of(record, seg.name, offset, length, digest))
                seen.add(record.record_id)
                continue
            if record.record_id in seen:
                continue
            seen.add(record.record_id)
            entries.append(Entry.of(record, seg.name, offset, length, digest))
            problem = meaning_problem(record, fingerprint)
            if problem is not None:  # sound bytes that mean something else: named, deleted, kept in quarantine
                leave_out(record.record_id, data[offset:offset + length], problem)
                continue
            if identity(record) is not None:
                identities[record.record_id] = identity(record)
        if end < len(data):
            report.actions.append(f"{label}{SEGMENTS}/{seg.name}: {len(data) - end} unreadable bytes after its "
                                  f"last record; moved to {quarantine.cut(seg, end, prefix)}")
    deleted = set(corrupt)
    if old.has_header and not old.problems:  # an intact manifest's del lines stay in force
        deleted |= {e.record_id for e in entries if e.record_id not in old.entries
                    and e.offset + e.length <= old.extents.get(e.segment, -1)}
    missing = sorted(set(old.entries) - {e.record_id for e in entries} - corrupt)
    for rid in missing:
        report.unfixable.append(f"{label}record {rid}: named by the manifest but its bytes are gone; "
                                f"left out")
    return StorePlan(directory, label, entries, deleted, next_id, identities)


def quarantine_duplicates(plans: list[StorePlan], quarantine: Quarantine, report: RepairReport) -> None:
    """Mark every copy of an eviction stored more than once as deleted, its bytes copied to quarantine;
    the lowest id is kept (an id in both stores, a crash between their commits, is one record)."""
    holders: dict[tuple, list[tuple[int, StorePlan]]] = {}
    for plan in plans:
        for rid, key in plan.identities.items():
            if rid not in plan.deleted:
                holders.setdefault(key, []).append((rid, plan))
    for key, held in holders.items():
        keep = min(rid for rid, _ in held)
        for rid, plan in held:
            if rid == keep:
                continue
            entry = next(e for e in plan.entries if e.record_id == rid)
            copy = plan.directory / f"duplicate-{rid}{SUFFIX}"
            write_bytes_atomic(copy, read_exact(plan.directory / SEGMENTS / entry.segment, entry.offset, entry.length))
            plan.deleted.add(rid)
            report.actions.append(f"{plan.label}record {rid}: a second copy of record {keep} (frames "
                                  f"{key[0]}..{key[1]}, the eviction at frame {key[3]}); left out, its bytes copied to "
                                  f"{quarantine.move(copy, plan.label.replace('/', '-'))}")


def write_store(plan: StorePlan, quarantine: Quarantine, report: RepairReport) -> None:
    """Write a rebuilt manifest (the old one copied into quarantine first)."""
    directory, label, entries, deleted = plan.directory, plan.label, plan.entries, plan.deleted
    path, prefix = directory / MANIFEST, label.replace("/", "-")
    body = header_line(plan.next_id) + b"".join(e.line() for e in entries)
    if deleted:
        body += del_line(sorted(deleted))
    if path.exists():
        report.actions.append(f"{label}{MANIFEST}: old copy moved to {quarantine.copy(path, prefix)}")
    write_bytes_atomic(path, body)
    kept = len(entries) - len(deleted)
    report.actions.append(f"{label}{MANIFEST}: rebuilt from the segments with {kept} record(s)")
    report.records[label.rstrip("/ ") or "disk"] = kept
    tmp = directory / (MANIFEST + ".tmp")
    if tmp.exists():
        report.actions.append(f"{label}{tmp.name}: moved to {quarantine.move(tmp, prefix)}")


def repair(directory: str | Path) -> RepairReport:
    """Repair a memory directory in place (docs/ARCHITECTURE.md, Memory, "Repair").

    Raises:
        MemoryDirError: Not a memory directory, or in use by another process.
        StorageError: The directory cannot be written.
    """
    directory = Path(directory)
    if not (directory / FINGERPRINT).is_file():
        raise MemoryDirError(f"{directory} is not a memory directory (no {FINGERPRINT}); nothing to repair")
    try:
        fd, other = lock_directory(directory, directory / LOCK)
    except OSError as exc:
        raise storage_error(directory, "locking", exc) from exc
    if fd is None:
        raise MemoryDirError(f"memory directory {directory} is in use by process {other or '?'}; stop it first")
    report = RepairReport()
    try:
        quarantine = Quarantine(directory)
        settle_fingerprints(directory, quarantine, report)
        plans = {"disk": rebuild_store(directory, quarantine, report, "")}
        if (directory / WAL / SEGMENTS).is_dir():
            plans["dram"] = rebuild_store(directory / WAL, quarantine, report, f"{WAL}/")
        quarantine_duplicates(list(plans.values()), quarantine, report)
        for plan in plans.values():
            write_store(plan, quarantine, report)
        next_ids = {store: plan.next_id for store, plan in plans.items()}
        for name in (INDEX, INDEX_META):
            if (directory / name).exists():
                report.actions.append(f"{name}: moved to {quarantine.move(directory / name)}")
        folder = directory / checkpoint.CHECKPOINTS
        for info_path in sorted(folder.glob("*.json")) if folder.exists() else []:
            reason = None
            try:
                _, meta = checkpoint.load_checkpoint(directory, info_path.stem)
                claimed = (meta.get("store") or {})
                for store, key in (("disk", "disk_next_id"), ("dram", "dram_next_id")):
                    if int(claimed.get(key, 0)) > next_ids.get(store, 0):
                        reason = (f"it claims {store} records up to id {int(claimed[key]) - 1}, the store now "
                                  f"ends before id {next_ids.get(store, 0)}")
            except (MemoryDirError, KeyError, ValueError, TypeError) as exc:
                reason = str(exc)
            if reason is not None:
                file = (checkpoint.read_info(info_path) or {}).get("file")
                moved = [quarantine.move(info_path)]
                if file and (folder / str(file)).exists():
                    moved.append(quarantine.move(folder / str(file)))
                report.actions.append(f"checkpoint {info_path.stem!r}: {reason}; moved to {', '.join(moved)} "
                                      f"(the next run starts the stream afresh)")
        rebuild_index(directory, report)
        (directory / LOCK).unlink(missing_ok=True)
    except OSError as exc:
        raise storage_error(directory, "repairing", exc) from exc
    finally:
        os.close(fd)
    return report


def rebuild_index(directory: Path, report: RepairReport) -> None:
    """Build and save the FAISS index from the repaired records (a read-only open derives it)."""
    md = MemoryDirectory(directory, None, 0, 0, readonly=True)
    try:
        md._save_index()
        report.actions.append(f"{INDEX}: rebuilt from the {len(md.index)} record(s) of level 3")
    finally:
        md.close(spill_dram=False)


def settle_fingerprints(directory: Path, quarantine: Quarantine, report: RepairReport) -> None:
    """When ``fingerprint.json`` and the log's copy disagree, keep the one the records agree with
    (`hermes.tiers.meaning`), the other copied to quarantine; if the records cannot tell, report it.
    """
    copies = [directory / FINGERPRINT, directory / WAL / FINGERPRINT]
    try:
        texts = [json.loads(p.read_text()) for p in copies]
    except (OSError, ValueError):
        return  # no log, or a copy that does not parse: verify names it
    if texts[0] == texts[1]:
        return
    records = []
    for store in (directory, directory / WAL):
        for seg in sorted((store / SEGMENTS).glob(f"*{SUFFIX}")):
            records += [r for _, _, r in scan_segment(seg.read_bytes())[0] if r is not None]
    fails = [sum(meaning_problem(r, fp) is not None for r in records) for fp in texts]
    checks = [isinstance(fp.get("kv"), dict) for fp in texts]
    if not all(checks) or fails[0] == fails[1]:
        report.unfixable.append(f"{FINGERPRINT} and {WAL}/{FINGERPRINT} disagree and the records cannot tell which "
                                f"is theirs; put the right one in both places")
        return
    good, bad = (0, 1) if fails[0] < fails[1] else (1, 0)
    moved = quarantine.copy(copies[bad], "dram-" if bad else "")
    write_bytes_atomic(copies[bad], copies[good].read_bytes())
    report.actions.append(f"{copies[bad].relative_to(directory)}: replaced by {copies[good].relative_to(directory)}, "
                          f"which the records agree with ({fails[bad]} of {len(records)} disagree with it); "
                          f"old copy in {moved}")
