"""The schema: typed records that round-trip, and a manifest of any shape refused by name.

The fuzz here is structural: a real manifest is edited (a field removed, replaced by a value
of another type or out of range, a list emptied or doubled) and re-encoded with correct
checksums, so only the schema stands between it and the code. Whatever the edit, reading
ends in a valid result or a ``SnapshotError``; a restore from an edited manifest either
refuses or yields exactly the uninterrupted stream.
"""

from __future__ import annotations

import ast
import copy
import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot import format as fmt
from snapshot import schema
from snapshot.cli import _diff, _dot, _inspect, _view
from snapshot.container import _dict_form, _payload
from snapshot.storage import _sources
from tests import graphs, helpers

CHEAP = settings(max_examples=2000, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COSTLY = settings(max_examples=120, derandomize=True, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _saved() -> tuple[bytes, list[Any]]:
    with helpers.loader_at(graphs.linear(n=30), 2, seed=3) as (dl, it):
        data = dl.save_snapshot(verify=2).to_bytes()
        return data, list(it)


DATA, REST = _saved()
CONTAINER = fmt.unpack(DATA)
MANIFEST: dict[str, Any] = CONTAINER.manifest
PAYLOAD: bytes = CONTAINER.payload or b""


# -- the records ------------------------------------------------------------------------------

def test_a_written_manifest_round_trips_through_the_types() -> None:
    info = schema.Manifest.from_dict(MANIFEST)
    assert info.to_dict() == MANIFEST
    assert schema.Manifest.from_dict(info.to_dict()) == info
    assert info.loader == schema.LoaderPosition(epoch=0, yielded=2, epoch_finished=False, lookahead=0)
    assert [node.path for node in info.graph.nodes][:2] == ["0", "0/datapipe"]
    assert info.verify is not None and info.verify.count == 2 and len(info.verify.fingerprints) == 2


def test_a_loaded_snapshot_carries_its_typed_manifest() -> None:
    snap = snapshot.load(DATA)
    assert snap.info == schema.Manifest.from_dict(MANIFEST)
    assert (snap.epoch, snap.yielded, snap.seed) == (0, 2, 3)
    state = schema.SavedState.from_dict(snap.state)
    assert state.position.yielded == 2 and state.service is not None
    assert state.service.layout["logical_shards"] == 1


def test_fields_this_version_does_not_know_are_kept() -> None:
    manifest = copy.deepcopy(MANIFEST)
    manifest["from_the_future"] = {"x": 1}
    manifest["shards"][0]["per_worker"] = [1, 2]
    assert schema.Manifest.from_dict(manifest).to_dict() == manifest


def test_owners_written_as_a_list_by_older_versions_are_read() -> None:
    service = schema.ServiceLayout.from_dict({"name": "M", "logical_shards": 2, "owners": [0, 1]})
    assert service.owners == {"0": schema.Owner(0), "1": schema.Owner(1)}


def _edited(edit: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(MANIFEST)
    edit(manifest)
    return manifest


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["graph"]["nodes"][3].update(path=5), "graph.nodes[3].path: expected a string, got 5"),
    (lambda m: m["shards"][0]["nodes"]["0"].update(yielded="x"),
     "shards[0].nodes['0'].yielded: expected a non-negative int, got 'x'"),
    (lambda m: m["loader"].update(yielded=-1), "loader.yielded: expected a non-negative int, got -1"),
    (lambda m: m["loader"].update(epoch=True), "loader.epoch: expected an int >= -1, got True"),
    (lambda m: m["graph"].pop("nodes"), "graph.nodes: expected a value (the field is missing)"),
    (lambda m: m.update(graph=[]), "graph: expected an object, got []"),
    (lambda m: m["verify"].update(fingerprints=3), "verify.fingerprints: expected a list, got 3"),
    (lambda m: m["shards"][0]["nodes"]["0"].update(restore="guess"),
     "shards[0].nodes['0'].restore: expected one of 'state', 'replay', got 'guess'"),
    (lambda m: m["shards"].append(None), "shards: expected one entry per logical shard (1"),
    (lambda m: m["payload"].update(sha256="abc"), "payload.sha256: expected a sha256 digest"),
    (lambda m: m["graph"]["nodes"].append(m["graph"]["nodes"][0]), "graph.nodes[5].path: expected a path no other"),
    (lambda m: m["shards"][0]["nodes"].update({"elsewhere": {}}),
     "shards[0].nodes: expected paths of nodes of graph.nodes, got 'elsewhere'"),
])
def test_a_wrong_field_is_named_with_what_was_expected(edit: Any, message: str) -> None:
    data = fmt.pack(_edited(edit), PAYLOAD)
    for read in (lambda: _sources.read_manifest(io.BytesIO(data)), lambda: snapshot.load(data),
                 lambda: snapshot.load(_dict_form.to_state_dict(_edited(edit), PAYLOAD))):
        with pytest.raises(snapshot.ManifestError) as info:
            read()
        assert message in str(info.value)
        assert isinstance(info.value, snapshot.CorruptSnapshotError)


