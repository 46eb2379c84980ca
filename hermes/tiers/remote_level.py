"""One ``s3://`` stream as `hermes.tiers.directory.MemoryDirectory` holds it: connection, lease, stream
marker, local folder (cache, index, checkpoint copies) and the checkpoints kept in the store
(docs/ARCHITECTURE.md, Memory, "Level 3 in an object store")."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from hermes.tiers import checkpoint
from hermes.tiers.files import cache_root, write_bytes_atomic
from hermes.tiers.lease import Lease
from hermes.tiers.objects import LocalObjects, ObjectStore, PreconditionFailed
from hermes.tiers.remote import MANIFEST_PREFIX, RemoteStore
from hermes.tiers.s3 import S3Location, S3Objects, S3Settings


@dataclass(frozen=True)
class RemoteOptions:
    """`hermes.config.MemoryConfig`'s ``s3_*`` keys, as the memory directory needs them."""

    settings: S3Settings = field(default_factory=S3Settings)
    cache_dir: str | None = None  # None: `default_cache_dir`; the stream's marker names a folder inside it
    cache_bytes: int = 1 << 30  # bound on the local copies of segment objects
    lease_s: float = 60.0  # a writer's lease; another may take over this long after it stops renewing


def remote_options(cfg) -> RemoteOptions:
    """The `RemoteOptions` of a `hermes.config.MemoryConfig` (its ``s3_*`` keys)."""
    return RemoteOptions(S3Settings(cfg.s3_endpoint or None, cfg.s3_region or None, cfg.s3_timeout_s, cfg.s3_retries),
                         cfg.s3_cache_dir or None, cfg.s3_cache_bytes, cfg.s3_lease_s)


STREAM_ID = "stream-id"  # the store-side marker: a random id written create-only when the stream is made


def default_cache_dir(location: S3Location, endpoint: str) -> Path:
    """``<cache root>/s3/<endpoint digest>/<bucket>/<prefix>``: the same bucket and prefix on two
    endpoints never share a folder (`hermes.tiers.files.cache_root`)."""
    where = hashlib.sha256(endpoint.encode()).hexdigest()[:16]
    return cache_root() / "s3" / where / location.bucket / (location.prefix or "_")


def stream_id(objects: ObjectStore, create: bool) -> str | None:
    """The stream's marker (`STREAM_ID`): read, or with `create` written create-only if missing (two
    writers agree on one). None: a read-only look at a stream no writer has marked.
    """
    got = objects.get(STREAM_ID)
    if got is None and create:
        try:
            objects.put(STREAM_ID, uuid.uuid4().hex.encode(), create_only=True)
        except PreconditionFailed:
            pass  # another writer made it first: theirs stands
        got = objects.get(STREAM_ID)
    text = got[0].decode("ascii", "replace").strip() if got is not None else ""
    return text if text.isalnum() else None


