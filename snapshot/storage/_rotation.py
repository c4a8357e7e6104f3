"""A directory of numbered snapshots: find the newest (:func:`latest`), keep the last K (:func:`prune`).

Snapshots are told apart from other files by reading their manifest (never unpickling), so
temporary files of a save in progress (hidden, ``.name.snapshot-tmp.<pid>.<host>-<random>``), a distributed save's
staging directories (hidden too), a file cut short by a copy and unrelated files are all
skipped. Order: by the last number in the name (``step-1200.snap`` after ``step-800.snap``),
then by modification time; a directory whose snapshots carry no number is ordered by time.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterator

from snapshot.errors import SnapshotError
from snapshot.storage import _failures, _sources

__all__ = ["intact_at", "latest", "prune", "prune_check", "snapshots"]

_log = logging.getLogger(__name__)
_NUMBER = re.compile(r"\d+")


def _number(name: str) -> int | None:
    found = _NUMBER.findall(name)
    return int(found[-1]) if found else None


def _candidates(directory: str, pattern: re.Pattern[str] | None = None) -> Iterator[tuple[str, int | None, float]]:
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue  # a save in progress, a distributed save's staging directory
        if pattern is not None and not pattern.fullmatch(entry.name):
            continue
        try:
            mtime = entry.stat().st_mtime
        except FileNotFoundError:  # removed meanwhile
            continue
        yield entry.path, _number(entry.name), mtime


def _is_snapshot(path: str) -> bool:
    try:
        _sources.read_manifest(path)
    except (SnapshotError, OSError) as exc:
        _log.debug("skipping %s: not a complete snapshot (%s)", path, exc)
        return False
    return True


def snapshots(directory: str | os.PathLike[str], pattern: re.Pattern[str] | None = None) -> list[str]:
    """The complete snapshots in ``directory``, oldest first (see the module docstring)."""
    found = [c for c in _candidates(os.fspath(directory), pattern) if _is_snapshot(c[0])]
    if all(number is not None for _, number, _ in found):
        found.sort(key=lambda c: (c[1], c[2], c[0]))
    else:
        found.sort(key=lambda c: (c[2], c[0]))
    return [path for path, _, _ in found]


def latest(directory: str | os.PathLike[str]) -> str | None:
    """The path of the newest complete snapshot in ``directory``, or ``None`` if it has none.

    A missing directory has none (a first run). Newest means the highest number in the name
    (``step-1200.snap``), or the latest modification time for names without numbers;
    temporary files and files that are not complete snapshots are skipped.

    Examples:
        >>> import os, tempfile, snapshot
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> ckpt = tempfile.mkdtemp()
        >>> snapshot.latest(ckpt) is None
        True
        >>> dl = snapshot.DataLoader2(IterableWrapper(range(10)))
        >>> for step, x in enumerate(dl):
        ...     if step % 3 == 0:
        ...         _ = dl.save_snapshot(f"{ckpt}/step-{step}.snap", keep_last=2)
        >>> sorted(os.listdir(ckpt))
        ['step-6.snap', 'step-9.snap']
        >>> snapshot.latest(ckpt).endswith("step-9.snap")
        True
    """
    found = snapshots(directory)
    return found[-1] if found else None


def intact_at(dest: str) -> str:
    """What a save to the local path ``dest`` that failed before its commit left: the snapshot at ``dest``,
    or else the newest of its directory (:func:`latest`), which is still the one to restore."""
    said = _failures.intact_at(dest)
    if os.path.lexists(dest):
        return said
    try:
        newest = latest(os.path.dirname(os.path.abspath(dest)))
    except OSError:  # the directory cannot be read: say only what is known
        return said
    return f"{said} The newest snapshot there is still {newest}." if newest else said


def _sibling_pattern(name: str) -> re.Pattern[str]:
    """Names like ``name`` with other numbers: ``step-100.snap`` -> ``step-\\d+\\.snap``."""
    parts = _NUMBER.split(name)
    return re.compile(r"\d+".join(re.escape(p) for p in parts))


def prune_check(dest: str | os.PathLike[str]) -> None:
    """Raise ``ValueError`` unless snapshots named like ``dest`` can be ordered by their number."""
    name = os.path.basename(os.path.abspath(os.fspath(dest)))
    if _number(name) is None:
        raise ValueError(
            f"keep_last needs numbered snapshot names, so that older ones can be told apart from the "
            f"newest: save to a name with a step in it, such as 'step-{{step}}.snap', not {name!r}")


def prune(dest: str | os.PathLike[str], keep_last: int) -> list[str]:
    """Remove the snapshots numbered like ``dest`` in its directory but the ``keep_last`` newest.

    Only names that differ from ``dest``'s in their numbers are touched (``step-100.snap``
    prunes ``step-*.snap``, never ``best.snap``), and ``dest`` itself is always kept.
    Returns the removed paths.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    prune_check(dest)
    path = os.path.abspath(os.fspath(dest))
    name = os.path.basename(path)
    others = [p for p in snapshots(os.path.dirname(path), _sibling_pattern(name)) if p != path]
    # ``dest`` itself is always kept, even when an older run left higher numbers behind
    older = others[:max(len(others) - (keep_last - 1), 0)]
    for old in older:
        if os.path.islink(old):  # a distributed snapshot: the link, then its directory
            target = os.path.realpath(old)
            os.unlink(old)
            shutil.rmtree(target, ignore_errors=True)
        elif os.path.isdir(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)
        _log.info("removed old snapshot %s (keep_last=%d)", old, keep_last)
    return older
