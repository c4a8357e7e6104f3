"""``snapshot diff A B``: what changed between two snapshots, from their manifests.

Structure (nodes added, removed or changed), per-node positions, seeds, the reading
service's layout and per-shard positions, restore plans, versions and payloads. The
creation times are shown but do not count as a difference.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any

from snapshot.cli._exit import EXIT_OK, EXIT_PROBLEM
from snapshot.cli._inspect import describe_position
from snapshot.cli._source import read
from snapshot.cli._text import MAX_LISTED, count, fit, more, path_lines, table, terminal_width
from snapshot.cli._view import NodeDesc, NodeTotals, View, read_view

__all__ = ["Difference", "add_command", "compare", "render"]

SECTIONS = ("position", "metadata", "graph", "nodes", "randomness", "layout", "shards", "ranks", "upstream", "plan",
            "versions", "payload")
_MISSING = "(none)"


@dataclass(frozen=True)
class Difference:
    """One thing that is not the same in A and B (``None``: absent on that side).

    ``item`` names the thing (a node path, a layout key, ...); ``field`` which of its figures
    differs, for per-node positions.
    """

    section: str
    item: str
    a: Any
    b: Any
    field: str = ""


def add_command(commands: Any) -> None:
    cmd = commands.add_parser(
        "diff", help="show what changed between two snapshots",
        description="Compare two snapshots' manifests: position, graph structure, per-node "
                    "counts, seeds, layout, restore plan, versions and payload. Exit code 0 when "
                    "they are the same, 1 when they differ, 2 when one cannot be read.")
    cmd.add_argument("a", metavar="A", help="the first snapshot file")
    cmd.add_argument("b", metavar="B", help="the second snapshot file")
    cmd.add_argument("--json", action="store_true", help="print the differences as JSON")
    cmd.set_defaults(run=run)


def _signature(node: NodeDesc) -> str:
    return node.signature()


def _structure(a: View, b: View) -> list[Difference]:
    out = []
    for node in a.nodes:
        other = b.by_path.get(node.path)
        if other is None:
            out.append(Difference("graph", node.path, _signature(node), None))
        elif (node.type, node.args, node.fingerprint) != (other.type, other.args, other.fingerprint):
            out.append(Difference("graph", node.path, _signature(node), _signature(other)))
        elif node.inputs != other.inputs:
            out.append(Difference("graph", f"{node.path} inputs", list(node.inputs), list(other.inputs)))
    out.extend(Difference("graph", node.path, None, _signature(node)) for node in b.nodes if node.path not in a.by_path)
    return out


def _figures(totals: NodeTotals | None) -> dict[str, Any]:
    if totals is None:
        return {}
    replayed = totals.restore in ("replay", "mixed")
    return {"yielded": totals.yielded, "buffered": totals.buffered, "restore": totals.restore,
            "replay": totals.replay if replayed else None}


def _nodes(a: View, b: View, changed: set[str]) -> list[Difference]:
    """Figures of the nodes that are the same node in both (``changed``: those that are not)."""
    ta, tb = a.totals(), b.totals()
    out = []
    for node in a.nodes:
        if node.path not in b.by_path or node.path in changed:
            continue
        fa, fb = _figures(ta.get(node.path)), _figures(tb.get(node.path))
        for name in dict.fromkeys([*fa, *fb]):
            if fa.get(name) != fb.get(name):
                out.append(Difference("nodes", node.path, fa.get(name), fb.get(name), name))
    return out


def _mapping(section: str, a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[Difference]:
    return [Difference(section, f"{prefix}{key}", a.get(key), b.get(key))
            for key in dict.fromkeys([*a, *b]) if a.get(key) != b.get(key)]


def _shards(a: View, b: View) -> list[Difference]:
    out = []
    by_index_a, by_index_b = {s.index: s for s in a.shards}, {s.index: s for s in b.shards}
    if list(by_index_a) != list(by_index_b):
        recorded_a, recorded_b = list(by_index_a), list(by_index_b)
        same_count = len(recorded_a) == len(recorded_b)
        out.append(Difference("shards", "logical shards recorded", recorded_a if same_count else len(recorded_a),
                              recorded_b if same_count else len(recorded_b)))
    for index in [i for i in by_index_a if i in by_index_b]:
        sa, sb = by_index_a[index], by_index_b[index]
        fields_a = {"yielded": sa.yielded, "in_flight": sa.in_flight, "exhausted": sa.exhausted, **sa.extra}
        fields_b = {"yielded": sb.yielded, "in_flight": sb.in_flight, "exhausted": sb.exhausted, **sb.extra}
        out.extend(_mapping("shards", fields_a, fields_b, f"shard {index} "))
        drivers_a = "; ".join(f"replay {d.replay} samples of {d.path}" for d in sa.drivers) or "all from state"
        drivers_b = "; ".join(f"replay {d.replay} samples of {d.path}" for d in sb.drivers) or "all from state"
        if drivers_a != drivers_b:
            out.append(Difference("plan", f"shard {index}", drivers_a, drivers_b))
    return out


def _ranks(a: View, b: View) -> list[Difference]:
    out = []
    if len(a.ranks) != len(b.ranks):
        out.append(Difference("ranks", "ranks recorded", len(a.ranks), len(b.ranks)))
    for index, (ra, rb) in enumerate(zip(a.ranks, b.ranks)):
        out.extend(_mapping("ranks", ra, rb, f"rank {ra.get('rank', index)} "))
    return out


def _payloads(a: View, b: View) -> list[Difference]:
    out = []
    if a.payload_sha256 != b.payload_sha256:
        out.append(Difference("payload", "payload", a.payload_size, b.payload_size))
    files_a, files_b = {p.file: p for p in a.part_files}, {p.file: p for p in b.part_files}
    for name in dict.fromkeys([*files_a, *files_b]):
        pa, pb = files_a.get(name), files_b.get(name)
        if pa is None or pb is None or pa.sha256 != pb.sha256:
            out.append(Difference("payload", name, pa.size if pa else None, pb.size if pb else None))
    return out


def _upstream(a: View, b: View) -> list[Difference]:
    out = []
    if len(a.upstream) != len(b.upstream):
        out.append(Difference("upstream", "copies above the sharding point", len(a.upstream), len(b.upstream)))
    for ua, ub in zip(a.upstream, b.upstream):
        label = f"copy {ua.index} "
        if ua.shards != ub.shards:
            out.append(Difference("upstream", f"{label}feeds shards", list(ua.shards), list(ub.shards)))
        for path in dict.fromkeys([*ua.routers, *ub.routers]):
            ra, rb = ua.routers.get(path), ub.routers.get(path)
            fields_a = {"read": ra.position, "ended": ra.ended, "queued": ra.queued} if ra else {}
            fields_b = {"read": rb.position, "ended": rb.ended, "queued": rb.queued} if rb else {}
            out.extend(_mapping("upstream", fields_a, fields_b, f"{label}{path} "))
        out.extend(_mapping("upstream", ua.extra, ub.extra, label))
    return out


def compare(a: View, b: View) -> list[Difference]:
    """Every difference between the snapshots ``a`` and ``b``, in section order."""
    out = _mapping("position", {"epoch": a.epoch, "yielded": a.yielded, "epoch finished": a.epoch_finished,
                                "lookahead": a.lookahead},
                   {"epoch": b.epoch, "yielded": b.yielded, "epoch finished": b.epoch_finished,
                    "lookahead": b.lookahead})
    out += _mapping("metadata", a.metadata, b.metadata)
    structure = _structure(a, b)
    out += structure
    out += _nodes(a, b, {d.item.split(" ")[0] for d in structure})
    out += _mapping("randomness", {"seed": a.seed, "seed source": a.seed_source},
                    {"seed": b.seed, "seed source": b.seed_source})
    out += _mapping("randomness", a.node_seeds, b.node_seeds, "derived seed of ")
    out += _mapping("layout", a.service, b.service)
    out += _shards(a, b)
    out += _ranks(a, b)
    out += _upstream(a, b)
    out += _mapping("versions", a.versions, b.versions)
    out += _payloads(a, b)
    return out


def _value(value: Any, missing: str = _MISSING) -> str:
    if value is None:
        return missing
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return count(value)
    return value if isinstance(value, str) else json.dumps(value)


def _progress(a: View, b: View) -> str:
    if a.epoch == b.epoch and a.epoch_finished == b.epoch_finished:
        delta = b.yielded - a.yielded
        if delta == 0:
            return f"same position ({describe_position(a)})"
        direction = "ahead of" if delta > 0 else "behind"
        return (f"B is {count(abs(delta))} {a.unit().name} {direction} A in epoch {a.epoch} "
                f"({count(a.yielded)} → {count(b.yielded)})")
    ahead = (b.epoch, b.epoch_finished, b.yielded) > (a.epoch, a.epoch_finished, a.yielded)
    later = "B is later" if ahead else "B is earlier"
    return f"{later}: A at {describe_position(a)}; B at {describe_position(b)}"


def _type(node: NodeDesc | None) -> str:
    """A node's class, short: ``Shuffler`` for ``ShufflerIterDataPipe``."""
    if node is None:
        return "-"
    name = node.short_type
    return name[:-len("IterDataPipe")] if name.endswith("IterDataPipe") and name != "IterDataPipe" else name


