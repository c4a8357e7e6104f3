"""``Batcher``, ``UnBatcher`` and ``Grouper``: partial batches and groups saved by value."""

from __future__ import annotations

from collections import deque
from typing import Any

from snapshot.hooks._base import DONE, PENDING, ResumableIterator

BATCH = "batch"
ERROR = "error"
GROUPS = "groups"
SIZE = "size"
DRAINING = "draining"


class BatcherIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._batch: list[Any] = []
        self._done = False

    def next(self) -> Any:
        if self._done:
            raise StopIteration
        dp = self.datapipe
        batch = self._batch
        size = dp.batch_size
        for x in self._src:
            batch.append(x)
            if len(batch) == size:
                self._batch = []
                return dp.wrapper_class(batch)
        self._done = True
        if batch and not dp.drop_last:
            self._batch = []
            return dp.wrapper_class(batch)
        raise StopIteration

    def buffered(self) -> int:
        return len(self._batch)

    def get_state(self) -> dict[str, Any]:
        return {BATCH: list(self._batch), DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._batch = list(state[BATCH])
        self._done = bool(state[DONE])


class UnBatcherIterator(ResumableIterator):
    """Flattens one input sample at a time; its remaining leaves are the state."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._pending: deque[Any] = deque()
        self._error: BaseException | None = None

    def next(self) -> Any:
        while True:
            if self._pending:
                return self._pending.popleft()
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            element = next(self._src)
            try:
                for leaf in self.datapipe._dive(element, unbatch_level=self.datapipe.unbatch_level):
                    self._pending.append(leaf)
            except Exception as exc:  # noqa: BLE001 - raised after the leaves before it, as the original
                self._error = exc

    def buffered(self) -> int:
        return len(self._pending)

    def get_state(self) -> dict[str, Any]:
        return {PENDING: list(self._pending), ERROR: self._error}

    def set_state(self, state: dict[str, Any]) -> None:
        self._pending = deque(state[PENDING])
        self._error = state[ERROR]


class GrouperIterator(ResumableIterator):
    """``Grouper``: buffered groups by key (insertion-ordered) and groups ready to yield."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._groups: dict[Any, list[Any]] = {}
        self._size = 0
        self._ready: deque[Any] = deque()
        self._draining = False

    def _out(self, key: Any, items: list[Any]) -> Any:
        result = self.datapipe.wrapper_class(items)
        return (key, result) if self.datapipe.keep_key else result

    def _remove_biggest(self) -> list[Any] | None:
        dp = self.datapipe
        biggest_key, biggest_size = None, 0
        for key, items in self._groups.items():
            if len(items) > biggest_size:
                biggest_size, biggest_key = len(items), key
        if dp.guaranteed_group_size is not None and biggest_size < dp.guaranteed_group_size \
                and not dp.drop_remaining:
            raise RuntimeError("Failed to group items", str(self._groups.get(biggest_key, [])))
        result = None
        if dp.guaranteed_group_size is None or biggest_size >= dp.guaranteed_group_size:
            result = self._groups.get(biggest_key, [])
        self._size -= biggest_size
        self._groups.pop(biggest_key, None)
        return result

    def next(self) -> Any:
        dp = self.datapipe
        while not self._ready:
            if self._draining:
                if not self._groups:
                    raise StopIteration
                key = next(iter(self._groups))
                items = self._groups.pop(key)
                self._size -= len(items)
                return self._out(key, items)
            try:
                x = next(self._src)
            except StopIteration:
                self._draining = True
                continue
            key = dp.group_key_fn(x)
            group = self._groups.setdefault(key, [])
            group.append(x)
            self._size += 1
            if dp.group_size is not None and dp.group_size == len(group):
                self._ready.append(self._out(key, group))
                self._size -= len(group)
                del self._groups[key]
            if self._size == dp.max_buffer_size:
                removed = self._remove_biggest()
                if removed is not None:
                    # torch yields the key of the sample just read here, not the group's key
                    self._ready.append(self._out(key, removed))
        return self._ready.popleft()

    def buffered(self) -> int:
        return self._size + len(self._ready)

    def get_state(self) -> dict[str, Any]:
        return {GROUPS: [[key, list(items)] for key, items in self._groups.items()],
                SIZE: self._size, PENDING: list(self._ready), DRAINING: self._draining}

    def set_state(self, state: dict[str, Any]) -> None:
        self._groups = {key: list(items) for key, items in state[GROUPS]}
        self._size = int(state[SIZE])
        self._ready = deque(state[PENDING])
        self._draining = bool(state[DRAINING])
