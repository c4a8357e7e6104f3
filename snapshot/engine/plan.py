"""Deciding a restore: the strategies, the checks made before anything changes, and the
printable :class:`Plan` of which node restores from its state and which subgraphs replay.

Three strategies (``RestoreStrategy`` or their string values):

``fast_forward``
    Rebuild the graph, reseed it with the saved seeds, and replay the saved number of
    samples. Works for any graph; costs O(samples since the epoch began).
``state``
    Put every node back from its saved state; costs O(size of the state). Refused up front,
    listing every node that has no state hook, when the graph needs replay.
``auto``
    Use state wherever the graph allows and replay only the smallest subgraphs that hold a
    node without a hook.

Everything is checked before the loader is touched: the file, the graph (node by node, with
saved and current side by side, and each function's code: see ``CodeChanges``), the
reading-service layout and the strategy. All problems are collected and raised together.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from snapshot._choice import Choice
from snapshot._warnings import user_stacklevel
from snapshot.engine._hooked import check_restorable, generation, needs_replay, rereads
from snapshot.errors import GraphMismatchError, StrategyError
from snapshot.schema.graph import NodeDesc
from snapshot.schema.state import PlanState

if TYPE_CHECKING:  # the graph and the hooks import torch: loaded when a restore is planned
    from snapshot.engine.graph import Graph

__all__ = ["CodeChanges", "Plan", "RestoreStrategy", "check_graph", "check_restorable", "log_plan", "make_plan",
           "needs_replay", "rereads"]


_log = logging.getLogger(__name__)

#: A restore that replays at least this many samples because of a pipe without a state hook
#: warns (once per node and pipe class in a process) that a hook would make it fast.
REPLAY_WARNING = 10_000
_warned: set[tuple[str, str]] = set()


class RestoreStrategy(Choice):
    """How a restore puts the graph back at the saved position."""

    FAST_FORWARD = "fast_forward"
    STATE = "state"
    AUTO = "auto"

    @classmethod
    def label(cls) -> str:
        return "restore strategy"


class CodeChanges(Choice):
    """What a restore does when a function of the graph (``map``'s ``fn``, a ``filter``'s
    predicate, ...) runs other code than when the snapshot was saved. Samples the snapshot holds
    (buffers, samples in flight) were computed by the old code, and the rest of the stream comes
    from the new code."""

    #: A :class:`~snapshot.GraphMismatchError` naming each changed function (the default).
    REFUSE = "refuse"
    #: Restore, with a warning naming each changed function.
    WARN = "warn"
    #: Restore; the changed functions are logged (``snapshot.plan``, INFO).
    ALLOW = "allow"

    @classmethod
    def label(cls) -> str:
        return "code_changes"


def check_graph(saved_nodes: Sequence[dict[str, Any]] | Sequence[NodeDesc], graph: Graph,
                code_changes: CodeChanges = CodeChanges.REFUSE) -> None:
    """Raise :class:`GraphMismatchError` naming every node that differs (a function whose code
    changed only with ``code_changes="refuse"``). ``saved_nodes``: the saved graph's nodes, as a
    manifest's records or their dicts."""
    if _unchanged(saved_nodes, graph):
        return
    from snapshot.engine.graph import another_pipeline, compare_nodes

    saved_nodes = [node if isinstance(node, dict) else node.to_dict() for node in saved_nodes]
    diffs = compare_nodes(saved_nodes, graph)
    changed = [d for d in diffs if d.code]
    refused = diffs if code_changes is CodeChanges.REFUSE else [d for d in diffs if not d.code]
    if not refused:
        if changed:
            listing = "\n".join(str(d) for d in changed)
            text = (f"restoring with {len(changed)} function(s) whose code changed since the snapshot "
                    f"(code_changes={code_changes.value!r}); the rest of the stream comes from the new "
                    f"code:\n{listing}")
            if code_changes is CodeChanges.WARN:
                warnings.warn(text, stacklevel=user_stacklevel())
            _log.info("%s", text)
        return
    foreign = another_pipeline(saved_nodes, graph)  # said first, with a few of its differences
    shown = 5 if foreign else 20
    listing = "\n".join(str(d) for d in refused[:shown])
    more = f"\n  ... and {len(refused) - shown} more" if len(refused) > shown else ""
    structural = len(refused) - len(changed)
    head = (f"the graph given to the loader does not match the graph in the snapshot: {foreign}; the first "
            f"{shown} of its {len(refused)} differences" if foreign else
            f"the graph given to the loader does not match the graph in the snapshot ({len(refused)} "
            f"difference{'s' if len(refused) != 1 else ''})" if structural else
            f"{len(changed)} function(s) of the graph changed since the snapshot was saved")
    hints = []
    if changed:
        hints.append("Samples computed by the old and the new code would mix silently, so the restore is refused: "
                     "restore with the code the snapshot was saved with (a function of an importable module is "
                     "saved by its name, so from_snapshot runs the module as it is now), or accept the change "
                     "with code_changes=\"allow\" (or \"warn\") in DataLoader2(...) or from_snapshot(...).")
    if structural:
        hints.append("Build the graph exactly as when the snapshot was saved, or use "
                     "DataLoader2.from_snapshot(...) to restore with the graph pickled inside it.")
    raise GraphMismatchError(f"{head}:\n{listing}{more}\n" + "\n".join(hints),
                             [(d.path, d.saved, d.current) for d in refused])