@pytest.mark.parametrize(("version", "message"), [
    (4, "written in snapshot format 4, which a newer release of snapshot reads; this installation "
        f"(snapshot {snapshot.__version__}) reads formats 1 to 3. Upgrade"),
    (0, "written in snapshot format 0, which no release of snapshot reads"),
])
def test_an_unknown_format_version_names_it_and_what_reads_it(version: int, message: str) -> None:
    manifest = _edited(lambda m: m.update(format=version))
    for read in (lambda: _sources.read_manifest(io.BytesIO(fmt.pack(manifest, PAYLOAD))),
                 lambda: snapshot.load({**_dict_form.to_state_dict(manifest, PAYLOAD), "snapshot_format": version})):
        with pytest.raises(snapshot.VersionSkewError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read()


def test_the_schema_imports_neither_torch_nor_dill() -> None:
    modules = sorted(Path(schema.__file__).parent.glob("*.py"))
    assert len(modules) > 1, modules
    imported = set()
    for module in modules:
        tree = ast.parse(module.read_text())
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    outside = {name for name in imported if not name.startswith("snapshot.schema")}
    assert outside <= {"__future__", "json", "math", "re", "collections.abc", "dataclasses", "typing", "msgspec",
                       "snapshot._version", "snapshot.errors"}, outside


# -- the structural fuzz ----------------------------------------------------------------------

json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**64), st.floats(allow_nan=True),
                        st.text(max_size=6), st.sampled_from(["0", "0/datapipe", "state", "replay", "a" * 64]))
json_values = st.recursive(json_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=6)


@st.composite
def edited_manifests(draw: st.DrawFn, base: dict[str, Any] = MANIFEST) -> dict[str, Any]:
    """``base`` with 1 to 3 structural edits at places that exist in it."""
    manifest = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        parent: Any = manifest
        key: Any = draw(st.sampled_from(sorted(manifest)))
        while isinstance(parent[key], (dict, list)) and parent[key] and draw(st.booleans()):
            parent = parent[key]
            key = draw(st.sampled_from(sorted(parent) if isinstance(parent, dict) else range(len(parent))))
        op = draw(st.sampled_from(["delete", "replace", "replace", "negate", "wrap", "empty", "double"]))
        value = parent[key]
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(json_values)
        elif op == "negate" and isinstance(value, int) and not isinstance(value, bool):
            parent[key] = -value - 1
        elif op == "wrap":
            parent[key] = [value]
        elif op == "empty" and isinstance(value, (dict, list)):
            parent[key] = type(value)()
        elif op == "double" and isinstance(value, list):
            parent[key] = value + value
        else:
            parent[key] = str(value)
    return manifest


