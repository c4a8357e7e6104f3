"""The resume-equivalence harness: prove that a graph restores exactly, at every cut point.

:func:`assert_resumes_exactly` checks, for a graph built by a factory and a fixed seed:

1. **The reference**: the graph read uninterrupted for ``epochs`` epochs.
2. **Saving changes nothing**: for each cut point, a run reads to the cut, saves a snapshot and
   reads on in the same loader through the last epoch; its whole stream must be the reference
   (a ``state_dict()`` or hook that disturbs the live pipe fails here).
3. **The restore continues the stream**: the snapshot (through a real file unless
   ``via_file=False``) is restored, with each strategy, into a loader over a freshly built graph
   (in a fresh process, on another reading service, if asked); what it reads through the last
   epoch must be the reference from the cut on.
4. **A restore of a restore** (a cut with ``then``): the first restore reads to the second cut,
   saves again and reads on through the last epoch, all of it compared with the reference; the
   second snapshot is restored into another fresh loader and compared from the second cut.

Comparisons are sample for sample (:func:`same_items`: tensors by dtype, shape and value); a
difference is an ``AssertionError`` naming the cut, the run, the strategy, the epoch and the
first differing sample. A restore onto ``restore_service`` is compared with the stream on
``reading_service`` (the same for one seed and number of logical shards). In your tests::

    def test_my_pipeline_resumes():
        assert_resumes_exactly(lambda: MySource(...).shuffle().map(parse).batch(32), epochs=2)

The default cuts are the start, the first sample, the middle, the last sample, the end of the
epoch before and after ``StopIteration``, a point in a later epoch, and twice in a row.

:func:`assert_hook_roundtrip` checks one state hook at every step: a run saves before every
sample (it must yield the reference), and each snapshot goes through :func:`snapshot.save` and
:func:`snapshot.load`, is restored with ``strategy="state"`` into a fresh pipe from the factory,
and must continue with the reference.
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

__all__ = ["Cut", "ResumeReport", "assert_hook_roundtrip", "assert_resumes_exactly", "first_difference",
           "same_items"]


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


def _check_continuation(what: str, cut: Cut, position: int, expected: list[list[Any]],
                       streams: list[list[Any]]) -> None:
    """Raise naming ``what`` was read (the cut and how) and the first differing sample, if any."""
    if len(expected) != len(streams):
        raise AssertionError(f"{what} read {len(streams)} epoch(s) after the cut at {cut}, expected {len(expected)}")
    for offset, (want, got) in enumerate(zip(expected, streams)):
        index = first_difference(want, got)
        if index is not None:
            epoch = cut.epoch + offset + (1 if cut.finished else 0)
            start = position if offset == 0 and not cut.finished else 0
            raise AssertionError(
                f"{what} diverges in epoch {epoch} at sample {start + index}: expected "
                f"{_show(want, index)}, got {_show(got, index)} "
                f"(expected {len(want)} more samples, got {len(got)})"
            )


def _show(items: Sequence[Any], index: int) -> str:
    if index >= len(items):
        return "<end of epoch>"
    text = repr(items[index])
    return text if len(text) < 120 else text[:117] + "..."


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


def _loader(factory: Callable[[], Any], service: Callable[[], Any] | None, seed: int,
            buffer_state: str = "values") -> Any:
    from snapshot import DataLoader2

    loader: Any = DataLoader2(factory(), reading_service=service() if service else None, buffer_state=buffer_state)
    loader.seed(seed)
    return loader


def _reference(factory: Callable[[], Any], service: Callable[[], Any] | None,
               seed: int, epochs: int) -> list[list[Any]]:
    loader: Any
    with _loader(factory, service, seed) as loader:
        return [list(loader) for _ in range(epochs)]


Continuation = tuple[list[list[Any]], bytes | None]


def _continue(factory: Callable[[], Any], service: Callable[[], Any] | None, data: bytes,
              strategy: str, epochs_left: int, second_cut: int | None, buffer_state: str = "values") -> Continuation:
    """Restore ``data`` into a fresh loader and read ``epochs_left`` epochs (the first partial); with
    ``second_cut``, save again after that many samples and read on (and return that snapshot too)."""
    from snapshot import DataLoader2

    loader: Any
    with DataLoader2(factory(), reading_service=service() if service else None, buffer_state=buffer_state) as loader:
        # this process just saved ``data``: its pickled values (samples that are not data) are trusted
        loader.restore_snapshot(io.BytesIO(data), strategy=strategy, allow_pickle=True)
        if second_cut is None:
            return [list(loader) for _ in range(epochs_left)], None
        it = iter(loader)
        head, second = [next(it) for _ in range(second_cut)], loader.save_snapshot().to_bytes()
        return [head + list(it), *[list(loader) for _ in range(epochs_left - 1)]], second


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


def _through_file(snap: Any) -> bytes:
    """The snapshot's bytes after a round trip through a real file, as a user would save it."""
    from snapshot import save

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/cut.snap"
        save(snap, path)
        with open(path, "rb") as f:
            return f.read()


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
    buffer_state: str = "values",
) -> ResumeReport:
    """Check that saving at every cut leaves ``factory()``'s stream as it was, and that every
    cut restores to the uninterrupted stream (the module's page lists each comparison).

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
        buffer_state: the loaders' ``buffer_state`` (``"values"`` or ``"positions"``).

    Raises:
        AssertionError: naming the cut, the run that differs (the one that saved, a restore, a
            restore saved again), the strategy and the first differing sample.

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
    reference = _reference(factory, reading_service, seed, epochs)
    lengths = [len(e) for e in reference]
    report = ResumeReport(lengths, strategies=list(strategies))
    restore_with = restore_service or reading_service
    for cut in (list(cuts) if cuts is not None else default_cuts(lengths)):
        data = _save_at(factory, reading_service, seed, buffer_state, cut, reference, via_file)
        epochs_left = epochs - cut.epoch - (1 if cut.finished else 0)
        for strategy in strategies:
            how, position, blob = f"with strategy={strategy!r}", cut.samples, data
            if cut.then is not None:
                args = (factory, restore_with, blob, strategy, epochs_left, cut.then - cut.samples, buffer_state)
                streams, second = _run_continuation(fresh_process, args)
                _check_continuation(f"the restore at [{cut}] {how}, saved again at its second cut and read on,",
                                    cut, position, _after(reference, cut, position), streams)
                blob, position = second or b"", cut.then
            streams, _ = _run_continuation(fresh_process, (factory, restore_with, blob, strategy, epochs_left, None,
                                                           buffer_state))
            _check_continuation(f"restore at [{cut}] {how}", cut, position, _after(reference, cut, position), streams)
        report.cuts.append(cut)
    return report


def _after(reference: list[list[Any]], cut: Cut, position: int) -> list[list[Any]]:
    """The reference from ``position`` of the cut's epoch (from the next epoch if it had finished)."""
    return ([] if cut.finished else [reference[cut.epoch][position:]]) + reference[cut.epoch + 1:]


