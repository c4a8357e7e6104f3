"""Hugging Face accelerate: save the loader with the model, resume mid-epoch exactly.

A :class:`~snapshot.DataLoader2` has ``state_dict()`` / ``load_state_dict()``, so registering
it is all the glue there is::

    from snapshot.integrations.accelerate import reading_service_for

    accelerator = Accelerator()
    loader = snapshot.DataLoader2(graph, reading_service=reading_service_for(accelerator, num_workers=2))
    loader.seed(42)
    accelerator.register_for_checkpointing(loader)
    ...
    accelerator.save_state("ckpt")   # on every process
    ...
    accelerator.load_state("ckpt")   # the next iter(loader) yields the rest of the epoch

What accelerate (1.x) does with it: ``save_state`` calls ``state_dict()`` of every registered
object *on every process* and the main process writes ``custom_checkpoint_<i>.pkl`` with
``torch.save``; ``load_state`` has every process ``torch.load`` that file (with
``weights_only=False``) and call ``load_state_dict``. In a distributed run the loader's
``state_dict()`` is a collective that gathers every rank's part on rank 0 (the main process),
so the one file it writes restores every rank, and restores onto another number of processes.
Hence the caveat: call ``save_state`` on every process, as accelerate documents (never under
``if accelerator.is_main_process``): a rank that skips it leaves the others waiting until the
loader's ``timeout``, then :class:`~snapshot.RankError`.

Do not pass the loader to ``accelerator.prepare``: it is not a ``torch.utils.data.DataLoader``
(accelerate returns it untouched), and batches are not moved to the device for you.
"""

from __future__ import annotations

from typing import Any

import snapshot
from snapshot.integrations import _services
from snapshot.integrations._extras import require

require("accelerate", "accelerate", "snapshot.integrations.accelerate")

__all__ = ["reading_service_for"]


def reading_service_for(
    accelerator: Any,
    num_workers: int = 0,
    *,
    timeout: float = 1800.0,
    logical_shards: int | None = None,
    even_batches: str | None = _services.EVEN_BATCHES_DEFAULT,
    **worker_options: Any,
) -> snapshot.ReadingServiceInterface:
    """The reading service for the processes ``accelerator`` runs.

    One process: :class:`~snapshot.InProcessReadingService`, or
    :class:`~snapshot.MultiProcessingReadingService` with ``num_workers`` workers. Several
    processes (``accelerator.use_distributed``):
    :class:`~snapshot.DistributedReadingService` with ``timeout`` and ``even_batches``
    (default ``"drop"``: every rank takes the same number of steps), in front of
    ``num_workers`` workers per rank when ``num_workers > 0``. ``worker_options`` go to
    :class:`~snapshot.MultiProcessingReadingService`.
    """
    return _services.choose(distributed=bool(accelerator.use_distributed), num_workers=num_workers,
                            timeout=timeout, logical_shards=logical_shards, even_batches=even_batches,
                            worker_options=worker_options)
