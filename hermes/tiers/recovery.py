"""Opening a disk store after a crash: what a crash can leave behind, and how each leftover is cut.

The writer's order (record bytes, fsync; manifest line, fsync; drop line, fsync, then unlink)
means a crash can leave only these, none of which loses a committed record:

- a torn manifest tail: a last line without its newline, or not valid JSON (the append was cut);
  everything after the last good line is truncated;
- bytes at the end of a segment that no line names (written, never committed): truncated;
- a segment file no live record uses: created and never committed, or dropped by a durable
  ``drop`` line whose unlink never happened: deleted;
- ``manifest.jsonl.tmp``: a compaction that never reached its rename (the old manifest stands):
  deleted.

Anything else is damage, not a crash: a line in the middle that does not parse (skipped,
reported), or a committed record whose bytes are missing (the storage lost them: reported, and
removed from the manifest with a ``del`` line by the caller). With ``fix=False`` (read-only
inspection) nothing is changed and the leftovers are only reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hermes.tiers.files import fsync_dir
from hermes.tiers.manifest import MANIFEST, SEGMENTS, SUFFIX, Entry, replay


@dataclass
class Recovered:
    """The state of a store as its files describe it, after cutting crash leftovers.

    Attributes:
        entries: Live records by id, oldest first.
        by_segment: Live ids per segment name, oldest segment first (only segments with records).
        seg_lines: Manifest-line bytes of the live records, per segment.
        seg_sizes: Bytes of each segment file holding live records (after any cut).
        next_id: One more than the largest record id the manifest has ever named.
        next_segment: Number for the next segment file (never reusing one the manifest named).
        manifest_size: Manifest bytes (after any cut).
        lost: Ids of committed records whose bytes are missing (to be deleted from the manifest).
        problems: Damage found.
        notes: Crash leftovers found (and cut, with ``fix``).
    """

    entries: dict[int, Entry]
    by_segment: dict[str, set[int]]
    seg_lines: dict[str, int]
    seg_sizes: dict[str, int]
    next_id: int
    next_segment: int
    manifest_size: int
    lost: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def recover(directory: Path, fix: bool) -> Recovered:
    """Replay the manifest, check it against the segment files, and cut crash leftovers.

    Args:
        directory: The store's directory.
        fix: Truncate and delete leftovers (False: report only).

    Returns:
        The recovered state.
    """
    path, segdir = directory / MANIFEST, directory / SEGMENTS
    data = path.read_bytes() if path.exists() else b""
    state = replay(data, MANIFEST)
    problems, notes = list(state.problems), []

    def later(what: str) -> str:
        return what if fix else f"{what} on next open"

    if state.torn_bytes:
        notes.append(f"{MANIFEST}: torn tail of {state.torn_bytes} bytes after the last committed line "
                     f"({later('cut')})")
        if fix:
            os.truncate(path, state.good_end)
    files = {p.name: p.stat().st_size for p in segdir.glob(f"*{SUFFIX}")} if segdir.exists() else {}
    lost = [e.record_id for e in state.entries.values() if e.offset + e.length > files.get(e.segment, -1)]
    for rid in lost:
        e = state.entries.pop(rid)
        state.by_segment[e.segment].discard(rid)
        problems.append(f"record {rid}: its bytes in {SEGMENTS}/{e.segment} are missing "
                        f"({'removed from the manifest' if fix else 'needs repair'})")
    by_segment = {s: ids for s, ids in sorted(state.by_segment.items()) if ids}
    seg_sizes: dict[str, int] = {}
    changed = False
    for name, size in sorted(files.items()):
        ids = by_segment.get(name)
        if not ids:
            notes.append(f"{SEGMENTS}/{name}: no committed record uses it ({later('deleted')})")
            if fix:
                os.unlink(segdir / name)
                changed = True
            continue
        end = max(state.entries[i].offset + state.entries[i].length for i in ids)
        if size > end:
            notes.append(f"{SEGMENTS}/{name}: {size - end} bytes after the last committed record ({later('cut')})")
            if fix:
                os.truncate(segdir / name, end)
                changed = True
        seg_sizes[name] = end if fix else size
    tmp = directory / (MANIFEST + ".tmp")
    if tmp.exists():
        notes.append(f"{tmp.name}: an unfinished manifest rewrite ({later('deleted')})")
        if fix:
            tmp.unlink()
            changed = True
    if changed:
        fsync_dir(segdir)
        fsync_dir(directory)
    numbers = [int(n[: -len(SUFFIX)]) for n in set(files) | state.segments_named if n[: -len(SUFFIX)].isdigit()]
    return Recovered(
        entries=state.entries, by_segment=by_segment,
        seg_lines={s: sum(state.line_bytes[i] for i in ids) for s, ids in by_segment.items()},
        seg_sizes=seg_sizes, next_id=state.next_id, next_segment=max(numbers, default=0) + 1,
        manifest_size=state.good_end if fix else state.size, lost=lost, problems=problems, notes=notes)
