"""Graph layer: deterministic traversal, stable paths, fingerprints, shared nodes."""

from __future__ import annotations

import pytest
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper, Mapper, Shuffler, Zipper

from snapshot.engine import _tokens
from snapshot.graph import Graph, compare_nodes
from tests import graphs


def paths(dp: object) -> list[str]:
    return [n.path for n in Graph(dp)]


def test_chain_paths_follow_input_attributes() -> None:
    assert paths(graphs.linear()) == [
        "0", "0/datapipe", "0/datapipe/datapipe", "0/datapipe/datapipe/datapipe",
        "0/datapipe/datapipe/datapipe/datapipe",
    ]


def test_multi_input_paths_carry_the_index() -> None:
    dp = Zipper(IterableWrapper([1]), IterableWrapper([2]), IterableWrapper([3]))
    assert paths(dp) == ["0", "0/datapipes/0", "0/datapipes/1", "0/datapipes/2"]


def test_shared_container_is_visited_once_with_all_consumers() -> None:
    graph = Graph(graphs.combining())
    containers = [n for n in graph if n.type.endswith("_ForkerIterDataPipe")]
    assert len(containers) == 1
    fork = containers[0]
    assert len(fork.consumers) == 3
    assert all(graph[c].type.endswith("_ChildDataPipe") for c in fork.consumers)
    assert len({n.path for n in graph}) == len(graph)


def test_rebuilt_graph_has_identical_paths_and_fingerprints() -> None:
    for factory in (graphs.linear, graphs.linear_lambdas, graphs.combining, graphs.grouped):
        a, b = Graph(factory()), Graph(factory())
        assert [(n.path, n.fingerprint, n.inputs) for n in a] == \
            [(n.path, n.fingerprint, n.inputs) for n in b]
        assert a.fingerprint == b.fingerprint
        assert compare_nodes(a.describe(), b) == []


@pytest.mark.parametrize("changed", [
    lambda: Batcher(Mapper(Shuffler(IterableWrapper(range(10)), buffer_size=6), graphs.double), 4),
    lambda: Batcher(Mapper(Shuffler(IterableWrapper(range(10)), buffer_size=5), graphs.mod3), 4),
    lambda: Batcher(Mapper(Shuffler(IterableWrapper(range(10)), buffer_size=5), graphs.double), 3),
    lambda: Batcher(Mapper(Shuffler(IterableWrapper(range(11)), buffer_size=5), graphs.double), 4),
    lambda: Batcher(Shuffler(IterableWrapper(range(10)), buffer_size=5), 4),
])
def test_fingerprint_sees_changed_arguments_and_structure(changed: object) -> None:
    base = Batcher(Mapper(Shuffler(IterableWrapper(range(10)), buffer_size=5), graphs.double), 4)
    saved = Graph(base)
    current = Graph(changed())  # type: ignore[operator]
    assert saved.fingerprint != current.fingerprint
    assert compare_nodes(saved.describe(), current)


def test_compare_nodes_names_the_node_and_both_versions() -> None:
    saved = Graph(Batcher(Shuffler(IterableWrapper(range(10)), buffer_size=5), 4)).describe()
    diffs = compare_nodes(saved, Graph(Batcher(Shuffler(IterableWrapper(range(10)), buffer_size=9), 4)))
    assert len(diffs) == 1
    assert diffs[0].path == "0/datapipe"
    assert "buffer_size=5" in diffs[0].saved and "buffer_size=9" in diffs[0].current


def test_large_sources_are_fingerprinted_by_length_and_sample() -> None:
    big = list(range(2_000_000))
    node = Graph(IterableWrapper(big))["0"]
    assert node.args["iterable"].startswith("list[2000000]:")
    big[-1] = -1
    assert Graph(IterableWrapper(big))["0"].fingerprint != node.fingerprint


def test_fingerprints_carry_no_addresses() -> None:
    class Opaque:
        pass

    node = Graph(Mapper(IterableWrapper([Opaque()]), graphs.double))
    for n in node:
        for value in n.args.values():
            assert "0x" not in value


def test_bfs_order_matches_torchdata() -> None:
    pytest.importorskip("torchdata")
    from torchdata.dataloader2.graph import list_dps, traverse_dps

    for factory in (graphs.linear, graphs.combining, graphs.grouped, graphs.sharded):
        dp = factory()
        graph = Graph(dp)
        ours = [graph[p].datapipe for p in graph.bfs()]
        theirs = list_dps(traverse_dps(dp))
        assert [id(x) for x in ours] == [id(x) for x in theirs]


def test_ancestors() -> None:
    graph = Graph(graphs.linear())
    assert graph.ancestors("0/datapipe/datapipe") == [
        "0/datapipe/datapipe", "0/datapipe/datapipe/datapipe", "0/datapipe/datapipe/datapipe/datapipe"]


class _Forwarding(IterableWrapper):
    """A pipe whose own ``__getattr__`` answers names its class lacks (forwards them to an inner object)."""

    def __init__(self, inner: object) -> None:
        super().__init__(range(3))
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class _Sharded:
    def apply_sharding(self, count: int, shard: int) -> None:
        pass


class _Described(IterableWrapper):
    @property
    def label(self) -> str:
        return "from the class"


def test_attribute_answers_as_getattr_does() -> None:
    """The graph's probes skip torch's refusing ``__getattr__``, and nothing else: instance and class
    attributes, descriptors, torch's functional names and a pipe's own ``__getattr__`` read as getattr."""
    from snapshot.engine._tokens import attribute
    from snapshot.engine.sharding import is_sharding_point

    plain, described, forwarding = IterableWrapper(range(3)), _Described(range(3)), _Forwarding(_Sharded())
    missing = object()
    cases = [(plain, "iterable"), (plain, "deepcopy"), (plain, "no_such_name"), (plain, "map"),
             (plain, "_fast_forward_iterator"), (described, "label"), (forwarding, "apply_sharding"),
             (forwarding, "no_such_name"), (Mapper(plain, abs), "fn"), (Mapper(plain, abs), "unbatch_level")]
    for obj, name in cases:
        expected, got = getattr(obj, name, missing), attribute(obj, name, missing)
        assert type(got) is type(expected) and (got is missing) == (expected is missing), (obj, name)
        if not callable(expected):
            assert got == expected, (obj, name)
    assert is_sharding_point(forwarding) and not is_sharding_point(plain)


def test_the_types_known_not_to_be_datapipes_are_not_and_a_pipe_still_is() -> None:
    known = [t for t, is_pipe in _tokens._DATAPIPE_TYPES.items() if not is_pipe]
    assert range in known and dict in known  # the first check of each costs a walk of torch's subclasses
    assert not any(issubclass(t, (IterDataPipe, MapDataPipe)) for t in known)
    assert _tokens._is_datapipe(IterableWrapper(range(3))) and not _tokens._is_datapipe(range(3))
