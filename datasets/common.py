"""File, path and selection helpers shared by every benchmark loader.

Loaders differ in what their files say; they do not differ in how a data root is checked, how
an annotation file is found and read, how a video named in an annotation is found on disk (the
official archives do not always match their own annotations: `.MP4` for `.mp4`, `.mkv`, a
different folder), how a `tasks=` selection is validated, or how `limit` applies. That shared
part lives here so that every benchmark fails the same way, with the same one-line messages.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hermes.errors import SourceError, UsageError, closest

from .records import VideoRecord, normalize_options

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".npy", ".gif")
T = TypeVar("T")
# Off inside `annotations_only()`: loaders then read annotation files without any video on disk.
_REQUIRE_VIDEOS: contextvars.ContextVar[bool] = contextvars.ContextVar("require_videos", default=True)


@contextlib.contextmanager
def annotations_only() -> Iterator[None]:
    """Within this block loaders do not require any video on disk (`eval check`, load reports)."""
    token = _REQUIRE_VIDEOS.set(False)
    try:
        yield
    finally:
        _REQUIRE_VIDEOS.reset(token)
# How many flagged / excluded items a summary lists one by one (all of them are counted).
LISTED_ISSUES = 200


@dataclass
class DataIssues:
    """What a loader found wrong in an official file, and what it did about it (docs/ARCHITECTURE.md, Evaluation).

    The rule: a malformed field that scoring does not need (LVBench `time_reference`, a padded
    option) is kept and *flagged*; one that scoring needs (the answer, the options, the time a
    streaming question is asked) *excludes* that question from the denominator, with a reason;
    only an unreadable file is an error. Both lists name the file and the record.

    Attributes:
        flagged: {"where", "field", "value", "reason"} for each kept oddity.
        excluded: {"where", "reason"} for each question (or entry) left out.
    """

    flagged: list[dict] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)

    def flag(self, where: str, field_name: str, value: Any, reason: str) -> None:
        """Record a malformed field that is kept (scoring does not need it)."""
        self.flagged.append({"where": where, "field": field_name, "value": _short(value), "reason": reason})

    def exclude(self, where: str, reason: str) -> None:
        """Record a question (or a whole entry) left out of the denominator."""
        self.excluded.append({"where": where, "reason": reason})

    def guard(self, where: str, build: Callable[[], T]) -> T | None:
        """Run `build()`; a UsageError (a malformed field scoring needs) excludes it instead.

        Returns:
            What `build` returned, or None when it was excluded.
        """
        try:
            return build()
        except UsageError as exc:
            self.exclude(where, str(exc))
            return None

    def metadata(self, where: str, field_name: str, value: Any, parse: Callable[[Any], T]) -> T | None:
        """`parse(value)` for a field scoring does not need; a UsageError flags it and gives None."""
        try:
            return parse(value)
        except UsageError as exc:
            self.flag(where, field_name, value, str(exc))
            return None

    def to_json(self) -> dict:
        """Counts by reason and the first LISTED_ISSUES items of each kind, for summary.json."""
        def by_reason(items):
            counts: dict[str, int] = {}
            for item in items:
                # a field name, or the reason with its values and location left out
                key = item.get("field") or re.sub(r"'[^']*'|\"[^\"]*\"| in \S+\.jsonl?.*$", "...", item["reason"])[:80]
                counts[key] = counts.get(key, 0) + 1
            return counts

        return {"flagged": len(self.flagged), "excluded": len(self.excluded),
                "flagged_by_field": by_reason(self.flagged), "excluded_by_reason": by_reason(self.excluded),
                "flagged_items": self.flagged[:LISTED_ISSUES], "excluded_items": self.excluded[:LISTED_ISSUES]}


class Loaded(list):
    """The records a loader returns (a plain list), with the `DataIssues` met while reading them."""

    issues: DataIssues

    def __init__(self, records: Iterable[VideoRecord] = (), issues: DataIssues | None = None) -> None:
        super().__init__(records)
        self.issues = issues if issues is not None else DataIssues()


def _short(value: Any) -> Any:
    """A value as a summary shows it: long texts cut to 120 characters."""
    text = value if isinstance(value, (int, float, bool)) or value is None else str(value)
    return text[:117] + "..." if isinstance(text, str) and len(text) > 120 else text


def clean_options(raw: Sequence[Any], where: str, issues: DataIssues, expected: int | None = None) -> list[str]:
    """A question's candidates as the prompt shows them, with junk flagged.

    Padded candidates are stripped; empty ones are dropped when the others carry their letters
    in order ("A. x", "", "B. y": the letters in the text are what the official prompt shows and
    the answer names), kept otherwise; a count other than the template's is kept. Each case is
    flagged; none is fatal.

    Args:
        raw: The options as the file gives them.
        where: File and record, for the flag.
        issues: Where flags go.
        expected: How many options the official template shows (None: any number).

    Returns:
        The option texts, letter prefixes removed (see `records.normalize_options`).
    """
    texts = [str(o) for o in raw]
    if any(t != t.strip() for t in texts if t.strip()):
        issues.flag(where, "options", _short(texts), "padded candidate stripped")
    options = normalize_options(texts)
    if any(not t.strip() for t in texts):
        kept = [t for t in texts if t.strip()]
        lettered = normalize_options(kept)
        if kept and lettered != [t.strip() for t in kept]:  # the others are lettered A, B, ... in order
            options = lettered
            issues.flag(where, "options", _short(texts), "empty candidate dropped (the others carry their letters)")
        else:
            issues.flag(where, "options", _short(texts), "empty candidate kept")
    if expected is not None and len(options) != expected:
        issues.flag(where, "options", len(options), f"{len(options)} candidates where the template shows {expected}")
    return options


def first_file(root: Path, candidates: Iterable[str]) -> Path | None:
    """The first of `candidates` (paths relative to `root`) that is a file, or None."""
    return next((root / rel for rel in candidates if (root / rel).is_file()), None)


def find_file(root: Path, candidates: Sequence[str], what: str) -> Path:
    """Return the first of `candidates` (paths relative to `root`) that exists.

    Args:
        root: The data root.
        candidates: Relative paths in order of preference.
        what: What the file is, for the message.

    Returns:
        The path found.

    Raises:
        UsageError: If none exists.
    """
    path = first_file(root, candidates)
    if path is None:
        raise UsageError(f"expected {what} at {root / candidates[0]}, found nothing; download it into --data-root")
    return path


def _read_text(path: Path) -> str:
    """The file's text; an unreadable or non-UTF-8 file is a UsageError."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text; is it the annotation file?") from None


