"""Running logical shards: the engine every reading service shares.

A :class:`ShardEngine` runs the logical shards one process owns: one copy of the part of
the graph above the sharding point (with a :class:`Router` per ``sharding_filter`` dealing
its samples to shards by index) and one copy of the part below it per owned shard. It knows
nothing of processes: the in-process service runs one engine for all shards, each worker
runs one for its own.

:class:`RoundRobin` merges the shards into the loader's stream in a fixed order (0, 1, ...,
L-1, 0, ..., skipping exhausted shards), so the stream depends on the seed and L only.

:func:`recombine` turns the engine states saved from one layout (W workers) into the
state an engine owning another set of shards needs: the router queues of the old owners are
merged onto the most-behind copy of the part above the sharding point.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from snapshot.errors import LayoutError
from snapshot.execution import Run, capture_persistent, restore_persistent, rewind
from snapshot.graph import Graph
from snapshot.plan import RestoreStrategy, make_plan
from snapshot.randomness import EpochSeeds
from snapshot.sharding import Topology, WorkerInfo

try:
    import numpy
except ImportError:  # pragma: no cover - numpy is optional
    numpy = None  # type: ignore[assignment]

__all__ = ["GlobalRNG", "RemoteRouter", "RoundRobin", "Router", "ShardEngine", "merge_state_for", "owners",
           "parts", "plain_rng", "raw_from_plain", "raw_rng", "recombine", "restore_plans", "seeded_rng",
           "service_state", "set_raw_rng", "start_upstream"]


class GlobalRNG(str, enum.Enum):
    """What code in the graph gets when it draws from ``random``, ``numpy`` or ``torch``.

    ``ISOLATE``: each logical shard has its own generator states, seeded from the loader seed
    and saved in snapshots, so such code is reproducible and restorable. ``SHARED``: graph
    code uses the process's generators (in-process: your training loop's), untouched.
    """

    ISOLATE = "isolate"
    SHARED = "shared"


class Router:
    """Deals the samples reaching a ``sharding_filter`` to logical shards: sample i to i % L.

    Only owned shards' samples are kept (queued by value until their shard reads them). A
    filter that was already configured by hand (``apply_sharding(n, k)`` before the loader
    saw it) keeps only its share first; the logical shards split that share.
    """

    def __init__(self, source: Iterator[Any], count: int, shards: Sequence[int],
                 state: Mapping[str, Any] | None = None, *, outer: tuple[int, int] = (1, 0)):
        self.source = source
        self.count = count
        self.outer = outer
        self.position = 0  # samples read from the source
        self.kept = 0  # samples of this filter's share so far (the index shards are dealt by)
        self.ended = False
        self.next_index = {s: s for s in shards}
        self.queues: dict[int, deque[tuple[int, Any]]] = {s: deque() for s in shards}
        if state is not None:
            self.position, self.kept, self.ended = int(state["position"]), int(state["kept"]), bool(state["ended"])
            self.next_index = {int(s): int(i) for s, i in state["next"].items()}
            self.queues = {int(s): deque((int(i), x) for i, x in q) for s, q in state["queues"].items()}

    def next_for(self, shard: int) -> Any:
        queue = self.queues[shard]
        outer_count, outer_id = self.outer
        while not queue:
            if self.ended:
                raise StopIteration
            try:
                item = next(self.source)
            except StopIteration:
                self.ended = True
                raise
            position = self.position
            self.position = position + 1
            if outer_count > 1 and position % outer_count != outer_id:
                continue
            index = self.kept
            self.kept = index + 1
            target = index % self.count
            wanted = self.queues.get(target)
            if wanted is not None and index >= self.next_index[target]:
                wanted.append((index, item))
        index, item = queue.popleft()
        self.next_index[shard] = index + self.count
        return item

    def state(self) -> dict[str, Any]:
        return {"position": self.position, "kept": self.kept, "ended": self.ended,
                "next": {s: i for s, i in self.next_index.items()},
                "queues": {s: [[i, x] for i, x in q] for s, q in self.queues.items()}}


def _outer(datapipe: Any) -> tuple[int, int]:
    """The share a ``sharding_filter`` was configured to keep by hand (a dispatcher keeps all)."""
    return int(getattr(datapipe, "num_of_instances", 1)), int(getattr(datapipe, "instance_id", 0))


class RouterPort(Iterator[Any]):
    """A shard's view of a router: the cell of the ``sharding_filter`` in the shard's copy."""

    __slots__ = ("router", "shard", "yielded", "exhausted", "path", "datapipe")

    def __init__(self, router: Router | RemoteRouter, shard: int, datapipe: Any):
        self.router = router
        self.shard = shard
        self.datapipe = datapipe
        self.yielded = 0
        self.exhausted = False
        self.path: str | None = None

    def __iter__(self) -> RouterPort:
        return self

    def __next__(self) -> Any:
        try:
            item = self.router.next_for(self.shard)
        except StopIteration:
            self.exhausted = True
            raise
        self.yielded += 1
        return item


#: How a worker gets a dispatcher's samples: ``fetch(dispatcher path, shard, samples received
#: so far)`` returns the next samples of that shard and whether the shard has ended there.
RemoteFetch = Callable[[str, int, int], tuple[list[Any], bool]]


class RemoteRouter:
    """A dispatcher whose upstream part runs in another process: a worker's side of it.

    Asks for a shard's samples only when it has none left, so a request also tells the
    dispatching process exactly how many the shard has read.
    """

    def __init__(self, path: str, fetch: RemoteFetch, shards: Sequence[int], received: Mapping[int, int]):
        self.path = path
        self.fetch = fetch
        self.received = {s: int(received.get(s, 0)) for s in shards}
        self.ended = {s: False for s in shards}
        self.queues: dict[int, deque[Any]] = {s: deque() for s in shards}

    def next_for(self, shard: int) -> Any:
        queue = self.queues[shard]
        if not queue:
            if self.ended[shard]:
                raise StopIteration
            items, ended = self.fetch(self.path, shard, self.received[shard])
            self.received[shard] += len(items)
            self.ended[shard] = ended
            queue.extend(items)
            if not queue:
                raise StopIteration
        return queue.popleft()


# Generator states are swapped as the generators' own objects (cheap: no copies into lists);
# they become plain data only when a snapshot is taken.
_RawRNG = tuple[Any, Any, Any]


def raw_rng() -> _RawRNG:
    return (random.getstate(), torch.get_rng_state(),
            numpy.random.get_state() if numpy is not None else None)


def set_raw_rng(raw: _RawRNG) -> None:
    random.setstate(raw[0])
    torch.set_rng_state(raw[1])
    if numpy is not None and raw[2] is not None:
        numpy.random.set_state(raw[2])


def plain_rng(raw: _RawRNG) -> dict[str, Any]:
    """A raw state as plain data (lists, bytes) for a snapshot."""
    version, internal, gauss = raw[0]
    state: dict[str, Any] = {"random": [version, list(internal), gauss], "torch": raw[1].numpy().tobytes()}
    if raw[2] is not None:
        kind, keys, pos, has_gauss, cached = raw[2]
        state["numpy"] = [kind, list(map(int, keys)), pos, has_gauss, cached]
    return state


def raw_from_plain(state: Mapping[str, Any]) -> _RawRNG:
    version, internal, gauss = state["random"]
    numpy_state = None
    if numpy is not None and "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        numpy_state = (kind, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached)
    return ((version, tuple(internal), gauss), torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8),
            numpy_state)


def seeded_rng(seed: int) -> _RawRNG:
    saved = raw_rng()
    random.seed(seed)
    torch.manual_seed(seed)
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    state = raw_rng()
    set_raw_rng(saved)
    return state


class _ShardRNG:
    """Global generator states per logical shard, swapped in while a shard runs."""

    def __init__(self, policy: GlobalRNG, protect_caller: bool):
        self.enabled = policy is GlobalRNG.ISOLATE
        self.protect_caller = protect_caller
        self.states: dict[int, _RawRNG] = {}
        self.active: int | None = None
        self._caller: _RawRNG | None = None

    def reset(self, states: Mapping[int, _RawRNG]) -> None:
        self.leave()
        if self.active is not None:  # a worker that never leaves: drop the old epoch's shard
            self.active = None
        self.states = dict(states)

    def enter(self, shard: int) -> None:
        if not self.enabled or self.active == shard:
            return
        if self.active is not None:
            self.states[self.active] = raw_rng()
        elif self.protect_caller:
            self._caller = raw_rng()
        set_raw_rng(self.states[shard])
        self.active = shard

    def leave(self) -> None:
        if not self.enabled or not self.protect_caller or self.active is None:
            return
        self.states[self.active] = raw_rng()
        if self._caller is not None:
            set_raw_rng(self._caller)
        self.active, self._caller = None, None

    def state(self, shard: int) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        raw = raw_rng() if self.active == shard else self.states.get(shard)
        return plain_rng(raw) if raw is not None else None


def restore_plans(graphs: Mapping[int, Graph], topology: Topology, saved: Mapping[int, Any],
                  strategy: RestoreStrategy) -> tuple[dict[int, Any], set[int]]:
    """Each saved shard's restore plan, and the shards whose plan replays up to a router."""
    plans = {}
    for shard, graph in graphs.items():
        record = saved.get(shard)
        if record is not None and not record.get("exhausted"):
            counts = {p: r["yielded"] for p, r in record["nodes"].items()}
            plans[shard] = make_plan(graph, counts, strategy, ports=frozenset(topology.routers))
    return plans, {s for s, plan in plans.items() if plan.reaches_ports}


