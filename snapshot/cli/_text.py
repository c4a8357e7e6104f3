"""Plain-text building blocks for the commands: aligned tables, sizes, counts, fitting the terminal."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Sequence

__all__ = ["MAX_LISTED", "count", "elide", "elide_middle", "fit", "more", "path_lines", "size", "table",
           "terminal_width"]

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


def elide_middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters in its middle (its end, which names a node or a file, kept
    longer than its beginning), never from the left.

    >>> elide_middle("0/datapipe/datapipe/datapipe/datapipe", 24)
    '0/datap…atapipe/datapipe'
    """
    if len(text) <= width:
        return text
    if width < 5:
        return elide(text, width)
    head = (width - 1) // 3
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def path_lines(path: str, width: int, indent: str = "  ") -> list[str]:
    """``path`` on lines of at most ``width``, broken after a ``/`` (the lines after the first indented
    two more), so that it is read whole.

    >>> path_lines("0/datapipe/datapipe/datapipe", 24)
    ['  0/datapipe/datapipe/', '    datapipe']
    """
    lines, first = [], indent
    while len(first) + len(path) > width:
        cut = path.rfind("/", 0, width - len(first))
        cut = max(width - len(first), 1) if cut <= 0 else cut + 1
        lines.append(first + path[:cut])
        path, first = path[cut:], indent + "  "
    return [*lines, first + path]


def _distinct_width(cells: Sequence[str], cut: Callable[[str, int], str], start: int) -> int:
    """The narrowest width from ``start`` at which ``cut`` keeps distinct ``cells`` distinct."""
    distinct = set(cells)
    longest = max(map(len, distinct), default=0)
    for width in range(start, longest):
        if len({cut(cell, width) for cell in distinct}) == len(distinct):
            return width
    return longest


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
          indent: str = "  ", width: int | None = None, middle: Sequence[int] = (),
          whole: Sequence[int] = ()) -> list[str]:
    """Rows aligned under ``header``; columns whose index is in ``right`` align right.

    Wider than ``width`` (default: :func:`terminal_width`), the widest left-aligned columns are
    narrowed and their cells elided (``--json`` has every value whole); cells of columns in
    ``middle`` (paths) are cut in the middle, keeping both ends; those in ``whole`` are never
    narrowed (short names, as the counts in ``right``). A column is never narrowed so far
    that two different cells would read the same: a table that cannot fit so is left wider (and
    :func:`fit` wraps it).

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

    def cut(i: int) -> Callable[[str, int], str]:
        return elide_middle if i in middle else elide

    if limit:
        excess = len(indent) + 2 * (len(widths) - 1) + sum(widths) - limit
        floors: dict[int, int] = {}
        while excess > 0:
            narrowable = [i for i in range(len(widths))
                          if i not in right and i not in whole and widths[i] > MIN_COLUMN]
            for i in narrowable:
                if i not in floors:
                    floors[i] = max(len(header[i]), _distinct_width([row[i] for row in rows], cut(i), MIN_COLUMN))
            narrowable = [i for i in narrowable if widths[i] > floors[i]]
            if not narrowable:
                break
            widths[max(narrowable, key=widths.__getitem__)] -= 1
            excess -= 1
    lines = []
    for n, row in enumerate([list(header), *rows]):
        cells = [cut(i)(cell, widths[i]) if n else elide(cell, widths[i]) for i, cell in enumerate(row)]
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(cells)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def more(total: int, indent: str = "  ") -> list[str]:
    """The line that says how many of ``total`` items were not listed (none if all were)."""
    if total <= MAX_LISTED:
        return []
    return [f"{indent}... and {total - MAX_LISTED} more (--json lists every difference)"]
