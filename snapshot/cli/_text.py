"""Plain-text building blocks for the commands: aligned tables, sizes, counts."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_LISTED", "count", "more", "size", "table"]

#: Items of one kind listed in full before the rest is summed up (``--json`` lists all).
MAX_LISTED = 20
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(n: int | None) -> str:
    """``"3.7 KiB"``; ``"-"`` for an unknown size.

    >>> size(40), size(3830), size(None)
    ('40 B', '3.7 KiB', '-')
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def count(n: int | None) -> str:
    """A count with thousands separators; ``"-"`` when unknown.

    >>> count(12345), count(None)
    ('12,345', '-')
    """
    return "-" if n is None else f"{n:,}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = (),
          indent: str = "  ") -> list[str]:
    """Rows aligned under ``header``; columns whose index is in ``right`` align right.

    >>> print("\\n".join(table(["node", "yielded"], [["0", "5"], ["0/datapipe", "12"]], right=[1])))
      node        yielded
      0                 5
      0/datapipe       12
    """
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(header), *rows]:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def more(total: int, indent: str = "  ") -> list[str]:
    """The line that says how many of ``total`` items were not listed (none if all were)."""
    if total <= MAX_LISTED:
        return []
    return [f"{indent}... and {total - MAX_LISTED} more (--json lists every difference)"]
