"""The loader's reading service through its life: configured, running, then stopped (by
``shutdown()``, the end of a ``with`` block, or a failure of the graph), keeping its position.

The reading service's checkpoint is taken as the loader stops, while its workers still run,
so a save or ``state_dict()`` after ``shutdown()`` restores exactly where the loader stopped
(trainers often save in teardown hooks). Where there is no exact position (the graph raised, a
worker died, the loader read across ranks and released its process group), the save raises a
:class:`~snapshot.SnapshotError` that says to save before stopping.
"""

from __future__ import annotations

from typing import Any

from snapshot.container import _serialization
from snapshot.errors import SnapshotError
from snapshot.hooks._positions import BufferState
from snapshot.loader._position import LivePosition, Stopped
from snapshot.reading_service.base import ReadingServiceInterface

__all__ = ["LoaderService"]


class LoaderService:
    """The loader's own copy of its reading service (``service``), the pickle snapshots keep of it
    (``pickled``), and whether it is stopped (``terminated``; ``stopped``: what it kept)."""

    def __init__(self, service: ReadingServiceInterface | None, buffer_state: BufferState) -> None:
        self._pickled: bytes | None = None
        if service is None:  # the default: a fresh one, pickled only when a save needs it (as this one was)
            self.service: ReadingServiceInterface = _default()
        else:
            self._pickled = _serialization.dumps(_checked(service), what="reading service")
            self.service = _serialization.loads(self._pickled)
        _configure_buffers(self.service, buffer_state)
        self.terminated = False
        #: Set by ``stop()``: the position it kept for saves after it (see ``Stopped``).
        self.stopped: Stopped | None = None

    @property
    def pickled(self) -> bytes:
        """The pickle of the service as it was given, which snapshots keep."""
        if self._pickled is None:
            self._pickled = _serialization.dumps(_default(), what="reading service")
        return self._pickled

    def collective(self) -> Any:
        """The service's collective operations when it spans ranks (else ``None``, also once it is
        stopped: its process group is released)."""
        if self.terminated:
            return None
        return getattr(self.service, "collective", None)

    def checkpoint(self, position: LivePosition, verify: int = 0) -> dict[str, Any]:
        """Where the service stands: asked of it while it runs, kept from its stop after that (or a
        ``SnapshotError`` that says why there is none)."""
        if self.terminated:
            return _stopped_checkpoint(self.stopped, verify)
        return self.service.checkpoint() if position.epoch >= 0 else {}

    def stop(self, position: LivePosition, *, keep_position: bool, error: BaseException | None = None) -> None:
        """Keep the position (unless ``keep_position`` is false: a finalizer, or no graph), then
        release the service. Safe to call twice. ``error``: what the graph raised, if it did."""
        if not self.terminated:
            if keep_position:
                self.stopped = self._at_stop(position, error)
            self.terminated = True
            self.service.finalize_iteration()
            self.service.finalize()
        position.detach()

    def _at_stop(self, position: LivePosition, error: BaseException | None) -> Stopped:
        """What a service that stops now keeps for later saves; called before it is torn down."""
        if position.epoch < 0:
            return Stopped(service={})
        distributed = self.collective() is not None
        if error is not None:
            return Stopped(why_not=f"it stopped because its graph raised {type(error).__name__} ({_summary(error)}) "
                                   f"after {position.yielded} samples of epoch {position.epoch}, and a graph's "
                                   "position past a failure is not a point of the uninterrupted stream",
                           distributed=distributed)
        if distributed:  # a save after the stop is refused anyway: its process group is released
            return Stopped(distributed=True)
        try:
            service = self.service.checkpoint()
        except Exception as exc:  # noqa: BLE001 - a dead worker, a service without checkpoint(): said at save
            return Stopped(why_not=f"its reading service could not report where it stood as it stopped "
                                   f"({type(exc).__name__}: {_summary(exc)})", distributed=distributed)
        return Stopped(service=service, distributed=distributed)


def _summary(error: BaseException) -> str:
    """An error's first line, and the original error's line when a worker's traceback follows."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    original = [line for line in lines[1:] if line.startswith(f"{type(error).__name__}: ")]
    return lines[0] if not original else f"{lines[0]} ... {original[-1]}"


def _stopped_checkpoint(stopped: Stopped | None, verify: int) -> dict[str, Any]:
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


def _default() -> ReadingServiceInterface:
    from snapshot.reading_service.in_process import InProcessReadingService

    return InProcessReadingService()


def _checked(service: Any) -> ReadingServiceInterface:
    """The constructor's ``reading_service``, refused when not ours."""
    if not isinstance(service, ReadingServiceInterface):
        raise TypeError(
            f"reading_service must implement snapshot.ReadingServiceInterface, got "
            f"{type(service).__name__}. torchdata's own reading services cannot take "
            "snapshots; use the ones from snapshot with the same names."
        )
    return service


def _configure_buffers(service: Any, buffer_state: BufferState) -> None:
    """Tell every service that runs graph parts (nested ones included) how to save buffers."""
    seen: set[int] = set()
    stack = [service]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if hasattr(type(current), "buffer_state"):
            current.buffer_state = buffer_state.value
        stack.extend(getattr(current, name, None) for name in ("inner", "executor"))
        stack.extend(getattr(current, "reading_services", []))