def _unchanged(saved: Sequence[dict[str, Any]] | Sequence[NodeDesc], graph: Graph) -> bool:
    """Whether :func:`compare_nodes` finds no difference, said without describing the saved nodes: each
    at its path with its fingerprint, inputs and functions' code (where comparable), and no other node."""
    described = [desc for desc in saved if isinstance(desc, NodeDesc)]
    if len(described) != len(saved) or len(saved) != len(graph.nodes):
        return False
    by_path = graph.by_path
    for desc in described:
        node = by_path.get(desc.path)
        if node is None or node.fingerprint != desc.fingerprint or list(desc.inputs) != node.inputs:
            return False
        for name, before in desc.code.items():
            now = node.code.get(name)
            if now is not None and now != before:
                from snapshot.engine._code import python_of

                if python_of(now) == python_of(before):  # (made by another Python: not comparable)
                    return False
    return len({desc.path for desc in described}) == len(saved)  # (each saved path once: every node compared)


@dataclass(frozen=True)
class Plan:
    """Which nodes a restore replays from the start of the epoch, and through which drivers.

    Every other node is put back from its saved state. A *driver* is the node whose saved
    count is replayed: the smallest subgraph containing a node without a hook whose nodes
    feed nothing outside it.
    """

    strategy: RestoreStrategy
    replay: frozenset[str]
    drivers: tuple[tuple[str, int], ...]
    reasons: Mapping[str, str] = field(default_factory=dict)
    #: The replay reaches the part's input (a logical shard's sharding point): the samples
    #: it received since the start of the epoch must be produced again.
    reaches_ports: bool = False
    #: Nodes restored from their state that read something again beyond it (a reader of a
    #: compressed stream re-inflates its current file), with what.
    rereads: Mapping[str, str] = field(default_factory=dict)

    def record(self) -> PlanState:
        """The plan as a shard's state saves it."""
        return PlanState(strategy=self.strategy.value, drivers=tuple((p, n) for p, n in self.drivers),
                         replayed_nodes=tuple(sorted(self.replay)), reasons=dict(self.reasons),
                         reaches_sharding_point=self.reaches_ports, rereads=dict(self.rereads))

    def describe(self) -> dict[str, Any]:
        return self.record().to_dict()

    def method(self, path: str) -> str:
        return "replay" if path in self.replay else "state"

    def __str__(self) -> str:
        lines = [f"restore plan ({self.strategy.value}):"]
        if not self.drivers:
            lines.append("  every node is restored from its state; nothing is replayed")
        for path, count in self.drivers:
            lines.append(f"  replay {count} samples of {path} (and the {len(self.replay)} nodes it reads from)")
        for path, reason in self.reasons.items():
            lines.append(f"  {path} needs replay: {reason}")
        for path, what in self.rereads.items():
            lines.append(f"  {path} is restored from its state, and {what}")
        return "\n".join(lines)


