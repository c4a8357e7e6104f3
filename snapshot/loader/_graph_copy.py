"""The loader's own copy of the DataPipe graph: the pipes it runs, their analysis, and the pickle
that snapshots keep of them.

A ``DataLoader2`` never runs the graph it is given: it deep-copies it (so one graph can feed
several loaders), applies the adapters, and keeps the copy's pickle in the portable form that
another script can load. A loader built from a snapshot adopts the graph pickled in it instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from snapshot._warnings import user_stacklevel
from snapshot.container import _serialization
from snapshot.engine.graph import Graph
from snapshot.engine.plan import CodeChanges
from snapshot.errors import SerializationError, SnapshotError

__all__ = ["GraphCopy"]

#: Bytes of script globals copied into the graph's pickle above which the loader warns.
_COPIED_GLOBALS_WARNING = 16 * 2**20


class GraphCopy:
    """The graph a loader runs (``datapipe``), its analysis (``graph``) and its pickle (``pickled``).

    Empty (all ``None``) until a graph is given or adopted from a snapshot. ``problem`` says
    why the pickle would not load in another script (a function of ``__main__`` that uses
    what cannot be pickled, ...); ``from_snapshot`` that the graph was unpickled from a file,
    so a missing module is explained in terms of the snapshot. ``code_changes`` is what
    restoring does when a function of the graph has other code than when it was saved.
    """

    def __init__(self, datapipe: Any = None, adapter_fns: list[Any] | None = None,
                 code_changes: CodeChanges = CodeChanges.REFUSE) -> None:
        self.code_changes = code_changes
        self.datapipe: Any = None
        self.graph: Graph | None = None
        self.pickled: bytes | None = None
        self.problem: str | None = None
        self.from_snapshot = False
        if datapipe is not None:
            datapipe, pickled, self.problem = _adapted_copy(datapipe, adapter_fns)
            self.pickled, self.datapipe, self.graph = pickled, datapipe, Graph(datapipe)

    def adopt(self, pickled: bytes) -> None:
        """Run the graph pickled in a snapshot (this unpickles it: the snapshot is trusted)."""
        self.datapipe = _serialization.loads_graph(pickled)
        self.pickled, self.from_snapshot, self.graph = pickled, True, Graph(self.datapipe)

    def require(self) -> Graph:
        """The graph's analysis, or a ``SnapshotError`` when the loader has no graph yet."""
        if self.graph is None:
            raise SnapshotError("this DataLoader2 has no graph yet; nothing to capture")
        return self.graph

    def explain(self, error: BaseException) -> None:
        """Add to ``error`` which module the snapshot's graph needs, when it came from a file."""
        if self.from_snapshot:
            _serialization.explain_missing_code(error)

    def check_portable(self, include_graph: bool = True, *, strict: bool = True) -> None:
        """Refuse (``strict``) or warn about a graph whose pickle would not load in another script."""
        if not include_graph or self.problem is None:
            return
        message = (f"the DataPipe graph cannot be saved so that another script can load it: {self.problem}. Move "
                   "that function (and what it uses) into a module the restoring script can import, or make the "
                   "value picklable; or save with include_graph=False and build the same graph in code before "
                   "restore_snapshot()")
        if strict:
            raise SerializationError(message + ".")
        warnings.warn(message + ". This state dict's graph loads only in the script that saved it (from_state "
                      "elsewhere fails); load_state_dict() onto a graph built in code is not affected.",
                      stacklevel=user_stacklevel())


def _adapted_copy(datapipe: Any, adapter_fns: list[Any] | None) -> tuple[Any, bytes, str | None]:
    """A private copy of ``datapipe`` with the adapters applied, the pickle a snapshot keeps of it
    (portable to another script: see ``_serialization.portable_graph``) and why it is not portable."""
    datapipe, data = _serialization.clone(datapipe)
    if adapter_fns is not None:
        for adapter_fn in adapter_fns:
            datapipe = adapter_fn(datapipe)
        data = _serialization.dumps_graph(datapipe)
    portable, problem = _serialization.portable_graph(datapipe, data)
    if len(portable) - len(data) > _COPIED_GLOBALS_WARNING:
        warnings.warn(
            f"the functions of your script use globals that make the graph's pickle {len(portable) / 2**20:.0f} "
            f"MiB (without them: {len(data) / 2**20:.0f} MiB), and every snapshot with the graph holds a copy. "
            "Move large data into a module the restoring script imports, or save with include_graph=False "
            "and build the graph in code before restoring.", stacklevel=user_stacklevel())
    return datapipe, portable, problem