def _save_at(factory: Callable[[], Any], service: Callable[[], Any] | None, seed: int, buffer_state: str,
             cut: Cut, reference: list[list[Any]], via_file: bool) -> bytes:
    """Read to ``cut``, save, read on through the last epoch: the snapshot's bytes (the whole run checked)."""
    loader: Any
    with _loader(factory, service, seed, buffer_state) as loader:
        stream = [list(loader) for _ in range(cut.epoch)]
        it = iter(loader)
        stream.append([next(it) for _ in range(cut.samples)] + (list(it) if cut.finished else []))
        snap = loader.save_snapshot()
        data = _through_file(snap) if via_file else snap.to_bytes()
        if not cut.finished:
            stream[-1] += list(it)
        stream += [list(loader) for _ in range(len(reference) - cut.epoch - 1)]
    _check_continuation(f"the run that saved at [{cut}] (a run must not change when it saves, nor differ from another "
                        "with its seed: a state_dict() or hook with a side effect?)", Cut(0, 0), 0, reference, stream)
    return data


def _steps(length: int, max_steps: int) -> list[int]:
    """Every step ``0..length``, or ``max_steps`` of them evenly apart, the last one always."""
    if length + 1 <= max_steps:
        return list(range(length + 1))
    stride = -(-(length + 1) // max_steps)
    return sorted(set(range(0, length + 1, stride)) | {length})


def assert_hook_roundtrip(
    factory: Callable[[], Any],
    *,
    seed: int = 0,
    epochs: int = 2,
    max_steps: int = 50,
) -> ResumeReport:
    """Check the state hook of ``factory()``'s pipe at every step of ``epochs`` epochs.

    The pipe needs a hook (registered with :func:`snapshot.register_state_hook`, or its own
    ``state_dict()`` / ``load_state_dict(state)``), and so do the pipes it reads from (the
    built-in ones have one). One run saves before every sample and after each epoch's end, and
    must yield the uninterrupted stream; each snapshot, written with :func:`snapshot.save` and
    read with :func:`snapshot.load`, is restored with ``strategy="state"`` (nothing replayed)
    into a loader over a fresh ``factory()``, whose stream through the last epoch must be the
    rest of the uninterrupted one.

    Args:
        factory: builds the pipe (a fresh instance per call, the same graph every time).
        seed: loader seed.
        epochs: epochs to run; each one is cut.
        max_steps: most cuts per epoch; a longer epoch is cut at evenly spaced steps (its
            last step and its end always).

    Raises:
        AssertionError: naming the epoch, the step and the first differing sample.

    Examples:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> report = assert_hook_roundtrip(lambda: IterableWrapper(range(10)).shuffle(buffer_size=4).batch(3))
        >>> report.epoch_lengths, len(report.cuts)
        ([4, 4], 12)
    """
    from snapshot import DataLoader2, load
    from snapshot.hooks import hook_for

    pipe = factory()
    if hook_for(pipe) is None:
        cls = type(pipe)
        raise AssertionError(
            f"{cls.__module__}.{cls.__qualname__} has no state hook: give it state_dict() and "
            f"load_state_dict(state), or register one with snapshot.register_state_hook({cls.__qualname__}, ...)")
    reference = _reference(factory, None, seed, epochs)
    report = ResumeReport([len(e) for e in reference], strategies=["state"])
    saved: list[tuple[Cut, bytes]] = []
    runs: list[list[Any]] = []
    loader: Any
    with _loader(factory, None, seed) as loader:
        for epoch, want in enumerate(reference):
            steps = set(_steps(len(want), max_steps))
            got: list[Any] = []
            it = iter(loader)
            while True:
                if len(got) in steps:
                    saved.append((Cut(epoch, len(got)), _saved(loader)))
                try:
                    got.append(next(it))
                except StopIteration:
                    break
            saved.append((Cut(epoch, len(got), finished=True), _saved(loader)))
            runs.append(got)
    _check_continuation("the run that saved a snapshot at every step", Cut(0, 0), 0, reference, runs)
    fresh: Any
    for cut, data in saved:
        snap = load(io.BytesIO(data), allow_pickle=True)  # saved by this process just now
        with DataLoader2(factory(), reading_service=None) as fresh:
            fresh.restore_snapshot(snap, strategy="state")
            streams = [list(fresh) for _ in range(epochs - cut.epoch - (1 if cut.finished else 0))]
        _check_continuation(f"the hook state saved at [{cut}] and restored into a fresh {type(pipe).__qualname__}",
                            cut, cut.samples, _after(reference, cut, cut.samples), streams)
        report.cuts.append(cut)
    return report


def _saved(loader: Any) -> bytes:
    """The loader's snapshot, written by :func:`snapshot.save` (the graph left out)."""
    from snapshot import save

    buffer = io.BytesIO()
    save(loader.save_snapshot(include_graph=False), buffer)
    return buffer.getvalue()