class RemoteLevel:
    """The stream's connection, lease and local folder; the lease is taken on open unless read-only.

    Raises:
        MemoryDirError: Another writer holds the lease (writable open).
        StorageError: The store cannot be reached.
    """

    def __init__(self, location: S3Location, options: RemoteOptions, readonly: bool, client=None) -> None:
        self.location, self.options, self.readonly = location, options, readonly
        self.objects = S3Objects(location, options.settings, client=client)
        self.lease = None if readonly else Lease(self.objects, options.lease_s)
        if self.lease is not None:
            self.lease.acquire()
            self.lease.keep_renewed()  # an idle stream keeps its lease as long as this process lives
        try:
            # the local folder is keyed by the store's identity (docs/ARCHITECTURE.md); a folder for an
            # unmarked stream is emptied of copies the store lacks
            self.stream_id = stream_id(self.objects, create=not readonly)
            base = Path(options.cache_dir) if options.cache_dir else default_cache_dir(location, self.objects.endpoint)
            self.cache_dir = base / (self.stream_id or "unmarked")
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self.download_checkpoints()
        except BaseException:
            self.release()
            raise

    def has_store(self, name: str) -> bool:
        return bool(self.objects.child(name).keys(MANIFEST_PREFIX))

    def open_store(self, name: str, capacity_bytes: int, fingerprint: dict | None, **kwargs) -> RemoteStore:
        """The record store under ``prefix/name`` ("" the stream's level 3), with its own cache folder."""
        objects = self.objects.child(name) if name else self.objects
        cache = LocalObjects(self.cache_dir / "cache" / (name or "level3"), self.options.cache_bytes)
        return RemoteStore(objects, cache, capacity_bytes, fingerprint, lease=self.lease, **kwargs)

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()

    # ---- checkpoints -----------------------------------------------------------------------------

    def upload_checkpoint(self, name: str) -> None:
        """Put a checkpoint saved locally into the store: tensors, then metadata (the switch)."""
        self.lease.check()
        folder = self.cache_dir / checkpoint.CHECKPOINTS
        info = checkpoint.read_info(folder / f"{name}.json") or {}
        tensor_file = str(info.get("file", ""))
        remote = set(self.objects.keys(f"{checkpoint.CHECKPOINTS}/"))
        key = f"{checkpoint.CHECKPOINTS}/{tensor_file}"
        if key not in remote:  # its name carries its digest: an object of that name holds these bytes
            self.objects.put(key, (folder / tensor_file).read_bytes())
        self.objects.put(f"{checkpoint.CHECKPOINTS}/{name}.json", (folder / f"{name}.json").read_bytes())
        for old in remote:  # earlier tensor files of this checkpoint, no longer named by its metadata
            if old.startswith(f"{checkpoint.CHECKPOINTS}/{name}.") and old.endswith(".safetensors") and old != key:
                self.objects.delete(old)

    def download_checkpoints(self) -> None:
        """Make the local checkpoint copies the store's; the tensor file lands before the metadata naming it.
        """
        folder = self.cache_dir / checkpoint.CHECKPOINTS
        names = [k for k in self.objects.keys(f"{checkpoint.CHECKPOINTS}/") if k.endswith(".json")]
        held = {key.split("/", 1)[1] for key in names}
        for stale in sorted(folder.glob("*.json")) if folder.exists() else []:
            if stale.name not in held:  # a copy of a checkpoint the store no longer holds: never resumed from
                stale.unlink()
        if not names:
            return
        folder.mkdir(exist_ok=True)
        for key in sorted(names):
            whole = self._read_checkpoint(key)
            if whole is None:
                continue  # gone, or replaced faster than it can be read: the local copy stays as it was
            metadata, tensor_file, tensors = whole
            if tensor_file is not None:
                _write_if_changed(folder / tensor_file, tensors)
            _write_if_changed(folder / key.split("/", 1)[1], metadata)

    def _read_checkpoint(self, key: str) -> tuple[bytes, str | None, bytes | None] | None:
        """``(metadata, tensor file name, its bytes)`` of the checkpoint whose metadata is `key`, or None.

        A writer deletes the old tensor file only after its new metadata is in place, so a missing one
        means newer metadata: read again (bounded). Metadata naming no valid file comes back alone.
        """
        for _attempt in range(_CHECKPOINT_READ_ATTEMPTS):
            got = self.objects.get(key)
            if got is None:
                return None
            tensor_file = (checkpoint.parse_info(got[0]) or {}).get("file")
            if not (isinstance(tensor_file, str) and tensor_file and "/" not in tensor_file
                    and not tensor_file.startswith(".")):  # it becomes a local path
                return got[0], None, None
            tensors = self.objects.get(f"{checkpoint.CHECKPOINTS}/{tensor_file}")
            if tensors is not None:
                return got[0], tensor_file, tensors[0]
        return None


_CHECKPOINT_READ_ATTEMPTS = 5  # reads of a checkpoint's metadata while its writer keeps replacing it


def _write_if_changed(path: Path, data: bytes) -> None:
    if not path.exists() or hashlib.md5(path.read_bytes(), usedforsecurity=False).digest() != \
            hashlib.md5(data, usedforsecurity=False).digest():
        write_bytes_atomic(path, data)
