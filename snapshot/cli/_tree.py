"""The graph as a tree, for ``snapshot inspect``: one row per node, laid out to fit the terminal.

Where the one-line table (tree, type, figures) fits, it is printed as it is. Where it does not,
each node is stacked: its place in the tree on one line (whole: a path too long for the line
goes on at a ``/``), and its type and figures on the line below, indented, in aligned columns.
A type too long for its column gets a line of its own, above the figures. Nothing of the tree
is cut; only a ``Type(args)`` longer than the whole line is shortened (``--json`` has it all).
"""

from __future__ import annotations

from dataclasses import dataclass

from snapshot.cli._text import count, elide, elide_middle, size, table
from snapshot.cli._view import NodeTotals, View

__all__ = ["FIGURES", "TreeRow", "graph_rows", "graph_table"]

#: Longest argument value, and longest ``Type(args)``, shown in the tree (``--json`` has all).
ARG_WIDTH = 32
TYPE_WIDTH = 64
#: Narrowest the type column is made before a node's lines are stacked instead.
MIN_TYPE = 24
#: The figures shown for every node, after its type.
FIGURES = ("yielded", "buffered", "state", "restore", "replay")
_RIGHT = (0, 1, 2, 4)  # of FIGURES: the counts and sizes align right
#: Indent of the tree, and of a stacked node's type and figures.
_INDENT = "  "
_DETAIL = "    "


@dataclass(frozen=True)
class TreeRow:
    """One node of the tree (or one more edge into a node listed above: ``shared``)."""

    prefix: str  # the tree drawn before the node: its ancestors' branches and its own connector
    name: str  # its path, or the edge from its parent
    type: str  # ``Type(args)``; for a shared node, where it is listed
    figures: tuple[str, ...]  # one per FIGURES, empty for a shared node
    below: str  # the branches that go on under the node (its children's prefix)

    @property
    def shared(self) -> bool:
        return not self.figures


def graph_rows(view: View, *, full_paths: bool = False, compact: bool = False) -> list[TreeRow]:
    """The graph as a tree, depth-first from the sink, inputs in order.

    A node's name is the edge from its parent (``full_paths``: its whole path). A node reached
    again through another edge (the input shared by ``fork`` children) is listed once and
    referred to by its full path afterwards. ``compact`` drops the ``IterDataPipe`` that ends
    torch's class names (for a narrow terminal).
    """
    totals = view.totals()
    rows: list[TreeRow] = []
    seen: set[str] = set()
    # iterative, so deep graphs cannot overflow the stack
    stack: list[tuple[str, str, str, str]] = [(node.path, "", "", "") for node in reversed(view.nodes)]
    while stack:
        path, parent, prefix, connector = stack.pop()
        below = prefix + ("" if not connector else ("   " if connector.startswith("└") else "│  "))
        if path in seen:
            if connector:  # a second edge into a shared node; unreached roots are skipped
                rows.append(TreeRow(prefix + connector, "(shared)", f"= {path}, listed above", (), below))
            continue
        seen.add(path)
        node = view.by_path[path]
        name = path
        if parent and not full_paths and path.startswith(parent + "/"):
            name = path[len(parent) + 1:]
        signature = node.signature(skip_none=True, width=ARG_WIDTH, limit=TYPE_WIDTH)
        if compact and node.short_type.endswith("IterDataPipe") and node.short_type != "IterDataPipe":
            signature = signature.replace("IterDataPipe(", "(", 1)
        rows.append(TreeRow(prefix + connector, name, signature, _figures(totals.get(path)), below))
        for i in reversed(range(len(node.inputs))):
            stack.append((node.inputs[i], path, below, "└─ " if i == len(node.inputs) - 1 else "├─ "))
    return rows


