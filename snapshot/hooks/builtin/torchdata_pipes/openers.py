"""Hooks for torchdata 0.9's pipes that name or open files: ``shard_expand``,
``list_files_by_fsspec`` and ``open_files_by_fsspec``.

The fsspec opener marks each stream with its address: the URL, the mode and what the file
system reported about the file when it was opened (size, modification time or ETag), so that
a reader after it can reopen the file at an offset (a range read on an object store) and
refuse a file that changed. The connection arguments (credentials, say) are never saved: a
restore takes them from the opener of the graph it restores into.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from typing import Any

from torch.utils.data.datapipes.utils.common import StreamWrapper, match_masks
from torchdata.datapipes.iter.util.shardexpander import _shard_expand

from snapshot.hooks._base import Expanding, Stateless
from snapshot.hooks.builtin._streams import KIND, changed, fsspec_version, mark, register_kind

__all__ = ["FSSpecFileListerIterator", "FSSpecFileOpenerIterator", "ShardExpanderIterator"]


class ShardExpanderIterator(Expanding):
    """``shard_expand``: the names a brace pattern expands to; state: the names not yet yielded."""

    def next(self) -> Any:
        while not self._pending:
            self._pending.extend(_shard_expand(next(self.inputs[0])))
        return self._pending.popleft()


def _protocols(fs: Any) -> list[str]:
    protocols = [fs.protocol] if isinstance(fs.protocol, str) else list(fs.protocol)
    if "abfs" in protocols:
        protocols.append("az")
    return protocols


def _listing(root: str, masks: Any, kwargs: dict[str, Any]) -> list[str]:
    """What ``list_files_by_fsspec`` yields for ``root``, in its order."""
    import fsspec  # type: ignore[import-untyped]

    fs, path = fsspec.core.url_to_fs(root, **kwargs)
    protocols = _protocols(fs)
    is_local = fs.protocol == "file" or not any(root.startswith(p) for p in protocols)
    if fs.isfile(path):
        return [root]
    names = []
    for name in fs.ls(path, detail=False):
        if not match_masks(name, masks):
            continue
        if any(name.startswith(p) for p in protocols):
            names.append(name)
            continue
        full = os.path.join(path, name) if is_local else (posixpath.join(path, name) if not name.startswith(path)
                                                          else name)
        prefix = next((p for p in protocols if root.startswith(p)), None)
        names.append(full if prefix is None else f"{prefix}://{full}")
    return names


class FSSpecFileListerIterator(Expanding):
    """``list_files_by_fsspec``: lists one root at a time; the names not yet yielded are the state."""

    def next(self) -> Any:
        dp = self.datapipe
        while not self._pending:
            self._pending.extend(_listing(next(self.inputs[0]), dp.masks, dp.kwargs_for_connection))
        return self._pending.popleft()


#: Per fingerprint of an opener's arguments, the arguments (this process only; never saved).
_CONNECTIONS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}


def _fingerprint(connection: dict[str, Any], for_open: dict[str, Any]) -> str:
    text = repr((sorted(connection.items(), key=repr), sorted(for_open.items(), key=repr)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _connect(address: dict[str, Any]) -> tuple[Any, str, dict[str, Any]]:
    import fsspec

    connection, for_open = _CONNECTIONS.get(address.get("opener", ""), ({}, {}))
    fs, path = fsspec.core.url_to_fs(address["path"], **connection)
    return fs, path, for_open


def open_fsspec(address: dict[str, Any]) -> Any:
    """A fresh stream for an ``fsspec`` address, with the arguments of the opener it came from."""
    fs, path, for_open = _connect(address)
    return StreamWrapper(fs.open(path, address["mode"], **for_open))


def check_fsspec(address: dict[str, Any]) -> None:
    """Raise if the file under an ``fsspec`` address is not the one that was opened."""
    fs, path, _ = _connect(address)
    try:
        now = fsspec_version(fs, path)
    except (OSError, FileNotFoundError) as exc:
        raise changed(address["path"], "present", f"gone ({exc})") from exc
    saved = {k: v for k, v in address.items() if k in now}
    if saved != {k: now[k] for k in saved}:
        raise changed(address["path"], saved, {k: now[k] for k in saved})


register_kind("fsspec", open_fsspec, check_fsspec)


class FSSpecFileOpenerIterator(Stateless):
    """``open_files_by_fsspec``: ``(url, stream)`` per URL, each stream marked with its address."""

    streams = "opens"

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._key = _fingerprint(datapipe.kwargs_for_connection, datapipe.kwargs_for_open)
        _CONNECTIONS[self._key] = (dict(datapipe.kwargs_for_connection), dict(datapipe.kwargs_for_open))

    def next(self) -> Any:
        import fsspec

        dp = self.datapipe
        uri = next(self.inputs[0])
        fs, path = fsspec.core.url_to_fs(uri, **dp.kwargs_for_connection)
        stream = StreamWrapper(fs.open(path, dp.mode, **dp.kwargs_for_open))
        address = {KIND: "fsspec", "path": uri, "mode": dp.mode, "opener": self._key, **fsspec_version(fs, path)}
        return uri, mark(stream, address)
