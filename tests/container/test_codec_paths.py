"""The codec's short paths (``snapshot.container._codec``): a value of msgpack's own types is packed and decoded in
one call of msgpack, with the bytes the encoder's walk writes; arrays are copied once each way (encoded into the
joined bytes from their own memory, decoded from the data in memory where it is); what these paths refuse goes
the long way with the same result, and no input leaks anything but a ``CorruptSnapshotError``."""

from __future__ import annotations

import collections
import io
import threading
import tracemalloc
from typing import Any

import numpy as np
import pytest

from snapshot.container import _codec, _codec_decode
from snapshot.container._codec import Decoder, Encoder, decode, encode
from snapshot.errors import CorruptSnapshotError


def walked(value: Any) -> tuple[bytes, list[tuple[str, Any]]]:
    """``value`` as the encoder's walk writes it (the long way)."""
    out = io.BytesIO()
    encoder = Encoder(out.write, frame=0)
    encoder.encode(value)
    return out.getvalue(), encoder.pickled


NATIVE = [
    None, 0, -1, 2**63, -(2**63), 1.5, "é", b"ab", [], {}, [1, [2, [3]]], {"a": {"b": [None, True]}},
    {1: "int key", None: 1.0, "s": b""}, list(range(5000)), {f"k{i}": i for i in range(3000)},
    {f"0/datapipe/{i}": {"yielded": i, "state": {"seen": i, "file": f"/data/{i}.tar"}} for i in range(12)},
]


@pytest.mark.parametrize("value", NATIVE, ids=lambda v: repr(v)[:40])
def test_a_value_of_msgpacks_own_types_is_packed_in_one_call_with_the_walks_bytes(
        value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = walked(value)
    monkeypatch.setattr(_codec, "Encoder", None)  # the walk is not taken
    monkeypatch.setattr(_codec_decode, "Decoder", None)  # nor is the decoder made: no ext value to build
    assert encode(value) == expected
    assert decode(expected[0]) == value


class Custom:
    pass


REFUSED = [
    (1, 2), [1, (2, 3)], {"a": {1, 2}}, 2**64, [0, -(2**64) - 1], "\ud800", ["ok", {"x": "\udcff"}],
    [(i, str(i)) for i in range(40)], {"rows": [(i, i) for i in range(20)]}, np.arange(3), Custom(),
    collections.deque([1]), bytearray(b"x"),
]


@pytest.mark.parametrize("value", REFUSED, ids=lambda v: repr(v)[:40])
def test_what_msgpack_has_no_type_for_takes_the_walk_and_leaves_the_packer_clean(value: Any) -> None:
    data, pickled = encode(value)
    expected, expected_pickled = walked(value)
    assert data == expected and [p[0] for p in pickled] == [p[0] for p in expected_pickled]
    assert encode([1, "a"])[0] == b"\x92\x01\xa1a"  # msgpack reset the thread's packer after the failed pack


def test_a_cycle_and_nesting_past_msgpacks_bounds_are_named_and_pickled() -> None:
    cycle: list[Any] = [1]
    cycle.append(cycle)
    data, pickled = encode(cycle)
    assert (data, [p[0] for p in pickled]) == (walked(cycle)[0], ["state"])
    deep: list[Any] = []
    for _ in range(2000):
        deep = [deep]
    data, pickled = encode({"deep": deep})
    assert len(pickled) == 1 and pickled[0][0].startswith("state.deep[0][0][0]")
    back = decode(data, pickled=lambda index: pickled[index][1])["deep"]
    while type(back) is list and back and back is not pickled[0][1]:
        back = back[0]
    assert back is pickled[0][1]  # the part past the bounds, where it was
    assert encode({"a": 1})[0] == b"\x81\xa1a\x01"


def test_threads_encode_and_decode_at_once_without_sharing_a_packer() -> None:
    values = [{"thread": n, "items": list(range(n * 100, n * 100 + 500)), "name": f"t{n}"} for n in range(6)]
    errors: list[BaseException] = []

    def run(value: Any) -> None:
        try:
            for _ in range(300):
                data, pickled = encode(value)
                assert decode(data) == value and pickled == []
                assert decode(encode((value["thread"], 1))[0]) == (value["thread"], 1)
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(value,)) for value in values]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(thread.is_alive() for thread in threads)


def test_arrays_reach_the_pieces_from_their_own_memory_unbuffered() -> None:
    arrays = [np.full(100, i, dtype="<f8") for i in range(5)]
    pieces: list[Any] = []
    Encoder(pieces.append, frame=0, buffered=False).encode(arrays)
    shared = [a for a in arrays if any(np.shares_memory(np.frombuffer(p, np.uint8), a) for p in pieces
                                       if isinstance(p, memoryview) and p.nbytes == a.nbytes)]
    assert len(shared) == len(arrays)
    assert b"".join(pieces) == walked(arrays)[0]


