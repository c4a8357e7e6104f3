"""The loader's collective operations across ranks, on a gloo group of its own with a timeout: a rank
that dies or hangs turns into a :class:`~snapshot.RankError` on the others within that time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from snapshot.errors import RankError

__all__ = ["Collective"]


class Collective:
    """The loader's collective operations on its own gloo group, with a timeout."""

    def __init__(self, group: Any, rank: int, world: int, timeout: float):
        self.group = group
        self.rank = rank
        self.world = world
        self.timeout = timeout

    def _run(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (RuntimeError, dist.DistBackendError) as exc:
            raise RankError(
                f"rank {self.rank} of {self.world}: {what} failed: another rank died, hung for more than "
                f"{self.timeout:g} s, or left the group ({type(exc).__name__}: {str(exc).splitlines()[0]}). "
                "Stop every rank and restore from the last complete snapshot."
            ) from exc

    def all_gather(self, value: Any, what: str) -> list[Any]:
        out: list[Any] = [None] * self.world
        self._run(what, lambda: dist.all_gather_object(out, value, group=self.group))
        return out

    def broadcast(self, value: Any, what: str) -> Any:
        box = [value if self.rank == 0 else None]
        self._run(what, lambda: dist.broadcast_object_list(box, src=0, group=self.group))
        return box[0]

    def all_reduce_min(self, value: int, what: str) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        self._run(what, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group))
        return int(tensor.item())

    def all_gather_ints(self, values: list[int], what: str) -> list[list[int]]:
        tensor = torch.tensor(values, dtype=torch.int64)
        out = [torch.empty_like(tensor) for _ in range(self.world)]
        self._run(what, lambda: dist.all_gather(out, tensor, group=self.group))
        return [[int(v) for v in t.tolist()] for t in out]

    def send(self, value: Any, rank: int, what: str) -> None:
        self._run(what, lambda: dist.send_object_list([value], dst=rank, group=self.group))

    def receive(self, rank: int, what: str) -> Any:
        box: list[Any] = [None]
        self._run(what, lambda: dist.recv_object_list(box, src=rank, group=self.group))
        return box[0]

    def barrier(self, what: str) -> None:
        self.all_gather(None, what)
