"""After a replay: how a replayed node's position differs from the one its snapshot saved."""

from __future__ import annotations

from typing import Any

from snapshot.hooks._base import ResumableIterator

__all__ = ["divergence"]


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively: a state as it reads after a trip through a snapshot."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def divergence(cell: Any, saved: int | None, ended: bool, state: Any) -> str | None:
    """How a replayed cell's position differs from the saved one: ``saved`` samples, the end of
    its epoch reached (``ended``), its ``state`` (``None``: it does not differ)."""
    if cell.yielded != saved:
        return f"saved {saved}, replayed {cell.yielded}"
    if bool(getattr(cell, "exhausted", False)) != ended:
        return (f"after {saved} samples it had {'' if ended else 'not '}reached the end of its epoch in the "
                f"snapshot, and had {'not ' if ended else ''}in the replay")
    if isinstance(cell, ResumableIterator) and cell.replay_checked and state is not None:
        now = cell.get_state()
        keys = [k for k in cell.replay_checked if k in state and _plain(now.get(k)) != _plain(state[k])]
        if keys:
            return f"after {saved} samples its {', '.join(keys)} differ from the snapshot's"
    return None
