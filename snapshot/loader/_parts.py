"""What the loader's helper modules may use of a ``DataLoader2``, as typed protocols.

``dataloader2.py`` imports the helpers (iteration, saving, restoring); they see the loader
only through these protocols, so every import points down and none leads back to the class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from snapshot.engine.graph import Graph
    from snapshot.engine.plan import CodeChanges
    from snapshot.loader._position import LivePosition, Pausing, Stopped
    from snapshot.reading_service.base import ReadingServiceInterface
    from snapshot.storage._background import BackgroundSaver

__all__ = ["IteratedLoader", "LoaderParts"]


class IteratedLoader(Protocol):
    """What ``DataLoader2Iterator`` reads and calls: the position, pausing and the limit."""

    valid_iterator_id: int | None
    _position: LivePosition
    _pausing: Pausing

    def shutdown(self) -> None: ...
    def _stop_after_error(self, error: BaseException) -> None: ...
    def _end_epoch(self) -> None: ...
    def _limit(self, num_batches: int | None) -> None: ...
    def _resume(self) -> None: ...


class LoaderParts(Protocol):
    """What saving and restoring read and set: the graph, the service, the position."""

    reading_service: ReadingServiceInterface
    datapipe: Any
    code_changes: CodeChanges
    _graph: Graph | None
    _graph_bytes: bytes | None
    _graph_problem: str | None
    _graph_from_snapshot: bool
    _service_bytes: bytes
    _position: LivePosition
    _terminated: bool
    _stopped: Stopped | None
    _saver: BackgroundSaver

    def state_dict(self) -> dict[str, Any]: ...
    def _set_graph_bytes(self, data: bytes, datapipe: Any = None) -> None: ...
    def _collective(self) -> Any: ...