class _Part:
    """The part of a graph one run covers: ``nodes``, with ``ports`` as its leaves."""

    def __init__(self, graph: Graph, sinks: list[str], ports: frozenset[str]):
        self.graph = graph
        self.ports = ports
        if not ports and sinks == [graph.nodes[0].path]:  # the whole graph: every node is read by its sink
            self.nodes = set(graph.by_path)
        else:
            self.nodes = set()
            for sink in sinks:
                self.nodes.update(graph.ancestors(sink, stop=ports))
        self._order: dict[str, int] | None = None

    @property
    def order(self) -> dict[str, int]:
        """Each node's place in the graph (asked only where some node replays)."""
        if self._order is None:
            self._order = {n.path: i for i, n in enumerate(self.graph.nodes)}
        return self._order

    def closure(self, path: str) -> set[str]:
        return set(self.graph.ancestors(path, stop=self.ports))

    def consumers(self, path: str) -> set[str]:
        return {c for c in self.graph[path].consumers if c in self.nodes}

    def is_closed(self, driver: str, closure: set[str]) -> bool:
        return all(self.consumers(p) <= closure for p in closure if p != driver)

    def descendants(self, path: str) -> list[str]:
        seen, stack = {path}, [path]
        while stack:
            for consumer in self.consumers(stack.pop()):
                if consumer not in seen:
                    seen.add(consumer)
                    stack.append(consumer)
        return sorted(seen, key=self.order.__getitem__)

    def smallest_closed(self, path: str) -> tuple[str, set[str]]:
        best: tuple[str, set[str]] | None = None
        for candidate in self.descendants(path):
            closure = self.closure(candidate)
            if self.is_closed(candidate, closure) and (best is None or len(closure) < len(best[1])):
                best = (candidate, closure)
        assert best is not None  # a sink of the part always qualifies
        return best


def check_strategy(graph: Graph, strategy: RestoreStrategy) -> None:
    """Refuse, before anything changes, a strategy that ``graph`` cannot be restored with (the plans
    themselves are made per logical shard, when the reading service restores it)."""
    _check_strategy(graph, set(graph.by_path), strategy)  # every node: the graph is what its sink reads


def _check_strategy(graph: Graph, nodes: set[str], strategy: RestoreStrategy) -> dict[str, str]:
    """Why each of ``nodes`` needs replay; refuses what cannot be restored, and ``state`` where some must replay.
    What the hooks say of ``nodes`` is found once per graph while no hook is registered (a restore checks the
    whole graph up front, then plans its shards)."""
    key, now = ("needs_replay", frozenset(nodes)), generation()
    found = graph.memo.get(key)
    if found is not None and found[0] == now:
        reasons: dict[str, str] = found[1]
    else:
        check_restorable(graph, nodes)
        reasons = needs_replay(graph, nodes)
        graph.memo[key] = (now, reasons)
    if strategy is RestoreStrategy.STATE and reasons:
        listing = "\n".join(f"  {p}: {graph[p].signature}: {r}" for p, r in reasons.items())
        raise StrategyError(
            f"strategy='state' needs a state hook on every node, and {len(reasons)} node(s) "
            f"cannot be restored from state:\n{listing}\nUse strategy='auto' (replays only the "
            "smallest subgraph around them) or 'fast_forward', or add hooks with "
            "snapshot.register_state_hook()."
        )
    return reasons


@dataclass(frozen=True)
class PlanLayout:
    """What a plan of one part of a graph is whatever the counts: the replayed nodes and their drivers, and
    what each node restored from its state would read again. :meth:`at` makes the plan at given counts."""

    strategy: RestoreStrategy
    sinks: tuple[str, ...]
    replay: frozenset[str]
    drivers: tuple[str, ...]
    reasons: Mapping[str, str]
    reaches_ports: bool
    #: Of the nodes restored from their state (when they have a count), those that read something again.
    rereads: Mapping[str, str] = field(default_factory=dict)

    def at(self, counts: Mapping[str, int | None]) -> Plan:
        """The plan at the saved ``counts``."""
        return Plan(self.strategy, self.replay, tuple((d, int(counts.get(d) or 0)) for d in self.drivers),
                    self.reasons, self.reaches_ports, {p: w for p, w in self.rereads.items() if counts.get(p)})