def read_json(path: Path, expect: type | tuple[type, ...] = (list, dict)) -> Any:
    """Read a JSON file whose top level must be of type `expect`.

    Raises:
        UsageError: If the file cannot be read, is not valid JSON, or has the wrong shape.
    """
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, expect):
        raise UsageError(f"expected {path} to hold a JSON {_names(expect)}, found a {type(data).__name__}")
    return data


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSON-lines file of objects, skipping blank lines.

    Raises:
        UsageError: If the file cannot be read or a line is not a JSON object.
    """
    rows = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{number} is not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise UsageError(f"expected a JSON object on {path}:{number}, found {type(row).__name__}")
        rows.append(row)
    return rows


def _names(types: type | tuple[type, ...]) -> str:
    """'list or dict' for (list, dict): JSON's names for Python types."""
    names = {list: "array", dict: "object", str: "string"}
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in types)


def require(entry: dict, key: str, where: str) -> Any:
    """Return `entry[key]`, or fail naming the entry.

    Raises:
        UsageError: If the key is missing (the annotation is not in the expected format).
    """
    if not isinstance(entry, dict) or key not in entry:
        raise UsageError(f"expected field {key!r} in {where}; is this the official annotation file?")
    return entry[key]


def optional_number(value: Any) -> float | None:
    """A value the annotation states as a number (a duration), as a float; None otherwise."""
    return float(value) if isinstance(value, (int, float)) else None