def start_upstream(graph: Graph, routers: Sequence[str], prefix: frozenset[str], count: int, shards: Sequence[int],
                   seeds: EpochSeeds, saved: Mapping[str, Any] | None, replayed: set[int],
                   strategy: RestoreStrategy, buffer_state: str = "values") -> tuple[Run, dict[str, Router]]:
    """Run the part above ``routers`` (the nodes in ``prefix``), restored from ``saved`` if given.

    When some shard replays up to its router (``replayed``), the part restarts from the
    start of the epoch and each router skips, for the other shards, what they had read.
    """
    sinks = [graph[r].inputs[0] for r in routers]
    records = plan = None
    routers_state: dict[str, Any] = {}
    if saved is not None:
        restore_persistent(graph, saved.get("persistent", {}))
        if not replayed:
            records = saved["nodes"]
            counts = {p: r["yielded"] for p, r in records.items()}
            plan = make_plan(graph, counts, strategy, sinks=sinks)
            routers_state = saved["routers"]
        else:  # restart the routers, skipping what was read
            rewind(graph, saved["nodes"], prefix)
            routers_state = {r: {"position": 0, "kept": 0, "ended": False, "queues": {s: [] for s in shards},
                                 "next": {s: (s if s in replayed else state["next"][s]) for s in shards}}
                             for r, state in saved["routers"].items()}
    shared = {p: s for p, s in seeds.shared.items() if p in prefix}
    run = Run(graph, shared, sink=sinks[0], sinks=tuple(sinks[1:]), records=records, plan=plan,
              buffer_state=buffer_state)
    built = {r: Router(run.cell(graph[r].inputs[0]), count, shards, routers_state.get(r),
                       outer=_outer(graph[r].datapipe))
             for r in routers}
    return run, built


