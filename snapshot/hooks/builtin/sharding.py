"""``ShardingFilter``: every ``num_of_instances``-th sample, counted from ``instance_id``."""

from __future__ import annotations

from typing import Any

from snapshot.hooks._base import ResumableIterator

INDEX = "index"


class ShardingFilterIterator(ResumableIterator):
    streams = "passes"

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._src = inputs[0]
        self._index = 0

    def next(self) -> Any:
        src = self._src
        count, me = self.datapipe.num_of_instances, self.datapipe.instance_id
        while True:
            item = next(src)
            index = self._index
            self._index = index + 1
            if index % count == me:
                return item

    def get_state(self) -> dict[str, Any]:
        return {INDEX: self._index}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = int(state[INDEX])