def test_arrays_of_one_dtype_and_shape_share_a_descriptor_but_not_one_with_metadata() -> None:
    plain, marked = np.zeros(2), np.zeros(2, dtype=np.dtype("<f8", metadata={"unit": "m"}))
    for value in ([plain, marked, plain], [marked, plain, marked]):
        data, pickled = encode(value)
        assert [p[1] is marked for p in pickled] == [True] * sum(a is marked for a in value)
        back = decode(data, pickled=lambda index, found=pickled: found[index][1])  # type: ignore[misc]
        assert [a.dtype.metadata for a in back] == [a.dtype.metadata for a in value]


def _traced_peak(run: Any) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        kept = run()
        peak = tracemalloc.get_traced_memory()[1] - base
        del kept
    finally:
        tracemalloc.stop()
    return peak


ARRAYS = [np.full(2048, i, dtype="<f8") for i in range(256)]  # 4 MiB


def test_arrays_are_copied_once_when_encoded() -> None:
    assert _traced_peak(lambda: encode(ARRAYS)) < 1.2 * 256 * 2048 * 8  # the joined bytes, and little more


def test_arrays_are_copied_once_when_decoded_from_memory() -> None:
    data = encode(ARRAYS)[0]
    assert _traced_peak(lambda: decode(data)) < 1.2 * 256 * 2048 * 8  # the arrays, not a copy of the bytes too
    back = decode(data)
    back[3][0] = -1.0  # writable, and its own memory
    assert back[3][1] == 3.0 and back[4][0] == 4.0 and all(a.flags.c_contiguous for a in back)


@pytest.mark.parametrize("size", [100, 400_000], ids=["decoded at once", "read as a stream"])
def test_truncations_and_trailing_bytes_of_arrays_are_corrupt_snapshot_errors(size: int) -> None:
    value = {"head": (1, "x"), "arrays": [np.arange(size, dtype="<i8"), np.ones(size // 2)], "tail": {3}}
    data = encode(value)[0]
    assert (len(data) > 1 << 20) is (size > 100_000)  # decode takes at most 1 MiB at once
    tree = len(data) - 12 * size
    for end in [0, 1, tree // 2, tree - 1, tree, tree + 1, tree + 8 * size - 1, tree + 8 * size, len(data) - 1]:
        with pytest.raises(CorruptSnapshotError) as info:
            decode(data[:end], source="cut.snap")
        assert str(info.value).startswith("cut.snap (at byte ")
    with pytest.raises(CorruptSnapshotError, match="1 bytes follow the value"):
        decode(data + b"\x00")
    back = decode(memoryview(data))
    assert back["head"] == (1, "x") and back["tail"] == {3} and (back["arrays"][0] == np.arange(size)).all()


def test_a_stream_decoder_over_bytes_in_memory_fills_arrays_from_them() -> None:
    values = [np.arange(300_000, dtype="<i4"), {"a": (1,)}, np.ones(10)]
    pieces = []
    encoder = Encoder(pieces.append)
    for value in values:
        encoder.encode(value)
    decoder = Decoder(b"".join(pieces))
    back = [decoder.next() for _ in values]
    assert (back[0] == values[0]).all() and back[1] == {"a": (1,)} and (back[2] == 1).all()
    assert decoder.position == decoder.limit


@pytest.mark.parametrize("dtype", ["<M8[ns]", "<m8[s]", "<f8", [("a", "<i4"), ("b", "<f8", (2,))], "|S3", "<U2"])
def test_arrays_of_dtypes_without_a_buffer_export_are_filled_too(dtype: Any) -> None:
    """numpy exports no buffer of times: their bytes are filled through a view as uint8."""
    value = [np.zeros((2, 3), dtype), np.ones(4).astype(dtype)]
    back = decode(encode(value)[0])
    assert all(a.dtype == b.dtype and a.tobytes() == b.tobytes() and b.flags.writeable for a, b in zip(value, back))


def test_a_small_measured_node_state_is_packed_whole_and_measured_by_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgpack

    small, big = {"position": 10, "file": "a.tar"}, {"seen": list(range(40))}
    body = {"nodes": {"0": {"state": small, "yielded": 1}, "0/x": {"state": big, "yielded": 2}}}
    walked_dicts: list[int] = []
    frame = Encoder._frame

    def spy(self: Encoder, value: dict[Any, Any], depth: int) -> None:
        walked_dicts.append(id(value))
        frame(self, value, depth)

    monkeypatch.setattr(Encoder, "_frame", spy)
    pieces: list[Any] = []
    encoder = Encoder(pieces.append, {id(small): ("small",), id(big): ("big",)})
    encoder.encode(body, "payload")
    assert id(small) not in walked_dicts and id(big) in walked_dicts  # a big one is still written as it is walked
    assert encoder.sizes == {"small": len(msgpack.packb(small)), "big": len(msgpack.packb(big))}
    assert decode(b"".join(pieces)) == body


def test_the_threads_packer_is_not_kept_after_a_big_value() -> None:
    """msgpack's packer keeps the buffer it grew: one that packed a big value is let go."""
    encode([1])
    kept = _codec._packers.packer
    assert kept is not None and encode(["x" * 100])[0] and _codec._packers.packer is kept
    encode(["x" * (1 << 20)])
    assert _codec._packers.packer is None
    encode((1, 2))  # refused: a new packer, not kept after a value it refused
    assert _codec._packers.packer is None
    encode({"a": 1})
    assert _codec._packers.packer is not None
