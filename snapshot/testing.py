"""The resume-equivalence harness: prove that a graph restores exactly, at every cut point.

:func:`assert_resumes_exactly` builds a graph from a factory, runs it uninterrupted for a
few epochs, then for each cut point runs it again, saves a snapshot there, restores the
snapshot into a freshly built loader (optionally in a fresh process, optionally onto a
different reading service) and checks that the continued stream equals the uninterrupted
one, sample for sample, through the end of the last epoch.

Use it on your own pipes::

    from snapshot.testing import assert_resumes_exactly

    def make_graph():
        return MySource(...).shuffle().map(parse).batch(32)

    def test_my_pipeline_resumes():
        assert_resumes_exactly(make_graph, epochs=2)

Cut points are ``(epoch, samples)`` pairs. The default set covers the start, the first
sample, the middle, the last sample, the end of the epoch before and after ``StopIteration``,
a point in a later epoch, and a restore followed by a second cut ("twice in a row").
"""

from __future__ import annotations

import io
import multiprocessing
import pickle
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Cut", "ResumeReport", "assert_resumes_exactly", "first_difference", "same_items"]


def same_items(a: Any, b: Any) -> bool:
    """Deep equality that understands tensors (and containers of them)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_items(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (type(a) is type(b) or (isinstance(a, list) and isinstance(b, list))) and \
            len(a) == len(b) and all(same_items(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - objects whose == is not a bool (numpy arrays)
        return bool((a == b).all())


def first_difference(expected: Sequence[Any], actual: Sequence[Any]) -> int | None:
    """Index of the first differing sample (``None`` when equal)."""
    for index, (x, y) in enumerate(zip(expected, actual)):
        if not same_items(x, y):
            return index
    if len(expected) != len(actual):
        return min(len(expected), len(actual))
    return None


@dataclass(frozen=True)
class Cut:
    """Where to take the snapshot: after ``samples`` samples of ``epoch``.

    ``finished`` takes it after the epoch's iterator raised ``StopIteration``; ``then``
    restores, continues to a second cut, and snapshots again (a restore of a restore).
    """

    epoch: int
    samples: int
    finished: bool = False
    then: int | None = None

    def __str__(self) -> str:
        text = f"epoch {self.epoch}, after {self.samples} samples"
        if self.finished:
            text += " and StopIteration"
        if self.then is not None:
            text += f", restored, then cut again after {self.then}"
        return text


@dataclass
class ResumeReport:
    """What the harness checked."""

    epoch_lengths: list[int]
    cuts: list[Cut] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)


def default_cuts(lengths: Sequence[int]) -> list[Cut]:
    """Start, 1, middle, last, end, end after StopIteration, a later epoch, twice in a row."""
    n = lengths[0]
    cuts = {Cut(0, 0), Cut(0, min(1, n)), Cut(0, n // 2), Cut(0, max(n - 1, 0)), Cut(0, n),
            Cut(0, n, finished=True)}
    if len(lengths) > 1:
        cuts.add(Cut(1, lengths[1] // 3))
    if n >= 3:
        cuts.add(Cut(0, n // 3, then=n // 3 + max(1, n // 3)))
    return sorted(cuts, key=lambda c: (c.epoch, c.samples, c.finished, c.then or -1))


def _loader(factory: Callable[[], Any], service: Callable[[], Any] | None, seed: int) -> Any:
    from snapshot import DataLoader2

    loader: Any = DataLoader2(factory(), reading_service=service() if service else None)
    loader.seed(seed)
    return loader


def _reference(factory: Callable[[], Any], service: Callable[[], Any] | None,
               seed: int, epochs: int) -> list[list[Any]]:
    loader: Any
    with _loader(factory, service, seed) as loader:
        return [list(loader) for _ in range(epochs)]


def _take_to(loader: Any, epoch: int, samples: int, finished: bool) -> Any:
    for _ in range(epoch):
        for _ in loader:
            pass
    it = iter(loader)
    for _ in range(samples):
        next(it)
    if finished:
        for _ in it:
            pass
    return it


Continuation = tuple[list[list[Any]], bytes | None]


def _continue(factory: Callable[[], Any], service: Callable[[], Any] | None, data: bytes,
              strategy: str, epochs_left: int, second_cut: int | None) -> Continuation:
    """Restore ``data`` into a fresh loader and read ``epochs_left`` epochs (the first partial)."""
    from snapshot import DataLoader2

    loader: Any
    with DataLoader2(factory(), reading_service=service() if service else None) as loader:
        loader.restore_snapshot(io.BytesIO(data), strategy=strategy)
        if second_cut is not None:
            it = iter(loader)
            for _ in range(second_cut):
                next(it)
            return [], loader.save_snapshot().to_bytes()
        return [list(loader) for _ in range(epochs_left)], None


def _continue_in_child(conn: Any, args: tuple[Any, ...]) -> None:
    try:
        result: Any = ("ok", _continue(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = ("error", f"{type(exc).__name__}: {exc}")
    # plain pickle: torch's multiprocessing pickler would share tensors through this process
    conn.send_bytes(pickle.dumps(result))
    conn.close()


def _run_continuation(fresh_process: bool, args: tuple[Any, ...], timeout: float = 300) -> Continuation:
    if not fresh_process:
        return _continue(*args)
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    # not daemonic: the restored loader may start worker processes of its own
    child = ctx.Process(target=_continue_in_child, args=(sender, args), name="snapshot-testing-restore")
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise AssertionError(f"the restore in a fresh process did not finish within {timeout:g} s")
        status, value = pickle.loads(receiver.recv_bytes())
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
        receiver.close()
    if status != "ok":
        raise AssertionError(f"the restore in a fresh process failed: {value}")
    return value


def assert_resumes_exactly(
    factory: Callable[[], Any],
    *,
    reading_service: Callable[[], Any] | None = None,
    restore_service: Callable[[], Any] | None = None,
    seed: int = 0,
    epochs: int = 2,
    cuts: Iterable[Cut] | None = None,
    strategies: Sequence[str] = ("auto",),
    fresh_process: bool = False,
    via_file: bool = True,
) -> ResumeReport:
    """Check that every cut of ``factory()``'s graph resumes to the uninterrupted stream.

    Args:
        factory: builds the graph (called once per loader; must build the same graph).
        reading_service: builds the service for the original run (default in-process).
        restore_service: builds the service to restore onto (default: the same).
        seed: loader seed.
        epochs: epochs in the reference run; a cut's continuation runs through all of them.
        cuts: cut points (default: :func:`default_cuts`).
        strategies: restore strategies to check each cut with.
        fresh_process: restore and continue in a new (spawned) process; ``factory`` and the
            services must then be picklable (module-level functions or ``functools.partial``).
        via_file: write the snapshot to a real file and read it back (else keep it in memory).

    Raises:
        AssertionError: naming the cut, the strategy and the first differing sample.

    Examples:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> def make_graph():
        ...     return IterableWrapper(range(20)).shuffle(buffer_size=5).batch(3)
        >>> report = assert_resumes_exactly(make_graph, epochs=2, strategies=("state", "fast_forward"))
        >>> report.epoch_lengths
        [7, 7]
        >>> len(report.cuts) >= 7
        True
    """
    from snapshot import save

    reference = _reference(factory, reading_service, seed, epochs)
    lengths = [len(e) for e in reference]
    report = ResumeReport(lengths, strategies=list(strategies))
    restore_with = restore_service or reading_service
    for cut in (list(cuts) if cuts is not None else default_cuts(lengths)):
        with _loader(factory, reading_service, seed) as loader:
            _take_to(loader, cut.epoch, cut.samples, cut.finished)
            snap = loader.save_snapshot()
        data = snap.to_bytes()
        if via_file:  # through a real file, as a user would
            with tempfile.TemporaryDirectory() as tmp:
                path = f"{tmp}/cut.snap"
                save(snap, path)
                with open(path, "rb") as f:
                    data = f.read()
        for strategy in strategies:
            position = cut.samples
            blob = data
            if cut.then is not None:
                _, second = _run_continuation(
                    fresh_process, (factory, restore_with, blob, strategy, 0, cut.then - cut.samples))
                assert second is not None
                blob, position = second, cut.then
            epochs_left = epochs - cut.epoch - (1 if cut.finished else 0)
            streams, _ = _run_continuation(
                fresh_process, (factory, restore_with, blob, strategy, epochs_left, None))
            expected = [] if cut.finished else [reference[cut.epoch][position:]]
            expected += reference[cut.epoch + 1:]
            for offset, (want, got) in enumerate(zip(expected, streams)):
                index = first_difference(want, got)
                if index is not None:
                    epoch = cut.epoch + offset + (1 if cut.finished else 0)
                    start = position if offset == 0 and not cut.finished else 0
                    raise AssertionError(
                        f"restore at [{cut}] with strategy={strategy!r} diverges in epoch "
                        f"{epoch} at sample {start + index}: expected "
                        f"{_show(want, index)}, got {_show(got, index)} "
                        f"(expected {len(want)} more samples, got {len(got)})"
                    )
        report.cuts.append(cut)
    return report


def _show(items: Sequence[Any], index: int) -> str:
    if index >= len(items):
        return "<end of epoch>"
    text = repr(items[index])
    return text if len(text) < 120 else text[:117] + "..."
