"""Credentials never reach a message or a log: `redact_url`, the one rule for every URL we print
(stream sources, downloads, the HTTP judge)."""

from __future__ import annotations

import re
from typing import Any

# user[:password]@ right after "scheme://"; greedy up to the last "@" before the path, so a
# password containing an unescaped "@" is hidden whole.
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s?#]*@")
# Query or fragment parameters whose value is a secret (password=, token=, api_key=, sig= ...).
_SECRET_PARAM_RE = re.compile(
    r"(?i)([?&;#][\w.-]*(?:pass(?:word|wd)?|pwd|token|secret|key|auth|sig(?:nature)?|credentials?)"
    r"[\w.-]*=)[^&;#\s]*"
)


def redact_url(url: Any) -> str:
    """Hide the credentials in a URL (or in any text that contains URLs).

    Args:
        url: a URL, a path, a webcam index or a message; anything `str()` accepts.

    Returns:
        The text with ``user:password@`` as ``***@`` and secret-looking query values
        (``password=``, ``token=``, ``key=`` ...) as ``***``.
    """
    text = str(url)
    text = _USERINFO_RE.sub(r"\1***@", text)
    return _SECRET_PARAM_RE.sub(r"\1***", text)
