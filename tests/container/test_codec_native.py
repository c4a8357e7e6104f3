"""msgspec's decoder of the codec's trees (``snapshot.container._codec_native``): where it decodes, the value is
msgpack's, type for type; every difference between the two decoders (timestamps, arrays as keys, lone
surrogates, nesting, lengths, bytes after the tree) is refused, and msgpack's result or error comes back
unchanged; forged lengths allocate nothing on either path."""

from __future__ import annotations

import collections
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from snapshot.container import _codec_decode, _codec_native
from snapshot.container._codec import decode, encode
from snapshot.errors import CorruptSnapshotError
from tests.container.test_codec import data_values, same


def present(data: bytes, **options: Any) -> Any:
    """``data`` decoded by msgpack alone (the decoder before msgspec): its value, or its error's type and text."""
    saved, _codec_native._DECODER = _codec_native._DECODER, None
    try:
        return outcome(data, **options)
    finally:
        _codec_native._DECODER = saved


def outcome(data: bytes, **options: Any) -> Any:
    try:
        return decode(data, **options)
    except Exception as error:  # noqa: BLE001 - the error itself is compared
        return ("raised", type(error), str(error))


def native(data: bytes) -> Any:
    """``data``'s tree decoded by msgspec (``Refused`` where it does not take it)."""
    return _codec_native.tree(data, _codec_decode._Plain())


def in_map(data: bytes) -> bytes:
    """``data``'s value as the one value of a map (``{"v": value}``): msgspec is tried on maps only."""
    return b"\x81\xa1v" + data


def agrees(data: bytes, **options: Any) -> None:
    """The decoder (msgspec where it takes the bytes) gives msgpack's value or error, type for type."""
    expected, got = present(data, **options), outcome(data, **options)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))  # same() recurses a frame a level: 1,024 levels of lists are data
    try:
        assert same(got, expected), (data[:40], got, expected)
    finally:
        sys.setrecursionlimit(limit)


# values the codec writes: msgspec takes them, with msgpack's result --------------------------------------------

TAKEN = [
    None, True, 0, -1, 127, 128, -33, 2**63, 2**64 - 1, -(2**63), 1.5, -0.0, float("nan"), float("inf"),
    -float("inf"), "", "é", "x" * 300, b"", b"ab", bytearray(b"ab"), [], {}, [[[]]], (), (1,), (1, (2, [3])),
    {1: "int key", -5: 1, 2**64 - 1: 2, 1.5: 3, "s": b"", b"k": 7}, {"a": {"b": [None, True, (1.0, -0.0)]}},
    {1, 2, (3, 4)}, frozenset({"a", b"b"}), 2**100, -(2**200), 1 + 2j, range(-5, 50, 7),
    collections.deque([1, {"a": 2}], maxlen=5), collections.defaultdict(list, {"a": [1]}),
    [(i, i * 7, 3) for i in range(40)], [{"k": (i, "x")} for i in range(20)],
    np.float64("nan"), np.int32(-3), np.bytes_(b"ab"), np.datetime64("2026-11-25T01:02"),
    {f"0/datapipe/{i}": {"yielded": i, "state": {"seen": i, "offset": 4096 * i, "file": f"/data/{i}.tar"}}
     for i in range(12)},
]


# ids by place, not repr: a set's repr follows the hash seed, and xdist needs one collection on every worker
@pytest.mark.parametrize("value", TAKEN, ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(TAKEN)])
def test_msgspec_decodes_what_the_codec_writes_as_msgpack_does(value: Any) -> None:
    data, pickled = encode({"v": value})
    assert pickled == []
    expected = present(data)
    assert same(expected, {"v": value}) or type(value) is bytearray  # msgpack packs a bytearray as bytes
    if 255 in data:  # a timestamp's type byte may be one of them: msgpack decodes these
        with pytest.raises(_codec_native.Refused):
            native(data)
    else:
        assert same(native(data), expected)
    assert same(decode(data), expected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data_values)
def test_any_data_decodes_as_msgpack_decodes_it(value: Any) -> None:
    data, _ = encode({"v": value})
    agrees(data)
    try:
        tree = native(data)
    except _codec_native.Refused:
        return
    assert same(tree, present(data))


def test_arrays_tensors_and_pickled_values_are_left_to_msgpack_before_their_hook_acts() -> None:
    value = {"a": (1, np.arange(3)), "b": [2.5]}
    data, _ = encode(value)
    with pytest.raises(_codec_native.Refused):
        native(data)
    assert same(decode(data), value)
    data, pickled = encode([1, (len,)])
    calls: list[int] = []
    assert decode(data, pickled=lambda index: calls.append(index) or pickled[index][1]) == [1, (len,)]
    assert calls == [0]  # the callback runs once, on msgpack's path


