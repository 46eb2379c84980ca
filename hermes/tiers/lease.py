"""The writer's lease on a stream in an object store: one holder at a time, a stale one fenced
(docs/ARCHITECTURE.md, Memory, "Level 3 in an object store")."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from hermes.tiers.errors import MemoryDirError
from hermes.tiers.objects import ObjectStore, PreconditionFailed

LEASE = "lease.json"


class LeaseLost(MemoryDirError):
    """Another writer holds the stream now; this one must not commit (it has been fenced)."""


class LeaseHeld(MemoryDirError):
    """Another writer's lease on the stream has not expired; `retry_after_s` is what is left of it."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):  # pickled whole (a Ray replica hands its errors to another process)
        return type(self), (str(self), self.retry_after_s)


class Lease:
    """This process's claim on a stream.

    Args:
        ttl_s: How long a lease lasts without renewal.
    """

    def __init__(self, objects: ObjectStore, ttl_s: float = 60.0) -> None:
        self.objects = objects
        self.ttl_s = float(ttl_s)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.epoch = 0
        self.etag: str | None = None
        self.expires_unix = 0.0
        self.lost: LeaseLost | None = None  # set by the renewal thread when another writer took the lease
        self._lock = threading.Lock()
        self._stop_renewing = threading.Event()
        self._renewer: threading.Thread | None = None

    def _body(self, expires_unix: float) -> bytes:
        return json.dumps({"holder": self.holder, "epoch": self.epoch, "expires_unix": expires_unix}).encode()

    def acquire(self) -> int:
        """Take the lease if it is free or expired; returns our epoch.

        Raises:
            LeaseHeld: Another writer holds it and it has not expired.
            MemoryDirError: Another writer won it just now.
        """
        with self._lock:
            now = time.time()
            got = self.objects.get(LEASE)
            previous = _parse(got[0]) if got is not None else {}
            if got is not None and previous.get("holder") != self.holder and previous.get("expires_unix", 0) > now:
                raise LeaseHeld(
                    f"memory directory {self.objects.name} is in use by writer {previous.get('holder')} "
                    f"(lease epoch {previous.get('epoch')}, {previous['expires_unix'] - now:.0f} s left); wait for it "
                    f"to stop or its lease to expire, or open it --read-only", previous["expires_unix"] - now)
            self.epoch = int(previous.get("epoch", 0)) + 1
            expires = now + self.ttl_s
            try:
                self.etag = self.objects.put(LEASE, self._body(expires), create_only=got is None,
                                             if_match=got[1] if got is not None else None)
            except PreconditionFailed:
                raise MemoryDirError(f"memory directory {self.objects.name}: another writer took it at the same "
                                     f"moment; this one is refused (open it --read-only to follow it)") from None
            self.expires_unix = expires
            return self.epoch

    def check(self) -> None:
        """Before a commit: still ours? Renew it when half its time is gone.

        Raises:
            LeaseLost: Another writer holds the lease (this one is fenced).
        """
        with self._lock:
            got = self.objects.get(LEASE)
            if got is None or got[1] != self.etag:
                holder = _parse(got[0]).get("holder") if got is not None else None
                raise LeaseLost(f"memory directory {self.objects.name}: this writer's lease (epoch {self.epoch}) "
                                f"was taken over by {holder or 'nobody'}; it stopped without committing more "
                                f"(records committed before are kept)")
            now = time.time()
            if now > self.expires_unix - self.ttl_s / 2:
                self._swap(now + self.ttl_s)

    def _swap(self, expires: float) -> None:
        try:
            self.etag = self.objects.put(LEASE, self._body(expires), if_match=self.etag)
            self.expires_unix = expires
        except PreconditionFailed:
            raise LeaseLost(f"memory directory {self.objects.name}: this writer's lease (epoch {self.epoch}) was "
                            f"taken over while renewing it; it stopped without committing more") from None

    def keep_renewed(self) -> None:
        """Renew the lease on a thread until `release`, so that a writer with nothing to commit (an idle
        stream) keeps it: only a writer that stopped lets it expire. A lease found taken over stops the
        thread and is kept in `lost` (the next commit's `check` raises it anyway)."""
        if self._renewer is not None:
            return

        def renew() -> None:
            while not self._stop_renewing.wait(self.ttl_s / 4):  # `check` renews once half the time is gone
                try:
                    self.check()
                except LeaseLost as exc:
                    self.lost = exc
                    return
                except Exception:  # noqa: BLE001 - a store that did not answer: the next round tries again
                    continue

        self._renewer = threading.Thread(target=renew, daemon=True, name=f"hermes-lease-{self.objects.name}")
        self._renewer.start()

    def release(self) -> None:
        """Give the lease up (expired at once) so the next writer need not wait; no error if lost."""
        self._stop_renewing.set()
        with self._lock:
            if self.etag is None:
                return
            try:
                self._swap(0.0)
            except LeaseLost:
                pass
            self.etag = None


def _parse(data: bytes) -> dict:
    try:
        obj = json.loads(data)
        return obj if isinstance(obj, dict) else {}
    except ValueError:
        return {}
