"""The save's fast paths write what the slow ones write: runs of small values of the payload's frame packed in
one call, rows written after their ext header, the rows check done in C passes, package versions read from
their metadata's headers (``snapshot.container._codec_encode``, ``_codec_shapes``, ``_manifest_of``)."""

from __future__ import annotations

import collections
from importlib import metadata
from typing import Any, NamedTuple

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshot.container import _codec_encode, _codec_shapes, _codec_types, _manifest_of
from snapshot.container._codec import Encoder, Pickled, decode, encode
from snapshot.container._codec_places import Rows

from .test_codec import same


def written(value: Any, measure: dict[int, tuple[Any, ...]] | None = None) -> tuple[bytes, dict[Any, int], list[Any]]:
    pieces: list[bytes] = []
    encoder = Encoder(lambda data: pieces.append(bytes(data)), measure)
    encoder.encode(value, "payload")
    return b"".join(pieces), encoder.sizes, [where for where, _ in encoder.pickled]


def walked(monkeypatch: pytest.MonkeyPatch, value: Any,
           measure: dict[int, tuple[Any, ...]] | None = None) -> tuple[bytes, dict[Any, int], list[Any]]:
    """What the encoder writes with no value taken for small: the frame walked item by item, rows packed as
    any value."""
    with monkeypatch.context() as patched:
        patched.setattr(_codec_encode, "fits", lambda value, measure, left, weights=None, measured=False: -1)
        patched.setattr(Encoder, "_emit_rows", lambda self, rows: self._emit(self._pack(Rows(rows))))
        return written(value, measure)


scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=5)
small = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
    st.text(max_size=3) | st.integers(0, 3), inner, max_size=5), max_leaves=40)
frames = st.recursive(small | st.binary(max_size=5000) | st.text(min_size=4090, max_size=4100)
                      | st.lists(st.tuples(st.integers(), st.text(max_size=3)), min_size=17, max_size=40)
                      | st.sets(st.integers(), max_size=4) | st.builds(Pickled, st.integers(0, 3)),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                          st.text(max_size=3) | st.integers(0, 3) | st.tuples(st.integers()), inner, max_size=6),
                      max_leaves=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(frames, st.data())
def test_the_frame_writes_the_bytes_of_its_walk(monkeypatch: pytest.MonkeyPatch, value: Any,
                                                draw: st.DataObject) -> None:
    """Small dicts and lists packed whole, and runs of small items of a dict packed in one call, are the bytes
    the item-by-item walk writes, with the same sizes measured and the same places named."""
    holders = [v for v in _values(value) if isinstance(v, dict)]
    marked = draw.draw(st.lists(st.sampled_from([item for h in holders for item in h.values()] or [None]),
                                max_size=3))
    measure = {id(item): (f"m{index}",) for index, item in enumerate(marked)}
    fast = written(value, measure)
    assert fast == walked(monkeypatch, value, measure)
    assert same(decode(fast[0], pickled=lambda index: Pickled(index)), value) or fast[2]


def _values(value: Any) -> list[Any]:
    found = [value]
    for item in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()):
        found += _values(item)
    return found


def test_a_small_value_holding_a_measured_one_is_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node state inside a small dict is measured where it is written (an int shared with another item too)."""
    state, other = {"position": 7}, 7
    payload = {"nodes": {"a": {"yielded": 7, "state": state}, "b": {"yielded": 7, "state": other, "n": 7}}}
    data, sizes, _ = written(payload, {id(state): ("a",), id(other): ("b",)})
    assert sizes == {"a": len(encode(state)[0]), "b": 1}
    assert (data, sizes) == walked(monkeypatch, payload, {id(state): ("a",), id(other): ("b",)})[:2]


def test_a_big_dict_in_the_frame_is_told_not_small_by_its_length_before_its_keys(monkeypatch: pytest.MonkeyPatch
                                                                                   ) -> None:
    """The frame asks at each level whether a value is small: a dict of 10,000 keys is not, from its length
    (each ask looked at the type of every key before: 136 instead of 30 ms for a node state holding a dict of
    200,000 counts)."""
    asked: list[int] = []

    class Keys(frozenset):  # type: ignore[type-arg]
        def issuperset(self, other: Any) -> bool:
            keys = list(other)
            asked.append(len(keys))
            return frozenset.issuperset(self, keys)

    monkeypatch.setattr(_codec_shapes, "KEYS", Keys(_codec_shapes.KEYS))
    counts = {index: index % 7 for index in range(10_000)}
    payload = {"state": {"service": {"shards": [{"nodes": {"0": {"yielded": 3, "state": {"counts": counts}}}}]}}}
    data, _, _ = written(payload)
    assert asked and max(asked) <= _codec_shapes.SMALL
    assert same(decode(data), payload)


@pytest.mark.parametrize("kind", [dict, list])
def test_a_big_dict_or_list_written_in_chunks_is_the_bytes_of_packing_it_whole(kind: type) -> None:
    """A dict or list of more than ``_CHUNKED`` items is written a slice at a time (a dict's items taken
    straight into each slice, a list sliced in C): every item once, in order, whatever the slices' sizes."""
    items = {f"k{index}": [index, f"v{index}"] for index in range(50_000)}
    value = items if kind is dict else list(items.values())
    pieces: list[bytes] = []
    Encoder(lambda data: pieces.append(bytes(data)), frame=0).encode(value)
    assert len(pieces) > 1  # written as it is made
    assert b"".join(pieces) == msgpack.packb(value, **_codec_types.PACK_OPTIONS)


