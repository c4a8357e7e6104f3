"""Restoring onto a graph built in code runs no code from the file (formats 2 and 3), and format-1 files still read.

An attacker with write access to a checkpoint store forges a snapshot saved with ``include_graph=False``:
the whole payload, one node state, one buffered sample, the graph or the reading service is replaced by
a pickle that creates a marker file, and every checksum is recomputed (no key: the default). Every
restore path onto a code-built graph (``restore_snapshot``, ``snapshot.load``, ``load_state_dict``,
``torch.load(weights_only=True)`` then ``load_state_dict``) must refuse or ignore it, and the marker
file must not appear.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
from typing import Any

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot import format, schema
from snapshot.container import _dict_form, _payload
from tests import helpers
from tests.fixtures.format1 import make as format1


class Marker:
    """Unpickling this creates ``path``: the proof that code from the file ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> Any:
        return (builtins.open, (self.path, "w"))


class Point:
    """A sample that is not data (a custom class): saved in the pickled section."""

    def __init__(self, x: int):
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.x == self.x

    def __hash__(self) -> int:
        return hash(self.x)


def make_point(x: int) -> Point:
    return Point(x)


def graph() -> Any:
    return IterableWrapper(range(60)).shuffle(buffer_size=8).batch(3)


def _loader(datapipe: Any = None) -> snapshot.DataLoader2[Any]:
    dl = snapshot.DataLoader2(graph() if datapipe is None else datapipe)
    dl.seed(3)
    return dl


def _saved(cut: int = 4, datapipe: Any = None) -> tuple[snapshot.Snapshot, list[Any]]:
    with helpers.loader_at(graph() if datapipe is None else datapipe, cut, seed=3) as (dl, it):
        return dl.save_snapshot(include_graph=False), list(it)


def _forge(snap: snapshot.Snapshot, change: Any, *, version: int = 3) -> tuple[dict[str, Any], bytes]:
    """A snapshot whose body ``change(body)`` rewrote, every checksum recomputed (unsigned):
    its manifest and payload."""
    body = {"state": snap.state, "graph": snap.graph, "service": snap.service}
    body = change(body)
    manifest = dict(snap.manifest)
    if version == 1:
        payload = pickle.dumps(body)
        manifest["format"] = 1
        manifest["payload"] = {"size": len(payload), "sha256": format.payload_record(payload)["sha256"]}
        return manifest, payload
    out = io.BytesIO()
    sections, _ = _payload.write(body, out.write)
    payload = out.getvalue()
    manifest["payload"] = {**format.payload_record(payload), **sections}
    return manifest, payload


def _routes(tmp_path: Any, manifest: dict[str, Any], payload: bytes) -> dict[str, Any]:
    """Each restore path onto a code-built graph, as a function of nothing."""
    path = tmp_path / "forged.snap"
    path.write_bytes(format.pack(manifest, payload))
    state = _dict_form.to_state_dict(manifest, payload)
    saved = tmp_path / "forged.pt"
    torch.save({"data": state}, saved)

    def weights_only() -> None:
        loaded = torch.load(saved, weights_only=True)
        _loader().load_state_dict(loaded["data"])

    return {
        "restore_snapshot": lambda: _loader().restore_snapshot(str(path)),
        "snapshot.load": lambda: snapshot.load(str(path)).state,
        "load_state_dict": lambda: _loader().load_state_dict(state),
        "torch.load(weights_only=True)": weights_only,
    }


def _node_path(snap: snapshot.Snapshot) -> str:
    shard = snap.state["service"]["shards"][0]
    return next(path for path, record in shard["nodes"].items() if record.get("state") is not None)


def _forge_node_state(marker: str) -> Any:
    def change(body: dict[str, Any]) -> dict[str, Any]:
        shard = body["state"]["service"]["shards"][0]
        path = next(p for p, r in shard["nodes"].items() if r.get("state") is not None)
        shard["nodes"][path]["state"] = Marker(marker)
        return body
    return change


def _forge_buffered_sample(marker: str) -> Any:
    def change(body: dict[str, Any]) -> dict[str, Any]:
        shard = body["state"]["service"]["shards"][0]
        for record in shard["nodes"].values():
            state = record.get("state")
            if isinstance(state, dict) and state.get("buffer"):
                state["buffer"][0] = Marker(marker)
                return body
        raise AssertionError("the graph has no buffered sample to forge")
    return change


def _forge_pickled_bytes(part: str, marker: str) -> Any:
    def change(body: dict[str, Any]) -> dict[str, Any]:
        body[part] = pickle.dumps(Marker(marker))
        return body
    return change


