"""Error paths: each bad input is a SnapshotError subclass whose message says what and where."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data.datapipes.iter import Batcher, FileLister, IterableWrapper, Mapper, Shuffler

import snapshot
from snapshot.errors import __doc__ as errors_doc
from tests import graphs, helpers


def test_hierarchy_is_drawn_in_the_module_docstring() -> None:
    import snapshot.errors as errors

    for name in errors.__all__:
        assert name in errors_doc, name


def snap_of(factory, samples: int = 3) -> snapshot.Snapshot:
    return helpers.snapshot_after(factory, samples, seed=0)


def test_graph_mismatch_names_the_node_and_both_versions() -> None:
    def build(buffer_size: int):
        shuffled = Shuffler(IterableWrapper(range(30)), buffer_size=buffer_size)
        return Batcher(Mapper(shuffled, graphs.double), 4)

    snap = snap_of(lambda: build(5))
    dl = snapshot.DataLoader2(build(8))
    with pytest.raises(snapshot.GraphMismatchError) as info:
        dl.restore_snapshot(snap)
    message = str(info.value)
    assert "at 0/datapipe/datapipe:" in message
    assert "in snapshot: ShufflerIterDataPipe(buffer_size=5)" in message
    assert "in loader:   ShufflerIterDataPipe(buffer_size=8)" in message
    assert "from_snapshot" in message
    assert info.value.differences == [("0/datapipe/datapipe", "ShufflerIterDataPipe(buffer_size=5)",
                                       "ShufflerIterDataPipe(buffer_size=8)")]


def test_graph_mismatch_lists_missing_and_extra_nodes() -> None:
    snap = snap_of(graphs.linear)
    with pytest.raises(snapshot.GraphMismatchError) as info:
        snapshot.DataLoader2(Batcher(IterableWrapper(range(47)), 4)).restore_snapshot(snap)
    message = str(info.value)
    assert "(no node at this path)" in message
    assert "differences" in message


def test_mismatch_leaves_the_loader_untouched() -> None:
    snap = snap_of(graphs.linear)
    dl = snapshot.DataLoader2(Batcher(IterableWrapper(range(8)), 4))
    with pytest.raises(snapshot.GraphMismatchError):
        dl.restore_snapshot(snap)
    assert list(dl) == [[0, 1, 2, 3], [4, 5, 6, 7]]


class Lines:
    """An iterable whose content lives in a file (so the graph's fingerprint cannot see it)."""

    def __init__(self, path: str):
        self.path = path

    def __iter__(self):
        with open(self.path) as f:
            yield from (line.strip() for line in f)


def test_a_position_beyond_the_data(tmp_path) -> None:
    data = tmp_path / "lines.txt"
    data.write_text("".join(f"{i}\n" for i in range(20)))

    def factory():
        return Batcher(IterableWrapper(Lines(str(data))), 2)

    snap = snap_of(factory, samples=6)
    data.write_text("".join(f"{i}\n" for i in range(5)))
    for strategy, expected in (("state", "item 12 of the IterableWrapper's iterable, which now ends "
                                         "after 5 items"),
                               ("fast_forward", "sample 6 of the DataPipe at 0")):
        with pytest.raises(snapshot.PositionError) as info:
            snapshot.DataLoader2(factory()).restore_snapshot(snap, strategy=strategy)
        message = str(info.value)
        assert expected in message, message
        assert "data" in message and "snapshot" in message


def test_file_names_listed_before_the_snapshot_are_kept(tmp_path) -> None:
    """FileLister's pending names are state: removing files later does not change the stream."""
    root = tmp_path / "files"
    root.mkdir()
    for i in range(10):
        (root / f"{i}.txt").write_text(str(i))

    def factory():
        return Batcher(FileLister(str(root), "*.txt"), 2)

    dl = snapshot.DataLoader2(factory())
    it = iter(dl)
    next(it)
    snap = dl.save_snapshot()
    rest = list(it)
    for name in sorted(os.listdir(root))[5:]:
        (root / name).unlink()
    fresh = snapshot.DataLoader2(factory())
    fresh.restore_snapshot(snap, strategy="state")
    assert list(fresh) == rest


def test_state_strategy_lists_every_node_without_a_hook() -> None:
    snap = snap_of(graphs.with_generator_pipe)
    with pytest.raises(snapshot.StrategyError) as info:
        snapshot.DataLoader2(graphs.with_generator_pipe()).restore_snapshot(snap, strategy="state")
    message = str(info.value)
    assert "1 node(s)" in message
    assert "0/datapipe: Squares(): no state hook" in message
    assert "strategy='auto'" in message


def test_snapshot_without_graph_needs_a_graph() -> None:
    dl = snapshot.DataLoader2(graphs.linear())
    next(iter(dl))
    snap = dl.save_snapshot(include_graph=False)
    assert snap.graph is None and snap.manifest["graph"]["included"] is False
    with pytest.raises(snapshot.SnapshotError, match="include_graph=False"):
        snapshot.DataLoader2.from_snapshot(snap)
    fresh = snapshot.DataLoader2(graphs.linear())
    fresh.restore_snapshot(snap)  # with the graph built in code it works


def test_nothing_raw_escapes_for_garbage_input(tmp_path) -> None:
    magic = b"\x89snapshot\r\n\x1a\n"
    for content in (magic + b"\xff" * 200, magic + b"\x01\x00" + b"\x00" * 78):
        path = tmp_path / "g.snap"
        path.write_bytes(content)
        with pytest.raises(snapshot.SnapshotFileError):
            snapshot.load(path)
        with pytest.raises(snapshot.SnapshotFileError):
            snapshot.read_manifest(path)


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i * i


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


@pytest.mark.parametrize(("data", "wrapper"), [
    (Squares(), "IterableWrapper(range(len(data))).map(data.__getitem__)"),
    ([1, 2, 3], "Wrap it in IterableWrapper(data)"),
    (Stream(), "IterableWrapper"),
    ((x for x in range(3)), "IterableWrapper"),
])
def test_a_dataset_or_a_list_is_refused_with_the_wrapper_to_use(data, wrapper) -> None:
    with pytest.raises(TypeError, match=r"expects an IterDataPipe or a MapDataPipe, got ") as info:
        snapshot.DataLoader2(data)
    assert type(data).__qualname__ in str(info.value) and wrapper in str(info.value)


def test_a_plain_list_is_answered_with_iterable_wrapper_first() -> None:
    with pytest.raises(TypeError) as info:
        snapshot.DataLoader2([1, 2, 3])
    message = str(info.value)
    assert message.index("IterableWrapper(data)") < message.index("IterableWrapper(range(len(data)))")
    assert list(snapshot.DataLoader2(IterableWrapper([1, 2, 3]))) == [1, 2, 3]


def test_the_suggested_wrapper_works() -> None:
    data = Squares()
    assert list(snapshot.DataLoader2(IterableWrapper(range(len(data))).map(data.__getitem__))) == [0, 1, 4, 9]
    assert list(snapshot.DataLoader2(IterableWrapper(Stream()))) == [0, 1, 2]


def test_a_mismatch_between_classes_of_the_same_name_shows_their_modules(monkeypatch) -> None:
    import sys
    import types

    other = types.ModuleType("elsewhere")
    monkeypatch.setitem(sys.modules, "elsewhere", other)
    exec("from tests.graphs import Squares\nclass Squares(Squares):\n    pass\n", other.__dict__)
    snap = snap_of(graphs.with_generator_pipe)
    built = Batcher(other.Squares(Shuffler(IterableWrapper(range(40)), buffer_size=6)), batch_size=3)
    with pytest.raises(snapshot.GraphMismatchError) as info:
        snapshot.DataLoader2(built).restore_snapshot(snap)
    message = str(info.value)
    assert "in snapshot: tests.graphs.Squares()" in message
    assert "in loader:   elsewhere.Squares()" in message
