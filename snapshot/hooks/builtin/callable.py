"""Pipes without a position of their own: ``Mapper`` (and ``Collator``), ``Filter``, ``RoutedDecoder``, and
the generic :class:`ItemwiseIterator` for pipes whose own generator keeps nothing between samples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes.utils.common import StreamWrapper

from snapshot.hooks._base import Stateless


def _unwrapped_iter(cls: type) -> Any:
    method = cls.__iter__  # type: ignore[attr-defined]
    return getattr(method, "__wrapped__", method)


class ItemwiseIterator(Stateless):
    """Runs the pipe's own generator over its input's iterator, for pipes whose generator keeps
    nothing between two samples (it holds no sample, count or buffer when it yields): a restore
    starts the generator afresh over its input, restored from its own state.

    Public as :class:`snapshot.hooks.Itemwise`: ``register_state_hook(MyPipe, Itemwise)`` declares
    that ``MyPipe`` is such a pipe, so that a restore no longer replays it (and everything before
    it) from the start of the epoch. A wrong declaration yields a wrong stream: declare only
    pipes like ``for x in self.source: yield f(x)`` (or that skip some ``x``).
    """

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._gen: Iterator[Any] | None = None

    def _generator(self) -> Iterator[Any]:
        # a copy of the pipe whose input attribute is this iterator's input (the pipe is not changed)
        (source,) = [cell for cell in self.inputs if not isinstance(cell, MapDataPipe)]
        view = object.__new__(type(self.datapipe))
        view.__dict__.update(self.datapipe.__dict__)
        for name, value in self.datapipe.__dict__.items():
            if isinstance(value, IterDataPipe):
                view.__dict__[name] = source
        return iter(_unwrapped_iter(type(self.datapipe))(view))

    def next(self) -> Any:
        if self._gen is None:
            self._gen = self._generator()
        return next(self._gen)

    def close(self) -> None:
        self._gen = None


class MapperIterator(Stateless):
    """``Mapper``/``Collator``: ``fn`` applied to each input sample."""

    elementwise = True

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        plain = datapipe.input_col is None and datapipe.output_col is None
        self._fn = datapipe.fn if plain else datapipe._apply_fn

    def next(self) -> Any:
        return self._fn(next(self._src))


class FilterIterator(Stateless):
    """``Filter``: input samples for which ``filter_fn`` holds; dropped streams are closed."""

    streams = "passes"

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._test = datapipe._returnIfTrue

    def next(self) -> Any:
        src, test = self._src, self._test
        while True:
            data = next(src)
            keep, filtered = test(data)
            if keep:
                return filtered
            StreamWrapper.close_streams(data)


class RoutedDecoderIterator(Stateless):
    """``RoutedDecoder``: ``(path, decoded)`` for each ``(path, stream)``."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]

    def next(self) -> Any:
        data = next(self._src)
        pathname = data[0]
        return pathname, self.datapipe.decoder(data)[pathname]
