"""Seeds: Philox streams, plain-data state, per-node epoch seeds."""

from __future__ import annotations

import json

import pytest

from snapshot.graph import Graph
from snapshot.randomness import SeedGenerator, epoch_seeds
from tests import graphs


@pytest.mark.parametrize("seed", [0, 1, 42, 2**63, 2**64 - 1])
def test_matches_torchdata_seed_generator(seed: int) -> None:
    pytest.importorskip("torchdata")
    from torchdata.dataloader2.random import SeedGenerator as Reference

    ours, theirs = SeedGenerator(seed), Reference(seed)
    for _ in range(5):
        assert ours.generate_shared_seed() == theirs.generate_shared_seed()
        assert ours.generate_seed() == theirs.generate_seed()
    for worker in range(4):
        a, b = ours.spawn(worker), theirs.spawn(worker)
        assert [a.generate_seed() for _ in range(3)] == [b.generate_seed() for _ in range(3)]


def test_state_is_json_and_resumes_the_sequence() -> None:
    gen = SeedGenerator(7)
    gen.generate_seed()
    gen.generate_shared_seed()
    state = json.loads(json.dumps(gen.state()))
    copy = SeedGenerator.from_state(state)
    assert [gen.generate_seed() for _ in range(5)] == [copy.generate_seed() for _ in range(5)]
    assert gen.generate_shared_seed() == copy.generate_shared_seed()


def test_epoch_seeds_split_at_the_sharding_point() -> None:
    graph = Graph(graphs.sharded())
    seeds = epoch_seeds(SeedGenerator(3), graph)
    shuffles = [n.path for n in graph if n.type.endswith("ShufflerIterDataPipe")]
    above = [p for p in shuffles if p.count("/") > 2]
    below = [p for p in shuffles if p not in above]
    assert set(seeds.shared) == set(above)
    assert set(seeds.shards[0]) == set(below)


def test_logical_shards_get_distinct_reproducible_seeds() -> None:
    graph = Graph(graphs.sharded())
    a = epoch_seeds(SeedGenerator(3), graph, logical_shards=4)
    b = epoch_seeds(SeedGenerator(3), graph, logical_shards=4)
    assert a.state() == b.state()
    per_shard = [tuple(s.values()) for s in a.shards]
    assert len(set(per_shard)) == 4
    assert all(s.keys() == a.shards[0].keys() for s in a.shards)


def test_consecutive_epochs_differ() -> None:
    graph = Graph(graphs.linear())
    gen = SeedGenerator(11)
    first, second = epoch_seeds(gen, graph), epoch_seeds(gen, graph)
    assert first.state() != second.state()