def _read_from(record: Mapping[str, Any] | None, router: str) -> int:
    """How many samples a saved shard had read from ``router``."""
    if record is None:
        return 0
    return int((record.get("nodes") or {}).get(router, {}).get("yielded") or 0)


class ShardEngine:
    """Runs the logical ``shards`` this process owns, out of ``count`` in all.

    ``graph`` is the live graph (used for the part above the sharding point and for the
    first owned shard); ``make_copy`` builds a fresh copy of the graph for each further shard.
    With ``remote``, the part above each dispatcher runs elsewhere (the main process) and
    its samples are fetched through ``remote``.
    """

    def __init__(self, graph: Graph, make_copy: Callable[[], Any], topology: Topology, count: int,
                 shards: Sequence[int], *, worker: WorkerInfo, init_fn: Callable[..., Any] | None = None,
                 global_rng: GlobalRNG = GlobalRNG.SHARED, protect_caller_rng: bool = True,
                 remote: RemoteFetch | None = None, buffer_state: str = "values"):
        self.topology = topology
        self.buffer_state = buffer_state
        self._remote = remote if topology.dispatchers else None
        self.count = count
        self.shards = list(shards)
        self.graph = graph
        self.worker = worker
        self._shard_graphs: dict[int, Graph] = {}
        for i, shard in enumerate(self.shards):
            datapipe = graph.sink if i == 0 else make_copy()
            if init_fn is not None:
                datapipe = init_fn(datapipe, worker) or datapipe
            shard_graph = graph if datapipe is graph.sink else Graph(datapipe)
            topology.configure_shard(shard_graph, count, shard)
            self._shard_graphs[shard] = shard_graph
        self._downstream = topology.downstream(graph)
        #: the part above the routers that runs here
        self._prefix = topology.upstream - topology.dispatched if self._remote is not None else topology.upstream
        self._rng = _ShardRNG(GlobalRNG(global_rng), protect_caller_rng)
        self._upstream: Run | None = None
        self._routers: dict[str, Router | RemoteRouter] = {}
        self._runs: dict[int, Run | None] = {}
        self._seeds: EpochSeeds | None = None

    # -- epochs ---------------------------------------------------------------------------

    def close(self) -> None:
        for run in [self._upstream, *self._runs.values()]:
            if run is not None:
                run.close()
        self._upstream, self._runs, self._routers = None, {}, {}

    def start(self, seeds: EpochSeeds, restore: Mapping[str, Any] | None = None,
              strategy: RestoreStrategy = RestoreStrategy.AUTO) -> None:
        """Start the epoch with ``seeds``, or put it back where ``restore`` (see recombine) says.

        A shard whose restore plan replays up to its sharding point (fast-forward, or a
        hookless pipe right below it) must receive its samples again from the start of the
        epoch: then the part above the sharding point restarts too, and the router skips, for
        the other shards, the samples they had already read.
        """
        self.close()
        self._seeds = seeds
        graph, topology = self.graph, self.topology
        shard_states = restore["shards"] if restore else {}
        plans, replayed = restore_plans(self._shard_graphs, topology, shard_states, strategy)
        upstream_state = restore.get("upstream") if restore else None
        local = topology.filters if self._remote is not None else topology.routers
        if local:
            self._upstream, routers = start_upstream(graph, local, self._prefix, self.count, self.shards, seeds,
                                                     upstream_state, replayed, strategy, self.buffer_state)
            self._routers.update(routers)
        if self._remote is not None:
            for path in topology.dispatchers:
                received = {s: 0 if s in replayed else _read_from(shard_states.get(s), path) for s in self.shards}
                self._routers[path] = RemoteRouter(path, self._remote, self.shards, received)
        rng_states = {}
        for shard in self.shards:
            saved = shard_states.get(shard)
            if self._rng.enabled:
                plain = (saved or {}).get("rng")
                rng_states[shard] = raw_from_plain(plain) if plain else seeded_rng(seeds.rng[shard])
            self._runs[shard] = self._shard_run(shard, seeds, saved, plans.get(shard), shard in replayed)
        self._rng.reset(rng_states)

    def _shard_run(self, shard: int, seeds: EpochSeeds, saved: Mapping[str, Any] | None, plan: Any,
                   replays_port: bool) -> Run | None:
        graph = self._shard_graphs[shard]
        if saved is not None:
            restore_persistent(graph, saved.get("persistent", {}))
            if saved.get("exhausted"):
                return None
        ports = {r: RouterPort(self._routers[r], shard, graph[r].datapipe) for r in self.topology.routers}
        records = None
        if saved is not None:
            records = saved["nodes"]
            if not replays_port:
                for path, port in ports.items():
                    port.yielded = int(records.get(path, {}).get("yielded") or 0)
        own = {p: s for p, s in seeds.for_shard(shard).items() if p in self._downstream}
        return Run(graph, own, ports=ports, records=records, plan=plan, buffer_state=self.buffer_state)

    # -- iterating ------------------------------------------------------------------------

    def next(self, shard: int) -> Any:
        """The next sample of ``shard``; ``StopIteration`` when the shard is exhausted."""
        run = self._runs.get(shard)
        if run is None:
            raise StopIteration
        self._rng.enter(shard)
        try:
            return next(run)
        finally:
            self._rng.leave()

    def produced(self, shard: int) -> int:
        run = self._runs.get(shard)
        return run.yielded if run is not None else -1

    # -- capturing ------------------------------------------------------------------------

    def capture(self) -> dict[str, Any]:
        """This engine's state: the part above the sharding point and each owned shard."""
        upstream = None
        if self._upstream is not None:
            upstream = {"shards": list(self.shards), "nodes": self._upstream.capture(),
                        "routers": {r: router.state() for r, router in self._routers.items()
                                    if isinstance(router, Router)},
                        "persistent": {p: s for p, s in capture_persistent(self.graph).items()
                                       if p in self._prefix}}
        shards: dict[int, dict[str, Any]] = {}
        for shard in self.shards:
            run = self._runs.get(shard)
            graph = self._shard_graphs[shard]
            persistent = {p: s for p, s in capture_persistent(graph).items() if p in self._downstream}
            if run is None:
                shards[shard] = {"produced": None, "exhausted": True, "nodes": {}, "plan": {},
                                 "rng": self._rng.state(shard), "persistent": persistent}
                continue
            records = run.capture()
            counts = {p: r["yielded"] for p, r in records.items()}
            plan = make_plan(graph, counts, RestoreStrategy.AUTO, ports=frozenset(self.topology.routers))
            shards[shard] = {"produced": run.yielded, "exhausted": run.exhausted, "nodes": records,
                             "plan": plan.describe(), "rng": self._rng.state(shard), "persistent": persistent}
        return {"upstream": upstream, "shards": shards}


