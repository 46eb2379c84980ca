"""Errors a user can act on: a `HermesError` is printed as one line (what was expected, what was found, the
fix) and exits with its `exit_code` (docs/ARCHITECTURE.md, Interfaces); anything else is a bug (exit 1)."""

from __future__ import annotations

EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_SOURCE = 3
EXIT_MODEL = 4


class HermesError(Exception):
    """Base of all user-facing errors; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_INTERNAL


class UsageError(HermesError):
    """Bad command-line arguments, questions file or option values."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """An unknown or ill-typed configuration key or value."""


class SourceError(HermesError):
    """A video source that is missing, corrupt, empty or unreachable."""

    exit_code = EXIT_SOURCE


class StorageError(HermesError):
    """A memory directory that cannot be written or read: disk full, read-only, a file where a folder
    belongs (exit 3, like a source that cannot be read; nothing already committed is lost)."""

    exit_code = EXIT_SOURCE


class ModelError(HermesError):
    """A model that cannot be found, loaded or is not supported."""

    exit_code = EXIT_MODEL


def closest(word: str, choices, cutoff: float = 0.5) -> str | None:
    """The choice most like `word` (difflib's ratio at least `cutoff`), else one equal to it but for
    case, else None: the one did-you-mean rule of every error message."""
    import difflib

    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)
    if close:
        return close[0]
    folded = {str(c).casefold(): c for c in choices}
    return folded.get(word.casefold())


def check_keys(keys, allowed, takes: str, kind: str = "key", where: str = "") -> None:
    """Refuse the first of `keys` not in `allowed`: "[WHERE: ]unknown KIND 'x' (did you mean ...); TAKES takes ...".

    Raises:
        UsageError: naming the key, the closest allowed one and every allowed one.
    """
    for key in keys:
        if key not in allowed:
            raise UsageError(f"{where + ': ' if where else ''}unknown {kind} {key!r}{did_you_mean(key, allowed)}; "
                             f"{takes} takes {', '.join(allowed)}")


def did_you_mean(word: str, choices, cutoff: float = 0.5, prefix: str = "") -> str:
    """`" (did you mean 'x'?)"` for the `closest` choice (written after `prefix`, e.g. a config section's
    "memory."), or "" when none is close."""
    match = closest(word, choices, cutoff)
    return f" (did you mean {prefix + match!r}?)" if match is not None else ""
