"""PyTorch Lightning: the loader's position in Lightning's own checkpoint; exact mid-epoch resumes.

Lightning (2.x) saves the state of every train dataloader that has ``state_dict()`` and
``load_state_dict()`` in its checkpoint (``loops.fit_loop.state_dict.combined_loader``) and
loads it back when ``Trainer.fit(ckpt_path=...)`` resumes. One detail decides whether the
resume is exact: Lightning's fetcher takes one batch *ahead* from a loader without
``len()`` (to know which batch is the last), so when a checkpoint is written the loader has
already handed out a batch that no training step has seen. A bare
:class:`~snapshot.DataLoader2` would resume after that batch, one batch late.
:class:`LightningLoader` wraps the loader, asks the trainer how many batches its loop has
taken, and keeps the batches handed out beyond that in its state, to hand them out again
first after a resume::

    from snapshot.integrations.lightning import LightningLoader, reading_service_for

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            service = reading_service_for(self.trainer, num_workers=2)
            loader = snapshot.DataLoader2(make_graph(), reading_service=service)
            loader.seed(42)
            return LightningLoader(loader, self.trainer)

:func:`reading_service_for` is the one place where the strategy decides how the graph is read:
in this process or in worker processes on a single device, and shared among the ranks (each
with its workers) under DDP, FSDP or DeepSpeed.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Iterator
from typing import Any

import snapshot
from snapshot.integrations import _services
from snapshot.integrations._extras import require

require("lightning", "lightning", "snapshot.integrations.lightning")

from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy  # noqa: E402

__all__ = ["LightningLoader", "reading_service_for"]

#: Keys of :meth:`LightningLoader.state_dict`.
FORMAT, LOADER, CONSUMED, FINISHED, PENDING = "lightning_loader", "loader", "consumed", "finished", "pending"
_FORMAT_VERSION = 1
#: Batches a loader may hand out ahead of the training loop (Lightning's fetcher takes one).
_MAX_AHEAD = 8


def reading_service_for(
    trainer: Any,
    num_workers: int = 0,
    *,
    timeout: float = 1800.0,
    logical_shards: int | None = None,
    even_batches: str | None = _services.EVEN_BATCHES_DEFAULT,
    **worker_options: Any,
) -> snapshot.ReadingServiceInterface:
    """The reading service for ``trainer``'s strategy.

    A single-device strategy: :class:`~snapshot.InProcessReadingService`, or
    :class:`~snapshot.MultiProcessingReadingService` with ``num_workers`` workers. A
    data-parallel strategy (DDP in all its launchers, FSDP, DeepSpeed: every
    ``ParallelStrategy``): :class:`~snapshot.DistributedReadingService` with ``timeout`` and
    ``even_batches`` (default ``"drop"``: every rank takes the same number of steps), in
    front of ``num_workers`` workers per rank when ``num_workers > 0``. ``worker_options``
    go to :class:`~snapshot.MultiProcessingReadingService`.

    ``ModelParallelStrategy`` is refused: the ranks of a tensor-parallel group must read
    the same batches, and the distributed service gives every rank its own share.
    """
    strategy = trainer.strategy
    if isinstance(strategy, ModelParallelStrategy):
        raise ValueError(
            "reading_service_for() does not support ModelParallelStrategy: the ranks of a tensor-parallel group "
            "must read the same batches, while DistributedReadingService gives every rank its own share. Build "
            "the reading service yourself for the data-parallel ranks.")
    return _services.choose(distributed=isinstance(strategy, ParallelStrategy), num_workers=num_workers,
                            timeout=timeout, logical_shards=logical_shards, even_batches=even_batches,
                            worker_options=worker_options)


class LightningLoader:
    """A :class:`~snapshot.DataLoader2` as Lightning's train dataloader, resuming exactly mid-epoch.

    Iterating it iterates ``loader`` (epochs, seeds and reading service as usual).
    ``state_dict()`` holds the loader's state dict plus the batches Lightning's fetcher took
    ahead of ``trainer``'s training loop; ``load_state_dict()`` restores the loader and hands
    those batches out first. In a distributed run ``state_dict()`` is a collective (Lightning
    calls it on every rank when it writes a checkpoint) that gathers every rank's part of the
    loader's state, and the batches each rank's fetcher took ahead, on rank 0, whose state
    Lightning writes. A checkpoint resumes on another number
    of ranks as the distributed service allows; mid-epoch, the batches the saved ranks' fetchers
    took ahead are dealt to the new ranks as evenly as they can be, and the loader's restore
    counts them when it evens out the new ranks' shares of the rest of the epoch, so every rank
    takes the same number of steps on any number of devices.

    The batches taken ahead are pickled into the state: trust a checkpoint that holds it as
    much as any pickle (see the threat model).
    """

    def __init__(self, loader: snapshot.DataLoader2[Any], trainer: Any) -> None:
        if not isinstance(loader, snapshot.DataLoader2):
            raise TypeError(f"LightningLoader wraps a snapshot.DataLoader2, got {type(loader).__name__}")
        self.loader = loader
        self.trainer = trainer
        self._handed = 0  # batches of the current epoch handed out (or taken, before a restore)
        self._finished = False  # the current epoch's loader iterator is exhausted
        self._resume = False  # the next iteration continues the current epoch (after load_state_dict)
        #: The training loop's batch count at which this epoch's count is 0: set by the first
        #: batch handed out after iter() (Lightning's count is not always reset at an epoch's start).
        self._base: int | None = None
        self._recent: deque[Any] = deque(maxlen=_MAX_AHEAD)  # the last batches handed out
        self._pending: deque[Any] = deque()  # batches to hand out again after a restore

    def __iter__(self) -> Iterator[Any]:
        return self._epoch()

    def _epoch(self) -> Iterator[Any]:
        # A generator: nothing happens until the first next(), so Lightning's iter() that
        # only checks that the loader is iterable starts nothing.
        it = iter(self.loader)
        if not self._resume:
            self._handed = 0
            self._pending.clear()
        self._resume = False
        self._finished = False
        self._recent.clear()
        self._base = None
        while self._pending:
            yield self._hand(self._pending.popleft())
        for item in it:
            yield self._hand(item)
        self._finished = True

    def _loop_count(self) -> int | None:
        """How many batches Lightning's training loop has taken (its own count), if it runs."""
        loop = getattr(self.trainer, "fit_loop", None)
        return None if loop is None else int(loop.epoch_loop.batch_idx) + 1

    def _hand(self, item: Any) -> Any:
        count = self._loop_count()
        if self._base is None and count is not None:
            self._base = count - self._handed  # the loop has taken all the batches handed out so far
        self._handed += 1
        self._recent.append(item)
        if self._taken() > self._handed:
            raise snapshot.SnapshotError(
                f"Lightning's training loop counts {self._taken()} batches of this epoch, and this loader has handed "
                f"out {self._handed}: the loader's state in the checkpoint was not loaded (Lightning skips it when "
                "configure_optimizers reads trainer.estimated_stepping_batches with max_epochs set, "
                "Lightning-AI/pytorch-lightning#20550: compute the number of steps another way), or the trainer "
                "given to LightningLoader is not the one fitting with it.")
        return item

    def _taken(self) -> int:
        """Batches of the current epoch the training loop has taken."""
        count = self._loop_count()
        if self._base is None or count is None:
            return self._handed
        return count - self._base

    def state_dict(self) -> dict[str, Any]:
        taken = self._taken()
        ahead = self._handed - taken
        if not 0 <= ahead <= len(self._recent):
            raise snapshot.SnapshotError(
                f"the training loop has taken {taken} batches of this epoch and the loader handed out "
                f"{self._handed}: the trainer given to LightningLoader is not the one iterating it, or a "
                "training_step with a dataloader_iter argument fetched batches itself (not supported). Give "
                "LightningLoader the trainer that fits with it.")
        pending = list(self._recent)[len(self._recent) - ahead:] if ahead else []
        pending += self._pending  # restored, not handed out again yet
        loader_state = self.loader.state_dict()  # a collective in a distributed run
        return {FORMAT: _FORMAT_VERSION, LOADER: loader_state, CONSUMED: taken, FINISHED: self._finished,
                PENDING: pickle.dumps(_gather(pending, self.loader), protocol=pickle.HIGHEST_PROTOCOL)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get(FORMAT) != _FORMAT_VERSION:
            raise snapshot.SnapshotError(
                "this is not a LightningLoader state (written by snapshot.integrations.lightning, format "
                f"{_FORMAT_VERSION}); a bare DataLoader2's state dict goes to DataLoader2.load_state_dict()")
        per_rank: list[list[Any]] = pickle.loads(state[PENDING])
        rank, world = _rank_and_world(self.loader)
        pending: list[Any] = []
        hand_out_first = getattr(self.loader.reading_service, "hand_out_first", None)
        if len(per_rank) == world:
            pending = list(per_rank[rank])
        elif hand_out_first is None:  # one process: it takes them all
            pending = [batch for saved in per_rank for batch in saved]
        else:  # through the loader: its restore evens out the rest of the epoch around them, and its
            hand_out_first(per_rank)  # even_batches policy counts them: every rank takes as many steps
        self.loader.load_state_dict(state[LOADER])
        self._pending = deque(pending)
        self._handed = int(state[CONSUMED])
        self._finished = bool(state[FINISHED])
        self._resume = not self._finished
        self._base = None
        self._recent.clear()

    def shutdown(self) -> None:
        """Shut the loader down (its worker processes); call it from ``LightningDataModule.teardown``."""
        self.loader.shutdown()


def _rank_and_world(loader: snapshot.DataLoader2[Any]) -> tuple[int, int]:
    if not isinstance(loader.reading_service, (snapshot.DistributedReadingService, snapshot.SequentialReadingService)):
        return 0, 1
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def _gather(pending: list[Any], loader: snapshot.DataLoader2[Any]) -> list[list[Any]]:
    """Every rank's batches taken ahead, in rank order, on rank 0 (the rank whose state Lightning writes;
    the other ranks' states hold none)."""
    rank, world = _rank_and_world(loader)
    if world == 1:
        return [pending]
    collective = loader.reading_service.collective  # type: ignore[attr-defined]
    gathered = collective.gather(pending, "gathering the batches Lightning's fetcher took ahead")
    return gathered if gathered is not None else []
