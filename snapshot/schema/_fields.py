"""The schema's vocabulary: its constants, and the readers that check one JSON value each
(type, range, choices) and name the field path of what is wrong."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from snapshot._version import DISTRIBUTION, __version__
from snapshot.errors import ManifestError, VersionSkewError

#: The version of the container and of this schema; written as the manifest's ``format``.
FORMAT_VERSION = 3
#: Which release of ``snapshot`` reads each format version (this one reads every version up to its own:
#: format 1's payload is a pickle, which a restore unpickles only with trust).
READERS = {1: "snapshot 0.1 and later", 2: "snapshot 0.2 and later", 3: "snapshot 0.3 and later"}

RESTORE_METHODS = ("state", "replay")
#: The reading services whose state is cut into logical shards (``layout.logical_shards``).
SHARDED_SERVICES = frozenset({"InProcessReadingService", "MultiProcessingReadingService",
                              "DistributedReadingService"})
SEED_SOURCES = ("user", "drawn")
#: ``DistributedReadingService(even_batches=...)``: the policies a layout may name (``None``: unequal ranks).
EVEN_BATCHES = ("drop", "pad", None)
#: Counts, sizes and indices are int64 (as torch's); seeds are uint64.
MAX_COUNT = 2**63 - 1
UINT64_LIMIT = 2**64
#: In a payload's shard record: the loader took the shard's last sample / its graph produced it.
SHARD_FINISHED, SHARD_PRODUCED_ALL = "finished", "exhausted"
_PART_NAME = re.compile(r"rank-(\d{5})\.snap")
_SHA256 = re.compile(r"[0-9a-f]{64}")

T = TypeVar("T")


# -- checking one value -----------------------------------------------------------------------

def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(where: str, expected: str, value: Any) -> ManifestError:
    return ManifestError(where, expected, _show(value))


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, "a list", value)
    return value


def _int(value: Any, where: str, *, minimum: int | None = 0, maximum: int = MAX_COUNT) -> int:
    """An int in ``[minimum, maximum]`` (a count, a size or an index unless told otherwise)."""
    if type(value) is int and (minimum is None or value >= minimum) and value <= maximum:
        return value  # the common case, in one test (a bool or an int subclass takes the checks below)
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        expected = "a non-negative int" if minimum == 0 else "an int" if minimum is None else f"an int >= {minimum}"
        raise _fail(where, expected, value)
    if value > maximum:
        raise _fail(where, "an int below 2**63 (a count, size or index; no data set reaches this)"
                    if maximum == MAX_COUNT else f"an int <= {maximum}", value)
    return value


def _seed(value: Any, where: str) -> int:
    """A seed: a uint64, as ``DataLoader2.seed()`` takes."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < UINT64_LIMIT:
        raise _fail(where, "a seed, an int in [0, 2**64)", value)
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, "a string", value)
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "true or false", value)
    return value


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices or not isinstance(value, str):
        raise _fail(where, "one of " + ", ".join(repr(c) for c in choices), value)
    return value


def _sha256(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise _fail(where, "a sha256 digest (64 lowercase hex digits)", value)
    return value


def _optional(read: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    def optional(value: Any, where: str) -> T | None:
        return None if value is None else read(value, where)
    return optional


def _texts(value: Any, where: str) -> dict[str, str]:
    """An object of strings (a number or a boolean is accepted and kept as its text)."""
    out = {}
    for key, item in _object(value, where).items():
        if isinstance(item, (dict, list)) or item is None:
            raise _fail(f"{where}[{key!r}]", "a string", item)
        out[key] = item if isinstance(item, str) else str(item)
    return out


def _counts(value: Any, where: str) -> dict[str, int]:
    return {key: _int(item, f"{where}[{key!r}]") for key, item in _object(value, where).items()}


class _Fields:
    """The fields of one JSON object, read once each; what is left over is ``extra``."""

    __slots__ = ("where", "data", "seen", "_prefix")

    def __init__(self, value: Any, where: str):
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        self.where = where
        self.data: Mapping[str, Any] = value
        self.seen: set[str] = set()
        self._prefix = f"{where}." if where else ""  # a field's path is _prefix + key (see _key)

    def required(self, key: str, read: Callable[[Any, str], T]) -> T:
        self.seen.add(key)
        if key not in self.data:
            raise ManifestError(self._prefix + key, "a value (the field is missing)", "nothing")
        return read(self.data[key], self._prefix + key)

    def get(self, key: str, read: Callable[[Any, str], T], default: T) -> T:
        self.seen.add(key)
        value = self.data.get(key)
        return default if value is None else read(value, self._prefix + key)

    def extra(self) -> dict[str, Any]:
        if self.data.keys() <= self.seen:
            return {}
        return {key: value for key, value in self.data.items() if key not in self.seen}


def _records(value: Any, where: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
    return tuple([read(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where))])


def _items(read: Callable[[Any, str], T]) -> Callable[[Any, str], list[T]]:
    """A reader of a list whose items ``read`` reads."""
    return lambda value, where: list(_records(value, where, read))


def _by_path(value: Any, where: str, read: Callable[[Any, str], T]) -> dict[str, T]:
    return {path: read(item, f"{where}[{path!r}]") for path, item in _object(value, where).items()}


def check_format(version: Any, source: str) -> int:
    """``version`` if this installation reads it, else a :class:`VersionSkewError` saying what does."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise ManifestError("format", "an int (the 'format' version)", _show(version), source=source)
    if 1 <= version <= FORMAT_VERSION:
        return version
    reader = READERS.get(version)
    if version > FORMAT_VERSION or reader is None:
        newer = version > FORMAT_VERSION
        raise VersionSkewError(
            f"written in snapshot format {version}, which {'a newer release of' if newer else 'no release of'} "
            f"snapshot reads; this installation (snapshot {__version__}) reads formats 1 to {FORMAT_VERSION}"
            + (f". Upgrade with `pip install -U {DISTRIBUTION}` on this machine" if newer else
               ": the file is damaged or not one of ours"), source=source)
    raise VersionSkewError(
        f"written in snapshot format {version}, which {reader} read; this installation (snapshot "
        f"{__version__}) reads formats 1 to {FORMAT_VERSION}: load it with that release and save it again",
        source=source)
