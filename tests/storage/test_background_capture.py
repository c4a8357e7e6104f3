"""save_snapshot(blocking=False): what the capture defers to the save's thread (the service record's dicts, made
from the taken values) writes the position at the call, whatever the loader, a user pipe or the training step
changes afterwards: a user pipe's live state, samples queued at a sharding point or in flight from workers."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.container import format
from snapshot.hooks import _fresh


class LiveCounter(IterDataPipe):
    """A user pipe (the torchdata Stateful protocol) whose ``state_dict`` returns its live dict and list, which
    it keeps changing in place as it yields."""

    def __init__(self, n: int):
        self.n = n
        self._state: dict[str, Any] = {"i": 0, "seen": []}

    def reset(self) -> None:
        self._state = {"i": 0, "seen": []}

    def __iter__(self) -> Any:
        state = self._state
        while state["i"] < self.n:
            i = state["i"]
            state["i"] += 1
            state["seen"].append(i)
            yield i

    def state_dict(self) -> dict[str, Any]:
        return self._state  # live: no copy

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = {"i": state["i"], "seen": list(state["seen"])}


def boxed(i: int) -> list[int]:
    return [i]  # a mutable sample: the training step below changes it in place


def live(n: int = 40) -> Any:
    return LiveCounter(n).map(boxed).shuffle(buffer_size=5)


def sharded(n: int = 40) -> Any:
    # the filter drops more of one shard's samples than of the other's: the router queues the other's
    return LiveCounter(n).map(boxed).shuffle(buffer_size=5).sharding_filter().filter(kept).map(boxed).map(unbox)


def kept(x: list[int]) -> bool:
    return x[0] % 3 != 0


def unbox(x: list[list[int]]) -> list[int]:
    return x[0]


def dispatched(n: int = 40) -> Any:
    """The part above the dispatcher (the user pipe) runs in the main process, the rest in the workers."""
    from torch.utils.data.datapipes.iter.sharding import SHARDING_PRIORITIES

    dispatcher = pytest.importorskip("torchdata.datapipes.iter").ShardingRoundRobinDispatcher
    return dispatcher(LiveCounter(n).map(boxed).shuffle(buffer_size=5), SHARDING_PRIORITIES.MULTIPROCESSING)


def indexed(n: int = 60) -> Any:
    return IterableWrapper(range(n)).map(boxed).shuffle(buffer_size=8).sharding_filter()


CASES = {
    "user pipe": (live, lambda: None),
    "sharding point": (sharded, lambda: snapshot.InProcessReadingService(logical_shards=2)),
    "2 workers": (sharded, lambda: snapshot.MultiProcessingReadingService(num_workers=2, timeout=60)),
    "2 workers, dispatcher": (dispatched, lambda: snapshot.MultiProcessingReadingService(num_workers=2, timeout=60)),
    "2 workers, positions": (indexed, lambda: snapshot.MultiProcessingReadingService(num_workers=2, timeout=60)),
}


def loader(case: str) -> snapshot.DataLoader2[Any]:
    factory, service = CASES[case]
    dl = snapshot.DataLoader2(factory(), reading_service=service(), buffer_state="positions")
    dl.seed(3)
    return dl


@pytest.fixture
def held(monkeypatch: Any) -> threading.Event:
    """Holds a background save in its thread, before it makes what the capture left for later (the service
    record's dicts), until the event is set."""
    hold, make_later = threading.Event(), _fresh.Collected.make_later

    def wait_then_make(self: Any, value: Any) -> None:
        assert hold.wait(60), "the test never let the save go on"
        make_later(self, value)

    monkeypatch.setattr(_fresh.Collected, "make_later", wait_then_make)
    return hold


@pytest.mark.parametrize("verify", [0, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_a_held_background_save_writes_the_position_at_the_call(tmp_path: Any, held: threading.Event,
                                                                 case: str, verify: int) -> None:
    """``verify``: the graph computes samples ahead after the capture, on the loader's thread."""
    with loader(case) as dl:
        reference = [list(x) for x in dl]
    with loader(case) as dl:
        it = iter(dl)
        head = [list(next(it)) for _ in range(7)]
        dl.save_snapshot(tmp_path / "sync.snap", verify=verify)
        future = dl.save_snapshot(tmp_path / "bg.snap", blocking=False, verify=verify)
        rest = []
        for x in it:  # the user pipe's state and the samples change while the save waits
            rest.append(list(x))
            x.append(-1)  # the training step changes its sample in place
        next(iter(dl))  # and the loader starts its next epoch
        held.set()
        assert future.result(timeout=60) == os.fspath(tmp_path / "bg.snap")
    assert head + rest == reference
    if "workers" not in case and not verify:  # (workers run on between two captures, and so does a graph that
        # computed samples ahead for the first: their states differ, both exact)
        sync, bg = (format.unpack((tmp_path / name).read_bytes()) for name in ("sync.snap", "bg.snap"))
        assert bg.payload == sync.payload
    for name in ("sync.snap", "bg.snap"):
        with loader(case) as dl:
            dl.restore_snapshot(tmp_path / name)
            assert [list(x) for x in dl] == rest, name


def test_the_service_record_is_left_for_the_save_s_thread_with_the_user_state_copied() -> None:
    with loader("sharding point") as dl:
        it = iter(dl)
        for _ in range(5):
            next(it)
        with _fresh.collecting() as fresh:
            assert isinstance(dl._saver.source(include_graph=False).service, dict)  # asked by another than the loader
        with _fresh.collecting() as fresh:
            fresh.service = dl._saver.service.service  # the loader asks it
            source = dl._saver.source(include_graph=False)
        assert isinstance(source.service, _fresh.Later) and id(source.service) in fresh
        pipe = dl._saver.graph.require().sink
        while not isinstance(pipe, LiveCounter):
            pipe = pipe.datapipe if hasattr(pipe, "datapipe") else pipe.source_datapipe
        service = source.service.make()
        (state,) = [r["state"] for u in service["upstream"] for r in u["nodes"].values()
                    if isinstance(r["state"], dict) and "seen" in r["state"]]
        assert state == pipe._state and state is not pipe._state and state["seen"] is not pipe._state["seen"]


class Noted(snapshot.InProcessReadingService):
    """A user's service that adds to the checkpoint dict of the service it extends."""

    def checkpoint(self) -> Any:
        state = super().checkpoint()
        state["note"] = "kept"
        return state


def test_a_service_that_changes_the_checkpoint_it_extends_gets_the_dict(tmp_path: Any) -> None:
    with snapshot.DataLoader2(indexed(), reading_service=Noted(), buffer_state="positions") as dl:
        it = iter(dl)
        for _ in range(4):
            next(it)
        dl.save_snapshot(tmp_path / "sync.snap")
        dl.save_snapshot(tmp_path / "bg.snap", blocking=False).result(timeout=60)
    sync, bg = (format.unpack((tmp_path / name).read_bytes()) for name in ("sync.snap", "bg.snap"))
    assert bg.payload == sync.payload and snapshot.load(tmp_path / "bg.snap").state["service"]["note"] == "kept"


def tensor(i: int) -> torch.Tensor:
    return torch.full((2,), float(i))


def bump(t: torch.Tensor) -> torch.Tensor:
    t.add_(1000)  # a pipe below the buffer that changes its sample in place
    return t


@pytest.mark.parametrize("blocking", [True, False])
def test_a_save_with_verify_writes_the_buffer_as_it_was_before_the_graph_computed_ahead(tmp_path: Any,
                                                                                        blocking: bool) -> None:
    """``verify`` computes samples ahead after the capture: the samples it takes out of the buffer are changed
    in place below it, and the file holds them as they were at the call."""
    def graph() -> Any:
        return IterableWrapper(range(30)).map(tensor).shuffle(buffer_size=8).map(bump)

    with snapshot.DataLoader2(graph(), buffer_state="values") as dl:
        dl.seed(1)
        it = iter(dl)
        for _ in range(3):
            next(it)
        saved = dl.save_snapshot(tmp_path / "v.snap", blocking=blocking, verify=2)
        if not blocking:
            saved.result(timeout=60)
        rest = [x.tolist() for x in it]
    with snapshot.DataLoader2(graph(), buffer_state="values") as dl:
        dl.restore_snapshot(tmp_path / "v.snap")
        assert [x.tolist() for x in dl] == rest
