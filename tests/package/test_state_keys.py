"""The payload's state is read through its typed records (``snapshot.schema.state`` and
``snapshot.schema.saved``): no module outside a record's owner reads the record's keys.

The scan is textual: a subscript (``record["nodes"]``), a ``.get("nodes"``, ``.pop("nodes"``,
``.setdefault("nodes"`` or a membership test (``"nodes" in record``) with one of the records'
keys, in any module of ``snapshot/`` but the records' owners. ``python tests/package/test_state_keys.py
DIR`` lists what it finds under another tree (``/work/main/snapshot``, say).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from snapshot import schema

PACKAGE = Path(__file__).resolve().parents[2] / "snapshot"

#: The records of the payload's state, whose keys only their owners read.
RECORDS = (schema.SavedState, schema.RankState, schema.ServiceState, schema.RankServiceState, schema.SeedsState,
           schema.UpstreamState, schema.RouterState, schema.ShardState, schema.PlanState, schema.NodeState)

#: The folders that own the keys they read: the records themselves, the hooks (a node's ``state`` is
#: its hook's own record, opaque to the rest), and the command line (it reads manifests, never state).
OWNERS = ("schema/", "hooks/", "cli/")

#: Records of their own that a module writes and reads, whose keys share a word with the payload's.
OWN_RECORDS: dict[str, set[str]] = {
    # SeedGenerator.state(): its two Philox streams
    "engine/randomness.py": {"shared", "shard"},
    # a distributed snapshot's part info (its rank, file, size, sha256), and a part's manifest as the
    # index takes it (its positions: the manifest's keys, which share words with the state's)
    "container/_parts.py": {"rank", "shards", "service", "upstream"},
    "storage/_object_directory.py": {"rank"},
    "storage/multipart.py": {"rank"},
    # a worker's set-up (its graph, shards, options), sent once when it starts
    "reading_service/_workers/worker.py": {"shards", "buffer_state"},
    # the payload's frame, {"state", "graph", "service"}: the container's, around the state's root
    "container/capture.py": {"state", "service"},
    "container/_payload.py": {"state", "service"},
}


def record_keys() -> set[str]:
    """Every key the records write, read from their ``to_dict()`` of a full record."""
    keys: set[str] = set()
    for record in RECORDS:
        keys |= {f.name for f in dataclasses.fields(record)} - {"extra"}
    # the on-disk names that are not attribute names (SavedState.position is written as three keys)
    return keys - {"graph_exhausted"} | {"exhausted", "epoch", "yielded", "epoch_finished"}


def _pattern(keys: set[str]) -> re.Pattern[str]:
    words = "|".join(sorted(re.escape(k) for k in keys))
    quoted = rf"""["']({words})["']"""
    subscript = rf"""(?<=[\w)\]])\[\s*{quoted}\s*\]"""
    return re.compile(rf"""{subscript}|\.(?:get|pop|setdefault)\(\s*{quoted}|{quoted}\s+(?:not\s+)?in\b""")


def string_key_reads(root: Path) -> list[str]:
    """``file:line: text`` of every read of a record's key outside its owners, under ``root``."""
    pattern = _pattern(record_keys())
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name.startswith(OWNERS):
            continue
        allowed = OWN_RECORDS.get(name, set())
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = line.split("#", 1)[0]
            if text.lstrip().startswith((">>>", "...")):
                continue
            keys = {next(g for g in match.groups() if g) for match in pattern.finditer(text)}
            if keys - allowed:
                found.append(f"{name}:{number}: {line.strip()}")
    return found


def test_no_module_reads_a_state_record_by_its_keys() -> None:
    found = string_key_reads(PACKAGE)
    assert not found, ("read these through the typed records of snapshot.schema (their attributes), "
                       "not by key:\n" + "\n".join(found))


@pytest.mark.parametrize("line", ['x = record["nodes"]', 'n = shard.get("in_flight", [])',
                                  'if "deal" in state:', 'service.pop("merge")'])
def test_the_scan_finds_a_key_read(tmp_path: Path, line: str) -> None:
    (tmp_path / "module.py").write_text(line + "\n")
    assert string_key_reads(tmp_path) == [f"module.py:1: {line}"]


def test_the_scan_leaves_owners_and_other_words_alone(tmp_path: Path) -> None:
    (tmp_path / "schema").mkdir()
    (tmp_path / "schema" / "state.py").write_text('x = record["nodes"]\n')
    (tmp_path / "module.py").write_text('x = record["fingerprints"]\ny = {"nodes": 1}\n')
    assert string_key_reads(tmp_path) == []


if __name__ == "__main__":
    print("\n".join(string_key_reads(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE)))
