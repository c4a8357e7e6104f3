"""The layouts a capture plans with are made when the epoch starts, not in the first save's blocking part; they
are made again when hooks are registered during the epoch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.hooks import _registry
from snapshot.reading_service._shards import engine


class Plain(IterDataPipe):  # type: ignore[misc]
    """A generator of its own: no hook (replayed), until one is registered."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __iter__(self) -> Iterator[Any]:
        yield from self.source


def graph() -> Any:
    return Plain(IterableWrapper(range(30)).shuffle(buffer_size=8)).map(str)


def shard_plan(snap: snapshot.Snapshot) -> dict[str, Any]:
    return snap.state["service"]["shards"][0]["plan"]


def test_an_epoch_start_makes_the_layouts_and_a_save_plans_with_them(monkeypatch: Any) -> None:
    made = []
    monkeypatch.setattr(engine, "shard_layout", lambda *args: made.append(args) or engine.plan_layout(
        args[0], args[2], sinks=[args[1].shard_sink], ports=frozenset(args[1].routers)))
    with snapshot.DataLoader2(graph(), buffer_state="positions") as dl:
        dl.seed(1)
        it = iter(dl)
        head = [next(it) for _ in range(4)]
        assert len(made) == 1  # at the epoch's start
        snap = dl.save_snapshot()
        assert len(made) == 1
        rest = list(it)
    assert shard_plan(snap)["replayed_nodes"]  # Plain, and what it reads, replayed
    with snapshot.DataLoader2(graph(), buffer_state="positions") as dl:
        dl.seed(1)
        assert list(dl) == head + rest
        dl.restore_snapshot(snap)
        assert list(dl) == rest


def test_a_hook_registered_during_the_epoch_is_planned_with_by_the_next_save() -> None:
    with snapshot.DataLoader2(graph(), buffer_state="positions") as dl:
        dl.seed(1)
        it = iter(dl)
        head = [next(it) for _ in range(4)]
        try:
            snapshot.register_state_hook(Plain, snapshot.hooks.Itemwise)
            snap = dl.save_snapshot()
        finally:
            _registry._HOOKS.pop(Plain, None)
            _registry._changed()
        rest = list(it)
        assert not shard_plan(snap)["replayed_nodes"]  # every node from its state
        snapshot.register_state_hook(Plain, snapshot.hooks.Itemwise)
        try:
            dl.restore_snapshot(snap)
            assert list(dl) == rest
        finally:
            _registry._HOOKS.pop(Plain, None)
            _registry._changed()
    assert len(head + rest) == 30
