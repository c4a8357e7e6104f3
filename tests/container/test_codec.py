"""The state codec of format 3 (``snapshot.container._codec``, msgpack): data round-trips with its types, what
is not data goes to ``pickled`` with its place, streaming keeps memory flat both ways, and no input runs code
or leaks a Python exception (only ``CorruptSnapshotError``)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import io
import math
import mmap
import os
import pickle
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from snapshot.container._codec import MAX_DEPTH, Decoder, Encoder, Pickled, decode, encode
from snapshot.errors import CorruptSnapshotError, UntrustedStateError

ROOT = Path(__file__).resolve().parents[2]


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down (nan equals nan, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) is complex:
        return same(a.real, b.real) and same(a.imag, b.imag)
    if type(a) in (list, tuple, collections.deque):
        return (len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
                and getattr(a, "maxlen", None) == getattr(b, "maxlen", None))
    if type(a) is dict:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a.items(), b.items()))
    if type(a) in (set, frozenset):
        return len(a) == len(b) and all(any(same(x, y) for y in b) for x in a)
    if type(a) is range:
        return (a.start, a.stop, a.step) == (b.start, b.stop, b.step)
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and np.shape(a) == np.shape(b) and a.tobytes() == b.tobytes()
    if type(a) is torch.Tensor:
        return (a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
                and torch.equal(raw(a), raw(b)))
    return bool(a == b)


def raw(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.numel():
        return torch.empty(0, dtype=torch.uint8)
    return tensor.detach().resolve_conj().contiguous().reshape(-1).view(torch.uint8)


def roundtrip(value: Any) -> Any:
    data, pickled = encode(value)
    assert pickled == []
    return decode(data)


# strategies ----------------------------------------------------------------------------------------

hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(exclude_categories=()))
    | st.binary(max_size=8) | st.complex_numbers(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=6)

numpy_dtypes = (hnp.scalar_dtypes() | hnp.byte_string_dtypes() | hnp.unicode_string_dtypes()
                | hnp.integer_dtypes(endianness=">") | hnp.array_dtypes(max_size=3))
numpy_arrays = hnp.arrays(numpy_dtypes, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
numpy_scalars = hnp.arrays(hnp.scalar_dtypes() | hnp.unicode_string_dtypes() | hnp.array_dtypes(max_size=2),
                           ()).map(lambda array: array[()])

TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
                torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    tensor = torch.from_numpy(np.asarray(np.random.default_rng(draw(st.integers(0, 99))).standard_normal(shape) * 50))
    tensor = tensor.to(torch.float32).to(dtype) if dtype.is_floating_point else tensor.to(torch.int64).to(dtype)
    if draw(st.booleans()) and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)
    if (dtype.is_floating_point or dtype.is_complex) and dtype.itemsize >= 2 and draw(st.booleans()):
        tensor.requires_grad_()
    return tensor


leaves = (st.none() | st.booleans() | st.integers() | st.integers(-(2**200), 2**200) | st.floats()
          | st.complex_numbers() | st.text(st.characters(exclude_categories=())) | st.binary()
          | st.builds(range, st.integers(-9, 9), st.integers(-9, 9),
                                                  st.integers(1, 3) | st.integers(-3, -1))
          | numpy_arrays | numpy_scalars | tensors())


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
            | st.lists(st.tuples(inner, inner), min_size=17, max_size=20)  # written by columns
            | st.dictionaries(hashables, inner, max_size=4) | st.sets(hashables, max_size=4)
            | st.frozensets(hashables, max_size=4)
            | st.builds(collections.deque, st.lists(inner, max_size=3), st.none() | st.integers(3, 5)))


data_values = st.recursive(leaves, containers, max_leaves=20)


# round trips ---------------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data_values)
def test_data_round_trips_with_its_types(value: Any) -> None:
    assert same(roundtrip(value), value)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(numpy_arrays | numpy_scalars | tensors(), min_size=1, max_size=3))
def test_arrays_numpy_scalars_and_tensors_round_trip(values: list[Any]) -> None:
    assert same(roundtrip(values), values)


@pytest.mark.parametrize("value", [
    float("nan"), float("inf"), -float("inf"), -0.0, 2**1000, -(2**1000) - 1, 0, -1, 255, 256, -256,
    "\ud800 lone surrogate", "", b"", (), [], {}, set(), frozenset(), (1,), [[[]]], 2**64 - 1, -(2**63), 2**64,
    [(i, "x", None) for i in range(40)], [(i,) for i in range(17)], [(1, 2)] * 16 + [(3,)], [()] * 20,
    collections.deque(maxlen=0), collections.deque([1, 2], maxlen=2), range(0), range(-5, 50, 7),
    {1: "a", "b": 2, (1, 2): 3, frozenset({1}): 4, None: 5, 1.5: 6, b"k": 7},
    np.zeros((0, 3), "f4"), np.float64("nan"), np.str_(""), np.bytes_(b"ab"), np.datetime64("NaT"),
    np.datetime64("2026-11-25T01:02"), np.timedelta64(5, "ms"), np.bool_(False), np.array(3.5),
    np.array([1, 2], ">i2"), np.arange(24).reshape(2, 3, 4)[:, ::2, 1:], np.asfortranarray(np.ones((3, 2))),
    np.zeros(2, dtype={"names": ["a"], "formats": ["<i4"], "offsets": [4], "itemsize": 12}),
    np.zeros(2, dtype=np.dtype([("x", "i4"), ("y", "u1")], align=True)),
    torch.tensor(3.0), torch.zeros(0, 2, dtype=torch.bfloat16), torch.arange(6).reshape(2, 3).t(),
    torch.ones(3, dtype=torch.complex64) * 1j, (torch.ones(2, dtype=torch.complex64) * 1j).conj(),
    torch.arange(4, dtype=torch.uint8).view(torch.float8_e4m3fnuz), torch.tensor([True, False]),
    torch.ones(2, requires_grad=True) * 2,  # not a leaf: decodes as a leaf that requires grad
], ids=repr)
def test_edge_values_round_trip(value: Any) -> None:
    assert same(roundtrip(value), value)


def test_decoded_arrays_and_tensors_are_writable_copies_of_the_payload() -> None:
    data = bytearray(encode([np.arange(5000, dtype="i8"), torch.arange(5000), b"x" * 70000])[0])
    array, tensor, blob = decode(data)
    array[0], tensor[0] = 7, 7
    data[:] = bytes(len(data))  # the decoded values must not see this
    assert array[1] == 1 and tensor[1] == 1 and blob == b"x" * 70000
    assert array.flags.writeable and array.flags.c_contiguous


def test_a_bytearray_decodes_as_bytes() -> None:
    """msgpack packs a bytearray as it packs bytes (no hook sees it): the one type data does not keep."""
    assert decode(encode({"b": bytearray(b"ab")})[0]) == {"b": b"ab"}


def test_a_decoder_reads_values_one_after_another_and_written_sizes_each(tmp_path: Path) -> None:
    path = tmp_path / "values.bin"
    values = [{"a": 1}, np.ones(10000), [b"y" * 20000, "z"], None, [torch.ones(3), np.zeros(2)]]
    with path.open("wb") as out:
        encoder = Encoder(out.write)
        sizes = []
        for value in values:
            before = encoder.written
            encoder.encode(value)
            sizes.append(encoder.written - before)
    data = path.read_bytes()
    assert encoder.written == len(data)
    with path.open("rb") as file:
        decoder = Decoder(file, limit=len(data))
        for value, size in zip(values, sizes):
            start = decoder.position
            assert same(decoder.next(), value)
            assert decoder.position - start == size == len(encode(value)[0])
        with pytest.raises(CorruptSnapshotError, match="ends where a value should start"):
            decoder.next()


def test_importing_the_codec_imports_neither_torch_nor_numpy() -> None:
    code = "import sys, snapshot.container._codec; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


# what is not data ----------------------------------------------------------------------------------

class Custom:
    pass


@dataclasses.dataclass
class Record:
    x: int


class Pair(NamedTuple):
    a: int
    b: int


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


def _not_data() -> list[Any]:
    looped: list[Any] = [1]
    looped.append(looped)
    tensor_with_attribute = torch.ones(2)
    tensor_with_attribute.note = "kept by pickle"  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated; still a tensor a state may hold
        quantized = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    return [
        Custom(), Record(1), Pair(1, 2), collections.OrderedDict(a=1), collections.defaultdict(lambda: 0), Color.RED,
        _not_data, lambda: 0, len, torch.Generator(), torch.nn.Parameter(torch.ones(2)), Name("x"),
        torch.ones(2).to_sparse(), quantized,
        torch.empty(2, device="meta"), tensor_with_attribute, looped, np.array([1, None], dtype=object),
        np.ma.masked_array([1, 2]), np.array([1.0], dtype=np.dtype("f8", metadata={"m": 1})),
        np.longlong(3), (x for x in ()), Path("p"), ValueError("e"), type,
    ]


@pytest.mark.parametrize("value", _not_data(), ids=lambda value: type(value).__name__)
def test_a_value_that_is_not_data_is_pickled_with_its_place(value: Any) -> None:
    state = {"service": {"shards": [{"nodes": {"/0/shuffle": {"state": [1, 2, 3, value]}}}]}}
    data, pickled = encode(state, "state")
    assert pickled == [("state.service.shards[0].nodes['/0/shuffle'].state[3]", value)]
    back = decode(data, pickled=lambda index: pickled[index][1])
    assert back["service"]["shards"][0]["nodes"]["/0/shuffle"]["state"][3] is value
    with pytest.raises(UntrustedStateError, match=r"the value stored pickled \(number 0\) needs unpickling") as info:
        decode(data, source="snap.bin")
    assert str(info.value).startswith("snap.bin: ")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(leaves | st.builds(Custom) | st.builds(Record, st.integers()) | st.just(len), containers,
                    max_leaves=12))
def test_values_that_are_not_data_come_back_from_the_pickled_callback(value: Any) -> None:
    data, pickled = encode(value)
    assert all(type(entry) in (Custom, Record) or entry is len for _, entry in pickled)
    calls: list[int] = []

    def unpickle(index: int) -> Any:
        calls.append(index)
        return pickled[index][1]

    assert same(decode(data, pickled=unpickle), value)
    assert calls == list(range(len(pickled)))
    assert all("somewhere inside" not in where for where, _ in pickled)


def test_places_of_keys_members_columns_and_a_cycle() -> None:
    outer: dict[str, Any] = {"x": [1]}
    outer["x"].append(outer)
    custom = Custom()
    rows = [(i, custom if i == 20 else i) for i in range(30)]
    data, pickled = encode({"loop": outer, custom: 1, "set": {(1, custom)}, 7: (custom,), "rows": rows}, "s")
    assert [where for where, _ in pickled] == ["s.loop", "s.keys()[1]", "s.set{0}[1]", "s[7][0]", "s.rows[20][1]"]
    assert pickled[0][1] is outer
    back = decode(data, pickled=Pickled)
    assert back["loop"] == Pickled(0) and back[Pickled(1)] == 1 and back["set"] == {(1, Pickled(2))}
    assert back[7] == (Pickled(3),) and back["rows"][20] == (20, Pickled(4)) and back["rows"][21] == (21, 21)
    out = io.BytesIO()
    encoder = Encoder(out.write)  # a payload's frame (dicts near the top) is written as it is walked
    encoder.encode({"loop": outer}, "p")
    assert [where for where, _ in encoder.pickled] == ["p.loop.x"]  # a cycle through it is cut below it
    assert decode(out.getvalue(), pickled=Pickled) == {"loop": {"x": Pickled(0)}}


def test_a_shared_container_is_not_a_cycle_and_nesting_past_the_limit_is_pickled() -> None:
    shared = [1, 2]
    assert roundtrip([shared, shared, {"a": shared}]) == [[1, 2], [1, 2], {"a": [1, 2]}]
    for make in (list, tuple):  # lists past msgpack's own depth; tuples past MAX_DEPTH
        deep: Any = "leaf"
        for _ in range(1100 if make is list else MAX_DEPTH + 5):
            deep = make([deep])
        data, pickled = encode(deep)
        assert len(pickled) == 1 and pickled[0][0] == "state" + "[0]" * MAX_DEPTH
        assert decode(data, pickled=lambda index, found=pickled: found[index][1]) == deep


def test_a_failing_pickled_callback_raises_its_own_error() -> None:
    data, _ = encode([Custom()])

    def refuse(index: int) -> Any:
        raise KeyError(f"no pickled value {index}")

    with pytest.raises(KeyError, match="no pickled value 0"):
        decode(data, pickled=refuse)


# bad input -----------------------------------------------------------------------------------------

def _sample() -> Any:
    return {"ints": [0, -1, 2**70], "f": 1.5, "c": 2j, "s": "é", "b": b"ab", "t": (None, True),
            "set": {1, 2}, "fs": frozenset({3}), "dq": collections.deque([1], maxlen=3), "r": range(3),
            "a": np.arange(6, dtype="<f4").reshape(2, 3), "rec": np.zeros(1, [("a", "<i4"), ("b", "<f8", (2,))]),
            "g": np.float32(2), "tensor": torch.arange(4, dtype=torch.bfloat16), "p": Custom(),
            "rows": [(i, str(i)) for i in range(20)]}


def test_every_truncation_and_every_trailing_byte_is_a_corrupt_snapshot_error() -> None:
    data, pickled = encode(_sample())
    assert len(pickled) == 1 and len(data) > 200
    objects = lambda index: pickled[index][1]  # noqa: E731
    assert same(decode(data, pickled=objects)["a"], _sample()["a"])
    for end in range(len(data)):
        with pytest.raises(CorruptSnapshotError):
            decode(data[:end], pickled=objects)
    with pytest.raises(CorruptSnapshotError, match="1 bytes follow the value"):
        decode(data + b"\xc0", pickled=objects)


def ext(code: int, body: Any) -> bytes:
    """A forged ext value whose body is ``body`` packed (bytes as they are)."""
    return msgpack.packb(msgpack.ExtType(code, body if isinstance(body, bytes) else msgpack.packb(body)))


def _forged() -> list[tuple[bytes, str]]:
    nested = b"\xc0"
    for _ in range(MAX_DEPTH + 1):  # tuples in tuples: each ext's body a list of one
        nested = ext(1, b"\x91" + nested)
    return [
        (b"", "ends where a value should start"),
        (b"\xc1", "does not decode"),  # a byte msgpack never uses
        (b"\xdb\xff\xff\xff\xff\x00", "ends inside a value"),  # a str longer than the data
        (b"\xdd\xff\xff\xff\xff\xc0", "does not decode"),  # a list longer than the data
        (b"\xa2\xc3\x28", "does not decode"),  # a str that is not UTF-8
        (b"\x81\x90\xc0", "unhashable"),  # a dict key that is a list
        (ext(99, b""), "unknown ext type 99"),
        (ext(1, {"a": 1}), "tuple whose body is a dict"),
        (ext(2, [[1]]), "set member of type list, which is not hashable"),
        (ext(5, b"\x00" * 8), "complex of 8 bytes"),
        (ext(7, ["a", 1]), "maxlen is 'a'"),
        (ext(7, [1, 1, 2]), "deque of 2 items whose maxlen is 1"),
        (ext(7, []), "deque of -1 items"),
        (ext(8, [0, 3, 0]), "nonzero step"),
        (ext(8, ["a", 3, 1]), "not three ints"),
        (ext(9, [99, {}]), "factory is number 99"),
        (ext(9, [0, []]), "defaultdict whose fields"),
        (ext(11, ["|O", [1], 8]) + bytes(8), "never Python objects"),
        (ext(11, [[["a", "|O"]], [1], 8]) + bytes(8), "never Python objects"),
        (ext(11, ["nonsense", [], 0]), "not one of plain data"),
        (ext(11, ["(2,3)f8", [], 0]), "not one of plain data"),
        (ext(11, ["<f3", [1], 0]), "not one numpy rebuilds"),
        (ext(11, ["<f8", [2, 2], 8]) + bytes(8), "needs 32 bytes, its descriptor says 8"),
        (ext(11, ["<f8", [-1], 8]), "shape \\[-1\\]"),
        (ext(11, ["<f8", [1] * 65, 8]), "at most 64 dimensions"),
        (ext(11, ["|V0", [1 << 30], 0]), "no bytes an element"),
        (ext(11, ["<f8", [1 << 40], 8 << 40]), "more than the data holds"),
        (ext(11, ["<f8", [4], 32]) + bytes(8), "of 32 bytes, more than the data holds"),
        (ext(11, ["<f8", [1]]), "array whose descriptor"),
        (ext(12, ["<f8", b"\x00"]), "numpy scalar of dtype float64 with 1 bytes"),
        (ext(13, ["pickle", [1], False, 1]) + bytes(1), "dtype 'pickle', which is not in the codec's table"),
        (ext(13, ["float32", [2], False, 4]) + bytes(4), "needs 8 bytes"),
        (ext(13, ["float32", [1], 1, 4]) + bytes(4), "tensor whose fields"),
        (ext(13, ["int64", [1], True, 8]) + bytes(8), "does not decode"),  # an int tensor cannot require grad
        (ext(14, b"\x00"), "index of 1 bytes"),
        (ext(15, [3, [1, 2]]), "columns are not 3 long"),
        (ext(15, [0]), "columns are not 0 long"),
        (nested, f"nested deeper than {MAX_DEPTH} levels"),
        (b"\x91" * 1100 + b"\xc0", "does not decode"),
    ]


@pytest.mark.parametrize(("data", "message"), _forged(), ids=lambda x: x if isinstance(x, str) else None)
def test_forged_input_is_a_corrupt_snapshot_error_that_says_what(data: bytes, message: str) -> None:
    with pytest.raises(CorruptSnapshotError, match=message) as info:
        decode(data, pickled=Pickled, source="forged.snap")
    assert str(info.value).startswith("forged.snap (at byte ")
    assert info.value.source == "forged.snap" and 0 <= (info.value.offset or 0) <= len(data) + 64


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64) | st.lists(st.sampled_from(list(b"\x90\x91\x92\x80\x81\xc0\xc3\xc4\xd4\xd5\xc7"
                                                              b"\x01\x02\x0b\x0d\x0e\x0f\xa1\x00\xff")),
                                         max_size=40).map(bytes))
def test_random_bytes_decode_or_raise_corrupt_snapshot_error(data: bytes) -> None:
    try:
        decode(data, pickled=Pickled)
    except CorruptSnapshotError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_damaged_encoding_decodes_or_raises_corrupt_snapshot_error(draw: st.DataObject) -> None:
    data = bytearray(_SAMPLE_BYTES)
    for _ in range(draw.draw(st.integers(1, 4))):
        data[draw.draw(st.integers(0, len(data) - 1))] = draw.draw(st.integers(0, 255))
    try:
        decode(data, pickled=Pickled)
    except CorruptSnapshotError:
        pass


_SAMPLE_BYTES = encode(_sample())[0]


# nothing runs ---------------------------------------------------------------------------------------

class Marker:
    """Unpickling this creates the file ``path`` (what an attacker's payload would do)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_a_pickle_inside_the_bytes_never_runs(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Marker(probe)))
    assert probe.exists()  # the marker works: unpickling it does create the file
    marker = tmp_path / "ran"
    bomb = pickle.dumps(Marker(marker))
    genuine, _ = encode({"nodes": {"/0": {"state": [1, 2]}}})
    forged = [
        bomb,
        msgpack.packb(bomb),  # a pickle as bytes: bytes
        genuine.replace(b"\x92\x01\x02", msgpack.packb([1, bomb])),
        genuine.replace(b"\x92\x01\x02", ext(14, bytes(8))),
        genuine[:-3] + bomb,
        ext(11, [bomb.decode("latin-1"), [], 0]),
        ext(13, [bomb.decode("latin-1"), [], False, 0]),
        ext(99, bomb),
        ext(9, [1, {"a": bomb}]),  # a defaultdict, its factory from the fixed table, never from the data
    ]
    outcomes = []
    for data in forged:
        try:
            outcomes.append(type(decode(data)).__name__)
        except (CorruptSnapshotError, UntrustedStateError) as error:
            outcomes.append(type(error).__name__)
    assert not marker.exists()
    assert outcomes == ["CorruptSnapshotError", "bytes", "dict", "UntrustedStateError", "CorruptSnapshotError",
                        "CorruptSnapshotError", "CorruptSnapshotError", "CorruptSnapshotError", "defaultdict"]


_DECODE_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import sys
    for name in sys.argv[2:]:
        __import__(name)
    from snapshot.container._codec import Pickled, decode
    data = open(sys.argv[1], "rb").read()
    before = set(sys.modules)
    value = decode(data, pickled=Pickled)
    decode(data, pickled=Pickled)
    print(sorted(set(sys.modules) - before))
""")


@pytest.mark.parametrize("arrays", [False, True], ids=["plain data", "arrays and tensors"])
def test_decoding_imports_nothing(tmp_path: Path, arrays: bool) -> None:
    value: Any = {"a": [1, "x", b"y", (2.5, None)], "p": Custom(), "d": collections.deque([1])}
    if arrays:
        value |= {"np": np.ones((2, 2), "<f4"), "rec": np.zeros(1, [("a", "<i4")]), "g": np.int16(3),
                  "t": torch.ones(3, dtype=torch.bfloat16)}
    path = tmp_path / "value.bin"
    path.write_bytes(encode(value)[0])
    preload = ["numpy", "numpy.lib.format", "torch"] if arrays else []
    out = subprocess.run([sys.executable, "-c", _DECODE_IN_A_FRESH_PROCESS, str(path), *preload],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# streaming -----------------------------------------------------------------------------------------

def test_encoding_a_big_list_to_a_file_adds_little_memory(tmp_path: Path) -> None:
    mib = 1 << 20
    arrays = [np.full(mib // 8, index, dtype="f8") for index in range(140)]
    blobs = [bytes([index]) * mib for index in range(10)]
    value = {"arrays": arrays, "blobs": blobs, "small": list(range(50000))}
    path = tmp_path / "big.bin"
    tracemalloc.start()
    try:
        with path.open("wb") as out:
            encoder = Encoder(out.write)
            encoder.encode(value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = 150 * mib
    assert encoder.written == path.stat().st_size > size
    assert peak < size // 10, f"peak {peak / mib:.1f} MiB while encoding {size / mib:.0f} MiB"
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            back = decode(view)
        finally:
            view.release()
    assert same(back["arrays"][139], arrays[139]) and back["blobs"][9] == blobs[9]
    assert back["small"] == value["small"]


def test_decoding_from_a_file_holds_one_copy_of_the_state(tmp_path: Path) -> None:
    """The tree is read a chunk at a time and each array's bytes straight into the array: decoding 150 MiB
    of arrays and bytes from a file traces about 150 MiB, not twice that."""
    mib = 1 << 20
    value = {"arrays": [np.full(mib // 8, index, dtype="f8") for index in range(140)],
             "tensors": [torch.full((mib // 4,), float(index)) for index in range(5)],
             "blobs": [bytes([index]) * mib for index in range(5)]}
    path = tmp_path / "big.bin"
    with path.open("wb") as out:
        Encoder(out.write).encode(value)
    del value
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with path.open("rb") as file:
            back = Decoder(file, limit=size).next()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size * 1.05, f"peak {peak / mib:.1f} MiB while decoding {size / mib:.0f} MiB"
    assert back["arrays"][139][0] == 139 and back["blobs"][4] == bytes([4]) * mib
    assert torch.equal(back["tensors"][4], torch.full((mib // 4,), 4.0))


def test_big_payloads_reach_write_from_their_own_memory_and_small_values_in_buffers() -> None:
    array, tensor, blob = np.arange(1 << 16, dtype="f8"), torch.arange(1 << 16, dtype=torch.float32), b"b" * 100000
    pieces: list[Any] = []
    encoder = Encoder(pieces.append)
    encoder.encode({"array": array, "ints": list(range(100000)), "tensor": tensor, "blobs": [blob] * 40})
    assert encoder.written == sum(len(piece) for piece in pieces)
    assert any(np.shares_memory(np.asarray(piece), array) for piece in pieces if isinstance(piece, memoryview))
    assert any(np.shares_memory(np.asarray(piece), tensor.numpy()) for piece in pieces if isinstance(piece, memoryview))
    # bytes are part of the tree (msgpack takes them whole): a big list of them is written in chunks
    assert max(len(piece) for piece in pieces) < 2 * (1 << 20) + 1024
    small = [len(piece) for piece in pieces if len(piece) not in (array.nbytes, tensor.nbytes)]
    assert len(small) > 3


def benchmark(total_mib: int = 100) -> None:
    """Encode and decode throughput of a list of 1 MiB numpy arrays, against pickle (not a test:
    ``PYTHONPATH=. python -c "from tests.container.test_codec import benchmark; benchmark()"``)."""
    import time

    arrays = [np.random.default_rng(index).random(1 << 17) for index in range(total_mib)]
    for name, dump, load in [("codec", lambda v: encode(v)[0], decode), ("pickle", pickle.dumps, pickle.loads)]:
        start = time.perf_counter()
        data = dump(arrays)
        middle = time.perf_counter()
        load(data)
        end = time.perf_counter()
        print(f"{name:6}: encode {total_mib / (middle - start):7.0f} MiB/s, "
              f"decode {total_mib / (end - middle):7.0f} MiB/s")


def test_torch_data_chunks_and_plain_defaultdicts_are_data() -> None:
    """``batch()`` yields ``DataChunk``s, which buffers and samples in flight hold: they must not need trust."""
    from torch.utils.data.datapipes.datapipe import DataChunk

    value = {"batch": DataChunk([1, DataChunk([b"x"])]), "groups": collections.defaultdict(list, {1: [2]}),
             "counts": collections.defaultdict(int)}
    data, pickled = encode(value)
    assert pickled == []
    back = decode(data)
    assert type(back["batch"]) is DataChunk and type(back["batch"][1]) is DataChunk
    assert back["batch"] == [1, [b"x"]] and back["batch"].items == [1, [b"x"]]
    assert type(back["groups"]) is collections.defaultdict and back["groups"].default_factory is list
    assert back["groups"] == {1: [2]} and back["counts"]["new"] == 0
    chunk = DataChunk([1, 2])
    chunk.items.append(3)  # its copy no longer matches: not something the decoder could rebuild
    odd = collections.defaultdict(lambda: 0)
    _, pickled = encode({"chunk": chunk, "odd": odd})
    assert [where for where, _ in pickled] == ["state.chunk", "state.odd"]


def test_the_encoder_measures_marked_values_as_it_writes_them() -> None:
    """``state_bytes`` of the manifest come from the one encoding: each marked value is measured where it
    is written (its tree and its arrays' bytes), and one object at two places (a small int) gets both labels."""
    path = "/data/shards/train-000017.tar"
    first = [{"file": path, "member": i} for i in range(50)]
    second = {"file": path, "offset": 10, "array": np.ones(100)}
    third = 7
    pieces: list[Any] = []
    encoder = Encoder(pieces.append, measure={id(first): ("a",), id(second): ("b",), id(third): ("c", "d")})
    encoder.encode({"nodes": {"x": {"state": first}, "y": {"state": second}, "z": {"state": third, "n": 7}},
                    "state": "not marked"})
    assert encoder.sizes["a"] == len(encode(first)[0])
    assert encoder.sizes["b"] == len(encode(second)[0]) > 800
    assert encoder.sizes["c"] == encoder.sizes["d"] == len(encode(third)[0])
    assert set(encoder.sizes) == {"a", "b", "c", "d"}


def test_a_save_encodes_the_state_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest's per-node sizes are measured during the one encoding of the payload."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    import snapshot

    calls: list[str] = []
    real = Encoder.encode

    def counted(self: Encoder, value: Any, where: str = "state") -> None:
        calls.append(where)
        real(self, value, where)

    monkeypatch.setattr(Encoder, "encode", counted)
    loader = snapshot.DataLoader2(IterableWrapper(range(100)).shuffle(buffer_size=20).map(str))
    loader.seed(1)
    it = iter(loader)
    for _ in range(7):
        next(it)
    snap = loader.save_snapshot(tmp_path / "a.snap")
    loader.shutdown()
    assert calls == ["payload"]
    nodes = snap.manifest["shards"][0]["nodes"]
    assert any((node["state_bytes"] or 0) > 20 for node in nodes.values())
