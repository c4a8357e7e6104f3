"""Applying a snapshot: :func:`restore` reads it (:mod:`snapshot.storage._io`) and hands it to the
loader's restorer (:class:`snapshot.loader._restore.Restorer`), which checks the graph, plans
(:mod:`snapshot.plan`) and applies the plan through the loader's reading service.

The planning names (``RestoreStrategy``, ``Plan``, ``make_plan``, ...) live in :mod:`snapshot.plan`
and are importable from here too, where earlier releases defined them.
"""

from __future__ import annotations

from typing import Any

from snapshot.container.capture import Snapshot
from snapshot.engine.plan import (
    CodeChanges,
    Plan,
    RestoreStrategy,
    check_graph,
    check_restorable,
    make_plan,
    needs_replay,
)
from snapshot.storage._io import load

__all__ = ["CodeChanges", "Plan", "RestoreStrategy", "check_graph", "check_restorable", "make_plan", "needs_replay",
           "restore"]


def restore(loader: Any, src: Any, *, strategy: RestoreStrategy | str = "auto",
            key: bytes | str | None = None, allow_pickle: bool = False) -> Snapshot:
    """Put ``loader`` (a :class:`~snapshot.DataLoader2`) at the position saved in ``src``.

    ``src`` is a path, a binary file, bytes, a :class:`Snapshot` or a state dict. Returns the
    snapshot that was applied. On one rank of many, only the parts of a distributed snapshot that the
    rank's re-shard plan names are read, and a rank that cannot read its parts makes every rank
    raise. The state is decoded as data: a snapshot that needs unpickling
    (format 1, or values that are not data) is refused unless it is signed with ``key`` or
    ``allow_pickle=True`` (see :func:`snapshot.load`).
    """
    restorer = getattr(loader, "_restorer", None)
    if restorer is None:
        raise TypeError(f"snapshot.restore() puts a snapshot.DataLoader2 at a saved position; got a "
                        f"{type(loader).__name__} as the loader")
    strategy = RestoreStrategy.parse(strategy)
    snap = src if isinstance(src, Snapshot) else restorer.read(
        lambda parts: load(src, key=key, allow_pickle=allow_pickle, parts=parts))
    restorer.restore(snap, strategy)
    return snap
