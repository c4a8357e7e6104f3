"""The dispatching side of ``sharding_round_robin_dispatch`` when the shards run in workers.

The part of the graph above a dispatcher is non-replicable: it runs once, here in the
process that drives the workers, and its samples are dealt to the logical shards by index
(sample i to shard i % L, as a ``sharding_filter`` would). A worker asks for a shard's next
samples when it has none left (see :class:`~snapshot.reading_service._shards.routing.RemoteRouter`),
and says how many that shard has read so far.

A snapshot of this part holds its node states, the dealing position, and per shard the
samples dealt but not yet read by the shard as the workers' own states count them: those
sent to a worker after it reported its state, and those not sent yet. So it restores onto
any number of workers, or in-process. With ``GlobalRNG.ISOLATE`` the part draws from
``random``/``numpy``/``torch`` generator states of its own (saved too), not the caller's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from snapshot.engine.execution import Run, capture_persistent
from snapshot.engine.graph import Graph
from snapshot.engine.plan import RestoreStrategy
from snapshot.engine.randomness import EpochSeeds
from snapshot.engine.sharding import Topology
from snapshot.errors import ExecutionError
from snapshot.reading_service._rng import GlobalRNG, plain_rng, raw_from_plain, raw_rng, seeded_rng, set_raw_rng
from snapshot.reading_service._shards.engine import restore_plans, start_upstream
from snapshot.reading_service._shards.recombine import parts, recombine
from snapshot.reading_service._shards.routing import Router
from snapshot.schema import ServiceState, ShardState, UpstreamState

__all__ = ["DispatchFailed", "Dispatcher"]

_RNG_SALT = 0x5EED_D15A_7C4E  # the part's generators are seeded apart from logical shard 0's


class Dispatcher:
    """Runs the part above the dispatchers of ``topology`` for ``shards`` of ``count``."""

    def __init__(self, graph: Graph, topology: Topology, count: int, shards: Sequence[int], *, chunk: int = 8,
                 global_rng: GlobalRNG = GlobalRNG.ISOLATE):
        self.graph = graph
        self.isolate = GlobalRNG(global_rng) is GlobalRNG.ISOLATE
        self._rng: Any = None
        self.topology = topology
        self.count = count
        self.shards = list(shards)
        self.chunk = max(1, chunk)
        self._run: Run | None = None
        self._routers: dict[str, Router] = {}
        self._sent: dict[tuple[str, int], deque[tuple[int, Any]]] = {}
        self._holding = False
        self.failure: tuple[BaseException, str] | None = None

    def start(self, seeds: EpochSeeds, state: ServiceState | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO) -> None:
        """Start the epoch, or put this part back where the saved service ``state`` was."""
        self.close()
        saved = None
        replayed: set[int] = set()
        if state is not None:
            mine = recombine(state.upstream, state.shards, self.shards, parts(self.topology, filters=False))
            saved = mine.upstream
            records = {s: r for s, r in mine.shards.items() if r is not None}
            _, replayed = restore_plans({s: self.graph for s in self.shards}, self.topology, records, strategy)
        caller = raw_rng() if self.isolate else None
        try:  # a replay while restoring must not draw from the caller's generators either
            self._run, self._routers = start_upstream(self.graph, self.topology.dispatchers, self.topology.dispatched,
                                                      self.count, self.shards, seeds, saved, replayed, strategy)
        finally:
            if caller is not None:
                set_raw_rng(caller)
        if self.isolate:  # the part's own random/numpy/torch generator states, saved in snapshots
            plain = saved.rng if saved is not None else None
            self._rng = raw_from_plain(plain) if plain else seeded_rng(seeds.rng[0] ^ _RNG_SALT)
        self._sent = {(r, s): deque() for r in self._routers for s in self.shards}
        self._holding = False
        self.failure = None

    def feed(self, router: str, shard: int, read: int) -> tuple[list[Any], bool]:
        """The next samples of ``shard`` from ``router``, and whether the shard ends after them.

        The worker asks only once it has read everything sent before (``read`` samples), so
        the record of what was sent starts over (unless a snapshot is being composed, which
        still needs it).
        """
        source = self._routers[router]
        limit = self.chunk
        if self.failure is not None:  # the samples dealt before the failure still go out, in order
            limit = min(limit, len(source.queues[shard]))
            if not limit:
                raise DispatchFailed(self.failure[1])
        sent = self._sent[(router, shard)]
        if not self._holding:
            sent.clear()
        items: list[Any] = []
        ended = False
        caller = None
        if self.isolate:
            caller = raw_rng()
            set_raw_rng(self._rng)
        try:
            while len(items) < limit:
                item = source.next_for(shard)
                index = source.next_index[shard] - self.count
                if not items and index != shard + read * self.count:
                    raise ExecutionError(
                        f"logical shard {shard} has read {read} samples from the dispatcher at {router}, but its "
                        f"next sample would be sample {index} of the dispatched stream (expected "
                        f"{shard + read * self.count}): the loader stopped rather than yield a wrong stream. "
                        "Please report this with the snapshot you restored from, if any.")
                sent.append((index, item))
                items.append(item)
        except StopIteration:
            ended = True
        except ExecutionError:
            raise
        except Exception as exc:  # kept, to raise in order when the loader reaches it
            node = getattr(exc, "_snapshot_node", None) or self.graph[router].inputs[0]
            self.failure = (exc, node)
            if not items:
                raise DispatchFailed(node) from exc
        finally:
            if caller is not None:
                self._rng = raw_rng()
                set_raw_rng(caller)
        return items, ended

    def hold(self) -> None:
        """A snapshot is being taken: keep every sent sample until :meth:`capture`."""
        self._holding = True

    def capture(self, read: Mapping[int, ShardState | None]) -> UpstreamState:
        """This part's state, given each shard's saved record (how much it read from each router)."""
        assert self._run is not None
        routers = {}
        for path, router in self._routers.items():
            state = router.state()
            for shard in self.shards:
                record = read.get(shard)
                if record is None or record.graph_exhausted:
                    continue
                start = shard + self.count * record.read_from(path)
                unread = [[i, x] for i, x in self._sent[(path, shard)] if i >= start]
                state.queues[shard] = unread + state.queues[shard]
                state.next[shard] = start
            routers[path] = state
        self._holding = False
        persistent = {p: s for p, s in capture_persistent(self.graph).items() if p in self.topology.dispatched}
        return UpstreamState(shards=list(self.shards), nodes=self._run.capture(), routers=routers,
                             persistent=persistent, rng=plain_rng(self._rng) if self.isolate else None)

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
        self._run, self._routers = None, {}


class DispatchFailed(Exception):
    """The part above a dispatcher raised; the loader raises the original when it gets there."""
