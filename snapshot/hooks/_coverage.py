"""The coverage table: every IterDataPipe of torch and of torchdata 0.9, and how it is restored.

Made from the hook registry, never written by hand: ``docs/coverage.md`` is this module's
output, and a test fails when the committed page differs from it. Make it again with::

    python -m snapshot.hooks._coverage docs/coverage.md

Each pipe is restored one of three ways:

- ``state hook``: put back from its saved state, in O(state);
- ``fast-forward``: no hook; the restore plan replays the smallest subgraph that holds it,
  from the start of the epoch, in O(samples);
- ``refused``: no strategy can put it back; saving or restoring a graph that holds it
  raises a ``RestoreError`` rather than yield a different stream. A pipe refused only in
  some configurations is listed by its usual method, with the refusal in its notes.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import warnings
from dataclasses import dataclass

from snapshot.hooks._registry import hook_for_class, refusal_condition

__all__ = ["FAST_FORWARD", "REASONS", "REFUSED", "STATE_HOOK", "Row", "coverage", "main", "render"]

STATE_HOOK = "state hook"
FAST_FORWARD = "fast-forward"
REFUSED = "refused"

TORCH = "torch.utils.data.datapipes.iter"
TORCHDATA = "torchdata.datapipes.iter"

#: Pipes whose constructor (``__new__``) returns other pipes: what each one builds.
BUILDS: dict[str, tuple[str, ...]] = {
    "Demultiplexer": ("torch.utils.data.datapipes.iter.combining._DemultiplexerIterDataPipe",
                      "torch.utils.data.datapipes.iter.combining._ChildDataPipe"),
    "Forker": ("torch.utils.data.datapipes.iter.combining._ForkerIterDataPipe",
               "torch.utils.data.datapipes.iter.combining._ChildDataPipe"),
    "UnZipper": ("torchdata.datapipes.iter.util.combining._UnZipperIterDataPipe",
                 "torch.utils.data.datapipes.iter.combining._ChildDataPipe"),
    "RoundRobinDemultiplexer": ("torchdata.datapipes.iter.util.indexadder.EnumeratorIterDataPipe",
                                "torchdata.datapipes.iter.util.combining._RoundRobinDemultiplexerIterDataPipe",
                                "torch.utils.data.datapipes.iter.callable.MapperIterDataPipe",
                                "torch.utils.data.datapipes.iter.combining._ChildDataPipe"),
    "BucketBatcher": ("torch.utils.data.datapipes.iter.grouping.BatcherIterDataPipe",
                      "torch.utils.data.datapipes.iter.grouping.UnBatcherIterDataPipe",
                      "torchdata.datapipes.iter.transform.bucketbatcher.InBatchShufflerIterDataPipe",
                      "torch.utils.data.datapipes.iter.combinatorics.ShufflerIterDataPipe",
                      "torch.utils.data.datapipes.iter.callable.MapperIterDataPipe"),
    "BatchAsyncMapper": ("torch.utils.data.datapipes.iter.grouping.BatcherIterDataPipe",
                         "torchdata.datapipes.iter.transform.callable._BatchAsyncMapperIterDataPipe",
                         "torchdata.datapipes.iter.transform.callable.FlatMapperIterDataPipe",
                         "torchdata.datapipes.iter.util.header.LengthSetterIterDataPipe"),
    "RandomSplitter": ("torchdata.datapipes.iter.util.randomsplitter._RandomSplitterIterDataPipe",
                       "torchdata.datapipes.iter.util.randomsplitter.SplitterIterator"),
}


_NETWORK = ("reads from a network service that cannot be reached or installed here, so a hook could not be "
            "tested; replayed from the start of the epoch")
#: Why a torchdata 0.9 pipe without a hook has none (by class name); the table prints it instead of
#: the default note. Every file, archive, parser, opener or thread-pool pipe without a hook is here.
REASONS: dict[str, str] = {
    "AISFileListerIterDataPipe": "needs the aistore client (not installable here); " + _NETWORK,
    "AISFileLoaderIterDataPipe": "needs the aistore client (not installable here); " + _NETWORK,
    "S3FileListerIterDataPipe": "needs torchdata's S3 extension, which the 0.9 wheels do not ship (use "
                                "list_files_by_fsspec, which has a hook); replayed from the start of the epoch",
    "S3FileLoaderIterDataPipe": "needs torchdata's S3 extension, which the 0.9 wheels do not ship (use "
                                "open_files_by_fsspec with s3fs: restored by URL, ETag and offset); replayed",
    "HTTPReaderIterDataPipe": "not hooked yet: its response stream cannot seek, and its tell() counts bytes on "
                              "the wire rather than bytes read, so a reader after it could not save an offset; "
                              "replayed, with the readers after it",
    "OnlineReaderIterDataPipe": _NETWORK + "; its response stream cannot seek, so a reader after it replays too",
    "GDriveReaderDataPipe": _NETWORK + "; its response stream cannot seek, so a reader after it replays too",
    "HuggingFaceHubReaderIterDataPipe": "needs the datasets package and the Hub (neither reachable here); "
                                        "replayed from the start of the epoch",
    "IoPathFileListerIterDataPipe": "needs iopath (not installed here, so a hook could not be tested); replayed "
                                    "(list_files_by_fsspec has a hook)",
    "IoPathFileOpenerIterDataPipe": "needs iopath (not installed here, so a hook could not be tested); replayed "
                                    "(open_files_by_fsspec has a hook: restored by path and offset)",
    "IoPathSaverIterDataPipe": "needs iopath (not installed here, so a hook could not be tested); replayed "
                               "(save_by_fsspec has a hook)",
    "RarArchiveLoaderIterDataPipe": "needs rarfile and an unrar tool (not installed here); replayed",
    "ParquetDFLoaderIterDataPipe": "needs torcharrow, which has no wheel for this Python and torch (pyarrow alone "
                                   "is not enough); replayed",
    "DataFrameMakerIterDataPipe": "its constructor builds torcharrow pipes (no wheel for this Python and torch); "
                                  "replayed",
    "ExtractorIterDataPipe": "deprecated alias: its constructor returns a Decompressor, which has a state hook",
    "OnDiskCacheHolderIterDataPipe": "its generator decides per item whether the on-disk cache holds it and "
                                     "routes it through an inner demultiplexer; replayed (after the first epoch "
                                     "the replay reads the cached files, not the source)",
    "EndOnDiskCacheHolderIterDataPipe": "its constructor builds the cache's writing half (a Saver after "
                                        "filters of the OnDiskCacheHolder's demultiplexer); replayed",
    "PinMemoryIterDataPipe": "refuses to run without CUDA (none here), so a hook could not be tested; replayed",
    "IterKeyZipperIterDataPipe": "its buffer of reference items waits on keys of the other input; replayed",
    "MaxTokenBucketizerIterDataPipe": "its heap of pending items is not yet captured; replayed",
    "ShuffledFlatMapperIterDataPipe": "its buffer holds iterators returned by the user's function, which "
                                      "cannot be saved or rebuilt; replayed",
    "FullSyncIterDataPipe": "synchronizes ranks through a thread and collective calls; the distributed "
                            "reading service equalizes ranks itself; replayed",
    "ShardingRoundRobinDispatcherIterDataPipe": "a marker for the reading service, which runs the part above "
                                                "it once and deals its samples; replayed",
}


@dataclass(frozen=True)
class Row:
    """One public IterDataPipe: its name, functional name and how a restore puts it back."""

    module: str
    name: str
    functional: str | None
    method: str
    notes: str
    classes: tuple[type, ...]


def _load(path: str) -> type:
    module, _, name = path.rpartition(".")
    cls: type = getattr(importlib.import_module(module), name)
    return cls


def _functional_names() -> dict[type, str]:
    from torch.utils.data import IterDataPipe

    names: dict[type, str] = {}
    for name, function in IterDataPipe.functions.items():
        cls = getattr(function, "args", (None,))[0]
        if isinstance(cls, type) and not name.startswith("_"):
            names.setdefault(cls, name)
    return names


def _method_of(cls: type) -> tuple[str, str]:
    """How instances of ``cls`` are restored, and a note."""
    hook = hook_for_class(cls)
    when = refusal_condition(cls)
    if hook is None:
        method, note = FAST_FORWARD, REASONS.get(cls.__name__, "replayed from the start of the epoch")
    elif hook.iterator is not None:
        method = STATE_HOOK
        doc = inspect.getdoc(hook.iterator) or ""
        own = hook.iterator.__doc__ is not None and doc
        note = doc.split("\n\n", 1)[0].replace("\n", " ").replace("``", "`") if own else ""
    else:
        method, note = STATE_HOOK, "its state_dict() / load_state_dict()"
    if when is not None:
        note = f"refused when {when}" + (f"; {note}" if note else "")
    return method, note


def _row(module: str, name: str, cls: type, functional: dict[type, str]) -> Row:
    built = BUILDS.get(name) if "__new__" in vars(cls) else None
    if built is None:
        method, notes = _method_of(cls)
        return Row(module, name, functional.get(cls), method, notes, (cls,))
    classes = tuple(_load(path) for path in built)
    methods = {c: _method_of(c) for c in classes}
    parts = sorted({m for m, _ in methods.values()})
    method = STATE_HOOK if parts == [STATE_HOOK] else FAST_FORWARD
    refusals = [n.split(";", 1)[0] for _, n in methods.values() if n.startswith("refused")]
    listing = ", ".join(f"`{c.__name__}` ({m})" for c, (m, _) in methods.items())
    notes = "; ".join([*refusals, f"builds {listing}"])
    return Row(module, name, functional.get(cls), method, notes, classes)


def _constructor_builds_unknown(cls: type, name: str) -> bool:
    return "__new__" in vars(cls) and name not in BUILDS


def coverage() -> list[Row]:
    """Every public IterDataPipe of torch, then those torchdata 0.9 adds (when installed)."""
    from torch.utils.data import IterDataPipe

    modules = []
    for module_name in (TORCH, TORCHDATA):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torchdata 0.9's deprecation notice
                modules.append(importlib.import_module(module_name))
        except ImportError:
            continue
    functional = _functional_names()  # once every module has registered its names
    rows: list[Row] = []
    seen: set[type] = {IterDataPipe}
    for module in modules:
        module_name = module.__name__
        for name in sorted(getattr(module, "__all__", [])):
            cls = getattr(module, name)
            if not (inspect.isclass(cls) and issubclass(cls, IterDataPipe)) or cls in seen:
                continue
            seen.add(cls)
            if _constructor_builds_unknown(cls, name):
                note = REASONS.get(cls.__name__, "its constructor builds other pipes; replayed")
                rows.append(Row(module_name, name, functional.get(cls), FAST_FORWARD, note, (cls,)))
                continue
            rows.append(_row(module_name, name, cls, functional))
    return rows


_INTRO = """\
# DataPipe coverage

