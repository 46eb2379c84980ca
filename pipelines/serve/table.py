"""The stream table: the spec of every open stream, kept under the memory root so that a restarted server
(or another replica) opens the same streams again without their clients (docs/ARCHITECTURE.md, Serving).

One JSON object per stream, ``ROOT/_streams/NAME.json`` in a folder (temp file, fsync, rename) or the
key ``PREFIX/_streams/NAME.json`` in an object store (one PUT), reached with the ``memory.s3_*`` settings
and AWS environment variables the memory directory uses. Stream names start with a letter or digit, so
``_streams`` is never a stream's own directory. A spec holds the source as the client gave it: it stays in
the store, never in a response or a log line.
"""

from __future__ import annotations

import json
from typing import Any

from hermes.errors import HermesError
from hermes.tiers.objects import LocalObjects, ObjectStore
from hermes.tiers.s3 import S3Location, S3Objects, S3Settings, parse_location

FOLDER = "_streams"
SPEC_KEYS = ("source", "memory", "fps", "name", "watches")


class DamagedSpec(HermesError):
    """A saved spec that is not a stream spec; it is reported and left in place for its owner to look at."""


class StreamTable:
    """Saved stream specs by name (see the module docstring).

    Args:
        memory_root: the server's ``--memory-root``: a folder or ``s3://bucket/prefix``.
        s3: how to reach an ``s3://`` root (None: the environment's defaults).
        objects: a store to use instead (tests).

    Raises:
        UsageError: an ``s3://`` root that does not parse, or boto3 missing.
    """

    def __init__(self, memory_root: str, s3: S3Settings | None = None, objects: ObjectStore | None = None) -> None:
        if objects is None:
            location = parse_location(memory_root, flag="--memory-root")
            objects = S3Objects(location.child(FOLDER), s3) if isinstance(location, S3Location) \
                else LocalObjects(location / FOLDER)
        self.objects = objects

    def put(self, name: str, spec: dict[str, Any]) -> None:
        """Save (or replace) stream `name`'s spec in one atomic write.

        Raises:
            StorageError: the store refused the write.
        """
        self.objects.put(f"{name}.json", json.dumps(spec, ensure_ascii=False, sort_keys=True).encode())

    def get(self, name: str) -> dict[str, Any] | None:
        """Stream `name`'s spec, or None if none is saved.

        Raises:
            DamagedSpec: the saved object is not a stream spec (it is kept).
            StorageError: the store cannot be read.
        """
        got = self.objects.get(f"{name}.json")
        if got is None:
            return None
        try:
            spec = json.loads(got[0])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DamagedSpec(f"the saved spec of stream {name!r} ({FOLDER}/{name}.json) is not JSON "
                              f"({type(exc).__name__}); it is left in place") from None
        if not isinstance(spec, dict) or set(spec) != set(SPEC_KEYS) or spec["name"] != name \
                or not isinstance(spec["source"], str) or not isinstance(spec["watches"], list) \
                or not all(isinstance(w, dict) for w in spec["watches"]):
            raise DamagedSpec(f"the saved spec of stream {name!r} ({FOLDER}/{name}.json) is not a stream spec; "
                              f"it is left in place")
        return spec

    def remove(self, name: str) -> None:
        """Forget stream `name` (nothing if it is not saved)."""
        self.objects.delete(f"{name}.json")

    def names(self) -> list[str]:
        """The saved streams' names, sorted."""
        return sorted(key[:-len(".json")] for key in self.objects.keys("") if key.endswith(".json")
                      and "/" not in key)

    def problem(self) -> str | None:
        """Why the table cannot be read now (a missing bucket, an endpoint down), else None (`/readyz`)."""
        try:
            self.objects.get(".probe")
        except HermesError as exc:
            return " ".join(str(exc).split())
        return None
