"""``Concater``, ``Zipper``, ``Multiplexer``, and the containers behind ``fork`` and ``demux``.

A fork or demux is one shared container node (its buffers and pointers are the state) read
by several ``_ChildDataPipe`` nodes, which have no state of their own.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from torch.utils.data.datapipes.utils.common import StreamWrapper

from snapshot.hooks._base import DONE, PENDING, ResumableIterator, Stateless

CURRENT = "current"
#: Keys of a fork's or demux's container state (``INPUT_ENDED``: its input has ended).
STARTED, QUEUES, USAGE, INPUT_ENDED, STOPPED = "started", "queues", "usage", "exhausted", "stopped"


class ConcaterIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._current = 0

    def next(self) -> Any:
        inputs = self.inputs
        while self._current < len(inputs):
            try:
                return next(inputs[self._current])
            except StopIteration:
                self._current += 1
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {CURRENT: self._current}

    def set_state(self, state: dict[str, Any]) -> None:
        self._current = int(state[CURRENT])


class ZipperIterator(ResumableIterator):
    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._done = False

    def next(self) -> Any:
        if self._done:
            raise StopIteration
        items = []
        try:
            for it in self.inputs:
                items.append(next(it))
        except StopIteration:
            self._done = True
            raise
        return tuple(items)

    def get_state(self) -> dict[str, Any]:
        return {DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._done = bool(state[DONE])


class MultiplexerIterator(ResumableIterator):
    """One sample from each input in turn; a round is yielded only when every input gave one."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._round: deque[Any] = deque()
        self._done = not inputs

    def next(self) -> Any:
        if self._round:
            return self._round.popleft()
        if self._done:
            raise StopIteration
        round_ = []
        for it in self.inputs:
            try:
                round_.append(next(it))
            except StopIteration:
                self._done = True
                raise
        self._round.extend(round_)
        return self._round.popleft()

    def buffered(self) -> int:
        return len(self._round)

    def get_state(self) -> dict[str, Any]:
        return {PENDING: list(self._round), DONE: self._done}

    def set_state(self, state: dict[str, Any]) -> None:
        self._round = deque(state[PENDING])
        self._done = bool(state[DONE])


class _Container(ResumableIterator):
    """A node read through its children (``next_for``), never iterated directly."""

    def next(self) -> Any:
        raise TypeError(f"{type(self.datapipe).__name__} is read through its child DataPipes")

    def next_for(self, instance: int) -> Any:
        raise NotImplementedError


class ForkerContainer(_Container):
    """``fork``: one buffer shared by the children, with a read pointer per child."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        n = datapipe.num_instances
        self._started = False
        self._buffer: deque[Any] = deque()
        self._pointers = [0] * n
        self._slowest = 0
        self._leading = 0
        self._end: int | None = None
        self._stopped = [True] * n

    def next_for(self, instance: int) -> Any:
        dp = self.datapipe
        if not self._started:
            self._started = True
            self._stopped = [False] * dp.num_instances
        pointers, buffer = self._pointers, self._buffer
        while not self._stopped[instance]:
            pointers[instance] += 1
            if self._end is not None and pointers[instance] == self._end:
                self._stopped[instance] = True
                break
            if buffer and pointers[instance] <= self._leading:
                value = buffer[pointers[instance] - self._slowest - 1]
            else:
                self._leading = pointers[instance]
                try:
                    value = next(self.inputs[0])
                    buffer.append(value)
                except StopIteration:
                    self._stopped[instance] = True
                    self._end = self._leading
                    continue
            if pointers[instance] == self._slowest + 1:
                lowest = min(pointers)
                if self._slowest < lowest:
                    self._slowest = lowest
                    buffer.popleft()
            if dp.buffer_size >= 0 and self._leading > dp.buffer_size + self._slowest:
                raise BufferError(
                    "ForkerIterDataPipe buffer overflow," + f"buffer size {dp.buffer_size} is insufficient."
                )
            self.yielded += 1
            return dp.copy_fn(value)
        raise StopIteration

    def buffered(self) -> int:
        return len(self._buffer)

    def get_state(self) -> dict[str, Any]:
        return {"started": self._started, "buffer": list(self._buffer), "pointers": list(self._pointers),
                "slowest": self._slowest, "leading": self._leading, "end": self._end,
                "stopped": list(self._stopped)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._started = bool(state["started"])
        self._buffer = deque(state["buffer"])
        self._pointers = [int(p) for p in state["pointers"]]
        self._slowest = int(state["slowest"])
        self._leading = int(state["leading"])
        self._end = None if state["end"] is None else int(state["end"])
        self._stopped = [bool(s) for s in state["stopped"]]


class DemultiplexerContainer(_Container):
    """``demux``: one queue per child, filled as the classifier routes input samples."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        n = datapipe.num_instances
        self._started = False
        self._queues: list[deque[Any]] = [deque() for _ in range(n)]
        self._usage = 0
        self._exhausted = False
        self._stopped = [True] * n

    def _find_next(self, instance: int) -> Any:
        dp = self.datapipe
        while True:
            if self._exhausted or self._stopped[instance]:
                raise StopIteration
            value = next(self.inputs[0])
            target = dp.classifier_fn(value)
            if target is None and dp.drop_none:
                StreamWrapper.close_streams(value)
                continue
            if target is None or target >= dp.num_instances or target < 0:
                raise ValueError(
                    f"Output of the classification fn should be between 0 and {dp.num_instances - 1}. "
                    + f"{target} is returned."
                )
            if target == instance:
                return value
            self._queues[target].append(value)
            self._usage += 1
            if dp.buffer_size >= 0 and self._usage > dp.buffer_size:
                raise BufferError(f"DemultiplexerIterDataPipe buffer overflow, buffer size "
                                  f"{dp.buffer_size} is insufficient.")

    def next_for(self, instance: int) -> Any:
        if not self._started:
            self._started = True
            self._exhausted = False
            self._stopped = [False] * self.datapipe.num_instances
        while not self._stopped[instance]:
            if self._queues[instance]:
                self._usage -= 1
                self.yielded += 1
                return self._queues[instance].popleft()
            try:
                value = self._find_next(instance)
            except StopIteration:
                self._stopped[instance] = True
                self._exhausted = True
                continue
            self.yielded += 1
            return value
        raise StopIteration

    def buffered(self) -> int:
        return self._usage

    def get_state(self) -> dict[str, Any]:
        return {STARTED: self._started, QUEUES: [list(q) for q in self._queues], USAGE: self._usage,
                INPUT_ENDED: self._exhausted, STOPPED: list(self._stopped)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._started = bool(state[STARTED])
        self._queues = [deque(q) for q in state[QUEUES]]
        self._usage = int(state[USAGE])
        self._exhausted = bool(state[INPUT_ENDED])
        self._stopped = [bool(s) for s in state[STOPPED]]


class ChildIterator(Stateless):
    """A child of ``fork`` or ``demux``: reads its share from the container."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._container = inputs[0]
        self._instance = datapipe.instance_id

    @classmethod
    def accepts(cls, datapipe: Any) -> bool:
        from snapshot.hooks._registry import hook_for

        hook = hook_for(datapipe.main_datapipe)
        return hook is not None and hook.iterator is not None and issubclass(hook.iterator, _Container)

    def next(self) -> Any:
        return self._container.next_for(self._instance)