# every difference between the decoders is refused, and msgpack judges ----------------------------------------

def ext(code: int, body: bytes) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, body))


TIMESTAMPS = [bytes.fromhex("d6ff00000001"), bytes.fromhex("d7ff") + bytes(8), bytes.fromhex("c70cff") + bytes(12),
              bytes.fromhex("c704ff00000001"), bytes.fromhex("c80004ff00000001"),
              bytes.fromhex("c900000008ff") + bytes(8), bytes.fromhex("91d6ff00000001"),
              ext(1, bytes.fromhex("91d6ff00000001")), bytes.fromhex("d5ff0000")]
ARRAY_KEYS = [bytes.fromhex("8192010203"), bytes.fromhex("8191910103"), ext(1, bytes.fromhex("9181910102")),
              bytes.fromhex("82a16101") + bytes.fromhex("dc0011") + bytes(17) + b"\x02"]
TEXT = [bytes.fromhex("a3eda080"), bytes.fromhex("a1ff"), bytes.fromhex("91a3edb080"), ext(1, bytes.fromhex("91a1ff"))]
OTHER = [bytes.fromhex("0102"), bytes.fromhex("dd0000000501"), b"", bytes.fromhex("d46300"), ext(14, bytes(8)),
         ext(1, b"\x01\x02"), b"\x91" * 1025 + b"\x01", b"\x91" * 1024 + b"\x01", b"\x81\x01" * 1025 + b"\x01"]


@pytest.mark.parametrize("data", TIMESTAMPS + ARRAY_KEYS + TEXT + OTHER, ids=lambda data: data[:12].hex())
def test_what_msgspec_decodes_otherwise_is_refused_and_judged_by_msgpack(data: bytes) -> None:
    for tree in (data, in_map(data)):  # msgspec is tried on the second (a map), refused on the first
        with pytest.raises(_codec_native.Refused):
            native(tree)
        agrees(tree)


@pytest.mark.parametrize("value", [list(range(10_000)), [(i, i * 7, 3) for i in range(40)], "text", 5, None])
def test_a_tree_that_is_not_a_map_is_left_to_msgpack(value: Any) -> None:
    data, _ = encode(value)  # on a list of ints msgspec's checks cost more than it saves
    with pytest.raises(_codec_native.Refused):
        native(data)
    assert same(decode(data), value)


def test_a_timestamp_decodes_as_msgpacks_timestamp_and_an_array_key_stays_an_error() -> None:
    assert decode(bytes.fromhex("d6ff00000001")) == msgpack.Timestamp(1)
    with pytest.raises(CorruptSnapshotError, match="unhashable type: 'list'"):
        decode(bytes.fromhex("8192010203"))


@pytest.mark.parametrize("data", [
    bytes.fromhex("ca3f800000"), bytes.fromhex("81ca3f80000001"), bytes.fromhex("810102"),
    bytes.fromhex("81cfffffffffffffffff01"), bytes.fromhex("81d3800000000000000001"), bytes.fromhex("82a16101a16102"),
    bytes.fromhex("81c0c3"), bytes.fromhex("81c3c2"), bytes.fromhex("91cb8000000000000000"),
    bytes.fromhex("cb7ff8000000000001"), bytes.fromhex("d9026162"), bytes.fromhex("c4026162"),
], ids=lambda data: data.hex())
def test_float32_int_keys_and_repeated_keys_decode_alike(data: bytes) -> None:
    agrees(data)


def test_deeper_nesting_than_msgpacks_is_refused_whatever_the_recursion_limit() -> None:
    deep = in_map(b"\x91" * 1024 + b"\x01")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        with pytest.raises(_codec_native.Refused):
            native(deep)
        agrees(deep)
    finally:
        sys.setrecursionlimit(limit)


# forged lengths --------------------------------------------------------------------------------------------------

FORGED = [bytes.fromhex(head) + bytes(5) for head in ("ddffffffff", "dfffffffff", "c6ffffffff", "dbffffffff",
                                                      "c9ffffffff01", "81ddffffffff", "81dfffffffff")]


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("data", [*FORGED, *map(ext, [1] * len(FORGED), FORGED), *map(in_map, FORGED)],
                         ids=lambda data: data.hex())
def test_a_forged_length_allocates_nothing_on_either_path(data: bytes, traced: None) -> None:
    for run in (_codec_native._DECODER.decode, native, present, decode):  # type: ignore[union-attr]
        tracemalloc.reset_peak()
        try:
            run(data)
        except Exception:  # noqa: BLE001 - each refuses; what it allocated is the point
            pass
        assert tracemalloc.get_traced_memory()[1] < 1 << 20, run
    with pytest.raises(CorruptSnapshotError):
        decode(data)
    agrees(data)
