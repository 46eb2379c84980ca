"""The manifest of a disk store: one JSON line per event, the truth of what is on disk (its format, torn
tails and damage: docs/ARCHITECTURE.md, Memory, "Level 3's files")."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from hermes.tiers.fingerprint import FORMAT

MANIFEST, SEGMENTS, SUFFIX = "manifest.jsonl", "segments", ".safetensors"
WAL = "dram"  # the host-memory log's folder inside a memory directory


def json_scalar(x: int | float | str) -> str:
    """``json.dumps(x)`` of one number or string, without the encoder's setup for ints and finite floats
    (a third of the time: a line names a dozen of them).
    """
    if type(x) is float and math.isfinite(x):
        return float.__repr__(x)  # what json writes for a finite float
    if type(x) is int:
        return int.__repr__(x)
    return json.dumps(x)  # strings, bools, NaN and infinities, float and int subclasses


@dataclass(frozen=True)
class Entry:
    """Where one committed record lives and what it is (an ``add`` line)."""

    record_id: int
    segment: str
    offset: int
    length: int
    sha256: str
    nbytes: int
    t_start_s: float
    t_end_s: float
    frame_start: int
    frame_end: int
    value: float
    kind: str
    storage: str
    tokens: tuple[int, ...]

    def line(self) -> bytes:
        """The manifest line (compact JSON plus newline); the same entry always gives the same bytes."""
        return self._line

    def obj(self) -> dict:
        """The line's object, as ``json.loads(self.line())`` gives it (an S3 manifest's entries)."""
        return {"op": "add", "id": self.record_id, "seg": self.segment, "off": self.offset, "len": self.length,
                "sha256": self.sha256, **self._record_obj()}

    def _record_obj(self) -> dict:
        """The record's own fields, in line order (a `placed` copy has the same)."""
        return {"nbytes": self.nbytes, "t": [self.t_start_s, self.t_end_s], "frames": [self.frame_start, self.frame_end],
                "value": self.value, "kind": self.kind, "storage": self.storage, "tokens": list(self.tokens)}

    @cached_property
    def _line(self) -> bytes:  # computed once: the writer asks for it several times
        # the bytes of json.dumps(every field, separators=(",", ":")), from the place (segment, offset,
        # length, checksum) and the record's own fields, which a `placed` copy shares (one dumps per record)
        return (f'{{"op":"add","id":{self.record_id},"seg":{json.dumps(self.segment)},"off":{self.offset},'
                f'"len":{self.length},"sha256":{json.dumps(self.sha256)},{self._record_fields}\n').encode()

    @cached_property
    def _record_fields(self) -> str:
        # `_record_obj` as json.dumps(..., separators=(",", ":")) writes it, without its "{" (a test
        # holds the two equal); formatted here because the encoder's setup cost more than the line
        j = json_scalar
        return (f'"nbytes":{j(self.nbytes)},"t":[{j(self.t_start_s)},{j(self.t_end_s)}],'
                f'"frames":[{j(self.frame_start)},{j(self.frame_end)}],"value":{j(self.value)},'
                f'{_line_tail(self.kind, self.storage, self.tokens)}')

    @classmethod
    def of(cls, record, segment: str, offset: int, length: int, digest: str) -> Entry:
        """The entry of a stored `Record` (as written) at `offset` of `segment`."""
        return cls(record.record_id, segment, offset, length, digest, record.nbytes(), record.t_start_s,
                   record.t_end_s, record.frame_start, record.frame_end, record.value, record.kind, record.storage,
                   tuple(record.num_tokens()))

    def placed(self, segment: str, offset: int, digest: str) -> Entry:
        """This entry at another place with another checksum (`dataclasses.replace`, without its cost)."""
        entry = Entry(self.record_id, segment, offset, self.length, digest, self.nbytes, self.t_start_s, self.t_end_s,
                      self.frame_start, self.frame_end, self.value, self.kind, self.storage, self.tokens)
        if "_record_fields" in self.__dict__:  # the same record: its part of the line is already formatted
            entry.__dict__["_record_fields"] = self._record_fields
        return entry

    @classmethod
    def from_obj(cls, obj: dict) -> Entry:
        """Parse an ``add`` line's object.

        Raises:
            KeyError, TypeError, ValueError: A field is missing or of the wrong type.
        """
        return cls(record_id=int(obj["id"]), segment=str(obj["seg"]), offset=int(obj["off"]),
                   length=int(obj["len"]), sha256=str(obj["sha256"]), nbytes=int(obj["nbytes"]),
                   t_start_s=float(obj["t"][0]), t_end_s=float(obj["t"][1]), frame_start=int(obj["frames"][0]),
                   frame_end=int(obj["frames"][1]), value=float(obj["value"]), kind=str(obj["kind"]),
                   storage=str(obj["storage"]), tokens=tuple(int(n) for n in obj["tokens"]))

    def summary(self) -> dict:
        """The entry as a dict for `inspect` output."""
        return {"id": self.record_id, "t": [self.t_start_s, self.t_end_s], "frames": [self.frame_start, self.frame_end],
                "segment": self.segment, "bytes": self.length, "nbytes": self.nbytes, "kind": self.kind,
                "storage": self.storage, "value": self.value, "tokens": sum(self.tokens)}


