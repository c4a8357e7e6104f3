"""A snapshot's payload: the state as data, then what is not data, pickled apart.

The payload (formats 2 and 3) has two sections:

- the *data section*: one value encoded by :mod:`snapshot.container._codec` (format 3: msgpack, arrays
  and tensors out of band after its tree; format 2's own encoding is still read, by
  :mod:`snapshot.container._codec_v2`),
  ``{"state": <the loader's state>, "graph": <bytes or None>, "service": <bytes or None>}``.
  Positions, seeds, node states and buffered samples decode as data (JSON-like values, bytes,
  tensors, numpy arrays): nothing named in the file is imported or called. The graph and the
  reading service are dill/pickle bytes inside it, unpickled only by ``from_snapshot``;
- the *pickled section*: one pickle per value the codec cannot encode (a custom class in a
  buffer), in the order the data section refers to them. The manifest lists each one (where it
  sits, its type, its size), so ``snapshot inspect`` shows what needs trust; decoding them needs
  it (a key the file is signed with, or ``allow_pickle=True``).

Format 1's payload is one pickle of the same dict, each node state pickled again inside it:
reading it is unpickling, so it needs trust too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from snapshot import schema
from snapshot.container import _codec, _codec_v2, _serialization
from snapshot.errors import CorruptSnapshotError, ManifestError, UntrustedStateError

__all__ = ["ENCODING", "TRUST_HINT", "read", "read_data", "write"]

#: The manifest's ``payload.encoding`` of what :func:`write` writes.
ENCODING = "msgpack"

#: How to proceed when a payload needs trust (the end of every such error).
TRUST_HINT = ("If you trust the file, pass allow_pickle=True to restore_snapshot() (which also takes a state dict) "
              "or snapshot.load(), or save with a key (save_snapshot(key=...) or $SNAPSHOT_KEY) and restore with "
              "the same key")

_NODE = re.compile(r"\.(shards|upstream)\[(\d+)\]\.nodes\[(?P<q>['\"])(?P<path>.+?)(?P=q)\](?P<rest>.*)")


def write(body: dict[str, Any], sink: Callable[[Any], Any],
          measure: dict[int, tuple[Any, ...]] | None = None) -> tuple[dict[str, Any], dict[Any, int]]:
    """Encode ``body`` into ``sink``: the data section, then the pickled section.

    Returns the manifest's record of the two sections (``encoding``, ``data``, ``pickled``), and
    the encoded size of each value ``measure`` labels (see ``Encoder``), by label.
    """
    encoder = _codec.Encoder(sink, measure)
    encoder.encode(body, "payload")
    data = encoder.written
    pickled = []
    for where, value in encoder.pickled:
        blob = _serialization.dumps(value, what=f"{describe(where)}, which is not data (it is saved pickled)")
        sink(blob)
        kind = type(value)
        pickled.append({"at": where, "type": f"{kind.__module__}.{kind.__qualname__}", "size": len(blob)})
    return {"encoding": ENCODING, "data": data, "pickled": pickled}, encoder.sizes


def describe(where: str) -> str:
    """``payload.state.service.shards[0].nodes['0/datapipe'].state[3]`` said for a person: which DataPipe
    holds the value, in which logical shard (or copy of the graph above the sharding point)."""
    found = _NODE.search(where)
    if found is None:
        flight = re.search(r"\.shards\[(\d+)\]\.in_flight\[", where)
        if flight is not None:
            return f"the samples in flight from logical shard {flight[1]}: {where}"
        return f"the samples computed ahead: {where}" if ".lookahead[" in where else where
    part = "state" if found["rest"].startswith(".state") else "record"
    place = (f"logical shard {found[2]}" if found[1] == "shards"
             else f"above the sharding point, copy {found[2]}")
    return f"the {part} of the DataPipe at {found['path']} ({place}): {where}"


def untrusted(record: schema.PayloadRecord, source: str) -> UntrustedStateError:
    """The error for a payload that needs trust, naming every value that does and how to proceed."""
    if record.encoding == "pickle":
        return UntrustedStateError(
            "this snapshot is in format 1, whose payload is one pickle: restoring it runs code from the file, "
            f"and nothing here vouches for it. {TRUST_HINT}; then save it again to get format 2, which "
            "restores as data", source=source)
    groups: dict[tuple[str, str], list[str]] = {}
    for value in record.pickled:
        holder, _, at = describe(value.at).rpartition(": ")
        groups.setdefault((holder or "the state", value.type), []).append(at)
    shown = "; ".join(f"{holder}: {len(ats)} x {kind} (first at {ats[0]})"
                      for (holder, kind), ats in list(groups.items())[:4])
    more = f"; and {len(groups) - 4} more places" if len(groups) > 4 else ""
    return UntrustedStateError(
        f"the snapshot's state holds {len(record.pickled)} value(s) that are not data and were saved pickled: "
        f"{shown}{more}. Restoring them runs code from the file. {TRUST_HINT}; or make those values data "
        "(JSON-like values, bytes, tensors, numpy arrays) before the pipe that buffers them", source=source)


def read(payload: bytes | memoryview, record: schema.PayloadRecord, *, trusted: bool, source: str) -> dict[str, Any]:
    """The payload's body (``state``, ``graph``, ``service``), decoded; refused before anything is decoded
    when it needs trust that the caller does not give."""
    if record.needs_trust and not trusted:
        raise untrusted(record, source)
    if record.encoding == "pickle":
        body = _serialization.loads(bytes(payload), what=f"snapshot payload of {source}")
        if not isinstance(body, dict) or not isinstance(body.get("state"), dict):
            raise CorruptSnapshotError("the payload does not hold a snapshot state", source=source)
        service = body["state"].get("service")
        if service:
            body["state"]["service"] = _serialization.decode_nodes(service)
        return body
    assert record.data is not None
    view = memoryview(payload)
    offsets = [record.data]
    for value in record.pickled:
        offsets.append(offsets[-1] + value.size)

    def unpickle(index: int, where: str | None = None) -> Any:
        if index >= len(record.pickled):
            raise CorruptSnapshotError(f"the data section refers to pickled value {index}, but the manifest lists "
                                       f"{len(record.pickled)}", source=source)
        if not trusted:  # pragma: no cover - refused above, from the manifest
            raise untrusted(record, source)
        return _serialization.loads(bytes(view[offsets[index]:offsets[index + 1]]),
                                    what=f"value at {record.pickled[index].at}")

    if record.encoding == "data":
        body = _codec_v2.decode(view[:record.data], pickled=unpickle, source=source)
    else:
        body = _codec.decode(view[:record.data], pickled=unpickle, source=source)
    return _checked(body, source)


def read_data(reader: _codec.Reader, record: schema.PayloadRecord, *, source: str) -> dict[str, Any]:
    """The body of a format-3 payload with no pickled values, decoded from ``reader`` as it is read (the
    bytes of its arrays read into the arrays): the payload is never held whole. The caller checks the
    payload's digest before it uses the body."""
    assert record.encoding == ENCODING and not record.pickled and record.data is not None

    def unlisted(index: int) -> Any:
        raise CorruptSnapshotError(f"the data section refers to pickled value {index}, but the manifest lists none",
                                   source=source)

    decoder = _codec.Decoder(reader, limit=record.data, pickled=unlisted, name=source)
    body = decoder.next()
    if decoder.position != record.data:
        raise CorruptSnapshotError(f"the data section holds {record.data - decoder.position} bytes after its value",
                                   source=source, offset=decoder.position)
    return _checked(body, source)


def _checked(body: Any, source: str) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("state"), dict):
        raise CorruptSnapshotError("the payload does not hold a snapshot state", source=source)
    for part in ("graph", "service"):
        if not isinstance(body.get(part), (bytes, type(None))):
            raise ManifestError(f"payload.{part}", "pickled bytes or None", type(body[part]).__name__, source=source)
    return body
