"""``snapshot inspect FILE``: what a snapshot holds, from its manifest alone."""

from __future__ import annotations

import argparse
import json
from typing import Any

from snapshot import format as fmt
from snapshot.cli._exit import CommandError
from snapshot.cli._source import read
from snapshot.cli._text import count, fit, size, table, terminal_width
from snapshot.cli._view import NodeTotals, Router, Shard, View, read_view

__all__ = ["add_command", "describe_position", "graph_rows", "render", "summed"]

#: Longest argument value, and longest ``Type(args)``, shown in the tree (``--json`` has all).
ARG_WIDTH = 32
TYPE_WIDTH = 64
_SEED_SOURCES = {"user": "given to seed()", "drawn": "drawn at random (seed() was not called)"}


def add_command(commands: Any) -> None:
    cmd = commands.add_parser(
        "inspect", help="show what a snapshot file holds (never unpickles)",
        description="Show a snapshot's versions, position, graph, restore plan, seeds, layout "
                    "and sizes. Reads the manifest only: safe on any file, and works where the "
                    "graph's modules cannot be imported.")
    cmd.add_argument("file", help="a snapshot file")
    cmd.add_argument("--json", action="store_true", help="print the manifest as JSON")
    cmd.add_argument("--full-paths", action="store_true",
                     help="show every node's full path in the tree (default: the edge from its parent)")
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    manifest, _ = read(args.file)
    if args.json:  # as it is, even when it is not of the shape snapshot writes
        try:
            print(fmt.dumps_manifest(manifest))
        except RecursionError as exc:
            raise CommandError(f"{args.file}: the manifest is nested too deeply to print") from exc
    else:
        print(fit(render(read_view(manifest, args.file), full_paths=args.full_paths)))
    return 0


def describe_position(view: View) -> str:
    if view.epoch < 0:
        return "not started (before the first epoch)"
    text = f"epoch {view.epoch}, {count(view.yielded)} samples yielded"
    if view.epoch_finished:
        text += " (epoch finished)"
    return text


def summed(view: View) -> str:
    """``"; figures summed over ..."`` when a node's figures add up several shards or copies."""
    parts = []
    if len(view.shards) > 1:
        parts.append(f"{len(view.shards)} logical shards")
    if len(view.upstream) > 1:
        parts.append(f"{len(view.upstream)} copies above the sharding point")
    return f"; figures summed over {' and '.join(parts)}" if parts else ""


