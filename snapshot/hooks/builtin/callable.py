"""Pipes without a position of their own: ``Mapper`` (and ``Collator``), ``Filter``, ``RoutedDecoder``."""

from __future__ import annotations

from typing import Any

from torch.utils.data.datapipes.utils.common import StreamWrapper

from snapshot.hooks._base import Stateless


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
