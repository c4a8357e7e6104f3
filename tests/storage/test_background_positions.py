"""save_snapshot(blocking=False) of buffers saved by position: what the hooks made for the capture is taken as it
is (no walk, no copy), every sample still held by value is staged, and the file is the synchronous save's."""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from typing import Any

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import snapshot
from snapshot.container import format
from snapshot.hooks import _fresh
from snapshot.loader import _save
from snapshot.storage import _staging


def tensor(i: int) -> torch.Tensor:
    return torch.full((4,), float(i))


def bump(t: torch.Tensor) -> torch.Tensor:
    t.add_(1000)  # a training step that changes its batch in place
    return t


def tensors(n: int = 40) -> Any:
    return IterableWrapper(range(n)).map(tensor).shuffle(buffer_size=10).map(bump)


def indexed(n: int = 60) -> Any:
    return IterableWrapper(list(range(n))).map(str).shuffle(buffer_size=16).batch(2)


def gzip_lines(root: str) -> Any:
    from torch.utils.data.datapipes.iter import Shuffler

    from tests import file_corpus

    return Shuffler(file_corpus.gzip_lines(root), buffer_size=6)  # keys: dicts of file, offset and line


def loader(factory: Any, buffer_state: str = "positions") -> snapshot.DataLoader2[Any]:
    dl = snapshot.DataLoader2(factory(), buffer_state=buffer_state)
    dl.seed(5)
    return dl


def shuffle_state(service: Any) -> dict[str, Any]:
    """The state of the shuffle in a service's record (a capture's ``service``, a snapshot's ``state["service"]``;
    a background capture leaves the record's dicts to its save's thread: made here)."""
    if isinstance(service, _fresh.Later):
        service = service.make()
    (state,) = [r["state"] for r in service["shards"][0]["nodes"].values()
                if isinstance(r["state"], dict) and "positions" in r["state"]]
    return state


@pytest.fixture
def corpus(tmp_path: Any) -> str:
    pytest.importorskip("torchdata.datapipes.iter")
    from tests import file_corpus

    return file_corpus.write_corpus(str(tmp_path / "corpus"))


def test_staging_takes_what_the_capture_said_fresh_as_it_is_and_copies_the_rest() -> None:
    keys, sample = [3, 1, 2], torch.zeros(2)
    with _fresh.collecting() as fresh:
        state = {"positions": _fresh.fresh(keys), "buffer": [sample, None], "rng": [1, [2, 3]]}
    staged = _staging.stage(state, fresh)
    assert staged["positions"] is keys  # no walk, no copy
    assert staged["buffer"] is not state["buffer"] and staged["rng"][1] is not state["rng"][1]
    sample.add_(1)
    assert torch.equal(staged["buffer"][0], torch.zeros(2))
    assert _fresh.fresh([1]) and not fresh.keys() - {id(keys)}  # outside a capture nothing is kept


def test_a_capture_says_fresh_the_positions_and_not_the_samples_held_by_value() -> None:
    with loader(tensors, "values") as dl:
        it = iter(dl)
        for _ in range(3):
            next(it)
        by_value = dl.save_snapshot().to_bytes()
    with loader(tensors) as dl:
        it = iter(dl)
        for _ in range(3):
            next(it)
        with _fresh.collecting() as fresh:
            state = shuffle_state(dl._saver.source(include_graph=False).service)
        assert {id(state["positions"]), id(state["buffer"]), id(state["rng"])} <= fresh.keys()
        with _fresh.collecting() as fresh:
            assert id(dl._saver.source(include_graph=False).generator) in fresh  # new dicts and lists of ints
        dl.restore_snapshot(by_value)  # the buffer holds its samples by value until they are swapped out
        next(iter(dl))
        with _fresh.collecting() as fresh:
            state = shuffle_state(dl._saver.source(include_graph=False).service)
        assert id(state["positions"]) in fresh and id(state["buffer"]) not in fresh
        assert sum(isinstance(x, torch.Tensor) for x in state["buffer"]) == 9


def test_samples_held_by_value_are_staged_while_the_graph_changes_them(tmp_path: Any, monkeypatch: Any) -> None:
    """A positions buffer restored by value holds tensors that the pipe after it changes in place once they
    leave the buffer: the save, held until the loader has taken (and changed) them all, writes them as they were."""
    with loader(tensors, "values") as dl:
        it = iter(dl)
        for _ in range(3):
            next(it)
        by_value = dl.save_snapshot().to_bytes()
    hold, write = threading.Event(), _save.write

    def held(*args: Any, **kwargs: Any) -> Any:
        assert hold.wait(60), "the test never let the save go on"
        return write(*args, **kwargs)

    monkeypatch.setattr(_save, "write", held)
    with loader(tensors) as dl:
        dl.restore_snapshot(by_value)
        it = iter(dl)
        taken = [next(it).clone() for _ in range(2)]
        future = dl.save_snapshot(tmp_path / "bg.snap", blocking=False)
        rest = [x.clone() for x in it]  # every buffered sample leaves the buffer and is changed in place
        hold.set()
        future.result(timeout=60)
    assert all(float(x.min()) >= 1000 for x in taken + rest)
    saved = shuffle_state(snapshot.load(tmp_path / "bg.snap").state["service"])
    held_by_value = [x for x in saved["buffer"] if x is not None]
    assert len(held_by_value) == 8 and all(float(x.max()) < 40 for x in held_by_value)
    with snapshot.DataLoader2(tensors(), buffer_state="positions") as dl:
        dl.restore_snapshot(tmp_path / "bg.snap")
        assert [x.tolist() for x in dl] == [x.tolist() for x in rest]