<!-- Generated by `python -m snapshot.hooks._coverage docs/coverage.md` from the hook
registry; tests/hooks/test_coverage.py fails when this page is out of date. Do not edit. -->

How a restore puts back each IterDataPipe of `torch.utils.data.datapipes.iter` and of
torchdata 0.9's `torchdata.datapipes.iter` (those it re-exports from torch are listed once):

- **state hook**: restored from its saved state, in time proportional to the state;
- **fast-forward**: no hook; the [restore plan](concepts/restore.md) replays the smallest
  part of the graph that holds it from the start of the epoch (exact for a pipe that is
  deterministic for a given seed and data; the engine checks that the replay ends where
  the snapshot says and raises a `RestoreError` otherwise);
- **refused**: no strategy can put it back; saving or restoring a graph that holds it
  raises a `RestoreError` naming it. A pipe refused only in some configurations keeps its
  usual method, with the condition in its notes.

Every pipe listed as *state hook* is resumed exactly at several cut points, in-process and
with 2 worker processes, by `tests/hooks/test_coverage.py`. Add your own pipes with
[`register_state_hook`](hooks.md).
"""


def render(rows: list[Row]) -> str:
    """The Markdown page for ``rows``."""
    out = [_INTRO]
    for module in (TORCH, TORCHDATA):
        mine = [r for r in rows if r.module == module]
        if not mine:
            continue
        counts = {m: sum(r.method == m for r in mine) for m in (STATE_HOOK, FAST_FORWARD, REFUSED)}
        summary = ", ".join(f"{n} {m}" for m, n in counts.items() if n)
        title = "torch" if module == TORCH else "torchdata 0.9"
        out.append(f"\n## `{module}` ({title}: {len(mine)} pipes; {summary})\n")
        out.append("| DataPipe | functional name | restored by | notes |")
        out.append("|---|---|---|---|")
        for r in mine:
            functional = f"`{r.functional}`" if r.functional else ""
            notes = r.notes.replace("|", "\\|")
            out.append(f"| `{r.name}` | {functional} | {r.method} | {notes} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page to the path given (or print it)."""
    args = sys.argv[1:] if argv is None else argv
    text = render(coverage())
    if args:
        with open(args[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