@pytest.mark.parametrize("kind", ["node state", "buffered sample", "whole payload as format 1",
                                  "one node state as format 1"])
def test_forged_pickles_run_nothing_on_any_restore_path(tmp_path: Any, kind: str) -> None:
    snap, _ = _saved()
    marker = str(tmp_path / "ran")
    change = {"node state": _forge_node_state(marker), "buffered sample": _forge_buffered_sample(marker),
              "whole payload as format 1": lambda body: Marker(marker),
              "one node state as format 1": _forge_node_state(marker)}[kind]
    manifest, payload = _forge(snap, change, version=1 if "format 1" in kind else 3)
    for route, run in _routes(tmp_path, manifest, payload).items():
        with pytest.raises(snapshot.UntrustedStateError) as info:
            run()
        assert not os.path.exists(marker), f"{route} ran code from a forged {kind}"
        text = str(info.value)
        assert "allow_pickle=True" in text, text
        if "format 1" in kind:
            assert "format 1" in text
        else:  # names the node that holds it, and the type
            assert _node_path(snap) in text and "Marker" in text, text


@pytest.mark.parametrize("part", ["graph", "service"])
def test_forged_graph_or_service_pickles_are_never_unpickled_onto_a_code_built_graph(tmp_path: Any,
                                                                                   part: str) -> None:
    snap, rest = _saved()
    marker = str(tmp_path / "ran")
    manifest, payload = _forge(snap, _forge_pickled_bytes(part, marker))
    for route, run in _routes(tmp_path, manifest, payload).items():
        run()
        assert not os.path.exists(marker), f"{route} unpickled the {part}"
    dl = _loader()
    dl.restore_snapshot(format.pack(manifest, payload))
    assert list(dl) == rest


@pytest.mark.parametrize("encoding", ["msgpack", "data"])
def test_a_pickle_in_place_of_the_data_section_is_refused_as_corrupt(tmp_path: Any, encoding: str) -> None:
    snap, _ = _saved()
    marker = str(tmp_path / "ran")
    forged = pickle.dumps(Marker(marker))
    manifest = dict(snap.manifest)
    manifest["payload"] = {**format.payload_record(forged), "encoding": encoding, "data": len(forged), "pickled": []}
    for route, run in _routes(tmp_path, manifest, forged).items():
        with pytest.raises(snapshot.CorruptSnapshotError):
            run()
        assert not os.path.exists(marker), route


def test_a_pickled_value_the_manifest_does_not_list_is_refused(tmp_path: Any) -> None:
    """The data section refers to a pickled value, but the forger dropped it from the manifest's list."""
    snap, _ = _saved()
    marker = str(tmp_path / "ran")
    manifest, payload = _forge(snap, _forge_node_state(marker))
    record = manifest["payload"]
    record.update(data=record["data"], pickled=[])
    payload = payload[:record["data"]]
    record.update(format.payload_record(payload))
    for route, run in _routes(tmp_path, manifest, payload).items():
        with pytest.raises(snapshot.CorruptSnapshotError):
            run()
        assert not os.path.exists(marker), route


def test_honest_state_is_data_and_needs_no_trust(tmp_path: Any) -> None:
    snap, rest = _saved()
    assert snap.info.payload is not None and snap.info.payload.encoding == "msgpack"
    assert snap.info.payload.pickled == () and not snap.info.payload.needs_trust
    state = snap.state_dict()
    path = tmp_path / "state.pt"
    torch.save({"data": state}, path)
    dl = _loader()
    dl.load_state_dict(torch.load(path, weights_only=True)["data"])
    assert list(dl) == rest


def test_custom_samples_are_pickled_apart_and_restore_only_with_trust(tmp_path: Any) -> None:
    datapipe = IterableWrapper(range(40)).map(make_point).shuffle(buffer_size=6)
    snap, rest = _saved(cut=5, datapipe=datapipe)
    record = snap.info.payload
    assert record is not None and record.pickled, "the buffered Points are saved pickled"
    assert all(p.type.endswith("Point") for p in record.pickled)
    assert any("nodes" in p.at and "buffer" in p.at for p in record.pickled)
    path = str(tmp_path / "points.snap")
    snapshot.save(snap, path)
    listed = json.loads(json.dumps(snapshot.read_manifest(path)["payload"]["pickled"]))
    assert [p["type"] for p in listed] == [p.type for p in record.pickled]

    def code_built() -> snapshot.DataLoader2[Any]:
        return _loader(IterableWrapper(range(40)).map(make_point).shuffle(buffer_size=6))

    with pytest.raises(snapshot.UntrustedStateError, match=r"Point.*allow_pickle=True"):
        code_built().restore_snapshot(path)
    dl = code_built()
    dl.restore_snapshot(path, allow_pickle=True)
    assert list(dl) == rest
    signed = str(tmp_path / "signed.snap")
    snapshot.save(snap, signed, key=b"k")
    dl = code_built()
    dl.restore_snapshot(signed, key=b"k")  # a key the file is signed with vouches for it
    assert list(dl) == rest


