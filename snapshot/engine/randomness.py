"""Seeds: one loader seed, and every seed derived from it, as plain data.

The loader seed drives a counter-based generator (Philox-4x32 with 10 rounds) that yields
64-bit seeds. It has two streams, as torchdata 0.9's ``SeedGenerator`` had: a *shared* stream
for pipes above the sharding point (identical on every worker and rank, so they see the same
order) and a *shard* stream for pipes below it. The draws happen in the same order as
torchdata 0.9 (breadth-first from the sink), so a graph run in-process with the same seed
yields the same samples as torchdata 0.9's ``DataLoader2`` with ``InProcessReadingService``.

With more than one logical shard, each shard's stream is spawned from one per-epoch draw,
so its seeds depend on the loader seed, the epoch and the shard index only, never on which
worker or rank runs the shard.

The generator state is a small JSON-able dict, so a snapshot records exactly where the
seed sequence stands and the next epoch after a restore gets the seeds it would have had.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from snapshot.engine.graph import Graph
from snapshot.engine.sharding import is_dispatcher
from snapshot.schema.state import SeedsState

__all__ = ["EpochSeeds", "PhiloxEngine", "SeedGenerator", "draw_seed", "epoch_seeds", "is_random", "pass_seed"]

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_MUL = (0xD2511F53, 0xCD9E8D57)
_WEYL = (0x9E3779B9, 0xBB67AE85)
UINT64_LIMIT = 2**64
_RNG_SALT = 0x5EED_0F_610BA1_5EED
_SUB_SALT = 0x5B_5EED_5B


def _philox(key: tuple[int, int], counter: list[int]) -> list[int]:
    """One Philox-4x32-10 block: four 32-bit words for ``counter`` under ``key``."""
    k0, k1 = key
    c0, c1, c2, c3 = counter
    for round_index in range(10):
        if round_index:
            k0 = (k0 + _WEYL[0]) & _M32
            k1 = (k1 + _WEYL[1]) & _M32
        p0 = _MUL[0] * c0
        p1 = _MUL[1] * c2
        c0, c1, c2, c3 = (
            (p1 >> 32) ^ c1 ^ k0,
            p1 & _M32,
            (p0 >> 32) ^ c3 ^ k1,
            p0 & _M32,
        )
    return [c0, c1, c2, c3]


def _split64(value: int) -> tuple[int, int]:
    return value & _M32, (value >> 32) & _M32


class PhiloxEngine:
    """A stream of 64-bit seeds from a 64-bit key (state: key, counter, one cached half)."""

    __slots__ = ("_key", "_counter", "_cached", "_spawn_key")

    def __init__(self, seed: int):
        self._key = _split64(seed & _M64)
        self._counter = [0, 0, 0, 0]
        self._cached: list[int] | None = None
        first = _philox(self._key, self._counter)
        self._spawn_key = (first[0], first[1])
        self._advance()

    def _advance(self) -> None:
        counter = self._counter
        for i in range(4):
            counter[i] = (counter[i] + 1) & _M32
            if counter[i]:
                return

    def generate(self) -> int:
        """The next 64-bit seed. Each block gives two seeds."""
        if self._cached is None:
            block = _philox(self._key, self._counter)
            self._advance()
            self._cached = block[2:]
            low, high = block[0], block[1]
        else:
            low, high = self._cached
            self._cached = None
        return (high << 32) + low

    def spawn(self, index: int) -> PhiloxEngine:
        """An independent engine for sub-stream ``index`` (a worker or a logical shard)."""
        if index < 0:
            raise ValueError(f"spawn index must be >= 0, got {index}")
        half = index % 2
        base = index - half
        counter = [(base >> (32 * i)) & _M32 for i in range(4)]
        block = _philox(self._spawn_key, counter)
        low, high = block[2 * half], block[2 * half + 1]
        return PhiloxEngine((high << 32) + low)

    def clone(self) -> PhiloxEngine:
        return PhiloxEngine.from_state(self.state())

    def state(self) -> dict[str, Any]:
        return {
            "key": list(self._key),
            "counter": list(self._counter),
            "cached": None if self._cached is None else list(self._cached),
            "spawn_key": list(self._spawn_key),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PhiloxEngine:
        engine = cls.__new__(cls)
        engine._key = (int(state["key"][0]), int(state["key"][1]))
        engine._counter = [int(x) for x in state["counter"]]
        engine._cached = None if state["cached"] is None else [int(x) for x in state["cached"]]
        engine._spawn_key = (int(state["spawn_key"][0]), int(state["spawn_key"][1]))
        return engine


class SeedGenerator:
    """The loader's source of seeds: a shared stream and a shard stream.

    As torchdata 0.9's: ``SeedGenerator()`` (or ``seed=None``) draws its seed from torch's
    global generator, ``seed()`` starts both streams again from a new seed, ``spawn(i)`` gives
    the generator of worker or shard ``i`` (same shared stream, its own shard stream).
    """

    def __init__(self, seed: int | None = None, *,
                 _engines: tuple[PhiloxEngine, PhiloxEngine] | None = None):
        if _engines is not None:
            self.shared, self.shard = _engines
        else:
            self.seed(seed)

    def seed(self, seed: int | None = None) -> None:
        """Restart both streams from ``seed`` (a uint64; ``None`` draws one from torch)."""
        if seed is None:
            seed = draw_seed()
        if not 0 <= seed < UINT64_LIMIT:
            raise ValueError(f"Expected an uint64 seed, but got {seed}.")
        self.shared, self.shard = PhiloxEngine(seed), PhiloxEngine(seed)

    def generate_shared_seed(self) -> int:
        return self.shared.generate()

    def generate_seed(self) -> int:
        return self.shard.generate()

    def spawn(self, worker_id: int, inplace: bool = False) -> SeedGenerator:
        """The generator of worker (or shard) ``worker_id``; ``inplace=True`` turns this one into it."""
        if worker_id < 0:
            raise ValueError(f"Expected `worker_id` equal or larger than 0, but got {worker_id}.")
        if inplace:
            self.shard = self.shard.spawn(worker_id)
            return self
        return SeedGenerator(_engines=(self.shared.clone(), self.shard.spawn(worker_id)))

    def clone(self) -> SeedGenerator:
        return SeedGenerator(_engines=(self.shared.clone(), self.shard.clone()))

    def state(self) -> dict[str, Any]:
        return {"shared": self.shared.state(), "shard": self.shard.state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (what :meth:`state` returned, here or on another rank)."""
        self.shared = PhiloxEngine.from_state(state["shared"])
        self.shard = PhiloxEngine.from_state(state["shard"])

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SeedGenerator:
        return cls(_engines=(PhiloxEngine.from_state(state["shared"]),
                                PhiloxEngine.from_state(state["shard"])))


