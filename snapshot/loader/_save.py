"""The loader's saver: it captures the position and writes it, now or in a background thread."""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

from snapshot.container import _serialization
from snapshot.container.capture import LoaderState, Snapshot, snapshot_of
from snapshot.container.format import PathOrFile
from snapshot.engine.graph import Graph
from snapshot.engine.plan import check_restorable
from snapshot.errors import RankError, WorkerError
from snapshot.hooks import _fresh, hook_for
from snapshot.loader import _state_dict
from snapshot.loader._graph_copy import GraphCopy
from snapshot.loader._position import LivePosition
from snapshot.loader._service import LoaderService
from snapshot.schema.manifest import check_metadata
from snapshot.storage import _fsspec, _object_directory, _rotation, _staging, multipart
from snapshot.storage._background import BackgroundSaver
from snapshot.storage._io import save, write

__all__ = ["Saver", "check_keep_last"]


def check_keep_last(dest: Any, keep_last: int) -> None:
    """Refuse ``keep_last`` before saving where it cannot apply."""
    if not isinstance(dest, (str, os.PathLike)):
        raise ValueError(f"keep_last needs dest to be a path in a directory of snapshots, got {dest!r}")
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    _rotation.prune_check(dest)


def _readers(graph: Any) -> dict[str, Any]:
    """Per node path, the hook of each file reader: it says where a saved state stands (the manifest's
    ``reading``, see :mod:`snapshot.container._readers`)."""
    found = {}
    for node in graph.nodes:
        hook = hook_for(node.datapipe)
        if hook is not None and callable(getattr(hook.iterator, "where", None)):
            found[node.path] = hook.iterator
    return found


class _Fixed:
    """What a capture holds that is fixed for the life of the loader's graph: the graph's description
    (node types, arguments, the fingerprints of their functions' code), its fingerprint and pickle, the
    reading service's pickle, ``code_changes``. The first save computes the description and the default
    service's pickle (0.3-0.5 ms); a background save computes them in its thread, after the loader goes
    on. That is exact: these are read from the :class:`~snapshot.engine.graph.Graph` and the pickle taken
    here, as of the call, and neither changes while the loader runs (iterating changes the pipes' state,
    not the graph's nodes, arguments or functions; a restore into the loader adopts a new ``Graph`` and
    pickle, it never changes these), and the service's pickle is of the service as it was given (or of a
    new default one), never of its running state."""

    def __init__(self, graph: Graph, graph_bytes: bytes | None, service: LoaderService, code_changes: str):
        self.graph, self.graph_bytes, self.service, self.code_changes = graph, graph_bytes, service, code_changes

    def fill(self, source: LoaderState) -> None:
        """Set these in ``source`` (a capture made with ``fixed=False``)."""
        source.graph_nodes = self.graph.describe()
        source.graph_fingerprint = self.graph.fingerprint
        source.code_changes = self.code_changes
        source.graph_bytes = self.graph_bytes
        source.service_bytes = self.service.pickled