class VideoFinder:
    """Finds the file an annotation names, tolerating the official archives' inconsistencies.

    Tries, in order: the path as given (absolute, or relative to each search folder); then a
    file in a search folder with the same stem whatever its extension and case (Video-MME
    ships `.MP4` and `.mkv` files its annotations call `.mp4`; RVS ships `.npy` arrays).
    Folder listings are read once and cached.
    """

    def __init__(self, root: Path, folders: Iterable[str] = (".",)) -> None:
        """Args:
        root: The data root.
        folders: Folders (relative to `root`) to search, in order of preference.
        """
        self.root = root
        self.folders = [root / f for f in folders]
        self._listing: dict[Path, dict[str, list[Path]]] = {}

    def find(self, name: str, extra_folders: Iterable[Path] = ()) -> Path | None:
        """Locate the file named `name` in an annotation.

        Args:
            name: The annotation's path or file name ("./videos/x.mp4", "Ego4D/clips/x.mp4").
            extra_folders: Further folders to search first (e.g. one per task).

        Returns:
            The existing path, or None when the video is not on disk.
        """
        rel = str(name).strip().replace("\\", "/")
        while rel.startswith("./"):
            rel = rel[2:]
        folders = [*extra_folders, *self.folders]
        direct = Path(rel)
        if direct.is_absolute() and direct.exists():
            return direct
        for folder in folders:
            for candidate in (folder / rel, folder / direct.name):
                if candidate.exists():
                    return candidate
        stem = Path(rel).stem.casefold()
        wanted_suffix = Path(rel).suffix.casefold()
        for folder in folders:
            matches = self._stems(folder).get(stem, [])
            if matches:
                # Prefer the extension the annotation names, then the order of VIDEO_SUFFIXES.
                return min(matches, key=lambda p: (p.suffix.casefold() != wanted_suffix, _suffix_rank(p)))
        return None

    def _stems(self, folder: Path) -> dict[str, list[Path]]:
        """Files (and frame folders) of `folder` by lower-cased stem, listed once."""
        if folder not in self._listing:
            index: dict[str, list[Path]] = {}
            if folder.is_dir():
                for entry in folder.iterdir():
                    if entry.is_dir() or entry.suffix.casefold() in VIDEO_SUFFIXES:
                        index.setdefault(entry.stem.casefold(), []).append(entry)
            self._listing[folder] = index
        return self._listing[folder]


def _suffix_rank(path: Path) -> int:
    """Position of a path's extension in VIDEO_SUFFIXES (unknown last)."""
    suffix = path.suffix.casefold()
    return VIDEO_SUFFIXES.index(suffix) if suffix in VIDEO_SUFFIXES else len(VIDEO_SUFFIXES)


def normalize_tasks(tasks: str | Iterable[str] | None) -> list[str] | None:
    """Turn a `tasks=` argument ("EPM,ASI", ["EPM"], None) into a list of names or None."""
    if tasks is None:
        return None
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    names = [str(t).strip() for t in items if str(t).strip()]
    return names or None


def check_names(requested: list[str] | None, known: Iterable[str], kind: str = "task") -> list[str] | None:
    """Validate requested task names against the known ones.

    Raises:
        UsageError: On the first unknown name, with a suggestion.
    """
    if requested is None:
        return None
    known = sorted(set(known))
    for name in requested:
        if name not in known:
            close = closest(name, known)  # difflib
            hint = f"; did you mean {close!r}?" if close is not None else f"; known: {', '.join(known)}"
            raise UsageError(f"unknown {kind} {name!r}{hint}")
    return requested


def task_files(
    root: Path,
    benchmark: str,
    tasks: str | Iterable[str] | None,
    files: Mapping[str, Sequence[str]],
    aliases: Mapping[str, str],
    default: Iterable[str],
) -> Iterator[tuple[str, Path]]:
    """The annotation file of each selected task, for benchmarks with one file per task.

    The selection is checked at once; files are looked for one at a time, as the loader asks
    for them, so a task is read before the next one's file is looked for. A task named in
    `tasks` whose file is missing is an error; a default task's missing file is skipped
    (a partial download evaluates the tasks that are present).

    Args:
        root: The data root.
        benchmark: Benchmark name, for the message.
        tasks: The `tasks=` argument; None selects `default`.
        files: Every task name, with its file's candidate paths relative to `root` (the
            first is the one a message names).
        aliases: Other accepted names (file stems), each with the task name it stands for.
        default: The tasks read when `tasks` is None.

    Returns:
        (task name, file) pairs, each task once, in the order asked for.

    Raises:
        UsageError: On an unknown task name, or a requested task's file missing.
    """
    wanted = check_names(normalize_tasks(tasks), [*files, *aliases])
    names = list(default) if wanted is None else list(dict.fromkeys(aliases.get(w, w) for w in wanted))

    def existing() -> Iterator[tuple[str, Path]]:  # a generator: each file looked for when it is read
        for name in names:
            path = first_file(root, files[name])
            if path is not None:
                yield name, path
            elif wanted is not None:
                raise UsageError(f"{benchmark}: expected {root / files[name][0]} for task {name!r}, found nothing")

    return existing()