def _node_rows(diffs: list[Difference], a: View, b: View) -> list[list[str]]:
    ta, tb = a.totals(), b.totals()
    rows = []
    for path in dict.fromkeys(d.item for d in diffs):
        fa, fb = _figures(ta.get(path)), _figures(tb.get(path))
        row = [path, _type(a.by_path.get(path))]
        for name in ("yielded", "buffered", "restore", "replay"):
            va, vb = _value(fa.get(name), "-"), _value(fb.get(name), "-")
            row.append(va if va == vb else f"{va} → {vb}")
            if name == "yielded":
                row.append(_delta(fa.get(name), fb.get(name)))
        rows.append(row)
    return rows


def _node_table(rows: list[list[str]]) -> list[str]:
    """A row per node (path, type, figures) where that fits the terminal; else each node's path on a
    line of its own above its type and figures: a path is never cut, so two nodes never read alike."""
    figures = ["yielded", "change", "buffered", "restore", "replay"]
    lines = table(["node", "type", *figures], rows, right=[2, 3, 4, 6], width=0)
    limit = terminal_width()
    if not limit or max(map(len, lines)) <= limit:
        return lines
    stacked = table(["type", *figures], [row[1:] for row in rows], right=[1, 2, 3, 5], indent="    ", width=0)
    out = ["  node", stacked[0]]
    for row, line in zip(rows, stacked[1:]):
        out += [*path_lines(row[0], limit), line]
    return out