class Saver:
    """Captures where the loader stands (its graph, service and position, which it reads and never
    changes but to compute samples ahead for ``verify``) and writes it. One save runs at a time:
    a background save (``background``) is waited for before the next, and before a stop."""

    def __init__(self, graph: GraphCopy, service: LoaderService, position: LivePosition) -> None:
        self.graph, self.service, self.position = graph, service, position
        self.background = BackgroundSaver()

    def wait(self) -> None:
        """Wait for the background save, if one runs (at most ``background.timeout`` seconds; never for one
        that failed)."""
        self.background.wait()

    def raise_failure(self) -> None:
        """Raise the failure of the last background save, once, unless its future's outcome was read."""
        self.background.raise_failure()

    def source(self, *, include_graph: bool, verify: int = 0, fixed: bool = True) -> LoaderState:
        """What the loader reports for a capture, after refusing a graph that cannot be restored
        exactly (before anything is computed ahead or written); ``verify=K`` fingerprints the next K samples.
        ``fixed=False`` leaves out what is fixed for the graph's life (see :class:`_Fixed`): the caller fills it
        in with :meth:`fixed`."""
        graph = self.graph.require()
        check_restorable(graph)
        pos = self.position
        source = LoaderState(
            epoch=pos.epoch,
            yielded=pos.yielded,
            epoch_finished=pos.epoch_finished,
            seed=pos.seed if pos.epoch >= 0 else None,
            seed_given=pos.seed_given,
            pending_seed=pos.user_seed if pos.reset_seed else None,
            # new dicts and lists of ints: a background save takes them as they are (snapshot.hooks._fresh)
            generator=_fresh.fresh(pos.generator.state()) if pos.generator is not None else None,
            service=self.service.checkpoint(pos, verify),
            service_name=type(self.service.service).__name__,
            graph_nodes=[],
            graph_fingerprint="",
            graph_bytes=None,
            service_bytes=None,
            lookahead=list(pos.lookahead),
            readers=_readers(graph),
        )
        if verify:
            # the graph computes ahead from here: what the capture holds of its live state (a user pipe's
            # state_dict may return its own dict) is copied first, else the file would hold the state after
            source.service = _staging.stage(source.service, _fresh.collected() or {})
            source.verify = pos.ahead(verify)
        if fixed:
            self.fixed(include_graph).fill(source)
        return source

    def fixed(self, include_graph: bool) -> _Fixed:
        """What a capture holds that is fixed for the life of the loader's graph, as of now (to fill in later)."""
        return _Fixed(self.graph.require(), self.graph.pickled if include_graph else None, self.service,
                      self.graph.code_changes.value)

    def _capture(self, dest: PathOrFile | None, *, include_graph: bool, verify: int, fixed: bool = True
                 ) -> LoaderState:
        """:meth:`source` for a save to ``dest``: a worker or a rank that fails meanwhile is an error that
        names ``dest`` and what is intact there."""
        try:
            return self.source(include_graph=include_graph, verify=verify, fixed=fixed)
        except (WorkerError, RankError) as exc:
            if not isinstance(dest, (str, os.PathLike)):
                raise
            where = os.fspath(dest)
            intact = _fsspec.intact_at(where) if _fsspec.is_url(where) else _rotation.intact_at(where)
            raise type(exc)(f"{where}: the snapshot was not saved: {exc} {intact}") from exc

    def save(self, dest: PathOrFile | None, *, blocking: bool, include_graph: bool, keep_last: int | None,
             key: bytes | str | None, verify: int, metadata: dict[str, Any] | None = None) -> Snapshot | Future[str]:
        """``save_snapshot``: after the previous background save, this one, now or in the background."""
        if keep_last is not None:
            check_keep_last(dest, keep_last)
        plain = None if metadata is None else check_metadata(metadata)  # refused before anything is captured
        self.wait()
        self.raise_failure()  # before this save captures anything
        save = self._save_now if blocking else self._save_in_background
        return save(dest, include_graph=include_graph, keep_last=keep_last, key=key, verify=verify, metadata=plain)

    def _save_now(self, dest: PathOrFile | None, *, include_graph: bool, keep_last: int | None,
                  key: bytes | str | None, verify: int, metadata: dict[str, Any] | None = None) -> Snapshot:
        """Capture and, when ``dest`` is given, write (a collective across ranks)."""
        self.graph.check_portable(include_graph)
        collective = self.service.collective()
        source = self._capture(dest, include_graph=include_graph, verify=verify)
        source.metadata = metadata
        # a path or a URL: encoded straight into the file (no copy of the state); across ranks, every
        # rank its part of a directory (a local one, or a prefix in object storage), rank 0 the index
        if isinstance(dest, (str, os.PathLike)) and collective is not None:
            directory = _object_directory if _fsspec.is_url(dest) else multipart
            snap = directory.save_directory(collective, source, dest, key)
        elif isinstance(dest, (str, os.PathLike)):
            snap = write(source, dest, key=key)
        else:
            snap = snapshot_of(source)
            if dest is not None:
                save(snap, dest, key=key)  # a binary file object
        if keep_last is not None and (collective is None or collective.rank == 0):
            _rotation.prune(dest, keep_last)  # type: ignore[arg-type]
        return snap

    def _save_in_background(self, dest: PathOrFile | None, *, include_graph: bool, keep_last: int | None,
                            key: bytes | str | None, verify: int, metadata: dict[str, Any] | None = None
                            ) -> Future[str]:
        """Capture now; encode and write in the background saver (synchronous across ranks)."""
        if dest is None or not isinstance(dest, (str, os.PathLike)):  # a path or a URL
            raise TypeError(
                f"save_snapshot(blocking=False) writes to a path, got {type(dest).__name__}; pass a "
                "path, or use blocking=True to write to a file object or to get the Snapshot")
        self.graph.check_portable(include_graph)
        path = os.fspath(dest)
        if self.service.collective() is not None:
            self._save_now(dest, include_graph=include_graph, keep_last=keep_last, key=key, verify=verify,
                           metadata=metadata)
            done: Future[str] = Future()
            done.set_result(path)
            return done
        with _fresh.collecting() as fresh:  # what the hooks made for this capture is taken as it is, or made later
            fresh.service = self.service.service
            source = self._capture(dest, include_graph=include_graph, verify=verify, fixed=False)
        source.metadata = metadata  # checked plain data: staged as it is
        source = _staging.stage(source, fresh)
        fixed = self.fixed(include_graph)

        def background() -> str:
            fresh.make_later(source)  # what the hooks left to make (snapshot.hooks._fresh), in this thread
            fixed.fill(source)  # in this thread: see _Fixed
            with _serialization.cooperative():
                write(source, path, key=key, progress=False)  # a background save never draws a bar
            if keep_last is not None:
                _rotation.prune(path, keep_last)
            return path

        return self.background.submit(background, path)

    def state_dict(self) -> dict[str, Any]:
        """``loader.state_dict()``; across ranks, every rank's part gathered where it is written, or each rank's
        own (:mod:`snapshot.loader._state_dict`)."""
        self.graph.check_portable(strict=False)
        collective = self.service.collective()
        writer = _state_dict.caller()
        if collective is not None and writer == _state_dict.LOAD:
            return _state_dict.load_template(collective)
        if collective is None:
            return snapshot_of(self.source(include_graph=True)).state_dict()
        return _state_dict.ranks_state_dict(collective, lambda: self.source(include_graph=True), writer=writer)
