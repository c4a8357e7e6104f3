"""torchdata 0.9's graph utilities (``torchdata.dataloader2.graph``), over torch's ``traverse_dps``.

They work on the nested dict that :func:`torch.utils.data.graph.traverse_dps` returns,
``{id(dp): (dp, {id(input): (input, {...}), ...})}``, and edit a graph in place by rebinding
the attribute of the consumer that holds a pipe. They are re-exported by :mod:`snapshot.graph`
with 0.9's names and behaviour, so ``from snapshot.graph import traverse_dps, replace_dp``
is the whole migration. Seeding takes any object with ``generate_seed()`` and
``generate_shared_seed()`` (a :class:`snapshot.SeedGenerator`), so this module depends on
torch only.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe
from torch.utils.data.graph import DataPipe, DataPipeGraph, traverse_dps

__all__ = [
    "DataPipe",
    "DataPipeGraph",
    "find_dps",
    "list_dps",
    "remove_dp",
    "replace_dp",
    "set_datapipes_seed",
    "set_graph_random_seed",
    "traverse_dps",
]


class _Seeds(Protocol):
    def generate_seed(self) -> int: ...

    def generate_shared_seed(self) -> int: ...


def _sink(graph: DataPipeGraph) -> Any:
    if len(graph) != 1:
        raise ValueError(f"expected the graph of one sink DataPipe (from traverse_dps), got {len(graph)} sinks")
    return next(iter(graph.values()))[0]


def find_dps(graph: DataPipeGraph, dp_type: type) -> list[DataPipe]:
    """Every pipe of ``graph`` whose type is exactly ``dp_type`` (subclasses do not count),
    in depth-first order from the sink, each once."""
    found: list[DataPipe] = []
    seen: set[int] = set()
    stack = list(reversed(graph.items()))
    while stack:
        key, (datapipe, inputs) = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        if type(datapipe) is dp_type:
            found.append(datapipe)
        stack.extend(reversed(inputs.items()))
    return found


def list_dps(graph: DataPipeGraph, exclude_dps: DataPipe | Iterable[DataPipe] | None = None) -> list[DataPipe]:
    """Every pipe of ``graph`` once, breadth-first from the sink.

    Pipes in ``exclude_dps``, and everything they read from, are left out.
    """
    seen: set[int] = set()
    if exclude_dps is not None:
        excluded = [exclude_dps] if isinstance(exclude_dps, (IterDataPipe, MapDataPipe)) else list(exclude_dps)
        for datapipe in excluded:
            if id(datapipe) not in seen:
                seen.update(id(dp) for dp in list_dps(traverse_dps(datapipe)))
    queue: deque[tuple[Any, DataPipeGraph]] = deque()
    for key, (datapipe, inputs) in graph.items():
        if key not in seen:
            seen.add(key)
            queue.append((datapipe, inputs))
    listed: list[DataPipe] = []
    while queue:
        datapipe, inputs = queue.popleft()
        listed.append(datapipe)
        for key, (source, sources) in inputs.items():
            if key not in seen:
                seen.add(key)
                queue.append((source, sources))
    return listed


def _rebind(holder: Any, old: Any, new: Any, *, top: bool = False) -> Any:
    """Put ``new`` where ``holder`` keeps ``old`` (in its attributes, or nested in a list,
    tuple, dict or set). Returns the replacement for ``holder`` itself when ``holder`` must be
    rebuilt (``old`` itself, or a tuple), else ``None``."""
    if holder is old:
        return new
    if isinstance(holder, (IterDataPipe, MapDataPipe)):
        if top:  # only the consumer's own attributes: never walk into another pipe
            _rebind_in(vars(holder), old, new)
        return None
    if isinstance(holder, (dict, list)):
        _rebind_in(holder, old, new)
        return None
    if isinstance(holder, tuple):
        items = [_rebind(item, old, new) for item in holder]
        if any(item is not None for item in items):
            return tuple(holder[i] if item is None else item for i, item in enumerate(items))
        return None
    if isinstance(holder, set) and old in holder:
        holder.remove(old)
        holder.add(new)
    return None


def _rebind_in(container: dict[Any, Any] | list[Any], old: Any, new: Any) -> None:
    keys = list(container.keys()) if isinstance(container, dict) else range(len(container))
    for key in keys:
        replacement = _rebind(container[key], old, new)
        if replacement is not None:
            container[key] = replacement
            return  # one edge per consumer, as in 0.9


def _consumers_of(graph: DataPipeGraph, target: int) -> list[Any]:
    """Every pipe of ``graph`` that reads directly from the pipe with id ``target``."""
    consumers: list[Any] = []
    seen: set[int] = set()
    stack = list(graph.items())
    while stack:
        key, (datapipe, inputs) = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        if target in inputs:
            consumers.append(datapipe)
        stack.extend(inputs.items())
    return consumers


def replace_dp(graph: DataPipeGraph, old_datapipe: DataPipe, new_datapipe: DataPipe) -> DataPipeGraph:
    """Make every consumer of ``old_datapipe`` read from ``new_datapipe`` instead; returns the
    new graph. ``new_datapipe`` may wrap ``old_datapipe``; replacing the sink makes
    ``new_datapipe`` the sink."""
    sink = _sink(graph)
    if sink is old_datapipe:  # the old sink's consumers are inside the new sink: leave them
        return traverse_dps(new_datapipe)
    for consumer in _consumers_of(graph, id(old_datapipe)):
        _rebind(consumer, old_datapipe, new_datapipe, top=True)
    return traverse_dps(sink)


def remove_dp(graph: DataPipeGraph, datapipe: DataPipe) -> DataPipeGraph:
    """Take ``datapipe`` out of the graph: its consumers read from its single input.

    A source (no input) or a pipe with several inputs cannot be removed (``RuntimeError``).
    """
    sink = _sink(graph)
    inputs = traverse_dps(datapipe)[id(datapipe)][1]
    if not inputs:
        raise RuntimeError("Cannot remove the source DataPipe from the graph of DataPipe")
    if len(inputs) > 1:
        raise RuntimeError("Cannot remove the receiving DataPipe having multiple sending DataPipes")
    source = next(iter(inputs.values()))[0]
    if sink is datapipe:
        return traverse_dps(source)
    for consumer in _consumers_of(graph, id(datapipe)):
        _rebind(consumer, datapipe, source, top=True)
    return traverse_dps(sink)


def _is_random(datapipe: Any) -> bool:
    return inspect.ismethod(getattr(datapipe, "set_seed", None))


def set_datapipes_seed(datapipes: Iterable[DataPipe], seed_generator: _Seeds, distributed_shared: bool) -> None:
    """Seed every random pipe (one with a ``set_seed`` method) of ``datapipes`` in order, with
    shared seeds (the same on every worker and rank) or per-worker seeds."""
    for datapipe in datapipes:
        if _is_random(datapipe):
            seed = seed_generator.generate_shared_seed() if distributed_shared else seed_generator.generate_seed()
            datapipe.set_seed(seed)


def set_graph_random_seed(datapipe: DataPipe, seed_generator: _Seeds) -> DataPipe:
    """Seed the random pipes of ``datapipe``'s graph as torchdata 0.9 does: pipes at or above a
    ``sharding_filter`` get shared seeds (so every worker sees the same order there), the others
    per-worker seeds, each group breadth-first from the sink."""
    graph = traverse_dps(datapipe)
    filters = find_dps(graph, ShardingFilterIterDataPipe)
    above: list[DataPipe] = []
    seen: set[int] = set()
    for sharding_filter in filters:
        for dp in list_dps(traverse_dps(sharding_filter)):
            if id(dp) not in seen:
                seen.add(id(dp))
                above.append(dp)
    set_datapipes_seed(above, seed_generator, distributed_shared=True)
    set_datapipes_seed(list_dps(graph, exclude_dps=filters), seed_generator, distributed_shared=False)
    return datapipe
