"""``snapshot graph FILE``: the saved graph as a Graphviz picture, annotated with positions.

The DOT text is written here, from the manifest; Graphviz's ``dot`` program (only when it
is installed) turns it into SVG or PNG. Nothing is unpickled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Any

from snapshot.cli._exit import EXIT_INVALID, EXIT_UNAVAILABLE, CommandError
from snapshot.cli._inspect import describe_position, summed
from snapshot.cli._source import read
from snapshot.cli._text import count, size, terminal_width
from snapshot.cli._view import NodeTotals, View, read_view

__all__ = ["INSTALL_HINT", "add_command", "fold", "to_dot"]

FORMATS = ("dot", "svg", "png")
#: Longest argument value, and longest argument list, shown in a box.
ARG_WIDTH = 30
ARGS_WIDTH = 60
DOT_TIMEOUT = 120
INSTALL_HINT = (
    "Install the Graphviz program: `apt-get install graphviz` (Debian, Ubuntu), "
    "`dnf install graphviz` (Fedora), `brew install graphviz` (macOS) or "
    "`conda install -c conda-forge graphviz`. Note that `pip install graphviz` installs only "
    "Python bindings, not the `dot` program. Or print the DOT text with `--format dot` and "
    "render it on another machine."
)
_FILL = {"state": "#e3efff", "replay": "#ffe1c2", "mixed": "#fff3b0"}


def add_command(commands: Any) -> None:
    cmd = commands.add_parser(
        "graph", help="draw the saved graph, annotated with positions (Graphviz)",
        description="Write the saved graph as Graphviz DOT, or as SVG or PNG through Graphviz's "
                    "dot program, each node annotated with its samples yielded, buffered "
                    "samples and restore method. Reads the manifest only.")
    cmd.add_argument("file", help="a snapshot file")
    cmd.add_argument("--format", "-f", choices=FORMATS, default="dot", help="output format (default: dot)")
    cmd.add_argument("--output", "-o", metavar="OUT", help="write to OUT instead of standard output")
    cmd.set_defaults(run=run)


def _escape(text: str) -> str:
    """Text for a DOT double-quoted string: backslashes and quotes escaped, controls shown."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(c if c.isprintable() else f"\\\\x{ord(c):02x}" for c in escaped)


def _quote(text: str) -> str:
    return f'"{_escape(text)}"'


def _label(lines: list[str]) -> str:
    """A multi-line label (``\\n`` separates centred lines in DOT)."""
    return '"' + "\\n".join(_escape(line) for line in lines) + '"'


def _box(view: View, path: str, totals: NodeTotals | None, drivers: dict[str, int]) -> list[str]:
    node = view.by_path[path]
    args = node.signature(skip_none=True, width=ARG_WIDTH, limit=ARGS_WIDTH)[len(node.short_type):]
    lines = [node.short_type, *([args] if args != "()" else []), path]
    if totals is not None:
        figures = f"yielded {count(totals.yielded)}"
        if totals.buffered:
            figures += f" · buffered {count(totals.buffered)}"
        lines.append(figures)
        if path in drivers:
            lines.append(f"restore: replay, drives {count(drivers[path])} samples")
        elif totals.restore == "state":
            lines.append(f"restore: from its state ({size(totals.state_bytes)})")
        elif totals.restore in ("replay", "mixed"):
            lines.append(f"restore: {totals.restore}, ≈{count(totals.replay)} samples again")
    return lines


def to_dot(view: View) -> str:
    """The graph in Graphviz DOT: sources at the top, the sink at the bottom."""
    totals = view.totals()
    drivers: dict[str, int] = {}
    for shard in view.shards:
        for driver in shard.drivers:
            drivers[driver.path] = drivers.get(driver.path, 0) + driver.replay
    ids = {node.path: f"n{i}" for i, node in enumerate(view.nodes)}
    title = f"{os.path.basename(view.source)}: {describe_position(view)}"
    title += summed(view)
    title += "\nblue: restored from its state · orange: replayed · bold: drives a replay"
    out = [
        "digraph snapshot {",
        f"  graph [label={_label(title.splitlines())}, labelloc=t, fontname=Helvetica, fontsize=11];",
        '  node [shape=box, style="rounded,filled", fillcolor="#f4f4f4", fontname=Helvetica, fontsize=10];',
        '  edge [color="#777777"];',
    ]
    for node in view.nodes:
        node_totals = totals.get(node.path)
        attrs = [f"label={_label(_box(view, node.path, node_totals, drivers))}", f"tooltip={_quote(node.path)}"]
        fill = _FILL.get(node_totals.restore or "") if node_totals else None
        if fill:
            attrs.append(f'fillcolor="{fill}"')
        if node.path in drivers:
            attrs.append("penwidth=2.5")
        out.append(f"  {ids[node.path]} [{', '.join(attrs)}];")
    for node in view.nodes:
        for source in node.inputs:
            out.append(f"  {ids[source]} -> {ids[node.path]};")
    out.append("}")
    return "\n".join(out) + "\n"


def fold(dot_text: str, width: int | None) -> str:
    """DOT text with no line wider than ``width`` where it can be helped: a long line breaks at a
    space between attributes, or inside a quoted string with a backslash-newline, which Graphviz
    reads as nothing (its C-style continuation)."""
    if not width:
        return dot_text
    out = []
    for line in dot_text.split("\n"):
        start, last = 0, None  # last: where a break may go (before that index), and if inside quotes
        quoted = escaped = False
        for i, char in enumerate(line):
            if i > start and not escaped and (quoted or char == " "):
                last = (i, quoted)
            if i - start >= width - 1 and last is not None:
                at, inside = last
                out.append(line[start:at] + ("\\" if inside else ""))
                start, last = at, None
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = not quoted
        out.append(line[start:])
    return "\n".join(out)


def _render(dot_text: str, image_format: str) -> bytes:
    program = shutil.which("dot")
    if program is None:
        raise CommandError(f"`--format {image_format}` needs Graphviz's `dot` program, which is not "
                           f"installed (not found on PATH). {INSTALL_HINT}", EXIT_UNAVAILABLE)
    try:
        proc = subprocess.run([program, f"-T{image_format}"], input=dot_text.encode(), capture_output=True,
                              timeout=DOT_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"Graphviz's dot did not finish within {DOT_TIMEOUT} s", EXIT_UNAVAILABLE) from exc
    if proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip() or f"exit status {proc.returncode}"
        raise CommandError(f"Graphviz's dot failed: {message}", EXIT_UNAVAILABLE)
    return proc.stdout


def run(args: argparse.Namespace) -> int:
    if args.format == "png" and args.output is None and sys.stdout.isatty():
        raise CommandError("PNG is binary: pass `-o FILE.png` or redirect the output", EXIT_INVALID)
    view = read_view(read(args.file)[0], args.file)
    text = to_dot(view)
    if args.format == "dot" and args.output is None and sys.stdout.isatty():  # read on a terminal: fitted to it
        text = fold(text, terminal_width())  # (a pipe or a file gets the DOT source exactly)
    data = text.encode() if args.format == "dot" else _render(text, args.format)
    if args.output is not None:
        with open(args.output, "wb") as f:
            f.write(data)
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
    return 0