@lru_cache(maxsize=1024)
def _line_tail(kind: str, storage: str, tokens: tuple[int, ...]) -> str:
    """The end of an ``add`` line, from fields a stream's records share (a few token splits per stream)."""
    j = json_scalar
    return f'"kind":{j(kind)},"storage":{j(storage)},"tokens":[{",".join(map(j, tokens))}]}}'


def header_line(next_id: int) -> bytes:
    # json.dumps({"op": "header", "format": FORMAT, "next_id": n}, separators=(",", ":")) + "\n", formatted
    # directly: the disk writer's bound on its peak bytes asks for it once per record
    return f'{{"op":"header","format":{_FORMAT_JSON},"next_id":{int(next_id)}}}\n'.encode()


_FORMAT_JSON = json.dumps(FORMAT)


def drop_line(segment: str) -> bytes:
    return (json.dumps({"op": "drop", "seg": segment}, separators=(",", ":")) + "\n").encode()


def del_line(ids: list[int]) -> bytes:
    return (json.dumps({"op": "del", "ids": [int(i) for i in ids]}, separators=(",", ":")) + "\n").encode()


@dataclass
class Replay:
    """What a manifest says, after replaying it."""

    entries: dict[int, Entry] = field(default_factory=dict)  # live records by id, in the order added
    next_id: int = 0  # one more than the largest record id ever recorded
    good_end: int = 0  # byte offset just after the last good line (where a torn tail starts)
    size: int = 0  # the manifest's size in bytes as read
    problems: list[str] = field(default_factory=list)  # unreadable lines before the tail (skipped)
    segments_named: set[str] = field(default_factory=set)  # every segment any line names (never reused)
    by_segment: dict[str, set[int]] = field(default_factory=dict)  # live ids per segment
    line_bytes: dict[int, int] = field(default_factory=dict)  # manifest line length of each live entry
    extents: dict[str, int] = field(default_factory=dict)  # per segment: end of the furthest record ever added
    has_header: bool = False  # whether the first line is a header (every manifest we write starts with one)

    @property
    def torn_bytes(self) -> int:
        """Bytes after the last good line: a torn tail to cut."""
        return self.size - self.good_end


def replay(data: bytes, name: str = "manifest") -> Replay:
    """Replay manifest bytes into the live records.

    Args:
        name: How to name the file in problem messages.

    Returns:
        A `Replay`; a torn tail is left out, unreadable lines before it are reported and skipped.
    """
    out = Replay(size=len(data))
    pos, lineno = 0, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # no newline: the append was cut short (torn tail)
        end = nl + 1
        lineno += 1
        obj = _parse(data[pos:end])
        try:
            if obj is None:
                raise ValueError("not a manifest line")
            again = obj.get("op") == "add" and _parse_id(obj) in out.entries
            _apply(out, obj, end - pos)
            if again:  # the writer never names a live id twice: a copied line, or two writers
                out.problems.append(f"{name} line {lineno} adds record {_parse_id(obj)} a second time "
                                    f"(a duplicated line)")
            if lineno == 1 and obj.get("op") == "header":
                out.has_header = True
        except (KeyError, TypeError, ValueError, IndexError):
            out.problems.append(f"{name} line {lineno} is unreadable; skipped")
        out.good_end = end
        pos = end
    if data and not out.has_header:
        out.problems.append(f"{name} does not start with its header line (emptied, replaced or cut from the "
                            f"front)")
    return out


def _parse_id(obj: dict) -> int | None:
    try:
        return int(obj["id"])
    except (KeyError, TypeError, ValueError):
        return None


def _parse(line: bytes) -> dict | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "op" in obj else None


def _apply(out: Replay, obj: dict, length: int) -> None:
    op = obj["op"]
    if op == "add":
        entry = Entry.from_obj(obj)
        old = out.entries.pop(entry.record_id, None)  # re-adding an id moves it to the end
        if old is not None:
            out.by_segment[old.segment].discard(old.record_id)
        out.entries[entry.record_id] = entry
        out.line_bytes[entry.record_id] = length
        out.segments_named.add(entry.segment)
        out.by_segment.setdefault(entry.segment, set()).add(entry.record_id)
        out.extents[entry.segment] = max(out.extents.get(entry.segment, 0), entry.offset + entry.length)
        out.next_id = max(out.next_id, entry.record_id + 1)
    elif op == "drop":
        seg = str(obj["seg"])
        out.segments_named.add(seg)
        for rid in out.by_segment.pop(seg, set()):
            del out.entries[rid]
    elif op == "del":
        for rid in obj["ids"]:
            old = out.entries.pop(int(rid), None)
            if old is not None:
                out.by_segment[old.segment].discard(old.record_id)
    elif op == "header":
        out.next_id = max(out.next_id, int(obj["next_id"]))
    else:
        raise ValueError(f"unknown manifest op {op!r}")