def read_everything(manifest: dict[str, Any]) -> None:
    """Every reader of a manifest; only a SnapshotError may escape."""
    data = fmt.pack(manifest, PAYLOAD)
    try:
        info = _sources.read_manifest(io.BytesIO(data))
    except snapshot.SnapshotError:
        info = None
    for read in (lambda: snapshot.load(data), lambda: snapshot.load(_dict_form.to_state_dict(manifest, PAYLOAD))):
        try:
            read()
        except snapshot.SnapshotError:
            pass
    if info is not None:
        view = _view.read_view(info, "fuzz.snap")
        assert isinstance(_inspect.render(view), str)
        assert _dot.to_dot(view).startswith("digraph")
        other = _view.read_view(MANIFEST, "valid.snap")
        assert isinstance(_diff.render(view, other, _diff.compare(view, other)), str)


@CHEAP
@given(manifest=edited_manifests())
def test_any_structural_edit_is_read_or_refused_with_a_snapshot_error(manifest: dict[str, Any]) -> None:
    read_everything(manifest)


def _restore_edited(manifest: dict[str, Any]) -> str:
    """``"refused"`` (a SnapshotError) or ``"exact"``; a restore that reads anything but the rest fails."""
    with snapshot.DataLoader2(graphs.linear(n=30)) as loader:
        try:
            loader.restore_snapshot(fmt.pack(manifest, PAYLOAD))
        except snapshot.SnapshotError:
            return "refused"
        assert list(loader) == REST
    return "exact"


@pytest.mark.parametrize("edit", [
    lambda m: None,  # the manifest as written
    lambda m: m.update(created="2000-01-01T00:00:00.000+00:00"),
    lambda m: m["versions"].update(torch="0.0.1", python="3.0.0", snapshot="0.0.1"),
    lambda m: m.pop("created"),
], ids=["as-written", "created", "versions", "no-created"])
def test_an_edit_of_what_a_restore_does_not_read_restores_exactly(edit: Any) -> None:
    assert _restore_edited(_edited(edit)) == "exact"


def test_a_restore_from_an_edited_manifest_refuses_or_is_exact() -> None:
    outcomes: Counter[str] = Counter()

    @COSTLY
    @given(manifest=edited_manifests())
    def restore(manifest: dict[str, Any]) -> None:
        outcomes[_restore_edited(manifest)] += 1

    restore()
    # a few edits touch only what a restore does not read (when it was made, the versions): those
    # restore, and exactly; a restore that refused every edit would fail here
    assert outcomes["exact"] >= 3, outcomes


def _edit_state(state: dict[str, Any], path: list[Any], value: Any) -> None:
    target: Any = state
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value


def _with_state(place: list[Any], value: Any) -> bytes:
    """The file with its payload's state edited at ``place`` (checksums and the payload's record redone)."""
    body = _body()
    _edit_state(body["state"], place, value)
    out = io.BytesIO()
    sections, _ = _payload.write(body, out.write)
    payload = out.getvalue()
    manifest = copy.deepcopy(MANIFEST)
    manifest["payload"] = {**fmt.payload_record(payload), "parts": manifest["payload"]["parts"], **sections}
    return fmt.pack(manifest, payload)


def _body() -> dict[str, Any]:
    """The payload's body, decoded afresh (a test edits it)."""
    assert CONTAINER.info.payload is not None
    return _payload.read(PAYLOAD, CONTAINER.info.payload, trusted=False, source="test")


_DELETE = object()
STATE_PLACES = [["epoch"], ["yielded"], ["epoch_finished"], ["seed"], ["seed_given"], ["pending_seed"],
                ["generator"], ["service"], ["lookahead"], ["service", "layout"], ["service", "shards"],
                ["service", "service"], ["service", "upstream"], ["service", "layout", "logical_shards"]]
#: What a reader takes for a field that is left out.
STATE_DEFAULTS = {("seed",): None, ("seed_given",): False, ("pending_seed",): None, ("generator",): None,
                  ("lookahead",): [], ("service", "upstream"): []}
STATE: dict[str, Any] = _body()["state"]


def _saved_at(place: list[Any]) -> Any:
    target: Any = STATE
    for step in place:
        target = target[step]
    return target


