"""Markdown tables: the one helper behind every report and bench table."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[bool] | None = None) -> str:
    """A markdown table: a header row, the separator, one line per row (cells as `str()`).

    Args:
        right: per column, whether it is right-aligned (`---:`); None: none is.

    Returns:
        The table's lines joined by newlines (no trailing newline).
    """
    right = right or [False] * len(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def spread_cell(values: Sequence[float | None], fmt: str = "{:.3f}") -> str:
    """One cell of min / median / max (or any values) joined by " / "; "-" when any was not measured."""
    return "-" if None in values else " / ".join(fmt.format(v) for v in values)