#: A part of the graph above the sharding point: its routers and the nodes above them.
Part = tuple[Sequence[str], frozenset[str]]


def parts(topology: Topology, *, filters: bool = True, dispatchers: bool = True) -> list[Part]:
    """The parts above the sharding point that one process runs: the one above the
    ``sharding_filter`` routers (run by every worker) and the one above the dispatchers (run
    once per loader process)."""
    found: list[Part] = []
    if filters and topology.filters:
        found.append((topology.filters, topology.upstream - topology.dispatched))
    if dispatchers and topology.dispatchers:
        found.append((topology.dispatchers, topology.dispatched))
    return found


def recombine(saved_upstream: Sequence[Mapping[str, Any]], saved_shards: Sequence[Mapping[str, Any]],
              shards: Sequence[int], wanted: Sequence[Part]) -> dict[str, Any]:
    """The restore state for an engine that owns ``shards``, from states saved in any layout.

    For each ``wanted`` part, the saved copy that had read the least is taken (every other
    copy's routers have queued, by value, what the shards still need from the samples it had
    read); each router's queues come from each shard's former owner.
    """
    upstream: dict[str, Any] | None = None
    if wanted:
        upstream = {"nodes": {}, "routers": {}, "persistent": {}}
        for routers, prefix in wanted:
            _recombine_part(upstream, saved_upstream, shards, routers, prefix)
    return {"upstream": upstream, "shards": {s: saved_shards[s] for s in shards}}


