"""The loader's collective operations across ranks, on a gloo group of its own with a timeout: a rank
that dies or hangs turns into a :class:`~snapshot.RankError` on the others within that time."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from snapshot.errors import RankError, SerializationError

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

    def gather(self, value: Any, what: str) -> list[Any] | None:
        """Every rank's ``value`` on rank 0, in rank order; ``None`` on the other ranks."""
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        self._run(what, lambda: dist.gather_object(value, out, dst=0, group=self.group))
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
        """Send ``value`` (pickled) to ``rank``. A value that cannot be pickled is refused here, and
        ``rank``, which waits for it, is told so (it raises too, at once)."""
        try:
            self._run(what, lambda: dist.send_object_list([value], dst=rank, group=self.group))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            message = f"{type(value).__name__} cannot be pickled ({type(exc).__name__}: {exc})"
            self._run(what, lambda: dist.send_object_list([_Unsent(self.rank, message)], dst=rank, group=self.group))
            raise SerializationError(_unsent(self.rank, what, message)) from exc

    def receive(self, rank: int, what: str) -> Any:
        box: list[Any] = [None]
        self._run(what, lambda: dist.recv_object_list(box, src=rank, group=self.group))
        if isinstance(box[0], _Unsent):
            raise RankError(_unsent(box[0].rank, what, box[0].message))
        return box[0]


class _Unsent:
    """Sent in place of a value that could not be pickled, so that the receiver does not wait for it."""

    def __init__(self, rank: int, message: str):
        self.rank, self.message = rank, message


def _unsent(rank: int, what: str, message: str) -> str:
    return (f"rank {rank} could not send a sample ({what}): a {message}. The ranks send samples to each other "
            "when one runs out of its share (even_batches=\"drop\" or \"pad\"): make the samples picklable (read "
            "file streams into bytes with a map before the end of the graph), or use even_batches=None")

    def barrier(self, what: str) -> None:
        self.all_gather(None, what)
