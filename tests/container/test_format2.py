"""Files written by snapshot 0.2 (format 2) still read: its data encoding is decoded by ``_codec_v2`` (kept for
reading only, as safe as before: forged input is a ``CorruptSnapshotError`` and runs nothing), and its
snapshots restore exactly, as data where they were data and only with trust where they hold pickles."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import snapshot
from snapshot import schema
from snapshot.container import _codec_v2
from snapshot.container._codec import Pickled
from tests.container.test_codec import same
from tests.fixtures.format1 import make as format1
from tests.fixtures.format2 import make as format2

CODEC = os.path.join(format2.HERE, "codec.bin")


def fixture(name: str) -> str:
    return os.path.join(format2.HERE, name)


def test_the_format2_encoding_decodes_to_the_value_it_was_written_from() -> None:
    with open(CODEC, "rb") as f:
        back = _codec_v2.decode(f.read())
    expected = format2.codec_value()
    assert set(back) == set(expected)
    for key, value in expected.items():
        assert same(back[key], value), key


def test_every_truncation_of_a_format2_encoding_is_a_corrupt_snapshot_error() -> None:
    with open(CODEC, "rb") as f:
        data = f.read()
    for end in range(0, len(data), max(1, len(data) // 400)):
        with pytest.raises(snapshot.CorruptSnapshotError):
            _codec_v2.decode(data[:end])


def _s(text: str) -> bytes:
    """A str in format 2's encoding."""
    raw = text.encode()
    return b"s" + bytes([len(raw)]) + raw


@pytest.mark.parametrize(("data", "message"), [
    (b"\x80\x04", "unknown tag byte 0x80"),
    (b"s\xff\xff\xff\xff\xff\xff\xff\xff\x7f", "runs past the end"),
    (b"l\xfe\xff\xff\xff\x00", "longer than the rest"),
    (b"D\x01l\x00N", "dict key of type list, which is not hashable"),
    (b"A" + _s("|O") + b"\x01\x01\x08" + bytes(8), "never Python objects"),
    (b"A" + _s("(2,3)f8") + b"\x00\x00", "not one of plain data"),
    (b"A" + b"P\x00s\x00" + b"\x00\x00", "description holds a pickled value"),
    (b"X\x06pickle\x01\x01\x00\x01" + bytes(1), "dtype 'pickle', which is not in the codec's table"),
    (b"l\x01" * 257 + b"N", "nested deeper than 256 levels"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_forged_format2_input_is_a_corrupt_snapshot_error(data: bytes, message: str) -> None:
    with pytest.raises(snapshot.CorruptSnapshotError, match=message):
        _codec_v2.decode(data, pickled=lambda index, where: Pickled(index))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.lists(st.sampled_from(list(b"NTFidjsbBltDSZQRAGXPCEr\x00\x01\x02\xfe")),
                                         max_size=40).map(bytes))
def test_random_bytes_through_the_format2_decoder_decode_or_raise_corrupt_snapshot_error(data: bytes) -> None:
    try:
        _codec_v2.decode(data, pickled=lambda index, where: Pickled(index))
    except snapshot.CorruptSnapshotError:
        pass


def _rest(name: str) -> list[Any]:
    import json

    with open(fixture(f"{name}.rest.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("workers", [0, 2])
def test_format2_snapshots_and_state_dicts_restore_exactly_as_data(workers: int) -> None:
    assert snapshot.read_manifest(fixture(f"workers{workers}.snap"))["format"] == 2
    for source in ("file", "state dict"):
        dl = snapshot.DataLoader2(format1.graph(), reading_service=format1.service(workers))
        try:
            if source == "file":
                dl.restore_snapshot(fixture(f"workers{workers}.snap"))
            else:  # a state dict saved with torch.save loads with weights_only=True, and restores as data
                dl.load_state_dict(torch.load(fixture(f"workers{workers}.state.pt"), weights_only=True)["data"])
            rest = [list(batch) for _ in range(2) for batch in dl]
        finally:
            dl.shutdown()
        assert rest == _rest(f"workers{workers}"), source


def test_a_format2_buffer_of_every_data_type_restores_exactly() -> None:
    dl = snapshot.DataLoader2(format2.values_graph())
    dl.restore_snapshot(fixture("values.snap"))
    rest = [sample for _ in range(2) for sample in dl]
    expected = torch.load(fixture("values.rest.pt"), weights_only=False)
    assert len(rest) == len(expected) and all(same(a, b) for a, b in zip(rest, expected))


def test_a_format2_snapshot_with_pickled_values_needs_trust(tmp_path: Any) -> None:
    dl = snapshot.DataLoader2(format2.points_graph())
    with pytest.raises(snapshot.UntrustedStateError, match="Point"):
        dl.restore_snapshot(fixture("points.snap"))
    dl.restore_snapshot(fixture("points.snap"), allow_pickle=True)
    assert [p.x for _ in range(2) for p in dl] == torch.load(fixture("points.rest.pt"), weights_only=True)
    again = tmp_path / "again.snap"
    snapshot.save(snapshot.load(fixture("points.snap"), allow_pickle=True), str(again))
    assert snapshot.read_manifest(str(again))["format"] == 2  # a loaded snapshot is written as it was read
    fresh = snapshot.DataLoader2.from_snapshot(fixture("workers0.snap"))
    next(iter(fresh))
    fresh.save_snapshot(str(again))
    assert snapshot.read_manifest(str(again))["format"] == schema.FORMAT_VERSION == 3