def _section_lines(section: str, diffs: list[Difference], a: View, b: View) -> list[str]:
    if section == "position":
        return [f"Position: {_progress(a, b)}"]
    if section == "nodes":
        rows = _node_rows(diffs, a, b)
        return [f"Per-node positions: {len(rows)} node{'s' if len(rows) != 1 else ''} moved",
                *_node_table(rows[:MAX_LISTED]), *more(len(rows))]
    if section == "graph":
        lines = [f"Graph: {len(diffs)} {'node differs' if len(diffs) == 1 else 'nodes differ'} (fingerprint "
                 f"{a.fingerprint[:16] or '-'} → {b.fingerprint[:16] or '-'}); restoring one snapshot "
                 "onto the other's graph is refused"]
        for d in diffs[:MAX_LISTED]:
            lines += [f"  at {d.item}:", f"    in A: {_value(d.a)}", f"    in B: {_value(d.b)}"]
        return lines + more(len(diffs))
    if section == "payload":
        return [f"{'Payload' if d.item == 'payload' else d.item}: different bytes "
                f"({_value(d.a)} → {_value(d.b)} bytes)" for d in diffs]
    title = {"randomness": "Randomness", "layout": "Reading service and layout", "shards": "Logical shards",
             "ranks": "Ranks", "upstream": "Above the sharding point", "plan": "Restore plan (auto)",
             "versions": "Versions", "metadata": "Metadata (save_snapshot(metadata=...))"}[section]
    rows = [[d.item, _value(d.a), _value(d.b)] for d in diffs[:MAX_LISTED]]
    return [f"{title}:", *table(["", "A", "B"], rows), *more(len(diffs))]


def _delta(a: Any, b: Any) -> str:
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
        return f"{b - a:+,}"
    return ""


def render(a: View, b: View, diffs: list[Difference]) -> str:
    out = [f"A: {a.source} (created {a.created or '?'}; {describe_position(a)})",
           f"B: {b.source} (created {b.created or '?'}; {describe_position(b)})", ""]
    if not diffs:
        out.append("No differences: same position, graph, seeds, layout, plan, versions and payload.")
        return "\n".join(out)
    by_section: dict[str, list[Difference]] = {}
    for diff in diffs:
        by_section.setdefault(diff.section, []).append(diff)
    for section in SECTIONS:
        if section in by_section:
            out.extend(_section_lines(section, by_section[section], a, b))
    if list(by_section) == ["payload"]:
        out.append("  The manifests agree, so node states or buffered samples differ.")
    absent = {"nodes"} | (set() if a.upstream or b.upstream else {"upstream"}) | (
        set() if a.ranks or b.ranks else {"ranks"}) | (set() if a.metadata or b.metadata else {"metadata"})
    same = [s for s in SECTIONS if s not in by_section and s not in absent]
    out.append(f"Same: {', '.join(same)}" if same else "")
    return "\n".join(out).rstrip()


def run(args: argparse.Namespace) -> int:
    a = read_view(read(args.a)[0], args.a)
    b = read_view(read(args.b)[0], args.b)
    diffs = compare(a, b)
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "same": not diffs,
                          "differences": [asdict(d) for d in diffs]}, indent=2))
    else:
        print(fit(render(a, b, diffs)))
    return EXIT_PROBLEM if diffs else EXIT_OK
