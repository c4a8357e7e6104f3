"""A bounded fuzz of the file container and the manifest parser.

Whatever the bytes, reading them ends in a valid result or a ``SnapshotError`` subclass:
never another exception, never a hang, and never an allocation out of proportion to the
input (a header may declare a 2**60-byte payload; the reader must not believe it).

The runs are derandomized and capped (``max_examples``), so the whole file takes a few
seconds and fails the same way every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapshot
from snapshot import format as fmt
from snapshot import multipart
from snapshot.container import _dict_form
from snapshot.storage import _sources
from tests import graphs, helpers

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Offsets of the header fields, after the magic (docs/format.md).
FLAGS_AT, MLEN_AT, PLEN_AT = (len(fmt.MAGIC) + n for n in (2, 4, 8))
#: Parsing JSON costs some tens of bytes per input byte; anything beyond this is a bug.
MEMORY_FACTOR = 64
MEMORY_SLACK = 1 << 20


def small_file(key: str | None = None) -> bytes:
    with helpers.loader_at(graphs.linear(n=12), 1, seed=3) as (dl, _):
        return dl.save_snapshot().to_bytes(key=key)


VALID = small_file()
SIGNED = small_file(key="fuzz-key")


def container(manifest: bytes, payload: bytes = b"", *, version: int = 1, flags: int = 0,
              mlen: int | None = None, plen: int | None = None, tail: bytes = b"") -> bytes:
    """A container around arbitrary manifest and payload bytes, digests correct."""
    header = struct.pack(
        "<HHIQ32s32s", version, flags, len(manifest) if mlen is None else mlen,
        len(payload) if plen is None else plen,
        hashlib.sha256(manifest).digest(), hashlib.sha256(payload).digest(),
    )
    return fmt.MAGIC + header + manifest + payload + tail


@pytest.fixture(scope="module")
def workdir() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield directory


def bounded(data: bytes, read: Callable[[], Any]) -> Any:
    """Run ``read``; only a SnapshotError may escape, and memory stays proportional to ``data``."""
    tracemalloc.start()
    try:
        result = read()
    except snapshot.SnapshotError as exc:
        result = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= MEMORY_FACTOR * len(data) + MEMORY_SLACK, f"{peak} bytes for a {len(data)}-byte input"
    return result


def read_everything(data: bytes, directory: str, key: str | None = None) -> None:
    """Parse ``data`` every way a reader can: bytes, path, manifest only; check what comes back."""
    unpacked = bounded(data, lambda: fmt.unpack(data, key=key))
    if isinstance(unpacked, fmt.Container):
        assert isinstance(unpacked.manifest, dict) and unpacked.manifest["format"] == fmt.FORMAT_VERSION
        assert unpacked.payload is not None and unpacked.size == len(data)
    path = os.path.join(directory, "fuzz.snap")
    with open(path, "wb") as f:
        f.write(data)
    manifest = bounded(data, lambda: _sources.read_manifest(path))
    if isinstance(manifest, dict):
        assert manifest["format"] == fmt.FORMAT_VERSION and manifest["_file"]["size"] == len(data)
    # The manifest-only reader never accepts less than the full reader checks up to the payload.
    if isinstance(unpacked, fmt.Container):
        assert isinstance(manifest, dict)


# -- raw bytes ------------------------------------------------------------------------------

@FUZZ
@given(data=st.binary(max_size=512))
def test_random_bytes(data: bytes, workdir: str) -> None:
    read_everything(data, workdir)


@FUZZ
@given(rest=st.binary(max_size=512))
def test_random_bytes_after_the_magic(rest: bytes, workdir: str) -> None:
    read_everything(fmt.MAGIC + rest, workdir)


sizes = st.one_of(st.integers(0, 300), st.sampled_from([2**31, 2**32 - 1, 2**60, 2**64 - 1]))


@FUZZ
@given(version=st.one_of(st.just(1), st.integers(0, 2**16 - 1)), flags=st.integers(0, 2**16 - 1),
       mlen=st.one_of(st.none(), sizes.filter(lambda n: n < 2**32)), plen=st.one_of(st.none(), sizes),
       manifest=st.binary(max_size=200), payload=st.binary(max_size=200), tail=st.binary(max_size=40))
def test_random_headers(version: int, flags: int, mlen: int | None, plen: int | None,
                        manifest: bytes, payload: bytes, tail: bytes, workdir: str) -> None:
    data = container(manifest, payload, version=version, flags=flags, mlen=mlen, plen=plen, tail=tail)
    read_everything(data, workdir)


# -- manifests with correct checksums: the JSON parser and the schema checks ------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
manifests = st.one_of(
    st.dictionaries(st.sampled_from(["format", "graph", "payload", "shards", "x"]), json_values, max_size=5),
    st.fixed_dictionaries({"format": json_values}),
    json_values,
)


@FUZZ
@given(manifest=manifests, payload=st.binary(max_size=64))
def test_arbitrary_json_manifests(manifest: Any, payload: bytes, workdir: str) -> None:
    read_everything(container(json.dumps(manifest).encode(), payload), workdir)


@FUZZ
@given(text=st.one_of(st.binary(max_size=300), st.text(max_size=100).map(str.encode)))
def test_arbitrary_manifest_bytes(text: bytes, workdir: str) -> None:
    read_everything(container(text), workdir)


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
def test_deeply_nested_manifest(depth: int, workdir: str) -> None:
    """A recursion bomb in the manifest is a CorruptSnapshotError, not a RecursionError."""
    body = b'{"format": 1, "x": ' + b"[" * depth + b"]" * depth + b"}"
    data = container(body)
    read_everything(data, workdir)
    if depth > 10_000:
        with pytest.raises(snapshot.CorruptSnapshotError, match="manifest"):
            fmt.unpack(data)


def test_a_boolean_is_not_a_format_version() -> None:
    with pytest.raises(snapshot.CorruptSnapshotError, match="'format'"):
        fmt.unpack(container(b'{"format": true}'))


# -- mutations of a valid file -------------------------------------------------------------

edits = st.lists(
    st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0, len(VALID) - 1),
              st.integers(0, 255)),
    min_size=1, max_size=4,
)


def apply(data: bytes, changes: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, offset, value in changes:
        offset %= max(len(out), 1)
        if kind == "flip":
            out[offset] ^= 1 << (value % 8)
        elif kind == "set":
            out[offset] = value
        elif kind == "insert":
            out[offset:offset] = bytes([value])
        elif out:
            del out[offset]
    return bytes(out)


@FUZZ
@given(changes=edits, key=st.sampled_from([None, "fuzz-key"]), signed=st.booleans())
def test_mutated_files(changes: list[tuple[str, int, int]], key: str | None, signed: bool, workdir: str) -> None:
    original = SIGNED if signed else VALID
    data = apply(original, changes)
    read_everything(data, workdir, key=key)
    if data != original:
        # any change is caught by the reader that needs the payload (checksums or signature)
        with pytest.raises(snapshot.SnapshotError):
            fmt.unpack(data, key="fuzz-key" if signed else None)


def parts(data: bytes) -> tuple[bytes, bytes]:
    """The manifest and the payload of a format-2 file (the payload first, after the header)."""
    mlen, plen = struct.unpack_from("<IQ", data, MLEN_AT)
    start = len(fmt.MAGIC) + struct.calcsize("<HHIQ32s32s")
    return data[start + plen:start + plen + mlen], data[start:start + plen]


MANIFEST, PAYLOAD = parts(VALID)


@FUZZ
@given(changes=st.lists(
    st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0, len(MANIFEST) - 1),
              st.sampled_from(b'{}[]",:0 1-e.\\nu\xff')),
    min_size=1, max_size=6))
def test_mutated_manifests_with_correct_checksums(changes: list[tuple[str, int, int]], workdir: str) -> None:
    """What a forger (or a buggy writer) can produce: damaged JSON that passes the checksums."""
    read_everything(container(apply(MANIFEST, changes), PAYLOAD), workdir)


@FUZZ
@given(keep=st.integers(0, len(VALID) - 1))
def test_truncations(keep: int, workdir: str) -> None:
    read_everything(VALID[:keep], workdir)
    with pytest.raises(snapshot.SnapshotFileError):
        fmt.unpack(VALID[:keep])


@FUZZ
@given(field=st.sampled_from([(MLEN_AT, "<I"), (PLEN_AT, "<Q")]),
       value=st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([2**60, 2**64 - 1])))
def test_lying_sizes_in_a_valid_header(field: tuple[int, str], value: int, workdir: str) -> None:
    offset, code = field
    if code == "<I" and value >= 2**32:
        value = 2**32 - 1
    data = bytearray(VALID)
    struct.pack_into(code, data, offset, value)
    read_everything(bytes(data), workdir)


def test_a_header_declaring_an_enormous_payload_is_refused_without_allocating(workdir: str) -> None:
    data = bytearray(VALID)
    struct.pack_into("<Q", data, PLEN_AT, 2**60)
    path = os.path.join(workdir, "huge.snap")
    with open(path, "wb") as f:
        f.write(data)
    for read in (lambda: fmt.unpack(bytes(data)), lambda: _sources.read_manifest(path)):
        tracemalloc.start()
        try:
            with pytest.raises(snapshot.TruncatedSnapshotError, match="declares"):
                read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * len(data) + MEMORY_SLACK


# -- the state-dict form and the parts of a distributed snapshot ------------------------------

manifest_texts = st.one_of(manifests.map(json.dumps), st.text(max_size=60), st.just('{"format": 1, "payload": 5}'))


@FUZZ
@given(manifest=st.one_of(manifest_texts, manifests,
                          st.dictionaries(st.text(max_size=5), st.binary(max_size=4), max_size=3)),
       payload=st.one_of(st.binary(max_size=32), st.none(), st.integers()),
       marker=st.one_of(st.just(1), json_values))
def test_state_dicts(manifest: Any, payload: Any, marker: Any) -> None:
    state = {"snapshot_format": marker, "manifest": manifest, "payload": payload}
    result = bounded(b"x" * 4096, lambda: _dict_form.from_state_dict(state))
    if isinstance(result, fmt.Container):
        assert result.manifest["format"] == fmt.FORMAT_VERSION


@FUZZ
@given(payload=st.binary(max_size=300), parts=st.lists(st.binary(max_size=40), max_size=4))
def test_parts_of_a_distributed_payload(payload: bytes, parts: list[bytes]) -> None:
    assert multipart.split_parts(multipart.join_parts(parts)) == parts
    for data in (payload, multipart.join_parts(parts)[:-1] if parts else payload,
                 struct.pack("<Q", 2**60) + payload):
        result = bounded(data, lambda data=data: multipart.split_parts(data))
        if isinstance(result, list):
            assert sum(len(p) + 8 for p in result) == len(data)


# -- the command line's reading of a manifest -------------------------------------------------

def render_everything(manifest: Any) -> None:
    """What ``inspect``, ``diff`` and ``graph`` do with a manifest; only a SnapshotError may escape."""
    from snapshot.cli import _diff, _dot, _inspect, _view

    try:
        view = _view.read_view(manifest, "fuzz.snap")
    except snapshot.SnapshotError:
        return
    assert isinstance(_inspect.render(view), str)
    assert _dot.to_dot(view).startswith("digraph")
    assert _diff.compare(view, view) == []
    other = _view.read_view(json.loads(MANIFEST), "valid.snap")
    assert isinstance(_diff.render(view, other, _diff.compare(view, other)), str)


def valid_manifest() -> dict[str, Any]:
    return json.loads(MANIFEST)


paths = st.sampled_from(["0", "0/datapipe", "0/datapipe/datapipe", "x", ""])
anything = st.one_of(json_values, paths)


@FUZZ
@given(edits=st.lists(st.tuples(
    st.sampled_from(["loader", "randomness", "graph", "service", "shards", "upstream", "payload", "verify",
                     "versions", "created", "_file"]),
    st.lists(st.one_of(st.sampled_from(["nodes", "inputs", "args", "plan", "drivers", "reasons", "yielded",
                                        "buffered", "restore", "state_bytes", "path", "type", "node_seeds",
                                        "seed", "parts", "size", "epoch", "routers", "queued", "position",
                                        "0", "0/datapipe"]),
                       st.integers(0, 3)), max_size=3),
    anything), min_size=1, max_size=4))
def test_the_cli_renders_any_manifest_or_refuses_it(edits: list[tuple[str, list[Any], Any]]) -> None:
    manifest = valid_manifest()
    for top, route, value in edits:
        target: Any = manifest
        key: Any = top
        for step in route:  # walk as far as the route exists, then replace what is there
            inner = target.get(key) if isinstance(target, dict) else (
                target[key] if isinstance(target, list) and isinstance(key, int) and key < len(target) else None)
            if not isinstance(inner, (dict, list)):
                break
            if isinstance(inner, list) and not isinstance(step, int):
                step = 0
            if isinstance(inner, list) and step >= len(inner):
                break
            if isinstance(inner, dict) and step not in inner and isinstance(step, int):
                break
            target, key = inner, step
        if isinstance(target, dict) or (isinstance(target, list) and isinstance(key, int) and key < len(target)):
            target[key] = value
    render_everything(manifest)


@FUZZ
@given(manifest=manifests)
def test_the_cli_renders_arbitrary_json(manifest: Any) -> None:
    if isinstance(manifest, dict):
        render_everything(manifest)
