"""Reference streams from torch's own DataPipe code (no hooks), seeded like the loader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from snapshot.graph import Graph
from snapshot.randomness import SeedGenerator, epoch_seeds


def native_epochs(factory: Callable[[], Any], seed: int = 0, epochs: int = 2) -> list[list[Any]]:
    """Iterate ``factory()`` with plain ``iter()``: the pipes' own generators, same seeds."""
    datapipe = factory()
    graph = Graph(datapipe)
    generator = SeedGenerator(seed)
    out = []
    for _ in range(epochs):
        for path, value in epoch_seeds(generator, graph).for_shard(0).items():
            graph[path].datapipe.set_seed(value)
        out.append(list(datapipe))
    return out


def hooked_epochs(factory: Callable[[], Any], seed: int = 0, epochs: int = 2) -> list[list[Any]]:
    import snapshot

    with snapshot.DataLoader2(factory()) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(epochs)]
