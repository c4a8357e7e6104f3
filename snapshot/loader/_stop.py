"""Stopping a ``DataLoader2`` (``shutdown()``, the end of a ``with`` block, a failure of its
graph), and the position it keeps for saves after the stop.

The reading service's checkpoint is taken as the loader stops, while its workers still run,
so a save or ``state_dict()`` after ``shutdown()`` restores exactly where the loader stopped
(trainers often save in teardown hooks). Where there is no exact position (the graph raised, a
worker died, the loader read across ranks and released its process group), the save raises a
:class:`~snapshot.SnapshotError` that says to save before stopping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snapshot.container import _serialization
from snapshot.errors import SnapshotError
from snapshot.loader._position import Stopped

if TYPE_CHECKING:
    from snapshot.loader._parts import LoaderParts

__all__ = ["at_stop", "stop", "stopped_service"]


def stop(loader: LoaderParts, *, keep_position: bool, error: BaseException | None = None) -> None:
    """Wait for a background save, keep the position (unless ``keep_position`` is false: a
    finalizer), then release the reading service. Safe to call twice."""
    if error is not None and getattr(loader, "_graph_from_snapshot", False):
        _serialization.explain_missing_code(error)
    saver = getattr(loader, "_saver", None)
    if saver is not None:
        saver.wait()
    if not loader._terminated:
        if keep_position and loader._graph is not None:
            loader._stopped = at_stop(loader, error)
        loader._terminated = True
        service = getattr(loader, "reading_service", None)
        if service is not None:
            service.finalize_iteration()
            service.finalize()
    position = getattr(loader, "_position", None)
    if position is not None:
        position.reset_iter = True
        position.datapipe_iter = None


def at_stop(loader: LoaderParts, error: BaseException | None = None) -> Stopped:
    """What a loader that stops now keeps for later saves; call it before the service is torn
    down. ``error``: the exception its graph raised (the position past it is not exact)."""
    pos = loader._position
    if pos.epoch < 0:
        return Stopped(service={})
    distributed = loader._collective() is not None
    if error is not None:
        return Stopped(why_not=f"it stopped because its graph raised {type(error).__name__} ({_summary(error)}) after "
                               f"{pos.yielded} samples of epoch {pos.epoch}, and a graph's position past a "
                               "failure is not a point of the uninterrupted stream", distributed=distributed)
    if distributed:  # a save after the stop is refused anyway: its process group is released
        return Stopped(distributed=True)
    try:
        service = loader.reading_service.checkpoint()
    except Exception as exc:  # noqa: BLE001 - a dead worker, a service without checkpoint(): said at save
        return Stopped(why_not=f"its reading service could not report where it stood as it stopped "
                               f"({type(exc).__name__}: {_summary(exc)})", distributed=distributed)
    return Stopped(service=service, distributed=distributed)


def _summary(error: BaseException) -> str:
    """An error's first line, and the original error's line when a worker's traceback follows."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    original = [line for line in lines[1:] if line.startswith(f"{type(error).__name__}: ")]
    return lines[0] if not original else f"{lines[0]} ... {original[-1]}"


def stopped_service(stopped: Stopped | None, verify: int) -> dict[str, Any]:
    """The service checkpoint a stopped loader kept, or a ``SnapshotError`` that says why there is none."""
    if stopped is None:
        why = "it was finalized without keeping its position"
    elif stopped.why_not is not None:
        why = stopped.why_not
    elif stopped.distributed:
        why = "it read across ranks, and a distributed save is a collective on the process group it released"
    elif verify:
        why = f"verify={verify} computes samples ahead, which a stopped loader cannot (save with verify=0)"
    else:
        assert stopped.service is not None
        return stopped.service
    raise SnapshotError(
        f"cannot capture this DataLoader2's position after shutdown(): {why}. Save with save_snapshot() "
        "or state_dict() before shutdown() or the end of the `with DataLoader2(...)` block; to go on, "
        "restore the last snapshot saved before it stopped.")