def plan_layout(graph: Graph, strategy: RestoreStrategy, sinks: list[str] | None = None,
                ports: frozenset[str] = frozenset()) -> PlanLayout:
    """The layout of every plan of the part of ``graph`` behind ``sinks`` (see :func:`make_plan`); refuses
    what cannot be restored as :func:`check_strategy` does."""
    sinks = sinks or [graph.nodes[0].path]  # (the sink: ROOT)
    part = _Part(graph, sinks, ports)
    reasons = _check_strategy(graph, part.nodes - ports, strategy)
    if strategy is RestoreStrategy.FAST_FORWARD:
        return PlanLayout(strategy, tuple(sinks), frozenset(part.nodes - ports), tuple(sinks), reasons,
                          bool(part.nodes & ports))
    chosen: dict[str, set[str]] = {}
    for path in reasons:
        driver, closure = part.smallest_closed(path)
        chosen[driver] = closure
    drivers = [d for d in chosen if not any(d != o and d in chosen[o] for o in chosen)]
    replay: set[str] = set()
    for d in drivers:
        replay |= chosen[d]
    if len(drivers) > 1:
        drivers.sort(key=part.order.__getitem__)
    return PlanLayout(strategy, tuple(sinks), frozenset(replay - ports), tuple(drivers), reasons,
                      bool(replay & ports), rereads(graph, part.nodes - ports - replay))


def make_plan(graph: Graph, counts: Mapping[str, int | None], strategy: RestoreStrategy,
              sinks: list[str] | None = None, ports: frozenset[str] = frozenset()) -> Plan:
    """The restore plan for the part of ``graph`` behind ``sinks`` at the saved ``counts``.

    ``ports`` are nodes fed from outside the part (a logical shard's input): they are put
    back by their owner, never replayed.
    """
    return plan_layout(graph, strategy, sinks, ports).at(counts)


def log_plan(plan: Plan, graph: Graph, drivers: list[tuple[str, int]], *, hooked: Callable[[str], bool]) -> None:
    """Log a plan as it is applied: INFO says what the restore replays (``drivers``: the replay
    drivers of ``graph`` and their counts); WARNING, once per node and pipe class in a process,
    a long replay caused by a pipe without a hook (``hooked(path)`` says which have one)."""
    if not drivers:
        _log.info("restore (%s): every node from its saved state, nothing replayed", plan.strategy.value)
    for path, what in plan.rereads.items():
        _log.info("restore (%s): %s (%s) %s", plan.strategy.value, path, graph[path].signature, what)
    for path, count in drivers:
        behind = [p for p in graph.ancestors(path) if p in plan.replay]
        _log.info("restore (%s): replaying %d samples of %s (%s) through %d node(s); the others from their "
                  "saved state", plan.strategy.value, count, path, graph[path].signature, len(behind))
        if count < REPLAY_WARNING or plan.strategy is RestoreStrategy.FAST_FORWARD:
            continue
        for node in behind:
            if node not in plan.reasons or hooked(node):
                continue
            cls = type(graph[node].datapipe)
            key = (node, f"{cls.__module__}.{cls.__qualname__}")
            if key in _warned:
                continue
            _warned.add(key)
            _log.warning(
                "restoring replays %d samples because the DataPipe at %s (%s) has no state hook, so its "
                "position can only be reached by replaying. Give %s state_dict() and load_state_dict(state) "
                "methods (the torchdata Stateful protocol), or register a hook with "
                "snapshot.register_state_hook(%s, ...) (see the state hooks how-to); it is then restored "
                "from its state. If its generator keeps nothing between samples, "
                "snapshot.register_state_hook(%s, snapshot.hooks.Itemwise) is enough.", count, node,
                graph[node].signature, cls.__qualname__, cls.__qualname__, cls.__qualname__)

