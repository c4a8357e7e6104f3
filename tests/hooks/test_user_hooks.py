"""User pipes: the Stateful protocol, register_state_hook (object and iterator hooks)."""

from __future__ import annotations

import pytest
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, IterableWrapper

import snapshot
from snapshot.errors import RestoreError
from snapshot.graph import Graph
from snapshot.hooks import ResumableIterator, Stateless, hook_for, register_refusal, register_state_hook
from snapshot.plan import RestoreStrategy, make_plan
from snapshot.testing import assert_resumes_exactly
from tests import graphs
from tests.helpers import HOOKED_STRATEGIES

STRATEGIES = HOOKED_STRATEGIES  # auto: the same plan as state for these (tests/helpers.py)


def test_stateful_protocol_pipe_is_restored_from_its_state() -> None:
    graph = Graph(graphs.with_stateful_pipe())
    assert make_plan(graph, {}, RestoreStrategy.STATE).replay == frozenset()
    assert hook_for(graph["0/datapipe/datapipe"].datapipe).kind == "object"
    assert_resumes_exactly(graphs.with_stateful_pipe, epochs=2, strategies=STRATEGIES)


def test_stateful_pipe_read_by_a_hookless_pipe() -> None:
    assert_resumes_exactly(graphs.stateful_behind_generator, epochs=2, strategies=("auto", "fast_forward"))


def test_restored_stateful_pipe_is_not_reset() -> None:
    dl = snapshot.DataLoader2(graphs.with_stateful_pipe())
    it = iter(dl)
    for _ in range(5):
        next(it)
    snap = dl.save_snapshot()
    state = snap.state["service"]["shards"][0]["nodes"]["0/datapipe/datapipe"]["state"]
    assert snapshot.load(snap.to_bytes()).state["service"]["shards"][0]["nodes"]["0/datapipe/datapipe"]
    assert state == {"i": 20}  # decoded as data, no pickle
    fresh = snapshot.DataLoader2(graphs.with_stateful_pipe())
    fresh.restore_snapshot(snap, strategy="state")
    counter = Graph(fresh.datapipe)["0/datapipe/datapipe"].datapipe
    assert counter._i == 20  # loaded, and reset() did not zero it


class Legacy(IterDataPipe):
    """A third-party pipe that keeps its position in an attribute but has no state methods."""

    def __init__(self, n: int):
        self.n = n
        self.position = 0

    def reset(self) -> None:
        self.position = 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield self.position * 10


register_state_hook(Legacy, state_dict=lambda dp: {"position": dp.position},
                    load_state_dict=lambda dp, state: setattr(dp, "position", state["position"]))


def legacy_graph():
    return Batcher(Legacy(23), 4)


class Refusable(Legacy):
    """Legacy with a hook of its own (object hooks are not inherited), and a refusal registered by a test."""


register_state_hook(Refusable, state_dict=lambda dp: {"position": dp.position},
                    load_state_dict=lambda dp, state: setattr(dp, "position", state["position"]))


def test_a_refusal_registered_after_a_restore_stops_the_next_restore_of_the_same_loader() -> None:
    saver = snapshot.DataLoader2(Batcher(Refusable(23), 4))
    it = iter(saver)
    next(it)
    snap = saver.save_snapshot()
    rest = list(it)
    loader = snapshot.DataLoader2(Batcher(Refusable(23), 4))
    loader.restore_snapshot(snap, strategy="state")  # its graph keeps what the hooks said of it...
    assert list(loader) == rest
    register_refusal(Refusable, lambda dp: "refused after the loader was built", when="in this test")
    with pytest.raises(RestoreError, match="0/datapipe: .*refused after the loader was built"):
        loader.restore_snapshot(snap, strategy="state")  # ...until a hook or a refusal is registered


def test_object_hook_for_a_class_you_cannot_edit() -> None:
    assert hook_for(Legacy(3)).kind == "object"
    assert_resumes_exactly(legacy_graph, epochs=2, strategies=STRATEGIES)


class Pairs(IterDataPipe):
    """A generator pipe: pairs consecutive samples (its position is in its generator)."""

    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        it = iter(self.datapipe)
        for first in it:
            yield first, next(it, None)


class PairsIterator(Stateless):
    def next(self):
        first = next(self.inputs[0])
        return first, next(self.inputs[0], None)


class PairsWithoutHook(Pairs):
    def __iter__(self):
        yield from super().__iter__()


register_state_hook(Pairs, PairsIterator)


def pairs_graph(cls=Pairs):
    return Batcher(cls(IterableWrapper(range(25)).shuffle(buffer_size=4)), 3)


def test_iterator_hook_for_a_generator_pipe() -> None:
    graph = Graph(pairs_graph())
    assert make_plan(graph, {}, RestoreStrategy.STATE).replay == frozenset()
    assert_resumes_exactly(pairs_graph, epochs=2, strategies=STRATEGIES)


def test_a_subclass_that_overrides_iter_does_not_inherit_the_hook() -> None:
    assert hook_for(PairsWithoutHook(IterableWrapper([1]))) is None


def test_registration_errors() -> None:
    with pytest.raises(TypeError, match="either iterator"):
        register_state_hook(Pairs)
    with pytest.raises(TypeError, match="both state_dict"):
        register_state_hook(Legacy, state_dict=lambda dp: {})
    with pytest.raises(TypeError, match="ResumableIterator subclass"):
        register_state_hook(Pairs, iterator=object)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replace=True"):
        register_state_hook(Pairs, PairsIterator)
    with pytest.raises(TypeError, match="needs a class"):
        register_state_hook(Pairs(IterableWrapper([])), PairsIterator)  # type: ignore[arg-type]


class Unpicklable(ResumableIterator):
    def next(self):
        return next(self.inputs[0])

    def get_state(self):
        return {"handle": (i for i in range(1))}  # a generator cannot be pickled

    def set_state(self, state):
        pass


class BadPipe(Pairs):
    pass


register_state_hook(BadPipe, Unpicklable)


def test_a_state_that_cannot_be_pickled_names_the_node() -> None:
    dl = snapshot.DataLoader2(Batcher(BadPipe(IterableWrapper(range(9))), 2))
    next(iter(dl))
    with pytest.raises(snapshot.SerializationError, match="state of the DataPipe at 0/datapipe"):
        dl.save_snapshot()
