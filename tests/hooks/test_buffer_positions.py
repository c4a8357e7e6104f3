"""DataLoader2(buffer_state="positions"): shuffle buffers saved by upstream position, restored exactly."""

from __future__ import annotations

import functools
import logging

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.map import SequenceWrapper

import snapshot
from snapshot import InProcessReadingService
from snapshot.reading_service import MultiProcessingReadingService
from snapshot.testing import Cut, assert_resumes_exactly

OPTIONS = ["values", "positions"]


def sample(i: int) -> bytes:
    return bytes([i % 251]) * 256 + i.to_bytes(4, "little")


def odd(i: int) -> bool:
    return i % 2 == 1


def listed(n: int = 40):
    return IterableWrapper(list(range(n))).map(sample).shuffle(buffer_size=10).batch(3)


def ranged(n: int = 40):
    return IterableWrapper(range(n)).map(sample).map(len).shuffle(buffer_size=7)


def from_map_style(n: int = 30):
    converter = pytest.importorskip("torchdata.datapipes.map.util.converter")
    return converter.MapToIterConverterIterDataPipe(SequenceWrapper([sample(i) for i in range(n)])).shuffle(
        buffer_size=8)


def sharded(n: int = 48):
    return IterableWrapper(list(range(n))).map(sample).shuffle(buffer_size=9).sharding_filter().batch(2)


def filtered(n: int = 40):
    return IterableWrapper(list(range(n))).filter(odd).shuffle(buffer_size=6)


def two_shuffles(n: int = 40):
    return IterableWrapper(list(range(n))).shuffle(buffer_size=5).map(sample).shuffle(buffer_size=6)


def loader(factory, buffer_state: str, service=None):
    dl = snapshot.DataLoader2(factory(), reading_service=service() if service else None, buffer_state=buffer_state)
    dl.seed(11)
    return dl


def shuffle_record(snap, path: str):
    return snap.manifest["shards"][0]["nodes"][path]


@pytest.mark.parametrize("buffer_state", OPTIONS)
@pytest.mark.parametrize("factory", [listed, ranged, from_map_style, filtered, two_shuffles])
def test_every_cut_resumes_exactly_in_process(factory, buffer_state: str) -> None:
    assert_resumes_exactly(factory, buffer_state=buffer_state, strategies=("auto", "state"))


@pytest.mark.parametrize("buffer_state", OPTIONS)
def test_every_cut_resumes_exactly_with_workers(buffer_state: str) -> None:
    workers = functools.partial(MultiProcessingReadingService, 2, logical_shards=2)
    cuts = [Cut(0, 0), Cut(0, 7), Cut(0, 24, finished=True), Cut(1, 5), Cut(0, 4, then=9)]
    assert_resumes_exactly(sharded, reading_service=workers, buffer_state=buffer_state, cuts=cuts,
                           restore_service=functools.partial(MultiProcessingReadingService, 1, logical_shards=2))


def test_positions_from_workers_restore_in_process() -> None:
    workers = functools.partial(MultiProcessingReadingService, 2, logical_shards=2)
    assert_resumes_exactly(sharded, reading_service=workers, buffer_state="positions",
                           restore_service=functools.partial(InProcessReadingService, logical_shards=2),
                           cuts=[Cut(0, 5), Cut(1, 3)])


def test_a_buffer_by_position_holds_no_sample() -> None:
    sizes = {}
    for option in OPTIONS:
        with loader(functools.partial(listed, 400), option) as dl:
            it = iter(dl)
            next(it)
            snap = dl.save_snapshot()
            sizes[option] = shuffle_record(snap, "0/datapipe")
    assert sizes["positions"]["buffer_state"] == "positions" and sizes["values"]["buffer_state"] == "values"
    assert sizes["values"]["state_bytes"] > 10 * 260 > sizes["positions"]["state_bytes"] - 4000


def test_snapshots_restore_across_options() -> None:
    with loader(listed, "values") as dl:
        reference = list(dl)
    for saved, restored in [("values", "positions"), ("positions", "values")]:
        with loader(listed, saved) as dl:
            it = iter(dl)
            head = [next(it) for _ in range(4)]
            data = dl.save_snapshot().to_bytes()
        with loader(listed, restored) as dl:
            dl.restore_snapshot(data)
            it = iter(dl)
            middle = [next(it) for _ in range(3)]
            again = dl.save_snapshot().to_bytes()  # a values-restored buffer is partly by value
            tail = list(it)
        assert head + middle + tail == reference
        with loader(listed, restored) as dl:
            dl.restore_snapshot(again)
            assert list(dl) == tail


def test_the_samples_restored_by_value_are_counted_until_the_buffer_holds_none() -> None:
    """A buffer restored by value holds samples without a position until it has swapped them all out; each
    save says how many (the count skipped once none can come back), and saves exactly."""
    with loader(ranged, "values") as dl:
        reference = list(dl)
        it = iter(dl)
        for _ in range(3):
            next(it)
        data = dl.save_snapshot().to_bytes()
    notes, saves = [], []
    with loader(ranged, "positions") as dl:
        dl.restore_snapshot(data)
        it = iter(dl)
        for taken in range(3, 37):
            snap = dl.save_snapshot()
            notes.append(shuffle_record(snap, "0")["buffer_state"])
            saves.append((taken, snap.to_bytes()))
            next(it)
    assert notes[0] == "positions (7 samples restored by value still buffered)"
    counts = [int(n.split("(")[1].split()[0]) if "(" in n else 0 for n in notes]
    assert counts == sorted(counts, reverse=True) and counts[-1] == 0 and notes[-1] == "positions"
    for taken, saved in saves[::5] + saves[-1:]:
        with loader(ranged, "positions") as dl:
            dl.restore_snapshot(saved)
            assert list(dl) == reference[taken:]


def test_an_upstream_that_cannot_reproduce_keeps_values_and_says_why(caplog) -> None:
    with loader(filtered, "positions") as dl, caplog.at_level(logging.WARNING, logger="snapshot"):
        it = iter(dl)
        next(it)
        snap = dl.save_snapshot()
    note = shuffle_record(snap, "0")["buffer_state"]
    assert note.startswith("values: ") and "FilterIterDataPipe" in note
    assert snap.manifest["shards"][0]["plan"]["buffers"] == {"0": note}
    assert any("by value" in r.getMessage() and "FilterIterDataPipe" in r.getMessage() for r in caplog.records)


def test_unknown_buffer_state_is_refused() -> None:
    with pytest.raises(ValueError, match="'values', 'positions'"):
        snapshot.DataLoader2(listed(), buffer_state="indices")
