"""Sources: ``IterableWrapper`` and ``Sampler``, restored by position."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from typing import Any

from snapshot.hooks._base import ResumableIterator
from snapshot.hooks.builtin._skip import advance

POSITION = "position"


class IterableWrapperIterator(ResumableIterator):
    """``IterableWrapper``: the wrapped iterable, deep-copied per epoch as the original does.

    Restoring a list, tuple, range, str or bytes jumps straight to the position; any other
    iterable is re-created and advanced.
    """

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._it: Iterator[Any] | None = None
        self._start_at = 0

    def _start(self) -> Iterator[Any]:
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
        self._it = advance(iter(source), self._start_at, source=source, what="IterableWrapper's iterable")
        return self._it

    def next(self) -> Any:
        it = self._it
        if it is None:
            it = self._start()
        return next(it)

    def get_state(self) -> dict[str, Any]:
        return {POSITION: self.yielded}

    def set_state(self, state: dict[str, Any]) -> None:
        self._start_at = int(state[POSITION])
        self._start()  # position now, so that data shorter than the snapshot fails the restore


class SamplerIterator(ResumableIterator):
    """``Sampler``: the sampler's iterator, restored by advancing a fresh one."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._it: Iterator[Any] | None = None
        self._start_at = 0

    def _start(self) -> Iterator[Any]:
        self._it = advance(iter(self.datapipe.sampler), self._start_at, what="sampler")
        return self._it

    def next(self) -> Any:
        it = self._it
        if it is None:
            it = self._start()
        return next(it)

    def get_state(self) -> dict[str, Any]:
        return {POSITION: self.yielded}

    def set_state(self, state: dict[str, Any]) -> None:
        self._start_at = int(state[POSITION])
        self._start()