def _figures(totals: NodeTotals | None) -> tuple[str, ...]:
    if totals is None:
        return ("-",) * len(FIGURES)
    return (count(totals.yielded), count(totals.buffered) if totals.buffered else "-",
            size(totals.state_bytes), totals.restore or "-",
            count(totals.replay) if totals.restore in ("replay", "mixed") else "-")


def graph_table(view: View, *, full_paths: bool, width: int | None) -> list[str]:
    """The tree as lines: one a node where that fits ``width`` (``None``: no limit), with shorter type
    names and then, if need be, ``Type(args)`` shortened to no less than ``MIN_TYPE``; else stacked."""
    node_header = "node" if full_paths else "node (edge from its parent)"
    lines = _one_line(node_header, graph_rows(view, full_paths=full_paths), None)
    if width is None or max(map(len, lines)) <= width:
        return lines
    rows = graph_rows(view, full_paths=full_paths, compact=True)
    lines = _one_line(node_header, rows, None)
    if max(map(len, lines)) <= width:
        return lines
    # the room left for the type column: what the widest row takes besides its type
    owned = [(len(line), len(row.type)) for line, row in zip(lines[1:], rows) if not row.shared]
    room = width - max(n for n, _ in owned) + max(t for _, t in owned) if owned else width
    if room >= MIN_TYPE:
        return _one_line(node_header, rows, room)
    return _stacked(node_header, rows, width)


def _one_line(node_header: str, rows: list[TreeRow], type_width: int | None) -> list[str]:
    """The table; a shared node's reference is not a type: it runs on over the empty figures."""
    cells = [[row.prefix + row.name, "" if row.shared else elide(row.type, type_width or len(row.type)),
              *(row.figures or ("",) * len(FIGURES))] for row in rows]
    lines = table([node_header, "type", *FIGURES], cells, right=[2 + i for i in _RIGHT], indent=_INDENT, width=0)
    start = len(_INDENT) + max(len(cell[0]) for cell in [[node_header], *cells]) + 2
    return [lines[0], *(line.ljust(start) + row.type if row.shared else line for line, row in zip(lines[1:], rows))]


def _stacked(node_header: str, rows: list[TreeRow], width: int) -> list[str]:
    """Two lines a node (three when its type is too long to share a line with its figures)."""
    figure_rows = [list(row.figures) for row in rows if not row.shared]
    figures_width = max(map(len, table(list(FIGURES), figure_rows, right=_RIGHT, indent="", width=0)))
    room = width - len(_DETAIL) - 2 - figures_width  # for the type, before the figures
    details = table(["type", *FIGURES],
                    [[row.type if len(row.type) <= room else "", *row.figures] for row in rows if not row.shared],
                    right=[1 + i for i in _RIGHT], indent=_DETAIL, width=0)
    lines = [_INDENT + node_header, details[0]]
    detail = iter(details[1:])
    for row in rows:
        lines.extend(_node_lines(row, width))
        if row.shared:
            lines.append(_DETAIL + row.type)
            continue
        if len(row.type) > room:  # on a line of its own, above the figures
            lines.append(_DETAIL + elide(row.type, width - len(_DETAIL)))
        lines.append(next(detail))
    return lines


def _node_lines(row: TreeRow, width: int) -> list[str]:
    """The node's place in the tree; a name too long for the line goes on after a ``/``, under it."""
    first = _INDENT + row.prefix
    room = width - len(first)
    if room < 12:  # a tree deeper than the line is wide: its end is what tells nodes apart
        text = first + row.name  # cut in its middle: the tree's start and the node's name stay
        return [elide_middle(text, width)]
    lines, name = [], row.name
    while len(name) > room:
        cut = name.rfind("/", 0, room)
        cut = room if cut <= 0 else cut + 1
        lines.append(first + name[:cut])
        name, first = name[cut:], _INDENT + row.below + "   "
        if width - len(first) < 12:  # under a tree too deep to go on under the node: at the margin
            first = _INDENT + "   "
        room = width - len(first)
    return [*lines, first + name]
