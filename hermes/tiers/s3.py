"""An S3-compatible object store (AWS, MinIO, Ceph, SeaweedFS; boto3) as level 3's truth: `parse_location`
and `S3Objects`. Credentials come only from boto3's chain and never enter a message; an endpoint that does
not answer is retried with timeouts, then a one-line `StorageError` (exit 3)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hermes.errors import StorageError, UsageError
from hermes.redact import redact_url
from hermes.tiers.objects import ObjectStore, PreconditionFailed

SCHEME = "s3://"


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: a stream's objects are the keys under ``prefix/``."""

    bucket: str
    prefix: str  # no leading or trailing "/"; may be empty

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

    def child(self, name: str) -> S3Location:
        return S3Location(self.bucket, f"{self.prefix}/{name}" if self.prefix else name)


@dataclass(frozen=True)
class S3Settings:
    """How to reach the store (`hermes.config.MemoryConfig`'s ``s3_*`` keys)."""

    endpoint: str | None = None  # None: AWS_ENDPOINT_URL, else AWS itself
    region: str | None = None  # None: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1
    timeout_s: float = 10.0  # connect and read timeout of one request
    retries: int = 3  # attempts per request before a StorageError


def parse_location(text: str | os.PathLike, flag: str = "--memory-dir") -> S3Location | Path:
    """A ``--memory-dir`` value (or `flag`'s): an `S3Location` for ``s3://bucket[/prefix]``, else a local `Path`.

    Raises:
        UsageError: An ``s3://`` value without a valid bucket name, or another URL scheme.
    """
    if isinstance(text, (Path, S3Location)):
        return text
    if not text.startswith(SCHEME):
        scheme = text.split("://", 1)[0] if "://" in text else ""
        if scheme and scheme.isalnum():
            raise UsageError(f"{flag} {redact_url(text)}: {scheme}:// is not supported; use a local folder "
                             f"or s3://bucket/prefix")
        return Path(text)
    bucket, _, prefix = text[len(SCHEME):].partition("/")
    if not (3 <= len(bucket) <= 63) or not all(c.isalnum() or c in ".-" for c in bucket) or bucket != bucket.lower():
        raise UsageError(f"{flag} {redact_url(text)}: {bucket!r} is not an S3 bucket name (3-63 lower-case "
                         f"letters, digits, '.' or '-'); expected s3://bucket/prefix")
    return S3Location(bucket, prefix.strip("/"))


def environment_credentials() -> dict[str, str]:
    """The AWS key in the environment now, as boto3 client arguments ({} without one: boto3's own chain).

    boto3's default session keeps the first credentials it resolved for the life of the process, so a
    client made later would sign with a key the environment no longer holds (a test's, a rotated one).
    """
    names = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "aws_session_token": "AWS_SESSION_TOKEN"}
    found = {arg: os.environ[var] for arg, var in names.items() if os.environ.get(var)}
    return found if "aws_access_key_id" in found and "aws_secret_access_key" in found else {}


class S3Objects(ObjectStore):
    """`ObjectStore` over the keys under one `S3Location`.

    Args:
        settings: Endpoint, region, timeouts and retries.
        client: A boto3 S3 client to use instead of building one (tests).

    Raises:
        UsageError: boto3 is not installed (``pip install 'hermes-video[s3]'``).
    """

    def __init__(self, location: S3Location, settings: S3Settings | None = None, client=None) -> None:
        self.location = location
        self.settings = settings or S3Settings()
        endpoint = self.settings.endpoint or os.environ.get("AWS_ENDPOINT_URL")
        self.endpoint = endpoint or "aws"  # part of the store's identity (`hermes.tiers.remote_level`)
        self.name = str(location) + (f" at {redact_url(endpoint)}" if endpoint else "")
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise UsageError("an s3:// memory directory needs boto3: pip install 'hermes-video[s3]'") from None
            region = self.settings.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            config = Config(connect_timeout=self.settings.timeout_s, read_timeout=self.settings.timeout_s,
                            retries={"total_max_attempts": max(1, self.settings.retries), "mode": "standard"},
                            s3={"addressing_style": "path"})
            client = boto3.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1", config=config,
                                  **environment_credentials())
        self.client = client

    def child(self, name: str) -> S3Objects:
        """The same store and connection, under ``prefix/name``."""
        out = S3Objects.__new__(S3Objects)
        out.location, out.settings, out.client = self.location.child(name), self.settings, self.client
        out.endpoint = self.endpoint
        out.name = self.name.replace(str(self.location), str(out.location), 1)
        return out

    def _key(self, key: str) -> str:
        return f"{self.location.prefix}/{key}" if self.location.prefix else key

    def _fail(self, what: str, key: str, exc: Exception) -> StorageError:
        code = _code(exc)
        hint = {"NoSuchBucket": f"the bucket {self.location.bucket!r} does not exist; create it first",
                "AccessDenied": "access denied; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
                "InvalidAccessKeyId": "the access key is not known to the store; check AWS_ACCESS_KEY_ID",
                "SignatureDoesNotMatch": "the secret key does not match; check AWS_SECRET_ACCESS_KEY"}.get(
            code, "check that the endpoint is up and reachable (memory.s3_endpoint or AWS_ENDPOINT_URL)")
        reason = code or type(exc).__name__
        return StorageError(f"object store {self.name}: {what} {key} failed ({redact_url(reason)}) after "
                            f"{self.settings.retries} attempts; {hint}; records committed before this are kept")

    def get(self, key: str) -> tuple[bytes, str] | None:
        try:
            out = self.client.get_object(Bucket=self.location.bucket, Key=self._key(key))
            return out["Body"].read(), out["ETag"].strip('"')
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                return None
            raise self._fail("reading", key, exc) from None

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            out = self.client.get_object(Bucket=self.location.bucket, Key=self._key(key),
                                         Range=f"bytes={offset}-{offset + length - 1}")
            return out["Body"].read()
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                raise FileNotFoundError(key) from None
            if _code(exc) == "InvalidRange":
                return b""
            raise self._fail("reading", key, exc) from None

    def put(self, key: str, data: bytes, *, create_only: bool = False, if_match: str | None = None) -> str:
        extra = {"IfNoneMatch": "*"} if create_only else {"IfMatch": f'"{if_match}"'} if if_match else {}
        try:
            out = self.client.put_object(Bucket=self.location.bucket, Key=self._key(key), Body=data, **extra)
            return out["ETag"].strip('"')
        except Exception as exc:
            if _code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise PreconditionFailed(f"{self.name}/{key}: {_code(exc)}") from None
            if if_match and _code(exc) in ("NoSuchKey", "404"):
                raise PreconditionFailed(f"{self.name}/{key}: gone") from None
            raise self._fail("writing", key, exc) from None

    def keys(self, prefix: str, after: str = "") -> list[str]:
        out, token = [], None
        base = len(self._key(""))
        try:
            while True:
                kwargs = {"Bucket": self.location.bucket, "Prefix": self._key(prefix)}
                if token:
                    kwargs["ContinuationToken"] = token
                elif after:
                    kwargs["StartAfter"] = self._key(after)
                page = self.client.list_objects_v2(**kwargs)
                out += [item["Key"][base:] for item in page.get("Contents", [])]
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    return out
        except Exception as exc:
            raise self._fail("listing", prefix or "/", exc) from None

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.location.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._fail("deleting", key, exc) from None


def _code(exc: Exception) -> str:
    """The S3 error code of a botocore ClientError ("NoSuchKey", "PreconditionFailed", "412"), else ""."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error") or {}
        return str(err.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")
    return ""
