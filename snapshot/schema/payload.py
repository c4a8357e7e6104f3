"""The payload's record in the manifest: its size and digest, and its sections (the data encoding,
then the pickles of the values that are not data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from snapshot.errors import ManifestError
from snapshot.schema import _native
from snapshot.schema._fields import (
    _choice,
    _counts,
    _fail,
    _Fields,
    _int,
    _records,
    _sha256,
    _str,
)
from snapshot.schema._quick import (
    COUNT,
    REQUIRED,
    STR,
    Doubt,
    Quick,
    quick_choice,
    quick_counts,
    quick_records,
    quick_sha256,
)

#: How a payload encodes its state: ``pickle`` (format 1: one pickle, a restore runs code from the
#: file), ``data`` (format 2: the tagged encoding of :mod:`snapshot.container._codec_v2`, then a pickled
#: section) or ``msgpack`` (format 3: :mod:`snapshot.container._codec`'s, then a pickled section).
PAYLOAD_ENCODINGS = ("pickle", "data", "msgpack")


@dataclass(frozen=True)
class PickledValue:
    """A value of the state that is not data (a custom class in a buffer): where it sits in the state,
    its type, and the size of its pickle in the payload's pickled section. Restoring it needs trust."""

    at: str
    type: str
    size: int

    @classmethod
    def from_dict(cls, value: Any, where: str = "pickled") -> PickledValue:
        try:
            return _PICKLED(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(at=f.required("at", _str), type=f.required("type", _str), size=f.required("size", _int))

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "type": self.type, "size": self.size}


_PICKLED = Quick(PickledValue, (("at", STR, REQUIRED), ("type", STR, REQUIRED), ("size", COUNT, REQUIRED)))


@dataclass(frozen=True)
class PayloadRecord:
    """The payload's size and digest, the size of each part (``graph``, ``service``, ``state``), and
    (formats 2 and 3) its two sections: ``data`` bytes of data encoding, then the ``pickled`` values' pickles."""

    size: int
    sha256: str
    parts: dict[str, int] = field(default_factory=dict)
    encoding: str = "pickle"
    data: int | None = None
    pickled: tuple[PickledValue, ...] = ()

    @classmethod
    def from_dict(cls, value: Any, where: str = "payload") -> PayloadRecord:
        try:
            return quick_payload(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        record = cls(size=f.required("size", _int), sha256=f.required("sha256", _sha256),
                     parts=f.get("parts", _counts, {}),
                     encoding=f.get("encoding", lambda v, w: _choice(v, w, PAYLOAD_ENCODINGS), "pickle"),
                     data=f.get("data", _int, None),
                     pickled=f.get("pickled", lambda v, w: _records(v, w, PickledValue.from_dict), ()))
        return record._check(where)

    def _check(self, where: str) -> PayloadRecord:
        """The sections agree with the encoding and add up to the size."""
        record = self
        if record.encoding != "pickle" and record.size > 0:
            if record.data is None:
                raise _fail(f"{where}.data", f"the size of the data section (encoding is {record.encoding!r})", None)
            sections = record.data + sum(p.size for p in record.pickled)
            if sections != record.size:
                raise _fail(f"{where}.data", f"sections that add up to the payload's size {record.size}",
                            f"{record.data} of data and {sections - record.data} pickled")
        elif record.pickled:
            raise _fail(f"{where}.pickled", "nothing (a format-1 payload is one pickle)", "pickled values")
        return record

    @property
    def needs_trust(self) -> bool:
        """Whether restoring this payload's state unpickles something from the file."""
        return self.encoding == "pickle" and self.size > 0 or bool(self.pickled)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": self.size, "sha256": self.sha256}
        if self.parts:
            out["parts"] = dict(self.parts)
        if self.encoding != "pickle":
            out["encoding"] = self.encoding
            out["data"] = self.data
            out["pickled"] = [p.to_dict() for p in self.pickled]
        return out


_PAYLOAD = Quick(PayloadRecord, (("size", COUNT, REQUIRED), ("sha256", quick_sha256, REQUIRED),
                                 ("parts", quick_counts, dict), ("encoding", quick_choice(PAYLOAD_ENCODINGS), "pickle"),
                                 ("data", COUNT, None), ("pickled", quick_records(_PICKLED), ())))


def _checked_payload(record: PayloadRecord) -> PayloadRecord:
    try:
        return record._check("")
    except ManifestError:
        raise Doubt from None


def quick_payload(value: Any) -> PayloadRecord:
    return _checked_payload(_PAYLOAD(value))


_native.register(quick_payload, _PAYLOAD, _checked_payload)
