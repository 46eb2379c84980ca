"""Opening a disk store after a crash: cut what a crash can leave, report damage (docs/ARCHITECTURE.md,
Memory, "Level 3's files"); with ``fix=False`` nothing is changed, everything only reported."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from hermes.tiers.errors import MemoryDamagedError
from hermes.tiers.files import fsync_dir, read_exact, write_bytes_atomic
from hermes.tiers.manifest import MANIFEST, SEGMENTS, SUFFIX, Entry, replay

QUARANTINE = "quarantine"


@dataclass
class Recovered:
    """The state of a store as its files describe it, after cutting crash leftovers."""

    entries: dict[int, Entry]  # live records by id, oldest first
    by_segment: dict[str, set[int]]  # live ids per segment holding any, oldest segment first
    seg_lines: dict[str, int]  # manifest-line bytes of the live records, per segment
    seg_sizes: dict[str, int]  # bytes of each segment file holding live records (after any cut)
    next_id: int  # one more than the largest record id the manifest has ever named
    next_segment: int  # number of the next segment file (never one the manifest named)
    manifest_size: int  # manifest bytes (after any cut)
    problems: list[str] = field(default_factory=list)  # damage found (a writable open refuses it)
    notes: list[str] = field(default_factory=list)  # crash leftovers (with ``fix``, cut into quarantine)


class Quarantine:
    """A fresh ``quarantine/<UTC stamp>-<pid>/`` folder, made on first use, that cut bytes move into."""

    def __init__(self, directory: Path) -> None:
        self.root = directory / QUARANTINE
        self.folder = self.root / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
        self.moved: list[str] = []

    def _ready(self) -> Path:
        if not self.folder.exists():
            self.folder.mkdir(parents=True)
            fsync_dir(self.root)
            fsync_dir(self.root.parent)
        return self.folder

    def move(self, path: Path, prefix: str = "") -> str:
        """Rename a whole file into quarantine (durably); returns where it went, relative."""
        target = self._ready() / (prefix + path.name)
        os.replace(path, target)
        fsync_dir(target.parent)
        fsync_dir(path.parent)
        return self._note(target)

    def copy(self, path: Path, prefix: str = "") -> str:
        """Copy a whole file into quarantine (durably) and leave it in place."""
        target = self._ready() / (prefix + path.name)
        shutil.copyfile(path, target)
        with open(target, "rb+") as f:
            os.fsync(f.fileno())
        fsync_dir(target.parent)
        return self._note(target)

    def cut(self, path: Path, keep: int, prefix: str = "") -> str:
        """Truncate `path` to `keep` bytes after saving the bytes beyond it as ``<name>.tail``."""
        size = path.stat().st_size
        target = self._ready() / f"{prefix}{path.name}.tail"
        write_bytes_atomic(target, read_exact(path, keep, size - keep))
        os.truncate(path, keep)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        return self._note(target)

    def _note(self, target: Path) -> str:
        rel = str(target.relative_to(self.root.parent))
        self.moved.append(rel)
        return rel


def quarantined_files(directory: Path) -> list[str]:
    """Files earlier opens or repairs moved into quarantine, relative to the directory."""
    root = directory / QUARANTINE
    return sorted(str(p.relative_to(directory)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _number(name: str) -> int | None:
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else ""
    return int(stem) if stem.isdigit() else None


def recover(directory: Path, fix: bool, min_next_id: int = 0, min_tail: tuple[str, int] | None = None) -> Recovered:
    """Replay the manifest, check it against the segment files, cut crash leftovers, find damage.

    Args:
        fix: Cut crash leftovers into quarantine, and refuse damage (False: report only).
        min_next_id: How far a checkpoint saw this manifest reach: a manifest ending before it has
            lost committed lines.
        min_tail: ``(segment, extent)`` a checkpoint saw committed (`DiskStore.committed_tail`): a
            manifest naming less of a segment that still holds those bytes has lost committed lines,
            although its unnamed bytes would look like a crash's tail (`min_next_id` alone misses
            this: the header's ``next_id`` counts ids handed to level 2).

    Returns:
        The recovered state.

    Raises:
        MemoryDamagedError: With ``fix``, damage was found (nothing was changed).
    """
    path, segdir = directory / MANIFEST, directory / SEGMENTS
    data = path.read_bytes() if path.exists() else b""
    state = replay(data, MANIFEST)
    problems, notes, actions = list(state.problems), [], []
    files = {p.name: p.stat().st_size for p in segdir.glob(f"*{SUFFIX}")} if segdir.exists() else {}
    if state.next_id < min_next_id:
        problems.append(f"a checkpoint saw records up to id {min_next_id - 1} committed, but {MANIFEST} ends "
                        f"before id {state.next_id} (lines were cut)")
    if min_tail is not None:
        seg, extent = min_tail
        named = state.extents.get(seg, 0)
        dropped_seg = seg in state.segments_named and not state.by_segment.get(seg)
        if named < extent <= files.get(seg, -1) and not dropped_seg:
            problems.append(f"a checkpoint saw records committed up to byte {extent} of {SEGMENTS}/{seg}, but "
                            f"{MANIFEST} names only {named} bytes of it (lines were cut)")
    if not path.exists() and any(files.values()):
        problems.append(f"{MANIFEST} is missing but {len(files)} segment file(s) hold records")

    def later(what: str) -> str:
        return what if fix else f"{what} on next open"

    if state.torn_bytes:
        notes.append(f"{MANIFEST}: torn tail of {state.torn_bytes} bytes after the last complete line "
                     f"({later('moved to quarantine')})")
        actions.append(("cut", path, state.good_end))
    lost = [e.record_id for e in state.entries.values() if e.offset + e.length > files.get(e.segment, -1)]
    for rid in lost:
        e = state.entries[rid]
        problems.append(f"record {rid}: its bytes in {SEGMENTS}/{e.segment} are missing "
                        f"(the storage lost them)")
    by_segment = {s: ids for s, ids in sorted(state.by_segment.items()) if ids}
    numbers = [n for n in (_number(x) for x in set(files) | state.segments_named) if n is not None]
    newest = max((n for n in (_number(x) for x in files) if n is not None), default=None)
    dropped = {s for s in state.segments_named if s not in by_segment}  # a drop line, or every record deleted
    seg_sizes: dict[str, int] = {}
    for name, size in sorted(files.items()):
        extent = state.extents.get(name, 0)
        is_newest = _number(name) == newest and (newest or 0) >= max(numbers, default=0)
        if name in dropped:
            notes.append(f"{SEGMENTS}/{name}: dropped by the manifest, never deleted ({later('deleted')})")
            actions.append(("unlink", segdir / name, 0))
            continue
        if size > extent:
            what = (f"{SEGMENTS}/{name}: {size - extent} bytes no manifest line names" if extent
                    else f"{SEGMENTS}/{name}: no manifest line names it ({size} bytes)")
            if is_newest:  # the segment being written when the process died: an uncommitted group
                notes.append(f"{what}, written but never committed ({later('moved to quarantine')})")
                actions.append(("cut", segdir / name, extent) if extent else ("move", segdir / name, 0))
            else:
                problems.append(f"{what}: the manifest is shorter than the segments it describes")
        if name in by_segment:
            seg_sizes[name] = extent if fix and size > extent else size
    tmp = directory / (MANIFEST + ".tmp")
    if tmp.exists():
        notes.append(f"{tmp.name}: an unfinished manifest rewrite ({later('moved to quarantine')})")
        actions.append(("move", tmp, 0))
    if fix and problems:
        raise MemoryDamagedError(
            f"memory directory {directory} is damaged ({problems[0]}"
            f"{f'; and {len(problems) - 1} more' if len(problems) > 1 else ''}); nothing was changed: "
            f"see `hermes-video memory verify {directory}`, then `hermes-video memory repair {directory}` "
            f"rebuilds what the segments hold and moves the rest to {QUARANTINE}/")
    if fix and actions:
        quarantine = Quarantine(directory)
        for kind, target, keep in actions:
            if kind == "cut":
                quarantine.cut(target, keep)
            elif kind == "move":
                quarantine.move(target)
            else:
                os.unlink(target)
        if segdir.exists():
            fsync_dir(segdir)
        fsync_dir(directory)
        if quarantine.moved:
            notes.append(f"moved to quarantine: {', '.join(quarantine.moved)}")
    for name in by_segment:
        seg_sizes.setdefault(name, files.get(name, 0))  # a live record's segment that is missing (damage)
    return Recovered(
        entries=state.entries, by_segment=by_segment,
        seg_lines={s: sum(state.line_bytes[i] for i in ids) for s, ids in by_segment.items()},
        seg_sizes=seg_sizes, next_id=state.next_id, next_segment=max(numbers, default=0) + 1,
        manifest_size=state.good_end if fix else state.size, problems=problems, notes=notes)
