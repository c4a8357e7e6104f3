"""The resumable-iterator protocol: an iterator whose position can be read and rebuilt."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

__all__ = ["ResumableIterator", "YIELDED", "STATE"]

#: Keys of :meth:`ResumableIterator.state_dict`.
YIELDED = "yielded"
STATE = "state"
#: Keys that several hooks' states share: outputs (or inputs) held and not yet yielded, and whether
#: the iterator has finished its input.
PENDING = "pending"
DONE = "done"


def counted_step(counter: Any, produce: Callable[[], Any]) -> Any:
    """One sample from ``produce()``, counted on ``counter``: ``yielded`` goes up, ``exhausted``
    is set at the end, and an error is marked with the node that raised it."""
    try:
        item = produce()
    except StopIteration:
        counter.exhausted = True
        raise
    except Exception as exc:
        _note(exc, counter)
        raise
    counter.yielded += 1
    return item


def _note(exc: BaseException, iterator: Any) -> None:
    """Say once, on the exception, which node raised it (the innermost one)."""
    if getattr(exc, "_snapshot_node", None) is not None:
        return
    path = getattr(iterator, "path", None)
    try:
        exc._snapshot_node = path  # type: ignore[attr-defined]
    except AttributeError:
        return
    if path is not None and hasattr(exc, "add_note"):
        name = type(iterator.datapipe).__name__
        exc.add_note(f"raised by the DataPipe at {path} ({name})")


class ResumableIterator(Iterator[Any], ABC):
    """Iterates one DataPipe for one epoch, and can say (and restore) where it is.

    The engine creates one per DataPipe and epoch with ``(datapipe, inputs)``, where
    ``inputs`` are the iterators of the pipe's input DataPipes in graph order (already
    positioned when restoring) or the input objects themselves for map-style inputs.
    Subclasses implement :meth:`next`, :meth:`get_state` and :meth:`set_state`; the public
    :meth:`__next__` and :meth:`state_dict` do the bookkeeping (the count of samples).

    Contract for subclasses:

    - yield exactly what the DataPipe's own ``__iter__`` would, in the same order, raising
      the same exceptions;
    - do nothing in ``__init__`` that the original does lazily (opening files, pulling
      from inputs): iteration starts on the first :meth:`next`;
    - :meth:`get_state` is called between two samples, never during :meth:`next`; it
      returns a dict of plain values (numbers, strings, lists, dicts) under fixed keys, plus
      the buffered samples themselves where the pipe holds some; it must not include the
      inputs' positions (the engine restores every node separately);
    - :meth:`set_state` is called on a fresh instance, before the first :meth:`next`, with
      inputs already positioned where they were when the state was taken.
    """

    #: Set to ``False`` in subclasses whose state cannot be restored in every graph;
    #: :meth:`can_restore` then decides per graph.
    always_restorable: ClassVar[bool] = True
    #: Keys of :meth:`get_state` (plain data: generator states, flags) that a replay of the
    #: pipe must reproduce exactly; after a restore that replays the pipe, the engine compares
    #: them with the saved ones and refuses a replay that ended somewhere else.
    replay_checked: ClassVar[tuple[str, ...]] = ()
    #: ``True`` for pipes that turn each input sample into one output sample, with no state
    #: (``map``): a buffer below them can be saved by position (see :mod:`._positions`).
    elementwise: ClassVar[bool] = False
    #: For pipes that yield ``(path, stream)`` pairs: ``"opens"`` (it opens them and marks each
    #: with its address), ``"unpacks"`` (it derives them from its input's streams: addressed when
    #: those are) or ``"passes"`` (it hands its input's samples on unchanged). See
    #: :func:`snapshot.hooks.builtin.files.reopenable`.
    streams: ClassVar[str | None] = None
    #: ``True`` for pipes that inflate compressed streams (gzip, bz2, xz): a reader after them that is
    #: restored at an offset re-inflates its current file from the start (see :meth:`rereads`).
    inflates: ClassVar[bool] = False
    #: How this pipe saves buffered samples (set by the engine from the loader's option).
    buffer_state: str = "values"

    def __init__(self, datapipe: Any, inputs: Sequence[Any]):
        self.datapipe = datapipe
        self.inputs = inputs
        self.yielded = 0
        #: ``True`` once :meth:`__next__` raised ``StopIteration``.
        self.exhausted = False
        #: The node path, set by the engine (used in error notes).
        self.path: str | None = None
        #: Set by the engine: makes a fresh iterator for input ``index`` (see restart_input).
        self._restart: Callable[[int], Any] | None = None

    def __iter__(self) -> ResumableIterator:
        return self

    def __next__(self) -> Any:
        return counted_step(self, self.next)

    @abstractmethod
    def next(self) -> Any:
        """The next sample; raise ``StopIteration`` at the end of the epoch."""

    @abstractmethod
    def get_state(self) -> dict[str, Any]:
        """The position of this pipe alone (not of its inputs)."""

    @abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (on a fresh instance, before the first :meth:`next`)."""

    def buffered(self) -> int:
        """Samples held in buffers (shown by ``snapshot inspect``)."""
        return 0

    def buffer_note(self) -> str | None:
        """For a buffering pipe, how its buffer is saved (``"positions"``, or ``"values"`` and why)."""
        return None

    def lookup(self) -> Callable[[int], Any] | None:
        """For a source: a function from a position in this epoch's stream to the sample there,
        if the source can be indexed (else ``None``)."""
        return None

    def addressing(self) -> Callable[[Any], Any] | None:
        """For a reader of files: start keeping the address of each sample it yields (see
        :meth:`last_address`) and return a function that reads a sample again from its address;
        ``None`` if its samples have no address."""
        return None

    def last_address(self) -> Any:
        """After :meth:`addressing`: the address of the sample just yielded (plain data), or
        ``None`` when it has none (it is then kept by value)."""
        return None

    def restart_input(self, index: int) -> Any:
        """Start input ``index`` over (a fresh iteration of its whole subgraph), as the
        original does when it calls ``iter()`` on an input a second time (``cycle``)."""
        restart = self._restart
        if restart is None:
            raise RuntimeError(f"{type(self).__name__} is not running inside a snapshot Run")
        inputs = list(self.inputs)
        inputs[index] = restart(index)
        self.inputs = inputs
        return inputs[index]

    def close(self) -> None:
        """Release what the iterator holds beyond its samples (threads), when its run closes."""

    @classmethod
    def persistent_state(cls, datapipe: Any) -> Any:
        """State the pipe keeps *across* epochs (a cache), or ``None``.

        It is saved with every snapshot, even one taken between epochs, and put back on the
        rebuilt pipe before anything else, whatever the restore strategy.
        """
        return None

    @classmethod
    def load_persistent_state(cls, datapipe: Any, state: Any) -> None:
        """Put back what :meth:`persistent_state` returned."""

    @classmethod
    def rewind(cls, datapipe: Any, state: dict[str, Any]) -> None:
        """Put the pipe back as it was when the epoch began, from ``state`` (what
        :meth:`get_state` returned later in that epoch).

        Called before the pipe is replayed from the start of the epoch, for pipes that keep
        something on themselves across epochs which the epoch changes (a generator of their
        own). Default: nothing to do.
        """

    @classmethod
    def accepts(cls, datapipe: Any) -> bool:
        """Whether this iterator can run ``datapipe`` (default: any instance of its class)."""
        return True

    @classmethod
    def can_restore(cls, node: Any, graph: Any) -> str | None:
        """``None`` if ``node`` can be restored from its state in ``graph``, else the reason."""
        return None

    @classmethod
    def rereads(cls, node: Any, graph: Any) -> str | None:
        """What a restore of ``node`` from its state reads again beyond its state (for the plan), or
        ``None`` when it reads nothing again."""
        return None

    @classmethod
    def replays_input(cls, node: Any, graph: Any) -> str | None:
        """Why a restore of ``node`` replays its input up to the saved count (what it took from it can
        be neither saved nor reopened: streams that no opener made), or ``None``. The pipe itself is
        restored from its state, and is handed its input's last replayed item (:meth:`replayed_input`)."""
        return None

    def replayed_input(self, item: Any) -> None:
        """The last item the input yielded when a restore replayed it (see :meth:`replays_input`)."""

    def state_dict(self) -> dict[str, Any]:
        return {YIELDED: self.yielded, STATE: self.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.yielded = int(state[YIELDED])
        self.set_state(state[STATE])


class Expanding(ResumableIterator):
    """Base for pipes that turn one input into several outputs, kept in ``_pending`` (the state)
    until they are yielded."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._pending: deque[Any] = deque()

    def buffered(self) -> int:
        return len(self._pending)

    def get_state(self) -> dict[str, Any]:
        return {PENDING: list(self._pending)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._pending = deque(state[PENDING])


class Stateless(ResumableIterator):
    """Base for pipes whose position is entirely their inputs' positions (map, filter, ...)."""

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        pass