def _recombine_part(into: dict[str, Any], saved_upstream: Sequence[Mapping[str, Any]], shards: Sequence[int],
                    routers: Sequence[str], prefix: frozenset[str]) -> None:
    first = routers[0]
    copies = [u for u in saved_upstream if first in u["routers"]]
    if not copies:
        raise LayoutError(f"the snapshot holds no state for the part of the graph above {first}")
    base = min(copies, key=lambda u: int(u["routers"][first]["position"]))
    owners: dict[int, Mapping[str, Any]] = {}
    for candidate in copies:
        for shard in candidate["shards"]:
            owners[int(shard)] = candidate
    for router in routers:
        position = int(base["routers"][router]["position"])
        behind = [u for u in copies if int(u["routers"][router]["position"]) < position]
        if behind:
            raise LayoutError(
                f"the sharding points of this graph were read unevenly ({router}); restore onto the "
                "same number of workers and ranks as when the snapshot was taken")
        queues, nexts = {}, {}
        for shard in shards:
            owner = owners.get(int(shard))
            if owner is None:
                raise LayoutError(f"the snapshot has no owner for logical shard {shard}")
            state = owner["routers"][router]
            nexts[shard] = int(state["next"][shard])
            queues[shard] = [[i, x] for i, x in state["queues"][shard]]
        kept = int(base["routers"][router]["kept"])
        into["routers"][router] = {"position": position, "kept": kept, "ended": bool(base["routers"][router]["ended"]),
                                   "next": nexts,
                                   "queues": {s: [e for e in q if int(e[0]) < kept] for s, q in queues.items()}}
    if base.get("rng") is not None:  # the dispatching part's own generator states
        into["rng"] = base["rng"]
    into["nodes"].update({p: r for p, r in base["nodes"].items() if p in prefix})
    into["persistent"].update({p: r for p, r in base.get("persistent", {}).items() if p in prefix})