def _well_formed(place: list[Any], value: Any) -> bool:
    """Whether the state edited so is one a loader could have saved with this manifest: the same value
    (a field left out, or null, reads as its default), or any seed for the seed that ``seed()`` left pending."""
    if value is _DELETE or (value is None and tuple(place) in STATE_DEFAULTS):  # null reads as left out
        if tuple(place) not in STATE_DEFAULTS:
            return False
        value = STATE_DEFAULTS[tuple(place)]
    if place == ["pending_seed"]:
        return value is None or (type(value) is int and 0 <= value < 2**64)
    return repr(value) == repr(_saved_at(place))  # repr: True is not 1, nor 2.0 is 2


@pytest.mark.parametrize(("place", "value", "message"), [
    (["epoch"], -2, "state.epoch: expected an int >= -1, got -2"),
    (["epoch"], 5, "loader.epoch: expected what the payload's state says (5)"),
    (["yielded"], 2**70, "state.yielded: expected an int below 2**63"),
    (["yielded"], 3, "loader.yielded: expected what the payload's state says (3)"),
    (["epoch_finished"], "no", "state.epoch_finished: expected true or false, got 'no'"),
    (["seed"], -1, "state.seed: expected a seed, an int in [0, 2**64), got -1"),
    (["seed"], 4, "randomness.seed: expected what the payload's state says (4)"),
    (["seed_given"], False, "randomness.seed_source: expected what the payload's state says ('drawn')"),
    (["pending_seed"], 2**64, "state.pending_seed: expected a seed, an int in [0, 2**64)"),
    (["generator"], None, "state.generator: expected the seed generator of epoch 0"),
    (["generator"], {"shared": {}}, "state.generator.shared.key: expected a value (the field is missing)"),
    (["service"], {}, "service: expected what the payload's state says ({})"),
    (["service"], [], "state.service: expected an object, got []"),
    (["lookahead"], [1], "loader.lookahead: expected what the payload's state says (1)"),
    (["service", "layout"], {}, "state.service.layout.logical_shards: expected an int >= 1, got None"),
    (["service", "layout", "logical_shards"], 2, "state.service.shards: expected 2 records"),
    (["service", "shards"], [None], "shards[0]: expected what the payload's state says (True)"),
    (["service", "shards"], [], "state.service.shards: expected 1 records"),
    (["service", "service"], "Elsewhere", "service.name: expected what the payload's state says ('Elsewhere')"),
    (["service", "upstream"], [{}], "upstream: expected what the payload's state says (1)"),
])
def test_a_payload_whose_state_is_malformed_is_refused(place: list[str], value: Any, message: str) -> None:
    data = _with_state(place, value)
    with pytest.raises(snapshot.ManifestError) as info:
        snapshot.load(data)
    assert message in str(info.value)


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(place=st.sampled_from(STATE_PLACES), value=st.one_of(st.just(_DELETE), json_values))
def test_any_edit_of_the_payloads_state_is_refused_unless_well_formed(place: list[str], value: Any) -> None:
    data = _with_state(place, value)
    if _well_formed(place, value):
        snap = snapshot.load(data)
        assert snap.info.loader == CONTAINER.info.loader
        if place == ["pending_seed"]:
            assert schema.SavedState.from_dict(snap.state).pending_seed == (None if value is _DELETE else value)
        return
    with pytest.raises(snapshot.ManifestError) as info:
        snapshot.load(data)
    assert "state" in str(info.value)  # a field of the state, or what the payload's state says


# -- the public name and the command line -----------------------------------------------------

def test_manifest_error_is_public() -> None:
    assert snapshot.ManifestError.__mro__[1] is snapshot.CorruptSnapshotError
    assert "ManifestError" in snapshot.__all__


def test_verify_exits_non_zero_on_a_structurally_invalid_file(tmp_path) -> None:
    from snapshot.cli import main

    path = tmp_path / "odd.snap"
    path.write_bytes(fmt.pack(_edited(lambda m: m["graph"].update(nodes=7)), PAYLOAD))
    assert main(["verify", str(path)]) == 1
    for command in (["inspect"], ["graph"]):
        assert main([*command, str(path)]) == 2
