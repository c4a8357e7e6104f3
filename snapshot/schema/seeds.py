"""The randomness as saved: an epoch's seeds (``randomness.EpochSeeds``: above the sharding point, per
logical shard, and the seeds of each shard's own generator states) and the loader's seed generator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from snapshot.schema._fields import (
    UINT64_LIMIT,
    _fail,
    _Fields,
    _int,
    _items,
    _list,
    _object,
    _records,
    _seed,
)
from snapshot.schema._quick import (
    REQUIRED,
    Doubt,
    Quick,
    quick_records,
    quick_seed,
)


def _seeds_by_path(value: Any, where: str) -> dict[str, int]:
    return {str(path): _seed(seed, f"{where}[{path!r}]") for path, seed in _object(value, where).items()}


@dataclass
class SeedsState:
    """An epoch's seeds (``randomness.EpochSeeds``): above the sharding point, per logical shard, and
    the seeds of each shard's own generator states."""

    VERSION: ClassVar[int] = 1

    shared: dict[str, int] = field(default_factory=dict)
    shards: list[dict[str, int]] = field(default_factory=list)
    rng: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, value: Any, where: str = "seeds") -> SeedsState:
        try:
            return quick_seeds(value)
        except Doubt:
            pass
        f = _Fields(value, where)
        return cls(shared=f.required("shared", _seeds_by_path),
                   shards=list(f.required("shards", lambda v, w: _records(v, w, _seeds_by_path))),
                   rng=f.get("rng", _items(_seed), []))

    def to_dict(self) -> dict[str, Any]:
        return {"shared": dict(self.shared), "shards": [dict(s) for s in self.shards], "rng": list(self.rng)}


def _quick_seeds_by_path(value: Any) -> dict[str, int]:
    """``_seeds_by_path`` of an object whose keys are strings already."""
    if type(value) is not dict:
        raise Doubt
    for path, seed in value.items():
        if type(path) is not str or type(seed) is not int or not 0 <= seed < UINT64_LIMIT:
            raise Doubt
    return dict(value)


#: The quick reader of :class:`SeedsState` (Doubt: read it with ``from_dict``).
quick_seeds = Quick(SeedsState, (("shared", _quick_seeds_by_path, REQUIRED),
                                 ("shards", quick_records(_quick_seeds_by_path, list), REQUIRED),
                                 ("rng", quick_records(quick_seed, list), list)))


def _generator(value: Any, where: str) -> dict[str, Any]:
    """The loader's seed generator (``snapshot.randomness.SeedGenerator.state()``): two Philox streams."""
    f = _Fields(value, where)
    return {"shared": f.required("shared", _philox), "shard": f.required("shard", _philox)}


def _words(value: Any, where: str, count: int) -> list[int]:
    words = _list(value, where)
    if len(words) != count:
        raise _fail(where, f"{count} 32-bit words", value)
    return [_int(word, f"{where}[{i}]", maximum=2**32 - 1) for i, word in enumerate(words)]


def _words_of(count: int) -> Callable[[Any, str], list[int]]:
    return lambda v, w: _words(v, w, count)


def _philox(value: Any, where: str) -> dict[str, Any]:
    f = _Fields(value, where)
    return {"key": f.required("key", _words_of(2)), "counter": f.required("counter", _words_of(4)),
            "cached": f.get("cached", _words_of(2), None), "spawn_key": f.required("spawn_key", _words_of(2))}


def _quick_philox(value: Any) -> dict[str, Any]:
    """``_philox`` of a stream whose words are plain ints (each list checked in one pass, no call per list)."""
    if type(value) is not dict:
        raise Doubt
    out = {"key": value.get("key"), "counter": value.get("counter"), "cached": value.get("cached"),
           "spawn_key": value.get("spawn_key")}
    for name, count in _PHILOX_WORDS:
        words = out[name]
        if words is None and name == "cached":
            continue
        if type(words) is not list or len(words) != count:
            raise Doubt
        for word in words:
            if type(word) is not int or not 0 <= word < 2**32:
                raise Doubt
        out[name] = list(words)
    return out


_PHILOX_WORDS = (("key", 2), ("counter", 4), ("cached", 2), ("spawn_key", 2))


def _quick_generator(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise Doubt
    return {"shared": _quick_philox(value.get("shared")), "shard": _quick_philox(value.get("shard"))}