def draw_seed() -> int:
    """A seed from torch's global generator, without advancing it (as torchdata 0.9 did)."""
    with torch.random.fork_rng(devices=[]):
        info = torch.iinfo(torch.int64)
        return int(torch.randint(info.min, info.max, ()).item()) + 2**63


def is_random(datapipe: Any) -> bool:
    """A pipe takes a seed when it has a bound ``set_seed`` method."""
    return inspect.ismethod(getattr(datapipe, "set_seed", None))


def _is_sharding_point(datapipe: Any) -> bool:
    return inspect.ismethod(getattr(datapipe, "apply_sharding", None)) or is_dispatcher(datapipe)


@dataclass
class EpochSeeds:
    """The seeds of one epoch: per node path, above the sharding point and per logical shard."""

    shared: dict[str, int] = field(default_factory=dict)
    shards: list[dict[str, int]] = field(default_factory=list)
    #: Per logical shard, the seed of its own ``random``/``numpy``/``torch`` generator states.
    rng: list[int] = field(default_factory=list)

    def for_shard(self, shard: int) -> dict[str, int]:
        """The seeds of unit ``shard``: a logical shard, or a sub-shard ``s + k L`` of logical shard
        ``s`` (its seeds derived from shard ``s``'s and ``k``, so they depend on neither the ranks
        nor the workers that run it)."""
        seeds = dict(self.shared)
        count = len(self.shards)
        if shard < count:
            seeds.update(self.shards[shard])
        else:
            seeds.update({p: _sub_seed(v, shard // count) for p, v in self.shards[shard % count].items()})
        return seeds

    def rng_seed(self, shard: int) -> int:
        """The seed of unit ``shard``'s own global generator states (see :meth:`for_shard`)."""
        count = len(self.rng)
        return self.rng[shard] if shard < count else _sub_seed(self.rng[shard % count], shard // count)

    def state(self) -> dict[str, Any]:
        return self.record().to_dict()

    def record(self) -> SeedsState:
        """These seeds as the service's saved record."""
        return SeedsState(dict(self.shared), [dict(s) for s in self.shards], list(self.rng))

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | SeedsState) -> EpochSeeds:
        record = state if isinstance(state, SeedsState) else SeedsState.from_dict(state)
        return cls(dict(record.shared), [dict(s) for s in record.shards], list(record.rng))


def _sub_seed(seed: int, sub: int) -> int:
    return PhiloxEngine(seed ^ _SUB_SALT).spawn(sub).generate()


def epoch_seeds(generator: SeedGenerator, graph: Graph, logical_shards: int = 1) -> EpochSeeds:
    """Draw this epoch's seeds for every random pipe of ``graph``; advances ``generator``.

    Pipes at or above a sharding point get shared seeds (every logical shard must see the
    same order there); pipes below it get per-shard seeds. The per-shard seeds of the global
    generators are derived from a copy of ``generator``, so they do not shift the sequence.
    """
    rng_key = PhiloxEngine(SeedGenerator.from_state(generator.state()).generate_shared_seed() ^ _RNG_SALT)
    sharding = [n.path for n in graph.nodes if _is_sharding_point(n.datapipe)]
    above: list[str] = []
    seen: set[str] = set()
    for path in sharding:
        for p in graph.bfs(path):
            if p not in seen:
                seen.add(p)
                above.append(p)
    below = graph.bfs(exclude=set(above))
    seeds = EpochSeeds(rng=[rng_key.spawn(shard).generate() for shard in range(logical_shards)])
    for path in above:
        if is_random(graph[path].datapipe):
            seeds.shared[path] = generator.generate_shared_seed()
    random_below = [p for p in below if is_random(graph[p].datapipe)]
    if logical_shards == 1:
        seeds.shards.append({p: generator.generate_seed() for p in random_below})
    else:
        base = SeedGenerator(generator.generate_seed())
        for shard in range(logical_shards):
            stream = base.spawn(shard)
            seeds.shards.append({p: stream.generate_seed() for p in random_below})
    return seeds



_PASS_SALT = 0x9A55_5EED_0F_9A55


def pass_seed(epoch_seed: int, key: Sequence[int]) -> int:
    """The seed of a random pipe's pass ``key`` within an epoch.

    A pipe iterated again within an epoch (by a ``cycle`` above it) starts a new pass each
    time; ``key`` names the pass: empty for the first, else the cycle counts of the pipes
    that started it again, outermost first. The first pass uses the epoch seed itself, every
    later one a seed derived from the epoch seed and the key alone, so it never depends on
    torch's global generator, on the worker that runs it, or on whether a snapshot was taken.
    """
    if not key:
        return epoch_seed
    engine = PhiloxEngine((epoch_seed & _M64) ^ _PASS_SALT)
    for index in key:
        engine = engine.spawn(int(index))
    return engine.generate()