@pytest.mark.parametrize("source", ["indexed", "gzip_lines"])
def test_a_background_save_by_position_writes_what_a_synchronous_save_writes(tmp_path: Any, source: str,
                                                                            request: Any) -> None:
    factory = indexed if source == "indexed" else functools.partial(gzip_lines, request.getfixturevalue("corpus"))
    with loader(factory) as dl:
        reference = list(dl)
    with loader(factory) as dl:
        it = iter(dl)
        head = [next(it) for _ in range(5)]
        dl.save_snapshot(tmp_path / "sync.snap")
        future = dl.save_snapshot(tmp_path / "bg.snap", blocking=False)
        rest = list(it)  # the graph goes on while the save is written
        assert future.result(timeout=60) == os.fspath(tmp_path / "bg.snap")
    assert head + rest == reference
    sync, bg = (format.unpack((tmp_path / name).read_bytes()) for name in ("sync.snap", "bg.snap"))
    assert bg.payload == sync.payload
    assert {**bg.manifest, "created": None} == {**sync.manifest, "created": None}
    assert shuffle_state(snapshot.load(tmp_path / "bg.snap").state["service"])["positions"]  # saved by position
    with snapshot.DataLoader2(factory(), buffer_state="positions") as dl:
        dl.restore_snapshot(tmp_path / "bg.snap")
        assert list(dl) == rest


def test_a_value_left_for_later_is_made_in_the_save_s_thread_where_the_staging_put_it() -> None:
    @dataclasses.dataclass
    class Record:
        nodes: dict[str, Any]

    assert _fresh.later(lambda: [1, 2]) == [1, 2]  # outside a capture: made at once
    with _fresh.collecting() as fresh:
        state = Record({"a": [{"positions": _fresh.later(lambda: [7, 8])}, _fresh.later(lambda: "x")]})
    assert isinstance(state.nodes["a"][0]["positions"], _fresh.Later)
    staged = _staging.stage(state, fresh)
    fresh.make_later(staged)
    assert staged.nodes == {"a": [{"positions": [7, 8]}, "x"]}
    with _fresh.collecting() as fresh:
        state = Record({"a": (_fresh.later(list),)})  # a tuple cannot take the value made
    with pytest.raises(RuntimeError, match="1 value"):
        fresh.make_later(_staging.stage(state, fresh))


def test_what_a_capture_left_for_later_is_made_while_the_loader_goes_on_and_the_file_is_the_call_s(
        tmp_path: Any, monkeypatch: Any) -> None:
    """The shuffle's list of None (one per position) is made in the save's thread, held here until the loader
    has finished its epoch and drawn the next one's seeds: the file is a synchronous save's at the call."""
    with loader(indexed) as dl:
        reference = list(dl)
    hold, make_later = threading.Event(), _fresh.Collected.make_later

    def held(self: Any, value: Any) -> None:
        assert hold.wait(60), "the test never let the save go on"
        make_later(self, value)

    monkeypatch.setattr(_fresh.Collected, "make_later", held)
    with loader(indexed) as dl:
        it = iter(dl)
        head = [next(it) for _ in range(5)]
        dl.save_snapshot(tmp_path / "sync.snap")
        future = dl.save_snapshot(tmp_path / "bg.snap", blocking=False)
        rest = list(it)  # every buffered position is replaced or popped
        generator = dl._saver.position.generator.state()
        next(iter(dl))  # the next epoch draws its seeds: the loader's generator moves on
        assert dl._saver.position.generator.state() != generator
        hold.set()
        assert future.result(timeout=60) == os.fspath(tmp_path / "bg.snap")
    assert head + rest == reference
    sync, bg = (format.unpack((tmp_path / name).read_bytes()) for name in ("sync.snap", "bg.snap"))
    assert bg.payload == sync.payload
    saved = shuffle_state(snapshot.load(tmp_path / "bg.snap").state["service"])
    assert len(saved["positions"]) == 16 and saved["buffer"] == [None] * 16
    with snapshot.DataLoader2(indexed(), buffer_state="positions") as dl:
        dl.restore_snapshot(tmp_path / "bg.snap")
        assert list(dl) == rest
        dl.restore_snapshot(tmp_path / "bg.snap")
        it = iter(dl)
        again = [next(it) for _ in range(3)]
        later = dl.save_snapshot(tmp_path / "again.snap", blocking=False)
        again += list(it)
        later.result(timeout=60)
        assert again == rest
        dl.restore_snapshot(tmp_path / "again.snap")
        assert list(dl) == rest[3:]


def test_a_synchronous_capture_makes_at_once_what_a_background_one_leaves_for_later() -> None:
    with loader(indexed) as dl:
        it = iter(dl)
        next(it)
        state = shuffle_state(dl._saver.source(include_graph=False).service)
        assert state["buffer"] == [None] * 16 and len(state["positions"]) == 16
        with _fresh.collecting() as fresh:
            later = shuffle_state(dl._saver.source(include_graph=False).service)
        assert isinstance(later["buffer"], _fresh.Later) and fresh.later == 1
        assert later["positions"] == state["positions"]
