"""The state codec (``snapshot.container._codec``): data round-trips with its types, what is not data goes
to ``pickled`` with its place, streaming keeps memory flat, and no input runs code or leaks a
Python exception (only ``CorruptSnapshotError``)."""

from __future__ import annotations

import collections
import dataclasses
import enum
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
          | st.binary().map(bytearray) | st.builds(range, st.integers(-9, 9), st.integers(-9, 9),
                                                  st.integers(1, 3) | st.integers(-3, -1))
          | numpy_arrays | numpy_scalars | tensors())


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
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
    "\ud800 lone surrogate", "", b"", bytearray(), (), [], {}, set(), frozenset(), (1,), [[[]]],
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


def test_a_decoder_reads_values_one_after_another_and_written_sizes_each(tmp_path: Path) -> None:
    path = tmp_path / "values.bin"
    values = [{"a": 1}, np.ones(10000), [b"y" * 20000, "z"], None]
    with path.open("wb") as out:
        encoder = Encoder(out.write)
        sizes = []
        for value in values:
            before = encoder.written
            encoder.encode(value)
            sizes.append(encoder.written - before)
    data = path.read_bytes()
    assert encoder.written == len(data)
    decoder = Decoder(data)
    for value, size in zip(values, sizes):
        start = decoder.offset
        assert same(decoder.next(), value)
        assert decoder.offset - start == size == len(encode(value)[0])
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
    back = decode(data, pickled=lambda index, where: pickled[index][1])
    assert back["service"]["shards"][0]["nodes"]["/0/shuffle"]["state"][3] is value
    with pytest.raises(UntrustedStateError, match=r"state\.service\.shards\[0\]\.nodes\['/0/shuffle'\]"
                                                  r"\.state\[3\] is stored pickled") as info:
        decode(data, source="snap.bin")
    assert info.value.where == "state.service.shards[0].nodes['/0/shuffle'].state[3]"
    assert str(info.value).startswith("snap.bin: ")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(leaves | st.builds(Custom) | st.builds(Record, st.integers()) | st.just(len), containers,
                    max_leaves=12))
def test_values_that_are_not_data_come_back_from_the_pickled_callback(value: Any) -> None:
    data, pickled = encode(value)
    assert all(type(entry) in (Custom, Record) or entry is len for _, entry in pickled)
    calls: list[tuple[int, str]] = []

    def unpickle(index: int, where: str) -> Any:
        calls.append((index, where))
        return pickled[index][1]

    assert same(decode(data, pickled=unpickle), value)
    assert calls == [(index, where) for index, (where, _) in enumerate(pickled)]


def test_places_of_keys_members_and_the_outermost_container_of_a_cycle() -> None:
    outer: dict[str, Any] = {"x": [1]}
    outer["x"].append(outer)
    custom = Custom()
    data, pickled = encode({"loop": outer, custom: 1, "set": {(1, custom)}, 7: (custom,)}, "s")
    assert [where for where, _ in pickled] == ["s.loop", "s.keys()[1]", "s.set{0}[1]", "s[7][0]"]
    assert pickled[0][1] is outer
    back = decode(data, pickled=Pickled)
    assert back == {"loop": Pickled(0, "s.loop"), Pickled(1, "s.keys()[1]"): 1,
                    "set": {(1, Pickled(2, "s.set{0}[1]"))}, 7: (Pickled(3, "s[7][0]"),)}


def test_a_shared_container_is_not_a_cycle_and_nesting_past_the_limit_is_pickled() -> None:
    shared = [1, 2]
    assert roundtrip([shared, shared, {"a": shared}]) == [[1, 2], [1, 2], {"a": [1, 2]}]
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    data, pickled = encode(deep)
    assert len(pickled) == 1 and pickled[0][0] == "state" + "[0]" * MAX_DEPTH
    assert decode(data, pickled=lambda index, where: pickled[index][1]) == deep


def test_a_failing_pickled_callback_raises_its_own_error() -> None:
    data, _ = encode([Custom()])

    def refuse(index: int, where: str) -> Any:
        raise KeyError(f"no pickled value {index}")

    with pytest.raises(KeyError, match="no pickled value 0"):
        decode(data, pickled=refuse)


# bad input -----------------------------------------------------------------------------------------

