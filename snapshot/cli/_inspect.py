"""``snapshot inspect FILE``: what a snapshot holds, from its manifest alone."""

from __future__ import annotations

import argparse
import json
from typing import Any

from snapshot.cli._exit import CommandError
from snapshot.cli._source import read
from snapshot.cli._text import MAX_LISTED, count, fit, more, size, table, terminal_width
from snapshot.cli._tree import graph_table
from snapshot.cli._view import Router, Shard, View, read_view
from snapshot.container import format as fmt

__all__ = ["add_command", "describe_position", "render", "summed"]

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
    cmd.add_argument("--plan-for", metavar="RANKS[xWORKERS]", type=_target,
                     help="print the re-shard plan of a restore onto RANKS ranks of WORKERS workers each (e.g. 3 or "
                          "6x2): which units each rank runs, which parts it reads, what it hands out first")
    cmd.set_defaults(run=run)


def _target(text: str) -> tuple[int, int]:
    ranks, _, workers = text.lower().partition("x")
    try:
        target = int(ranks), int(workers or 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANKS or RANKSxWORKERS (e.g. 3 or 6x2), got {text!r}") from None
    if target[0] < 1 or target[1] < 0:
        raise argparse.ArgumentTypeError(f"expected at least 1 rank and 0 or more workers, got {text!r}")
    return target


def run(args: argparse.Namespace) -> int:
    manifest, _ = read(args.file)
    if args.plan_for is not None:
        print(_reshard(manifest, args.file, *args.plan_for))
        return 0
    if args.json:  # as it is, even when it is not of the shape snapshot writes
        try:
            print(fmt.dumps_manifest(manifest))
        except RecursionError as exc:
            raise CommandError(f"{args.file}: the manifest is nested too deeply to print") from exc
    else:
        print(fit(render(read_view(manifest, args.file), full_paths=args.full_paths)))
    return 0


def _reshard(manifest: dict[str, Any], source: str, ranks: int, workers: int) -> str:
    from snapshot import schema
    from snapshot.errors import ManifestError
    from snapshot.reading_service.reshard import SavedLayout, plan_restore

    try:
        saved = SavedLayout.from_manifest(schema.Manifest.from_dict(manifest, source=source))
    except ManifestError as exc:
        raise CommandError(str(exc)) from exc
    if saved is None:
        return (f"{source}: no re-shard plan: the snapshot was taken before the first epoch, or by a service "
                "that does not run logical shards")
    return plan_restore(saved, ranks, workers).describe(limit=None)


def describe_position(view: View, *, below: bool = False) -> str:
    """``epoch 0, 80 batches yielded``, in the loader's unit; ``below``: with the samples its batcher took."""
    if view.epoch < 0:
        return "not started (before the first epoch)"
    unit = view.unit()
    text = f"epoch {view.epoch}, {count(view.yielded)} {unit.name} yielded"
    if view.epoch_finished:
        text += " (epoch finished)"
    taken = view.totals().get(unit.source or "")
    if below and taken is not None and taken.yielded is not None:
        text += (f"; the batcher at {unit.batcher} has taken {count(taken.yielded)} samples (with those of "
                 "batches in flight or buffered)")
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


def _shard_list(indices: list[int], total: int) -> str:
    """``every logical shard``, ``shard 3`` or ``shards 0, 2, 4``."""
    if len(indices) == total > 1:
        return "every logical shard"
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"shard {text}" if len(indices) == 1 else f"shards {text}"


def _plan(view: View) -> list[str]:
    """The plan once: one line per way the shards are restored (which nodes a restore replays), with the
    shards it applies to and the samples it replays in all (each shard's under Reading service)."""
    if not view.shards:
        return ["Restore plan: none recorded (the loader had not started)"]
    groups: dict[tuple[str, ...], list[int]] = {}
    for shard in view.shards:
        groups.setdefault(tuple(d.path for d in shard.drivers), []).append(shard.index)
    lines = []
    for paths, indices in groups.items():
        where = "" if len(view.shards) == 1 else f", {_shard_list(indices, len(view.shards))}"
        if not paths:
            lines.append(f"Restore plan (auto){where}: every node from its state, nothing replayed")
            continue
        replay = sum(d.replay for s in view.shards if s.index in indices for d in s.drivers)
        lines.append(f"Restore plan (auto){where}: replay {count(replay)} samples of {' and '.join(paths)}"
                     + (" in all" if len(indices) > 1 else ""))
    reasons: dict[str, str] = {}
    for shard in view.shards:
        reasons.update(shard.reasons)
    lines.extend(f"  {path}: {reason}" for path, reason in reasons.items())
    rereads: dict[str, str] = {}
    for shard in view.shards:
        rereads.update(shard.rereads)
    lines.extend(f"  {path} is restored from its state, and {what}" for path, what in rereads.items())
    recomputed = sum(t.replay for t in view.totals().values())
    if recomputed:
        lines.append(f"  about {count(recomputed)} samples are recomputed in all (column 'replay')")
    return lines


def _randomness(view: View) -> list[str]:
    source = _SEED_SOURCES.get(view.seed_source or "", view.seed_source or "not seeded yet")
    lines = ["Randomness", f"  seed  {view.seed if view.seed is not None else '-'} ({source})"]
    if view.node_seeds:
        lines.append("  derived seeds (fingerprints):")
        # the fingerprint first: a node's path is as long as the graph is deep, and is never cut
        lines.extend(table(["fingerprint", "node"], [[s, p] for p, s in view.node_seeds.items()], indent="    ",
                           width=0)[1:])
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
    layout = dict(view.layout)
    shards = layout.pop("logical_shards", None)
    if isinstance(shards, int) and not isinstance(shards, bool):  # the stream's L (more workers split it)
        lines.append(f"  logical shards: {count(shards)} (one stream on up to {count(shards)} "
                     f"worker{'s' if shards != 1 else ''} per rank; more split them)")
    elif shards is not None:  # not a count: shown as it is
        layout = dict(view.layout)
    lines.extend(table(["", ""], [[key, _compact(value)] for key, value in layout.items()])[1:])
    if view.shards:
        lines.extend(_shard_table(view))
    if view.ranks:
        keys = list(dict.fromkeys(key for rank in view.ranks for key in rank if key not in ("rank", "handout")))
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
                           rows, right=[3], middle=[2]))  # a path's end names the node
    return lines