class RoundRobin(Iterator[Any]):
    """Merges logical shards into one stream: each owned shard in turn, skipping exhausted ones.

    ``fetch(shard)`` produces a shard's next sample (raising ``StopIteration`` at its end);
    samples already produced but not yet yielded (``in_flight``) are served first.
    """

    def __init__(self, shards: Sequence[int], fetch: Callable[[int], Any]):
        self.shards = list(shards)
        self.fetch = fetch
        self.turn = 0
        self.exhausted: set[int] = set()
        self.consumed = {s: 0 for s in self.shards}
        self.in_flight: dict[int, deque[Any]] = {s: deque() for s in self.shards}

    def __iter__(self) -> RoundRobin:
        return self

    def __next__(self) -> Any:
        shards = self.shards
        while len(self.exhausted) < len(shards):
            shard = shards[self.turn]
            self.turn = (self.turn + 1) % len(shards)
            if shard in self.exhausted:
                continue
            waiting = self.in_flight[shard]
            if waiting:
                item = waiting.popleft()
            else:
                try:
                    item = self.fetch(shard)
                except StopIteration:
                    self.exhausted.add(shard)
                    continue
            self.consumed[shard] += 1
            return item
        raise StopIteration

    def state(self) -> dict[str, Any]:
        return {"shards": list(self.shards), "turn": self.turn, "exhausted": sorted(self.exhausted),
                "consumed": dict(self.consumed)}

    def load(self, state: Mapping[str, Any], shards: Sequence[Mapping[str, Any] | None]) -> None:
        """Continue from ``state`` (see :func:`merge_state_for`); ``shards`` are the saved records."""
        self.turn = int(state["turn"])
        self.exhausted = {int(s) for s in state["exhausted"]}
        self.consumed = {int(s): int(n) for s, n in state["consumed"].items()}
        for shard in self.shards:
            record = shards[shard]
            self.in_flight[shard] = deque(record["in_flight"] if record is not None else [])


def merge_state_for(state: Mapping[str, Any], shards: Sequence[int]) -> dict[str, Any]:
    """The merge position for ``shards``: the saved one if the same shards were merged
    together, else one derived from the shard records (for a restore onto another layout)."""
    candidates = [state.get("merge")] + [rank.get("merge") for rank in state.get("ranks", [])]
    for merge in candidates:
        if merge is not None and [int(s) for s in merge["shards"]] == list(shards):
            return dict(merge)
    records = state["shards"]
    return {"shards": list(shards), "turn": 0,
            "exhausted": [s for s in shards if records[s] is not None and records[s].get("finished")],
            "consumed": {s: int(records[s]["yielded"]) if records[s] is not None else 0 for s in shards}}


def owners(count: int, workers: int) -> list[int]:
    """Which worker owns each logical shard (shard s -> worker s % workers)."""
    return [shard % max(workers, 1) for shard in range(count)]


def service_state(name: str, layout: Mapping[str, Any], seeds: EpochSeeds, merge: RoundRobin,
                  engines: Sequence[Mapping[str, Any]], count: int) -> dict[str, Any]:
    """The checkpoint every sharded service returns (see ``ServiceState``).

    ``shards`` has one record per logical shard (``None`` for shards this process does not
    own, which a distributed snapshot fills in from the other ranks).
    """
    shards: list[dict[str, Any] | None] = [None] * count
    upstream = []
    for engine in engines:
        if engine["upstream"] is not None:
            upstream.append(engine["upstream"])
        for shard, record in engine["shards"].items():
            shards[int(shard)] = dict(record)
    for shard in merge.shards:
        record = shards[shard]
        assert record is not None
        record["shard"] = shard
        record["yielded"] = merge.consumed[shard]
        record["in_flight"] = list(merge.in_flight[shard])
        record["finished"] = shard in merge.exhausted
    return {"service": name, "layout": dict(layout), "seeds": seeds.state(), "merge": merge.state(),
            "upstream": upstream, "shards": shards}
