"""Refuse a bare :class:`~snapshot.DataLoader2` in Lightning's fit loop (it would resume one batch late).

Lightning's fetcher takes one batch ahead of the training step from a loader without ``len()``,
so the position a bare loader reports when Lightning writes a checkpoint is one batch past the
step's: a resume from it skips that batch, with no error. Lightning asks for the state (and
gives it back) from its ``CombinedLoader``; :func:`check_caller` recognises that caller from its
module name, without importing Lightning, and raises an error that says to wrap the loader in
``snapshot.integrations.lightning.LightningLoader``, which keeps the batch taken ahead.
"""

from __future__ import annotations

import sys

from snapshot.errors import SnapshotError

__all__ = ["check_caller"]

#: Where Lightning 2.x calls ``state_dict()`` / ``load_state_dict()`` of its train dataloaders.
_LIGHTNING_CALLERS = frozenset({"lightning.pytorch.utilities.combined_loader",
                                "pytorch_lightning.utilities.combined_loader"})

_WRAP = ("Wrap the loader that train_dataloader() returns: `return LightningLoader(loader, self.trainer)` "
         "(from snapshot.integrations.lightning import LightningLoader), which keeps the batches taken ahead "
         "and hands them out first after a resume (docs: how-to/lightning).")


def check_caller(what: str) -> None:
    """Raise if the caller of the loader's ``what`` (``"state_dict"``, ...) is Lightning's loop."""
    frame = sys._getframe(2)  # 0: here, 1: DataLoader2.<what>, 2: its caller
    if frame.f_globals.get("__name__") not in _LIGHTNING_CALLERS:
        return
    if what == "state_dict":
        happened = ("Lightning's fit loop asked a bare snapshot.DataLoader2 for its state to write a checkpoint. "
                    "Its fetcher has already taken the next batch, which no training step has seen, so the state "
                    "would resume one batch late and that batch would be lost.")
    else:
        happened = ("Lightning's fit loop is restoring a bare snapshot.DataLoader2 from a checkpoint. Lightning's "
                    "fetcher takes one batch ahead of the training step, so a bare loader resumes one batch late "
                    "(the batch is lost); resume from a checkpoint written with LightningLoader.")
    raise SnapshotError(f"{happened} {_WRAP}")
