"""Capturing a ``DataLoader2``'s position and writing it: now, or in a background thread."""

from __future__ import annotations

import os
import warnings
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from snapshot._warnings import user_stacklevel
from snapshot.container import _serialization
from snapshot.container.capture import LoaderState, Snapshot, snapshot_of
from snapshot.container.format import PathOrFile
from snapshot.engine.plan import check_restorable
from snapshot.errors import SerializationError, SnapshotError
from snapshot.loader._digest import digests_ahead
from snapshot.loader._stop import stopped_service
from snapshot.storage import _fsspec, _object_directory, _rotation, _staging, multipart
from snapshot.storage._io import save, write
from snapshot.storage.multipart import part_info, parts_state_dict

if TYPE_CHECKING:
    from snapshot.loader._parts import LoaderParts


def check_keep_last(dest: Any, keep_last: int) -> None:
    """Refuse ``keep_last`` before saving where it cannot apply."""
    if not isinstance(dest, (str, os.PathLike)):
        raise ValueError(f"keep_last needs dest to be a path in a directory of snapshots, got {dest!r}")
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    _rotation.prune_check(dest)


def snapshot_source(loader: LoaderParts, *, include_graph: bool, verify: int = 0) -> LoaderState:
    """What ``loader`` reports for a capture; ``verify=K`` fingerprints the next K samples."""
    if loader._graph is None:
        raise SnapshotError("this DataLoader2 has no graph yet; nothing to capture")
    pos = loader._position
    if loader._terminated:
        service_state = stopped_service(loader._stopped, verify)
    else:
        service_state = loader.reading_service.checkpoint() if pos.epoch >= 0 else {}
    source = LoaderState(
        epoch=pos.epoch,
        yielded=pos.yielded,
        epoch_finished=pos.epoch_finished,
        seed=pos.seed if pos.epoch >= 0 else None,
        seed_given=pos.seed_given,
        pending_seed=pos.user_seed if pos.reset_seed else None,
        generator=pos.generator.state() if pos.generator is not None else None,
        service=service_state,
        service_name=type(loader.reading_service).__name__,
        graph_nodes=loader._graph.describe(),
        graph_fingerprint=loader._graph.fingerprint,
        code_changes=loader.code_changes.value,
        graph_bytes=loader._graph_bytes if include_graph else None,
        service_bytes=loader._service_bytes,
        lookahead=list(pos.lookahead),
    )
    if verify:
        source.verify = digests_ahead(loader, verify)
    return source


def _checked_source(loader: LoaderParts, *, include_graph: bool, verify: int = 0) -> LoaderState:
    """:func:`snapshot_source`, after refusing a graph that cannot be restored exactly (before anything is
    computed ahead or written). The save path stays in this module: it never climbs back into the loader."""
    if loader._graph is not None:
        check_restorable(loader._graph)
    return snapshot_source(loader, include_graph=include_graph, verify=verify)


def check_portable(loader: LoaderParts, include_graph: bool = True, *, strict: bool = True) -> None:
    """Refuse (``strict``) or warn about a graph whose pickle would not load in another script."""
    problem = loader._graph_problem
    if not include_graph or problem is None:
        return
    message = (f"the DataPipe graph cannot be saved so that another script can load it: {problem}. Move that "
               "function (and what it uses) into a module the restoring script can import, or make the value "
               "picklable; or save with include_graph=False and build the same graph in code before "
               "restore_snapshot()")
    if strict:
        raise SerializationError(message + ".")
    warnings.warn(message + ". This state dict's graph loads only in the script that saved it (from_state "
                  "elsewhere fails); load_state_dict() onto a graph built in code is not affected.",
                  stacklevel=user_stacklevel())


def save_now(loader: LoaderParts, dest: PathOrFile | None, *, include_graph: bool,
             keep_last: int | None, key: bytes | str | None, verify: int) -> Snapshot:
    """Capture and, when ``dest`` is given, write (a collective across ranks)."""
    check_portable(loader, include_graph)
    collective = loader._collective()
    source = _checked_source(loader, include_graph=include_graph, verify=verify)
    if collective is None and isinstance(dest, (str, os.PathLike)):
        snap = write(source, dest, key=key)  # encoded straight into the file: no copy of the state
        if keep_last is not None:
            _rotation.prune(dest, keep_last)
        return snap
    snap = snapshot_of(source)
    if dest is not None and collective is not None and _fsspec.is_url(dest):
        # object storage: every rank uploads its part, rank 0 the index last
        _object_directory.save_directory(collective, snap.to_bytes(key=key), snap.manifest, str(dest), key)
    elif dest is not None and collective is not None:
        # a directory: every rank writes its part, rank 0 the manifest
        multipart.save_directory(collective, snap.to_bytes(key=key), snap.manifest, dest, key)
    elif dest is not None:
        save(snap, dest, key=key)
    if keep_last is not None and (collective is None or collective.rank == 0):
        _rotation.prune(dest, keep_last)  # type: ignore[arg-type]
    return snap


def save_in_background(loader: LoaderParts, dest: PathOrFile | None, *, include_graph: bool,
                       keep_last: int | None, key: bytes | str | None, verify: int) -> Future[str]:
    """Capture now; pickle and write in the loader's background saver (synchronous across ranks)."""
    if dest is None or not isinstance(dest, (str, os.PathLike)):  # a path or a URL
        raise TypeError(
            f"save_snapshot(blocking=False) writes to a path, got {type(dest).__name__}; pass a "
            "path, or use blocking=True to write to a file object or to get the Snapshot")
    check_portable(loader, include_graph)
    path = os.fspath(dest)
    done: Future[str] = Future()
    if loader._collective() is not None:
        save_now(loader, dest, include_graph=include_graph, keep_last=keep_last, key=key, verify=verify)
        done.set_result(path)
        return done
    source = _staging.stage(_checked_source(loader, include_graph=include_graph, verify=verify))

    def background() -> str:
        with _serialization.cooperative():
            write(source, path, key=key, progress=False)  # a background save never draws a bar
        if keep_last is not None:
            _rotation.prune(path, keep_last)
        return path

    return loader._saver.submit(background, path)


def state_dict(loader: LoaderParts) -> dict[str, Any]:
    """``loader.state_dict()``: across ranks, every rank's part on every rank (DCP keeps one copy)."""
    check_portable(loader, strict=False)
    snap = snapshot_of(_checked_source(loader, include_graph=True))
    collective = loader._collective()
    if collective is None:
        return snap.state_dict()
    data = snap.to_bytes()
    gathered = collective.all_gather((snap.manifest, data), "gathering the loader's state")
    infos = [part_info(rank, manifest, part) for rank, (manifest, part) in enumerate(gathered)]
    return parts_state_dict(infos, [part for _, part in gathered])