def test_values_not_data_in_a_big_dict_written_in_chunks_are_named_by_their_place() -> None:
    value: dict[Any, Any] = {index: index for index in range(20_000)}
    value[7], value[12_345] = Point(1, 2), collections.OrderedDict(a=1)
    _, pickled = encode({"counts": value})
    assert [where for where, _ in pickled] == ["state.counts[7]", "state.counts[12345]"]


@pytest.mark.parametrize("count", [17, 40, 3000, 20000])  # fixext and ext 8, ext 16, ext 32 bodies
def test_rows_written_after_their_header_are_the_bytes_of_packing_them(monkeypatch: pytest.MonkeyPatch,
                                                                       count: int) -> None:
    rows = [(i, f"/data/part-{i % 7}.jsonl", i * 300) for i in range(count)]
    odd = [(i, "\udcff" if i == count // 2 else "x") for i in range(count)]  # a lone surrogate: msgpack's slow path
    value = {"state": {"where": rows, "odd": odd, "plain": {"a": 1}}}
    data = written(value)[0]
    assert data == walked(monkeypatch, value)[0]
    assert same(decode(data), value)


class Point(NamedTuple):
    x: int
    y: int


def test_rows_that_hold_values_not_data_name_them_by_row_and_column() -> None:
    rows = [(i, i) for i in range(20)]
    rows[5] = (5, collections.OrderedDict(a=1))
    data, _, places = written({"state": {"where": rows}})
    assert places == ["payload.state.where[5][1]"]


def test_rows_that_nest_past_the_limit_or_hold_a_cycle_pickle_that_value_with_its_place() -> None:
    """A row's value nested deeper than the encoder goes, or a list that holds itself, is not data (it raised
    the encoder's internal ``TooDeep`` out of a save before)."""
    deep: Any = 1
    for _ in range(40):
        deep = (deep,)
    loop: list[Any] = []
    loop.append(loop)
    rows: list[Any] = [(i, i) for i in range(20)]
    rows[3], rows[11] = (3, deep), (11, loop)
    data, pickled = encode({"rows": rows})
    places = [where for where, _ in pickled]
    assert len(places) == 2 and places[0].startswith("state.rows[3][1]") and places[1] == "state.rows[11][1]"
    back = decode(data, pickled=lambda index: pickled[index][1])
    assert back["rows"][:3] == rows[:3] and back["rows"][11][1] is loop and type(back["rows"][5]) is tuple


@pytest.mark.parametrize("odd", [Point(1, 2), (1, 2, 3), ()], ids=["subclass", "longer", "empty"])
@pytest.mark.parametrize("at", [0, 9, 19])
def test_a_list_of_tuples_with_one_of_another_kind_keeps_every_type(odd: tuple[Any, ...], at: int) -> None:
    rows: list[Any] = [(i, i) for i in range(20)]
    rows[at] = odd
    data, pickled = encode({"rows": rows})
    back = decode(data, pickled=lambda index: pickled[index][1])
    assert same(back, {"rows": rows}) and type(back["rows"][at]) is type(odd)


@pytest.mark.parametrize("package", ["dill", "torchdata", "msgpack", "numpy"])
def test_package_versions_are_those_importlib_metadata_reads(package: str) -> None:
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed")
    assert _manifest_of._version_of(dist) == metadata.version(package)
