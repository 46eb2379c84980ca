"""Who may call the server (bearer keys, compared in constant time, never logged) and what a client may
make it open (`--allow-source` patterns; their forms: README.md, "Serving")."""

from __future__ import annotations

import fnmatch
import hmac
from pathlib import Path
from urllib.parse import unquote, urlsplit

from hermes.errors import HermesError, UsageError

DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "rtmp": 1935, "rtmps": 443, "http": 80, "https": 443}


class Forbidden(HermesError):
    """A source outside the allowlist (HTTP 403)."""


def bearer_ok(header: str | None, key: str | None) -> bool:
    """Whether an ``Authorization`` header carries `key` (always True when the server has no key)."""
    if key is None:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), key.encode())


def normalised_url(url: str) -> str:
    """``scheme://host:port/path`` of a URL: no credentials, no query, the default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme, 0)
    except ValueError:  # a port that is not a number
        port = 0
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}{parts.path or '/'}"


class Allowlist:
    """The `--allow-source` patterns, checked once at start-up.

    Raises:
        UsageError: a pattern that is neither a URL pattern, an absolute existing directory nor ``webcam``.
    """

    def __init__(self, patterns: tuple[str, ...] | list[str]) -> None:
        self.url_patterns: list[str] = []
        self.roots: list[Path] = []
        self.webcam = False
        for pattern in patterns:
            if pattern == "webcam":
                self.webcam = True
            elif "://" in pattern and not pattern.startswith("file://"):
                scheme = pattern.split("://", 1)[0].lower()
                if scheme not in DEFAULT_PORTS:
                    raise UsageError(f"--allow-source {pattern}: unknown scheme {scheme!r}; expected one of "
                                     f"{', '.join(DEFAULT_PORTS)}, an absolute folder or 'webcam'")
                hostport, _, path = pattern.split("://", 1)[1].partition("/")
                if ":" not in hostport and not hostport.endswith("*"):
                    hostport += f":{DEFAULT_PORTS[scheme]}"  # matched against URLs with their port filled in
                pattern = f"{scheme}://{hostport}/{path or '*'}"  # no path: every path on that host
                self.url_patterns.append(pattern.lower())
            else:
                root = Path(unquote(urlsplit(pattern).path) if pattern.startswith("file://") else pattern)
                if not root.is_absolute() or not root.is_dir():
                    raise UsageError(f"--allow-source {pattern}: expected a URL pattern (rtsp://HOST:*), "
                                     f"'webcam' or an existing absolute folder")
                self.roots.append(root.resolve())

    def check(self, source: str) -> None:
        """Refuse a source no pattern admits.

        Raises:
            Forbidden: naming the source without credentials.
        """
        from hermes.redact import redact_url

        text = source.strip()
        if text.isdigit():
            if self.webcam:
                return
            raise Forbidden(f"webcam {text} is not allowed on this server (start it with --allow-source webcam)")
        if "://" in text and not text.lower().startswith("file://"):
            target = normalised_url(text)
            if any(fnmatch.fnmatchcase(target, p) for p in self.url_patterns):
                return
            raise Forbidden(f"source {redact_url(text)} is not allowed on this server (see --allow-source)")
        path = Path(unquote(urlsplit(text).path) if text.lower().startswith("file://") else text).expanduser()
        resolved = path.resolve()
        if any(resolved.is_relative_to(root) for root in self.roots):
            return
        raise Forbidden(f"file {redact_url(text)} is outside the folders this server may read (see --allow-source)")
