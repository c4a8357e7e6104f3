"""The native manifest reader (``snapshot.schema._native``: msgspec, types made from the quick readers' fields) may
refuse more than the precise reader, never accept more: on every manifest the precise reader refuses, it doubts;
on every one it accepts, it gives the same record, field for field and type for type. A file whose manifest it
doubts reads as before (the same errors, the same messages)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from snapshot import schema
from snapshot.container import format
from snapshot.schema import _quick, manifest
from tests.schema import test_quick as quick

pytest.importorskip("msgspec")


def _native_agrees(value: Any) -> bool:
    """The native reader of ``value``'s JSON doubts it or reads it as the precise reader does; whether it took it."""
    try:
        data = json.dumps(value).encode()
    except (TypeError, ValueError):
        return False  # not JSON: no file holds it
    plain = json.loads(data)
    with quick._Precise():
        precise = quick._outcome(lambda: schema.Manifest.from_dict(plain))
    try:
        native = manifest.native_manifest(data)
    except _quick.Doubt:
        return False
    assert precise[0] == "value", f"the native reader took what the precise one refuses: {precise[1]}"
    quick._same(native, precise[1])
    return True


def test_the_native_reader_takes_what_a_loader_writes() -> None:
    assert manifest._NATIVE is not None
    for base in quick.MANIFESTS[:-1]:  # the last has an unknown field: doubted, read as before
        assert _native_agrees(base), "the native reader doubts a well-formed manifest: it is never used"


def test_on_every_edit_the_native_reader_doubts_or_agrees() -> None:
    taken = 0
    for base in quick.MANIFESTS:
        base = json.loads(json.dumps(base))
        for _, edited in quick._edits(base):
            taken += _native_agrees(edited)
    assert taken > 100  # it reads the edits that leave a manifest well-formed


def test_a_file_read_natively_is_the_file_read_before(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = quick._saved_with(quick.graphs.sharded, None, 7)
    data = snap.to_bytes()
    native = format.unpack(data)
    assert isinstance(native.json, bytes)  # read natively: the JSON object is parsed only if asked for
    monkeypatch.setattr(manifest, "_NATIVE", None)
    before = format.unpack(data)
    assert isinstance(before.json, dict)
    quick._same(native.info, before.info)
    assert native.manifest == before.manifest and native.payload == before.payload


@pytest.mark.parametrize("data", [b'"\xe6"', b'{"format": 3, "x": "\xed\xa0\x80"}', b"NaN", b"[" * 5000, b"{} x",
                                  b'{"format": 1e999}', b""])
def test_what_msgspec_does_not_read_is_doubted(data: bytes) -> None:
    with pytest.raises(_quick.Doubt):
        manifest.native_manifest(data)