def test_the_state_of_the_schema_lists_what_needs_trust() -> None:
    record = schema.PayloadRecord.from_dict({"size": 10, "sha256": "0" * 64, "encoding": "data", "data": 6,
                                             "pickled": [{"at": "payload['state']", "type": "m.C", "size": 4}]})
    assert record.needs_trust and record.to_dict()["pickled"][0]["type"] == "m.C"
    with pytest.raises(snapshot.ManifestError, match=r"payload\.data"):
        schema.PayloadRecord.from_dict({"size": 10, "sha256": "0" * 64, "encoding": "data", "data": 5})


# -- format 1: files written by the previous release still restore exactly (with trust) --------

def _fixture(name: str) -> str:
    return os.path.join(os.path.dirname(format1.__file__), name)


def _rest(workers: int) -> list[Any]:
    with open(_fixture(f"workers{workers}.rest.json")) as f:
        return json.load(f)


def _run(dl: snapshot.DataLoader2[Any]) -> list[Any]:
    out = list(dl) + list(dl)  # the rest of the interrupted epoch, and the next one
    dl.shutdown()
    return out


@pytest.mark.parametrize("saved,restored", [(0, 0), (2, 2), (2, 0), (2, 1)])
def test_format1_files_restore_exactly_with_trust(saved: int, restored: int) -> None:
    path = _fixture(f"workers{saved}.snap")
    dl = snapshot.DataLoader2(format1.graph(), reading_service=format1.service(restored))
    with pytest.raises(snapshot.UntrustedStateError, match="format 1"):
        dl.restore_snapshot(path)
    dl.restore_snapshot(path, allow_pickle=True)
    assert [list(b) for b in _run(dl)] == _rest(saved)


def test_format1_state_dicts_load_with_weights_only_and_restore_with_trust() -> None:
    for workers in (0, 2):
        state = torch.load(_fixture(f"workers{workers}.state.pt"), weights_only=True)["data"]
        assert state["snapshot_format"] == 1
        dl = snapshot.DataLoader2(format1.graph(), reading_service=format1.service(workers))
        with pytest.raises(snapshot.UntrustedStateError):
            dl.load_state_dict(state)
        dl.restore_snapshot(state, allow_pickle=True)
        assert [list(b) for b in _run(dl)] == _rest(workers)


def test_format1_from_snapshot_trusts_the_file_and_saving_again_writes_format3(tmp_path: Any) -> None:
    dl = snapshot.DataLoader2.from_snapshot(_fixture("workers0.snap"))
    it = iter(dl)
    first = next(it)
    again = tmp_path / "again.snap"
    dl.save_snapshot(str(again), include_graph=False)
    assert snapshot.read_manifest(str(again))["format"] == format.FORMAT_VERSION == 3
    rest = [first, *it, *dl]
    dl.shutdown()
    assert [list(b) for b in rest] == _rest(0)
    fresh = snapshot.DataLoader2(format1.graph())
    fresh.restore_snapshot(str(again))  # format 3: no trust needed
    assert [list(b) for b in _run(fresh)] == _rest(0)[1:]


def test_inspect_shows_which_sections_are_data_and_which_need_trust(tmp_path: Any) -> None:
    import subprocess
    import sys

    datapipe = IterableWrapper(range(40)).map(make_point).shuffle(buffer_size=6)
    snap, _ = _saved(cut=5, datapipe=datapipe)
    points, plain = str(tmp_path / "points.snap"), str(tmp_path / "plain.snap")
    snapshot.save(snap, points)
    snapshot.save(_saved()[0], plain)

    def inspect(path: str) -> str:
        done = subprocess.run([sys.executable, "-m", "snapshot", "inspect", path], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = inspect(points)
    assert f"Trust: {len(snap.info.payload.pickled)} value(s) of the state are not data" in out  # type: ignore[union-attr]
    assert "tests.container.test_untrusted.Point" in out and "buffer" in out
    assert "Trust: the state is data; restoring onto a graph built in code runs nothing" in inspect(plain)
    assert "Trust: format 1" in inspect(_fixture("workers0.snap"))