def _sample() -> Any:
    return {"ints": [0, -1, 2**70], "f": 1.5, "c": 2j, "s": "é", "b": b"ab", "ba": bytearray(b"c"), "t": (None, True),
            "set": {1, 2}, "fs": frozenset({3}), "dq": collections.deque([1], maxlen=3), "r": range(3),
            "a": np.arange(6, dtype="<f4").reshape(2, 3), "rec": np.zeros(1, [("a", "<i4"), ("b", "<f8", (2,))]),
            "g": np.float32(2), "tensor": torch.arange(4, dtype=torch.bfloat16), "p": Custom()}


def test_every_truncation_and_every_trailing_byte_is_a_corrupt_snapshot_error() -> None:
    data, pickled = encode(_sample())
    assert len(pickled) == 1 and len(data) > 200
    objects = lambda index, where: pickled[index][1]  # noqa: E731
    assert same(decode(data, pickled=objects)["a"], _sample()["a"])
    for end in range(len(data)):
        with pytest.raises(CorruptSnapshotError):
            decode(data[:end], pickled=objects)
    with pytest.raises(CorruptSnapshotError, match="1 bytes follow the value"):
        decode(data + b"N", pickled=objects)


def _forged() -> list[tuple[bytes, str]]:
    descr_o = encode("|O")[0]
    return [
        (b"", "ends where a value should start"),
        (b"\x80\x04", "unknown tag byte 0x80"),
        (b"s\xff\xff\xff\xff\xff\xff\xff\xff\x7f", "runs past the end"),
        (b"l\xfe\xff\xff\xff\x00", "longer than the rest"),
        (b"s\xfd", "malformed"),
        (b"s\xfe\x01", "ends inside the length"),
        (b"s\x02\xc3\x28", "not UTF-8"),
        (b"D\x01l\x00N", "dict key of type list, which is not hashable"),
        (b"S\x01D\x00", "set member of type dict"),
        (b"Q" + b"s\x01a" + b"\x00", "maxlen is 'a'"),
        (b"Q" + b"i\x01\x01" + b"\x02NN", "deque of 2 items with maxlen 1"),
        (b"R" + b"i\x01\x00" * 3, "nonzero step"),
        (b"R" + b"s\x00" + b"i\x01\x00" * 2, "not three ints"),
        (b"A" + descr_o + b"\x01\x01\x08" + bytes(8), "never Python objects"),
        (b"A" + encode([("a", "|O")])[0] + b"\x01\x01\x08" + bytes(8), "never Python objects"),
        (b"A" + encode({"descr": "<f8"})[0] + b"\x00\x08" + bytes(8), "not one of plain data"),
        (b"A" + encode("nonsense")[0] + b"\x00\x00", "not one of plain data"),
        (b"A" + encode("(2,3)f8")[0] + b"\x00\x00", "not one of plain data"),  # no string for numpy to parse
        (b"A" + encode([("a", "<f8", (-1,))])[0] + b"\x00\x00", "not one of plain data"),
        (b"A" + encode("<f3")[0] + b"\x01\x01\x00", "not one numpy rebuilds"),
        (b"A" + b"P\x00s\x00" + b"\x00\x00", "description holds a pickled value"),
        (b"A" + b"A" + encode("<f8")[0] + b"\x00\x08" + bytes(8), "description holds an array"),
        (b"A" + encode("<f8")[0] + b"\x02\x02\x02\x08" + bytes(8), r"needs 32 bytes, its payload has 8"),
        (b"A" + encode("<f8")[0] + b"\x41", "65 dimensions"),
        (b"A" + encode("|V0")[0] + b"\x01\xfe\x00\x00\x00\x40\x00", "no bytes an element"),
        (b"G" + encode("<f8")[0] + b"\x01\x01\x08" + bytes(8), "numpy scalar with dimensions"),
        (b"X\x06pickle\x01\x01\x00\x01" + bytes(1), "dtype 'pickle', which is not in the codec's table"),
        (b"X\x07float32\x01\x02\x00\x04" + bytes(4), "needs 8 bytes"),
        (b"X\x07float32\x00\x02\x04" + bytes(4), "requires_grad byte is 2"),
        (b"X\x05int64\x00\x01\x08" + bytes(8), "does not decode"),  # an int tensor cannot require grad
        (b"P\x00N", "place is not a str"),
        (b"l\x01" * (MAX_DEPTH + 1) + b"N", f"nested deeper than {MAX_DEPTH} levels"),
    ]


