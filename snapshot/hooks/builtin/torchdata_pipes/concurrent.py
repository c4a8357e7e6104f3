"""Hooks for torchdata 0.9's concurrent mappers: ``threadpool_map`` and ``async_map_batches``
(built of ``batch``, an inner async mapper, ``flatmap`` and ``set_length``).

``threadpool_map`` keeps up to ``scheduled_tasks`` inputs in flight in a thread pool; its
state is those inputs (pulled from its input, not yet yielded), by value, in order: a restore
submits them again, so the function runs again on them (and on nothing before them). The inner
async mapper turns each batch into one, with no state between batches.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from concurrent import futures
from typing import Any

from snapshot.hooks._base import ResumableIterator, Stateless

__all__ = ["AsyncBatchIterator", "LengthSetterIterator", "ThreadPoolMapperIterator"]

IN_FLIGHT = "in_flight"
HAS_NEXT = "has_next"


class ThreadPoolMapperIterator(ResumableIterator):
    """``threadpool_map``: ``fn`` applied in a thread pool, in input order; state: the inputs in flight."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._inputs: deque[Any] = deque()  # inputs in flight, oldest first
        self._futures: deque[futures.Future[Any]] = deque()
        self._pool: futures.ThreadPoolExecutor | None = None
        self._has_next = True
        self._started = False

    def _submit(self, item: Any) -> None:
        assert self._pool is not None
        self._inputs.append(item)
        self._futures.append(self._pool.submit(self.datapipe._apply_fn, item))

    def _pull(self) -> None:
        if not self._has_next:
            return
        try:
            item = next(self.inputs[0])
        except StopIteration:
            self._has_next = False
            return
        self._submit(item)

    def _start(self) -> None:
        dp = self.datapipe
        self._pool = futures.ThreadPoolExecutor(max_workers=dp.max_workers, **dp.threadpool_kwargs)
        weakref.finalize(self, self._pool.shutdown, wait=False)
        pending, self._inputs = list(self._inputs), deque()
        for item in pending:  # restored: the inputs that were in flight, submitted again
            self._submit(item)
        if not self._started:
            self._started = True
            for _ in range(dp.scheduled_tasks):
                self._pull()
                if not self._has_next:
                    break

    def next(self) -> Any:
        if self._pool is None:
            self._start()
        if not self._futures:
            self.close()
            raise StopIteration
        self._pull()
        self._inputs.popleft()
        return self._futures.popleft().result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def buffered(self) -> int:
        return len(self._inputs)

    def get_state(self) -> dict[str, Any]:
        return {IN_FLIGHT: list(self._inputs), HAS_NEXT: self._has_next, "started": self._started}

    def set_state(self, state: dict[str, Any]) -> None:
        self._inputs = deque(state[IN_FLIGHT])
        self._has_next, self._started = bool(state[HAS_NEXT]), bool(state["started"])


class AsyncBatchIterator(Stateless):
    """The inner pipe of ``async_map_batches``: each batch mapped by ``async_fn`` on an event loop of its own."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._loop: asyncio.AbstractEventLoop | None = None

    def next(self) -> Any:
        try:
            batch = next(self.inputs[0])
        except StopIteration:
            self.close()
            raise
        policy = asyncio.get_event_loop_policy()
        if self._loop is None:
            self._loop = policy.new_event_loop()
        policy.set_event_loop(self._loop)
        return self._loop.run_until_complete(self.datapipe.processbatch(batch))

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


class LengthSetterIterator(Stateless):
    """``set_length``: its input's samples, unchanged."""

    streams = "passes"

    def next(self) -> Any:
        return next(self.inputs[0])