def check_limit(limit: int | None, flag: str) -> None:
    """A selection limit is None (no limit) or a positive integer.

    Raises:
        UsageError: anything else, naming the command-line `flag` it came from.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(f"expected {flag} to be a positive integer, found {limit!r}")


def make_loader(benchmark: str, read: Callable[[Path, str | Iterable[str] | None, DataIssues], list[VideoRecord]],
                known: Iterable[str] | None = None, select: bool = True) -> Callable[..., Loaded]:
    """A benchmark's `load(data_root, tasks=None, limit=None)`: the frame every loader shares.

    The loader checks the data root, reads, then selects: a question is kept when its task or one of
    its group labels (`BenchmarkQuestion.labels`) was requested, videos left without questions are
    dropped, and `limit` keeps the first N videos (streams) in file order.

    Args:
        benchmark: Benchmark name, for messages.
        read: `read(root, tasks, issues)`: the records of the checked data root, in file order;
            what it flags or excludes goes to `issues`.
        known: Every valid task/group name when the benchmark defines them up front; otherwise the
            names found in the data are the valid ones.
        select: False when `read` applies `tasks` itself (by choosing files).

    Returns:
        The loader.
    """

    def load(data_root: str | os.PathLike, tasks: str | Iterable[str] | None = None,
             limit: int | None = None) -> Loaded:
        """Load the benchmark: one VideoRecord per video (stream), questions sorted by time.

        Args:
            data_root: The benchmark's folder (annotations and videos; its module names the files).
            tasks: Task or group names to keep (its module lists them); None keeps the default.
            limit: Keep at most this many videos.

        Returns:
            The records in file order, with `.issues`.

        Raises:
            UsageError: The data root is not a directory; missing or malformed annotations, unknown task
                names, a bad limit, nothing selected.
            SourceError: Not one selected video is on disk (the data root is probably wrong).
        """
        root = Path(data_root).expanduser()
        if not root.is_dir():
            raise UsageError(f"{benchmark}: --data-root {root} is not a directory; point it at the folder "
                             "holding the benchmark's annotation files")
        issues = DataIssues()
        records = read(root, tasks, issues)
        check_limit(limit, "--limit")
        wanted = normalize_tasks(tasks) if select else None
        if wanted is not None:
            found = {label for r in records for q in r.questions for label in q.labels}
            check_names(wanted, found if known is None else found.union(known))
            for record in records:
                record.questions = [q for q in record.questions if set(wanted).intersection(q.labels)]
            records = [r for r in records if r.questions]
        records = records if limit is None else records[:limit]
        if not records and issues.excluded:
            first = issues.excluded[0]
            raise UsageError(f"{benchmark}: all {len(issues.excluded)} malformed questions were excluded and none "
                             f"is left; first: {first['where']}: {first['reason']}")
        if not records:
            raise UsageError(f"{benchmark}: no questions selected; check --data-root and the task names")
        if _REQUIRE_VIDEOS.get() and not any(r.available for r in records):
            raise SourceError(f"{benchmark}: none of the {len(records)} videos was found under the data root "
                              f"(first: {records[0].video_id}); download the videos or fix --data-root")
        return Loaded(records, issues)

    return load


def first_questions(records: list[VideoRecord], limit: int | None) -> list[VideoRecord]:
    """The first `limit` questions in file order (lmms-eval's `--limit` counts samples; ours, videos).

    Args:
        records: Selected videos, in file order; the last one kept is cut to its first questions.
        limit: How many questions to keep; None keeps all.

    Returns:
        The videos holding those questions.

    Raises:
        UsageError: A limit that is not a positive integer.
    """
    check_limit(limit, "--limit-questions")
    if limit is None:
        return records
    kept = []
    for record in records:
        if limit <= 0:
            break
        record.questions = record.questions[:limit]  # as the loader selects: its records are this run's own
        limit -= len(record.questions)
        kept.append(record)
    return kept


def missing_videos(records: Iterable[VideoRecord]) -> list[str]:
    """Ids of the videos that are not on disk (their questions will count as missing)."""
    return [r.video_id for r in records if not r.available]