def _shard_table(view: View) -> list[str]:
    """A row per logical shard: what the loader took from it, in its unit (and, for batches, the samples
    the shard's batcher took), in flight, exhausted, buffered, replayed, and fields of the service's own."""
    unit = view.unit()
    extra = sorted({key for shard in view.shards for key in shard.extra})
    samples = unit.source is not None and any(unit.source in s.nodes for s in view.shards)
    header = ["shard", "batches" if unit.batcher else "yielded", *(["samples"] if samples else []), "in flight",
              "exhausted", "buffered",
              "replay", *extra]
    rows = []
    for s in view.shards:
        taken = s.nodes.get(unit.source or "")
        rows.append([str(s.index), count(s.yielded),
                     *([count(taken.yielded if taken else None)] if samples else []), count(s.in_flight),
                     "yes" if s.exhausted else "no", count(_shard_buffered(s)),
                     count(sum(d.replay for d in s.drivers)) if s.drivers else "-",
                     *(_compact(s.extra[key], 40) if key in s.extra else "-" for key in extra)])
    shift = 1 if samples else 0
    return table(header, rows, right=[1, *([2] if samples else []), 2 + shift, 4 + shift, 5 + shift])


def _readers(view: View) -> list[str]:
    """Where each file reader stands (file, member, offset, from the manifest): per reader node, what a
    restore reads again to put it back, then a row per shard (or copy above the sharding point)."""
    parts: list[tuple[str, dict[str, str], dict[str, Any]]] = [
        *((str(s.index), s.rereads, s.nodes) for s in view.shards),
        *((f"copy {u.index}", {}, u.nodes) for u in view.upstream)]
    found: dict[str, list[tuple[str, Any, str | None]]] = {}
    for label, rereads, nodes in parts:
        for path, position in nodes.items():
            if position.reading is not None:
                found.setdefault(path, []).append((label, position, rereads.get(path)))
    if not found:
        return []
    lines = ["Readers: where each file reader stands (--json: the manifest's 'reading' records)"]
    for path, rows in found.items():
        node = view.by_path.get(path)
        name = node.short_type.removesuffix("IterDataPipe") if node is not None else "?"
        lines.append(f"  {name} at {path}: {_again(rows)}")
        cells = [[label, p.reading.file, p.reading.member or "-",
                  f"entry {count(p.reading.entry)}" if p.reading.entry is not None else count(p.reading.offset)]
                 for label, p, _ in rows]
        header = ["shard" if view.shards else "copy", "file", "member", "offset"]
        lines += table(header, cells[:MAX_LISTED], right=[3], indent="    ", middle=[1, 2])
        lines += more(len(cells), "    ")
    return [*lines, ""]