@pytest.mark.parametrize(("data", "message"), _forged(), ids=lambda x: x if isinstance(x, str) else None)
def test_forged_input_is_a_corrupt_snapshot_error_that_says_what(data: bytes, message: str) -> None:
    with pytest.raises(CorruptSnapshotError, match=message) as info:
        decode(data, pickled=Pickled, source="forged.snap")
    assert str(info.value).startswith("forged.snap (at byte ")
    assert info.value.source == "forged.snap" and 0 <= (info.value.offset or 0) <= len(data)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64) | st.lists(st.sampled_from(list(b"NTFidjsbBltDSZQRAGXP\x00\x01\x02\xfe")),
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
        b"b" + encode(bomb)[0][1:],
        genuine.replace(b"i\x01\x02", b"b" + encode(bomb)[0][1:]),
        genuine.replace(b"i\x01\x02", b"P\x00" + encode("state")[0]),
        genuine[:-3] + bomb,
        b"A" + encode(bomb.decode("latin-1"))[0] + b"\x00\x00",
        b"X" + encode(bomb)[0][1:] + b"\x00\x00\x00",
    ]
    outcomes = []
    for data in forged:
        try:
            outcomes.append(type(decode(data)).__name__)
        except (CorruptSnapshotError, UntrustedStateError) as error:
            outcomes.append(type(error).__name__)
    assert not marker.exists()
    assert outcomes == ["CorruptSnapshotError", "bytes", "dict", "UntrustedStateError", "CorruptSnapshotError",
                        "CorruptSnapshotError", "CorruptSnapshotError"]


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


def test_big_payloads_reach_write_from_their_own_memory_and_small_values_in_buffers() -> None:
    array, tensor, blob = np.arange(1 << 16, dtype="f8"), torch.arange(1 << 16, dtype=torch.float32), b"b" * 100000
    pieces: list[Any] = []
    encoder = Encoder(pieces.append)
    encoder.encode([array, list(range(100000)), tensor, blob])
    assert encoder.written == sum(len(piece) for piece in pieces)
    assert any(np.shares_memory(np.asarray(piece), array) for piece in pieces if isinstance(piece, memoryview))
    assert any(np.shares_memory(np.asarray(piece), tensor.numpy()) for piece in pieces if isinstance(piece, memoryview))
    assert any(piece is blob for piece in pieces)
    small = [len(piece) for piece in pieces if len(piece) not in (array.nbytes, tensor.nbytes, len(blob))]
    assert len(small) > 3 and max(small) < 80 * 1024  # the ints came in buffers of about 64 KiB


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
    import collections

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
    with pytest.raises(CorruptSnapshotError, match="factory"):
        decode(b"E" + bytes([200]) + b"D" + bytes([0]))


def test_a_long_str_repeated_is_written_once_and_read_back_equal() -> None:
    """A file path in every buffered sample's address: written once, then referred to."""
    path = "/data/shards/train-000017.tar"
    value = [{"file": path, "member": i, "key": "short"} for i in range(200)]
    data, pickled = encode(value)
    assert pickled == [] and data.count(path.encode()) == 1
    assert decode(data) == value
    where = "where-strings-are-not-shared-" * 2
    data, pickled = encode({"a": Custom(), where: where, "b": where})
    back = decode(data, pickled=lambda index, at: "P")
    assert back == {"a": "P", where: where, "b": where}
    with pytest.raises(CorruptSnapshotError, match="reference to str number 0, of 0"):
        decode(b"r" + bytes([0]))


def test_the_encoder_measures_marked_values_as_it_writes_them() -> None:
    """``state_bytes`` of the manifest come from the one encoding: each marked value is measured
    where it is written, a shared long string counted where it is written first, and one object at
    two places (a small int) gets both labels."""
    path = "/data/shards/train-000017.tar"
    first = [{"file": path, "member": i} for i in range(50)]
    second = {"file": path, "offset": 10}
    third = 7
    pieces: list[Any] = []
    encoder = Encoder(pieces.append, measure={id(first): ("a",), id(second): ("b",), id(third): ("c", "d")})
    encoder.encode({"nodes": {"x": {"state": first}, "y": {"state": second}, "z": {"state": third, "n": 7}},
                    "state": "not marked"})
    assert encoder.sizes["a"] == len(encode(first)[0])
    assert 0 < encoder.sizes["b"] < len(encode(second)[0])  # the path is a reference to the first one
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
