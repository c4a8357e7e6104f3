"""Sources restored by position: ``IterableWrapper`` and ``Sampler`` (and, in
:mod:`.torchdata`, ``to_iter_datapipe``)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin._skip import advance

POSITION = "position"


class PositionedSource(ResumableIterator):
    """A source whose state is how many samples it yielded: restored by advancing a fresh one.

    Subclasses say how to make the fresh iterable (:meth:`source`). Restoring a list, tuple,
    range, str or bytes jumps straight to the position; any other iterable is advanced.
    """

    what = "source"

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._it: Iterator[Any] | None = None
        self._start_at = 0

    def source(self) -> Iterable[Any]:
        raise NotImplementedError

    def _start(self) -> Iterator[Any]:
        source = self.source()
        self._it = advance(iter(source), self._start_at, source=source, what=self.what)
        return self._it

    def next(self) -> Any:
        it = self._it
        if it is None:
            it = self._start()
        return next(it)

    def indexable(self) -> bool:
        """Whether :meth:`source` can be indexed (checked without building it when possible)."""
        return isinstance(self.source(), Sequence)

    def lookup(self) -> Callable[[int], Any] | None:
        if not self.indexable():
            return None
        made: list[Any] = []

        def at(position: int) -> Any:
            if not made:
                made.append(self.source())
            return made[0][position]

        return at

    def get_state(self) -> dict[str, Any]:
        return {POSITION: self.yielded}

    def set_state(self, state: dict[str, Any]) -> None:
        self._start_at = int(state[POSITION])
        self._start()  # position now, so that data shorter than the snapshot fails the restore


class IterableWrapperIterator(PositionedSource):
    """``IterableWrapper``: the wrapped iterable, deep-copied per epoch as the original does."""

    what = "IterableWrapper's iterable"

    def indexable(self) -> bool:
        return isinstance(self.datapipe.iterable, Sequence)

    def source(self) -> Iterable[Any]:
        source = self.datapipe.iterable
        if self.datapipe.deepcopy:
            try:
                source = copy.deepcopy(source)
            except TypeError:
                warnings.warn(
                    "The input iterable can not be deepcopied, please be aware of in-place "
                    "modification would affect source data.",
                    stacklevel=2,
                )
        return source


class SamplerIterator(PositionedSource):
    """``Sampler``: the sampler's own iteration."""

    what = "sampler"

    def source(self) -> Iterable[Any]:
        return self.datapipe.sampler
