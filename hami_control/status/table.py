"""Text output shared by the status commands: usage bars and left-aligned columns (kubectl's look). Pure."""

from __future__ import annotations

from collections.abc import Sequence

BAR = 10
"""Characters in a usage bar."""


def bar(used: int, total: int, width: int = BAR) -> str:
    """`####......`: `used` of `total` as filled characters (full when over; empty when total is 0)."""
    filled = round(width * used / total) if total > 0 else 0
    filled = max(0, min(filled, width))
    return "#" * filled + "." * (width - filled)


def columns(header: Sequence[str], rows: Sequence[Sequence[str]], gap: int = 2) -> str:
    """The rows under the header, each column as wide as its widest cell, trailing spaces cut."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in (header, *rows):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append((" " * gap).join(cells).rstrip())
    return "\n".join(lines)


__all__ = ["BAR", "bar", "columns"]
