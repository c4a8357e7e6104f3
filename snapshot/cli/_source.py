"""What a FILE argument names: a snapshot file, or the directory of a distributed snapshot.

A distributed run saves a directory (``manifest.snap`` and one ``rank-NNNNN.snap`` per rank,
see ``snapshot/storage/multipart.py``); the commands read its ``manifest.snap``, which describes the
whole run, and ``verify`` checks every part it lists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from snapshot.container import format as fmt
from snapshot.errors import SnapshotFileError
from snapshot.storage import _sources, multipart

__all__ = ["Source", "locate", "part_path", "read"]


@dataclass(frozen=True)
class Source:
    """``argument`` as given; ``manifest`` the file whose manifest describes it."""

    argument: str
    manifest: str
    directory: str | None


def locate(argument: str) -> Source:
    if os.path.isdir(argument):
        manifest = os.path.join(argument, fmt.DIRECTORY_MANIFEST)
        if not os.path.isfile(manifest):
            raise SnapshotFileError(multipart.without_index(argument), source=argument)
        return Source(argument, manifest, argument)
    return Source(argument, argument, None)


def read(argument: str) -> tuple[dict[str, Any], Source]:
    """The verified manifest (never the payload) of what ``argument`` names."""
    source = locate(argument)
    return _sources.read_manifest(source.manifest), source


def part_path(source: Source, name: str) -> str:
    """The path of a part a distributed manifest lists (a plain file name in the directory)."""
    assert source.directory is not None
    return os.path.join(source.directory, name)
