"""The ``snapshot`` command: look inside snapshot files without unpickling them.

    snapshot inspect FILE [--json]

Inspection reads the manifest only (see ``docs/format.md``): it is safe on files from
anywhere and works where the graph's modules are not importable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from snapshot import format as fmt
from snapshot._version import __version__
from snapshot.errors import SnapshotError

__all__ = ["main"]

EXIT_OK = 0
EXIT_INVALID = 2


def _tree(manifest: dict[str, Any]) -> list[str]:
    nodes = manifest["graph"]["nodes"]
    shards = manifest.get("shards", [])
    counts: dict[str, Any] = {}
    details: dict[str, list[str]] = {}
    for shard in shards:
        for path, record in shard.get("nodes", {}).items():
            value = record.get("yielded")
            if value is not None:
                counts[path] = counts.get(path, 0) + value
            if len(shards) == 1:
                extra = []
                if record.get("state_bytes") is not None:
                    extra.append(f"state={record['state_bytes']}B")
                if record.get("buffered"):
                    extra.append(f"buffered={record['buffered']}")
                if record.get("restore"):
                    extra.append(f"restore={record['restore']}")
                details[path] = extra
    by_path = {n["path"]: n for n in nodes}
    lines: list[str] = []
    seen: set[str] = set()

    def walk(path: str, prefix: str, last: bool, top: bool) -> None:
        node = by_path[path]
        short = node["type"].rsplit(".", 1)[-1]
        args = ", ".join(f"{k}={v}" for k, v in node["args"].items())
        count = counts.get(path)
        shown = f"{short}({args})"
        connector = "" if top else ("└─ " if last else "├─ ")
        tail = f"   yielded={count}" if count is not None else ""
        if details.get(path):
            tail += "  " + " ".join(details[path])
        if path in seen:
            lines.append(f"{prefix}{connector}{path}  (shared, see above)")
            return
        seen.add(path)
        lines.append(f"{prefix}{connector}{path}  {shown}{tail}")
        child_prefix = prefix if top else prefix + ("   " if last else "│  ")
        inputs = node.get("inputs", [])
        for i, child in enumerate(inputs):
            walk(child, child_prefix, i == len(inputs) - 1, False)

    if nodes:
        walk(nodes[0]["path"], "", True, True)
    return lines


def render(manifest: dict[str, Any]) -> str:
    loader = manifest["loader"]
    randomness = manifest.get("randomness", {})
    service = manifest.get("service", {})
    payload = manifest.get("payload", {})
    out = [
        f"snapshot format {manifest['format']}, created {manifest.get('created', '?')}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items()),
        f"position: epoch {loader['epoch']}, {loader['yielded']} samples yielded"
        + (" (epoch finished)" if loader.get("epoch_finished") else ""),
        f"seed: {randomness.get('seed')} ({randomness.get('seed_source')})",
        "service: " + ", ".join(f"{k}={v}" for k, v in service.items()),
        f"graph: {len(manifest['graph']['nodes'])} nodes, fingerprint {manifest['graph']['fingerprint']}, "
        f"{'pickled graph included' if manifest['graph'].get('included') else 'no pickled graph'}",
        "",
        *_tree(manifest),
        "",
        *_plan_lines(manifest.get("shards", [])),
        f"payload: {payload.get('size', 0)} bytes, sha256 {payload.get('sha256', '')[:16]}...",
    ]
    return "\n".join(out)


def _plan_lines(shards: list[dict[str, Any]]) -> list[str]:
    lines = []
    for index, shard in enumerate(shards):
        plan = shard.get("plan", {})
        label = f"shard {index}: " if len(shards) > 1 else ""
        drivers = plan.get("drivers", [])
        if not drivers:
            lines.append(f"{label}restore plan (auto): every node from its state, nothing replayed")
        for driver in drivers:
            lines.append(f"{label}restore plan (auto): replay {driver['replay']} samples of {driver['path']}")
        for path, reason in plan.get("reasons", {}).items():
            lines.append(f"  {path}: {reason}")
    return lines + ([""] if lines else [])


def _inspect(args: argparse.Namespace) -> int:
    manifest = fmt.read_manifest(args.file)
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        print(render(manifest))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="snapshot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"snapshot {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect_cmd = commands.add_parser("inspect", help="show what a snapshot file holds")
    inspect_cmd.add_argument("file")
    inspect_cmd.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect_cmd.set_defaults(run=_inspect)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except SnapshotError as exc:
        print(f"snapshot: {exc}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
