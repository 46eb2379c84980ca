"""The results folder of one evaluation: `run.json` (what the run is; `--resume` refuses another run's
folder), `samples.jsonl` (one fsynced line per answer, so a crash loses at most the line being written;
the last line of a qid wins), and `summary.json`, `report.md` and plots, rewritten atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hermes.errors import UsageError

MANIFEST_FILE = "run.json"
SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text`: readers see the old or the new file, never a mix.

    Raises:
        UsageError: If the folder is not writable.
    """
    from hermes.tiers.files import write_bytes_atomic

    try:
        write_bytes_atomic(path, text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}; choose a writable --output") from None


def _normalized(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _first_difference(old: Any, new: Any, where: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    return None if old == new else (where or "<root>")


class SampleLog:
    """The per-sample results of one run, read back on resume and appended as the run goes.

    Attributes:
        path: The `samples.jsonl` file.
        samples: Every sample read or written, by qid (the last line of a qid wins).
        reused: How many samples were read back from an earlier run.
        repaired_bytes: Size of the torn tail cut off on open (0 when the file was intact).
    """

    def __init__(self, path: Path, samples: dict[str, dict], repaired_bytes: int) -> None:
        self.path = path
        self.samples = samples
        self.reused = len(samples)
        self.repaired_bytes = repaired_bytes
        self._handle = path.open("ab")

    @classmethod
    def open(cls, output_dir: str | os.PathLike, manifest: dict, resume: bool) -> SampleLog:
        """The log of `output_dir` (created), with earlier samples when `resume`; `manifest` identifies the run.

        Raises:
            UsageError: The folder cannot be created; it holds results and `resume` is off; it
                holds results of a different run; or a line before the last is not JSON.
        """
        folder = Path(output_dir).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create --output {folder}: {exc.strerror or exc}") from None
        samples_path = folder / SAMPLES_FILE
        manifest_path = folder / MANIFEST_FILE
        has_samples = samples_path.is_file() and samples_path.stat().st_size > 0
        if has_samples and not resume:
            raise UsageError(
                f"{folder} already holds results ({SAMPLES_FILE}); pass --resume to continue that run "
                "or choose a new --output"
            )
        manifest = _normalized(manifest)
        if resume and manifest_path.is_file():
            if _check_same_run(manifest_path, manifest):  # a new --limit extends (or narrows) the same run
                write_atomic(manifest_path, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        elif resume and has_samples:
            raise UsageError(f"{folder} has {SAMPLES_FILE} but no {MANIFEST_FILE}; it was not written by this tool")
        else:
            write_atomic(manifest_path, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        samples, repaired = _read_samples(samples_path) if has_samples else ({}, 0)
        return cls(samples_path, samples, repaired)

    def append(self, sample: dict) -> None:
        """Write one sample (with a "qid") as one line, durable before returning."""
        line = json.dumps(sample, ensure_ascii=False, allow_nan=False) + "\n"
        # One write per line: a crash leaves either the whole line or a torn tail without "\n".
        self._handle.write(line.encode("utf-8"))
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.samples[sample["qid"]] = sample

    def close(self) -> None:
        """Close the file; further appends fail."""
        self._handle.close()

    def __enter__(self) -> SampleLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# Manifest keys that say how much of a run to do, not which run it is: resuming with another value
# continues the same samples (the loader's order is fixed, so a larger --limit only adds videos).
EXTENT_KEYS = ("limit", "limit_questions")


def _check_same_run(manifest_path: Path, manifest: dict) -> bool:
    """Refuse to resume a different run; whether the extent (`EXTENT_KEYS`) differs (rewrite the manifest)."""
    try:
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {manifest_path} ({exc}); start a new run with another --output") from None
    identity = {k: v for k, v in old.items() if k not in EXTENT_KEYS}
    differing = _first_difference(identity, {k: v for k, v in manifest.items() if k not in EXTENT_KEYS})
    if differing:
        raise UsageError(
            f"--resume: {manifest_path.parent} holds a run with a different {differing}; "
            "resume with the same settings or choose a new --output"
        )
    return any(old.get(k) != manifest.get(k) for k in EXTENT_KEYS)


def _read_samples(path: Path) -> tuple[dict[str, dict], int]:
    """(samples by qid, bytes cut off) of `samples.jsonl`; a torn last line (no newline) is cut off.

    Raises:
        UsageError: A complete line is not a JSON object with a "qid" (the file was edited).
    """
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    torn = len(data) - keep
    if torn:  # cut now, so the next append starts on a fresh line
        with path.open("r+b") as handle:
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
    samples: dict[str, dict] = {}
    for number, line in enumerate(data[:keep].splitlines(), 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UsageError(f"{path}:{number} is not valid JSON; the file was modified, start a new run") from None
        if not isinstance(sample, dict) or "qid" not in sample:
            raise UsageError(f"{path}:{number} is not a sample (no 'qid'); start a new run")
        samples[sample["qid"]] = sample
    return samples, torn