def _compact(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def graph_rows(view: View, *, full_paths: bool = False, compact: bool = False) -> list[list[str]]:
    """The graph as a tree: one row per node (node, type, yielded, buffered, state, restore, replay).

    A node's path is its parent's path, ``/``, and the edge shown (``full_paths`` shows it all).
    A node reached again through another edge (the input shared by ``fork`` children) is
    listed once and referred to by its full path afterwards. ``compact`` drops the
    ``IterDataPipe`` that ends torch's class names (for a narrow terminal).
    """
    totals = view.totals()
    rows: list[list[str]] = []
    seen: set[str] = set()
    # Depth-first from the sink, inputs in order; iterative, so deep graphs cannot overflow.
    stack: list[tuple[str, str, str, str]] = [(node.path, "", "", "") for node in reversed(view.nodes)]
    while stack:
        path, parent, prefix, connector = stack.pop()
        if path in seen:
            if connector:  # a second edge into a shared node; unreached roots are skipped
                rows.append([f"{prefix}{connector}(shared)", f"= {path}, listed above", "", "", "", "", ""])
            continue
        seen.add(path)
        node = view.by_path[path]
        name = path
        if parent and not full_paths and path.startswith(parent + "/"):
            name = path[len(parent) + 1:]
        signature = node.signature(skip_none=True, width=ARG_WIDTH, limit=TYPE_WIDTH)
        if compact and node.short_type.endswith("IterDataPipe") and node.short_type != "IterDataPipe":
            signature = signature.replace("IterDataPipe(", "(", 1)
        rows.append([f"{prefix}{connector}{name}", signature, *_figures(totals.get(path))])
        child_prefix = prefix + ("" if not connector else ("   " if connector.startswith("└") else "│  "))
        for i in reversed(range(len(node.inputs))):
            last = i == len(node.inputs) - 1
            stack.append((node.inputs[i], path, child_prefix, "└─ " if last else "├─ "))
    return rows


def _figures(totals: NodeTotals | None) -> list[str]:
    if totals is None:
        return ["-", "-", "-", "-", "-"]
    return [count(totals.yielded), count(totals.buffered) if totals.buffered else "-",
            size(totals.state_bytes), totals.restore or "-",
            count(totals.replay) if totals.restore in ("replay", "mixed") else "-"]


def _plan(view: View) -> list[str]:
    if not view.shards:
        return ["Restore plan: none recorded (the loader had not started)"]
    lines = []
    for shard in view.shards:
        label = f"shard {shard.index}: " if len(view.shards) > 1 else ""
        if not shard.drivers:
            lines.append(f"Restore plan (auto): {label}every node from its state, nothing replayed")
        for driver in shard.drivers:
            lines.append(f"Restore plan (auto): {label}replay {count(driver.replay)} samples of {driver.path}")
    reasons: dict[str, str] = {}
    for shard in view.shards:
        reasons.update(shard.reasons)
    lines.extend(f"  {path}: {reason}" for path, reason in reasons.items())
    recomputed = sum(t.replay for t in view.totals().values())
    if recomputed:
        lines.append(f"  about {count(recomputed)} samples are recomputed in all (column 'replay')")
    return lines


def _randomness(view: View) -> list[str]:
    source = _SEED_SOURCES.get(view.seed_source or "", view.seed_source or "not seeded yet")
    lines = ["Randomness", f"  seed  {view.seed if view.seed is not None else '-'} ({source})"]
    if view.node_seeds:
        lines.append("  derived seeds (fingerprints):")
        lines.extend(table(["node", "fingerprint"], [[p, s] for p, s in view.node_seeds.items()], indent="    ")[1:])
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return count(value)
    return "-" if value is None else _compact(value, 40)


def _shard_buffered(shard: Shard) -> int:
    return sum(p.buffered for p in shard.nodes.values())


def _service(view: View) -> list[str]:
    lines = [f"Reading service: {view.service_name}"]
    lines.extend(table(["", ""], [[key, _compact(value)] for key, value in view.layout.items()])[1:])
    if view.shards:
        extra = sorted({key for shard in view.shards for key in shard.extra})
        header = ["shard", "yielded", "in flight", "exhausted", "buffered", "replay", *extra]
        rows = [[str(s.index), count(s.yielded), count(s.in_flight), "yes" if s.exhausted else "no",
                 count(_shard_buffered(s)), count(sum(d.replay for d in s.drivers)) if s.drivers else "-",
                 *(_compact(s.extra[key], 40) if key in s.extra else "-" for key in extra)]
                for s in view.shards]
        lines.extend(table(header, rows, right=[1, 2, 4, 5]))
    if view.ranks:
        keys = list(dict.fromkeys(key for rank in view.ranks for key in rank if key != "rank"))
        rows = [[_compact(rank.get("rank", i)), *(_cell(rank.get(key)) for key in keys)]
                for i, rank in enumerate(view.ranks)]
        lines.extend(table(["rank", *(key.replace("_", " ") for key in keys)], rows,
                           right=[i + 1 for i, key in enumerate(keys) if key in ("epoch", "yielded", "lookahead")]))
    if view.upstream:
        lines.append("  above the sharding point (a copy of that part of the graph per process):")
        extra = sorted({key for copy in view.upstream for key in copy.extra})
        rows = []
        for copy in view.upstream:
            routers: list[tuple[str, Router | None]] = list(copy.routers.items()) or [("-", None)]
            for path, router in routers:
                rows.append([str(copy.index), ",".join(map(str, copy.shards)) or "-", path,
                             count(router.position) if router else "-",
                             ("yes" if router.ended else "no") if router else "-",
                             ", ".join(f"{shard}: {n}" for shard, n in router.queued.items()) if router else "-",
                             *(_compact(copy.extra[key], 40) if key in copy.extra else "-" for key in extra)])
        lines.extend(table(["copy", "feeds shards", "sharding point", "read", "ended", "queued per shard", *extra],
                           rows, right=[3]))
    return lines


def _buffers(view: View) -> str:
    totals = view.totals().values()
    held = sum(t.buffered for t in totals)
    holders = sum(1 for t in totals if t.buffered)
    in_flight = sum(s.in_flight for s in view.shards)
    text = f"Buffers: {count(held)} samples held in the buffers of {holders} node{'s' if holders != 1 else ''}"
    text += f"; {count(view.lookahead)} computed ahead by the loader"
    if in_flight:
        text += f"; {count(in_flight)} in flight between workers and the loader"
    return text


def _verification(view: View) -> str:
    if not view.verify:
        return "Verification: none recorded (save_snapshot(verify=K) records the next K samples)"
    recorded = view.verify.get("count", view.verify.get("fingerprints"))
    number = len(recorded) if isinstance(recorded, list) else recorded
    ends = " (the epoch ends sooner)" if view.verify.get("ends") is True else ""
    return f"Verification: fingerprints of the next {_compact(number)} samples recorded{ends}"


def _sizes(view: View) -> list[str]:
    total = view.file_size
    if view.part_files and total is not None:
        total += sum(part.size for part in view.part_files)
    lines = [f"Size: {size(total)}" + (f" ({count(total)} bytes)" if total is not None else "")]
    rows = []
    if view.part_files:
        rows.append(["manifest.snap" if view.payload_size is None else "manifest", count(view.file_size), ""])
        rows.extend([f"{part.file} (rank {part.rank})", count(part.size), f"sha256 {part.sha256[:16]}…"]
                    for part in view.part_files)
    elif view.file_size is not None and view.payload_size is not None:
        rows.append(["manifest and header", count(view.file_size - view.payload_size), ""])
    if view.payload_size is not None:
        sha = f"sha256 {view.payload_sha256[:16]}…" if view.payload_sha256 else ""
        rows.append(["payload", count(view.payload_size), sha])
        rows.extend([f"  {part}", count(n), ""] for part, n in view.payload_parts.items())
    return lines + table(["part", "bytes", ""], rows, right=[1])


def _graph_table(view: View, full_paths: bool) -> list[str]:
    """The graph's table; on a terminal too narrow for it, with shorter type names, then elided."""
    header = ["node" if full_paths else "node (edge from its parent)", "type", "yielded", "buffered",
              "state", "restore", "replay"]
    width = terminal_width()
    lines = table(header, graph_rows(view, full_paths=full_paths), right=[2, 3, 4, 6], width=0)
    if width is None or max(map(len, lines)) <= width:
        return lines
    return table(header, graph_rows(view, full_paths=full_paths, compact=True), right=[2, 3, 4, 6],
                 keep_ends=[0], width=width)


def render(view: View, *, full_paths: bool = False) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in view.versions.items()) or "unknown"
    graph = (f"Graph: {len(view.nodes)} nodes, fingerprint {view.fingerprint or '-'}, "
             + ("pickled graph included" if view.graph_included else "no pickled graph (rebuild it in code)"))
    graph += summed(view)
    kind = f"distributed snapshot of {len(view.part_files)} parts" if view.part_files else "snapshot"
    position = describe_position(view)
    if view.ranks:
        position = f"{position} (the whole run, {len(view.ranks)} ranks; each rank's under Reading service)"
    out = [
        f"{view.source}: {kind}, format {view.format}, created {view.created or 'at an unknown time'}",
        f"  written by  {versions}",
        f"  position    {position}",
        "",
        graph,
        *_graph_table(view, full_paths),
        "",
        *_plan(view),
        "",
        *_randomness(view),
        "",
        *_service(view),
        "",
        _buffers(view),
        _verification(view),
        "",
        *_sizes(view),
        "",
        "Only the manifest was read. `snapshot verify FILE` checks the payload and the signature.",
    ]
    return "\n".join(out)
