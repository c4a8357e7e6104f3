"""An epoch's seeds as saved (``randomness.EpochSeeds``): above the sharding point, per logical shard,
and the seeds of each shard's own generator states."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from snapshot.schema._fields import (
    REQUIRED,
    UINT64_LIMIT,
    Doubt,
    Quick,
    _Fields,
    _items,
    _object,
    _records,
    _seed,
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