def _again(rows: list[tuple[str, Any, str | None]]) -> str:
    """What a restore reads again to put a reader back, from its positions and the plan's ``rereads``."""
    if all(p.restore == "replay" for _, p, _ in rows):
        return "replayed with its part of the graph (see Restore plan)"
    if any(p.reading.inflated for _, p, _ in rows):
        return ("offsets count decompressed bytes; a restore inflates each current file again from its start up "
                "to the offset (never the files before it)")
    if any(reread for _, _, reread in rows):
        return ("a restore reopens the file and seeks to the offset (a compressed archive is inflated again up "
                "to it; never the archives before it)")
    return "a restore reopens the file and seeks to the offset; nothing before it is read again"


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


def _trust(view: View) -> list[str]:
    """Which sections decode as data and which need trust (the graph's pickle runs only in from_snapshot)."""
    graph = (" The graph and the reading service are pickles that only from_snapshot unpickles."
             if view.graph_included else "")
    if view.payload_encoding is None:
        return ["Trust: each rank's part records its own sections (inspect a part file)."] if view.part_files else []
    if view.payload_encoding == "pickle":
        return ["Trust: format 1, the state is one pickle: restoring it runs code from the file and needs trust "
                "(a key it is signed with, or allow_pickle=True). Save it again to get format 2."]
    if not view.pickled:
        return [f"Trust: the state is data; restoring onto a graph built in code runs nothing from the file.{graph}"]
    rows = [[value.at, value.type, count(value.size)] for value in view.pickled]
    return [f"Trust: {len(view.pickled)} value(s) of the state are not data and were saved pickled; restoring them "
            f"needs trust (a key the file is signed with, or allow_pickle=True).{graph}",
            *table(["where", "type", "bytes"], rows, right=[2])]


def render(view: View, *, full_paths: bool = False) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in view.versions.items()) or "unknown"
    graph = (f"Graph: {len(view.nodes)} nodes, fingerprint {view.fingerprint or '-'}, "
             + ("pickled graph included" if view.graph_included else "no pickled graph (rebuild it in code)"))
    graph += summed(view)
    kind = f"distributed snapshot of {len(view.part_files)} parts" if view.part_files else "snapshot"
    position = describe_position(view, below=True)
    if view.ranks:
        position = f"{position} (the whole run, {len(view.ranks)} ranks; each rank's under Reading service)"
    out = [
        f"{view.source}: {kind}, format {view.format}, created {view.created or 'at an unknown time'}",
        f"  written by  {versions}",
        f"  position    {position}",
        *([f"  metadata    {_compact(view.metadata, 400)}"] if view.metadata else []),
        "",
        graph,
        *graph_table(view, full_paths=full_paths, width=terminal_width()),
        "",
        *_plan(view),
        "",
        *_randomness(view),
        "",
        *_service(view),
        "",
        *_readers(view),
        _buffers(view),
        _verification(view),
        "",
        *_sizes(view),
        *_trust(view),
        "",
        "Only the manifest was read. `snapshot verify FILE` checks the payload and the signature.",
    ]
    return "\n".join(out)
