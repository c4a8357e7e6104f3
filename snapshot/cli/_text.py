"""Plain-text building blocks for the commands: aligned tables, sizes, counts, fitting the terminal."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence

__all__ = ["MAX_LISTED", "count", "elide", "fit", "more", "size", "table", "terminal_width"]

#: Narrowest width output is fitted to, and narrowest a table column is elided to.
MIN_WIDTH = 40
MIN_COLUMN = 8

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


def terminal_width() -> int | None:
    """The width to fit output to: ``$COLUMNS``, else the terminal's; ``None`` (no limit) when
    standard output is not a terminal (a pipe or a file gets whole lines, for grep)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), MIN_WIDTH)
    try:
        if not sys.stdout.isatty():
            return None
        return max(os.get_terminal_size(sys.stdout.fileno()).columns, MIN_WIDTH)
    except (OSError, ValueError, AttributeError):
        return None


def elide(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the last one an ellipsis when it was cut.

    >>> elide("ShufflerIterDataPipe(buffer_size=10000)", 12)
    'ShufflerIte…'
    """
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _elide_start(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[len(text) - max(width - 1, 0):]


def fit(text: str, width: int | None = None) -> str:
    """Wrap every line longer than ``width`` (default: :func:`terminal_width`), keeping its indent.

    >>> print(fit("  restore plan: replay 1,000 samples of 0/datapipe/datapipe", 30))
      restore plan: replay 1,000
        samples of
        0/datapipe/datapipe
    """
    width = terminal_width() if width is None else width
    if not width:
        return text
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        if len(indent) > width // 2:
            indent = ""
        out.extend(textwrap.wrap(line.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ",
                                 break_on_hyphens=False) or [""])
    return "\n".join(out)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = (),
          indent: str = "  ", width: int | None = None, keep_ends: Sequence[int] = ()) -> list[str]:
    """Rows aligned under ``header``; columns whose index is in ``right`` align right.

    Wider than ``width`` (default: :func:`terminal_width`), the widest left-aligned columns are
    narrowed and their cells elided (``--json`` has every value whole); cells of columns in
    ``keep_ends`` lose their beginning instead (a tree's indentation before a node's name).

    >>> print("\\n".join(table(["node", "yielded"], [["0", "5"], ["0/datapipe", "12"]], right=[1], width=0)))
      node        yielded
      0                 5
      0/datapipe       12
    >>> print("\\n".join(table(["node", "type"], [["0", "ShufflerIterDataPipe(buffer_size=10)"]], width=24)))
      node  type
      0     ShufflerIterDat…
    """
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    limit = terminal_width() if width is None else width
    if limit:
        excess = len(indent) + 2 * (len(widths) - 1) + sum(widths) - limit
        while excess > 0:
            narrowable = [i for i in range(len(widths)) if i not in right and widths[i] > MIN_COLUMN]
            if not narrowable:
                break
            widths[max(narrowable, key=widths.__getitem__)] -= 1
            excess -= 1
    lines = []
    for n, row in enumerate([list(header), *rows]):
        cells = [_elide_start(cell, widths[i]) if i in keep_ends and n else elide(cell, widths[i])
                 for i, cell in enumerate(row)]
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(cells)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def more(total: int, indent: str = "  ") -> list[str]:
    """The line that says how many of ``total`` items were not listed (none if all were)."""
    if total <= MAX_LISTED:
        return []
    return [f"{indent}... and {total - MAX_LISTED} more (--json lists every difference)"]
