"""Small real files for the fuzz grammar's file sources, and the sources that read them (some
sharded by file: a ``sharding_filter`` between the lister and the opener).

Every source ends in plain, comparable samples (names and contents, never open streams),
with paths cut to their base name, so a stream read in one process equals the same stream
read in another. :func:`write_data` makes the files; it is idempotent and deterministic.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import json
import lzma
import os
import tarfile
import warnings
import zipfile
from typing import Any

from torch.utils.data.datapipes.iter import (
    FileLister,
    FileOpener,
    IterableWrapper,
    Mapper,
    RoutedDecoder,
    StreamReader,
)

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata 0.9's deprecation notice
        import torchdata.datapipes.iter as td
except ImportError:  # torchdata>=0.10 has no DataPipes
    td = None

FILES = 4
#: Files of each source sharded by file (odd: they do not divide among 2 workers or ranks).
SHARDED_FILES = 3


def write_data(root: str) -> str:
    """Text, JSON, CSV, paragraph, archive and compressed files under ``root``; returns it."""
    if os.path.exists(os.path.join(root, ".done")):
        return root
    for sub in ("txt", "json", "csv", "para", "arch", "comp", "wds", "out"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    members = []
    for i in range(FILES):
        text = "".join(f"line {i}.{j}\n" for j in range(i % 3 + 1))
        members.append((f"m{i}.txt", text.encode()))
        _write(root, f"txt/r{i}.txt", text.encode())
        _write(root, f"json/d{i}.json", json.dumps({"id": i, "tags": list(range(i % 3))}).encode())
        out = io.StringIO()
        csv.writer(out).writerows([["id", "sq"], *[[i * 10 + j, (i * 10 + j) ** 2] for j in range(i % 3 + 1)]])
        _write(root, f"csv/c{i}.csv", out.getvalue().encode())
        _write(root, f"para/p{i}.txt", f"a{i}\nb{i}\n\nc{i}\n\n\nd{i}\n".encode())
        _write(root, f"comp/f{i}.txt.xz", lzma.compress(text.encode()))
        _write(root, f"comp/f{i}.txt.bz2", bz2.compress(text.encode()))
    with tarfile.open(os.path.join(root, "arch", "a.tar"), "w") as tar:
        for name, data in members:
            _add(tar, name, data)
    with zipfile.ZipFile(os.path.join(root, "arch", "a.zip"), "w") as z:
        for name, data in members:
            z.writestr(name, data)
    with tarfile.open(os.path.join(root, "wds", "s.tar"), "w") as tar:
        for i in range(FILES + 1):
            _add(tar, f"s{i}.txt", f"text {i}".encode())
            _add(tar, f"s{i}.cls", str(i % 2).encode())
    _write_sharded(root)
    _write(root, ".done", b"")
    return root


def _write_sharded(root: str) -> None:
    """Files for the sources sharded by file: tar shards and gzip JSON lines, uneven in samples."""
    for sub in ("shards", "gz"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    for f in range(SHARDED_FILES):
        with tarfile.open(os.path.join(root, "shards", f"t{f}.tar"), "w") as tar:
            for i in range(f % 3 + 2):
                _add(tar, f"k{f}_{i}.txt", f"shard {f} sample {i}".encode())
                _add(tar, f"k{f}_{i}.cls", str(i % 2).encode())
        lines = "".join(json.dumps({"file": f, "line": j}) + "\n" for j in range(f % 2 + 2))
        _write(root, f"gz/g{f}.jsonl.gz", gzip.compress(lines.encode(), mtime=0))


def _write(root: str, name: str, data: bytes) -> None:
    with open(os.path.join(root, name), "wb") as f:
        f.write(data)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def base(sample: Any) -> Any:
    """``(path, x)`` with the path cut to its base name."""
    path, rest = sample
    return (os.path.basename(str(path)), rest)


def read(sample: Any) -> Any:
    """``(path, stream)`` read whole (the stream closed) and named by its base name."""
    path, stream = sample
    try:
        data = stream.read()
    finally:
        stream.close()
    return (os.path.basename(str(path)), data)


def tar_names(sample: Any) -> Any:
    """``(path, TarFile)`` (what ``extract`` yields for a tar) as the path's base name and the member names."""
    path, tar = sample
    try:
        return (os.path.basename(str(path)), tuple(tar.getnames()))
    finally:
        tar.close()


def read_members(sample: dict[str, Any]) -> tuple[Any, ...]:
    """A WebDataset sample with each member read."""
    out = []
    for k in sorted(sample):
        value = sample[k]
        if hasattr(value, "read"):
            data = value.read()
            value.close()
            value = data
        out.append((k, os.path.basename(str(value)) if k == "__key__" else value))
    return tuple(out)


def name_only(path: str) -> str:
    return os.path.basename(path)


def to_file(x: int) -> tuple[str, bytes]:
    return (f"saved{x}.bin", repr(x).encode())


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _lister(root: str, sub: str, mask: str) -> Any:
    return FileLister(os.path.join(root, sub), mask)


def _opened(root: str, sub: str, mask: str, mode: str = "b") -> Any:
    return FileOpener(_lister(root, sub, mask), mode=mode)


def _saved_path(root: str, name: str) -> str:
    return os.path.join(root, "out", name)


#: File sources of torch (no torchdata needed).
TORCH_KINDS = ("stream", "decode")
#: File sources of torchdata 0.9.
TORCHDATA_KINDS = ("lines", "csv", "csvdict", "json", "tar", "zip", "xz", "bz2", "decompress", "extract",
                   "webdataset", "fsspec", "hash", "paragraphs", "saver")


def source(kind: str, root: str) -> Any:
    """The file source ``kind`` over the files under ``root`` (see :func:`write_data`)."""
    import functools

    if kind == "stream":
        return Mapper(StreamReader(_opened(root, "txt", "*.txt"), chunk=5), base)
    if kind == "decode":
        return Mapper(RoutedDecoder(_opened(root, "json", "*.json")), base)
    if kind == "lines":
        return Mapper(td.LineReader(_opened(root, "txt", "*.txt"), decode=True), base)
    if kind == "csv":
        return td.CSVParser(_opened(root, "csv", "*.csv", "t"), skip_lines=1)
    if kind == "csvdict":
        return td.CSVDictParser(_opened(root, "csv", "*.csv", "t"))
    if kind == "json":
        return Mapper(td.JsonParser(_opened(root, "json", "*.json", "t")), base)
    if kind == "tar":
        return Mapper(td.TarArchiveLoader(_opened(root, "arch", "*.tar")), read)
    if kind == "zip":
        return Mapper(td.ZipArchiveLoader(_opened(root, "arch", "*.zip")), read)
    if kind == "xz":
        return Mapper(td.XzFileLoader(_opened(root, "comp", "*.xz")), read)
    if kind == "bz2":
        return Mapper(td.Bz2FileLoader(_opened(root, "comp", "*.bz2")), read)
    if kind == "decompress":
        return Mapper(td.Decompressor(_opened(root, "comp", "*")), read)
    if kind == "extract":
        return Mapper(td.Extractor(_opened(root, "arch", "*.tar"), file_type="tar"), tar_names)
    if kind == "webdataset":
        return Mapper(td.WebDataset(td.TarArchiveLoader(_opened(root, "wds", "*.tar"))), read_members)
    if kind == "fsspec":
        lister = td.FSSpecFileLister(os.path.join(root, "txt"), masks="*.txt")
        return Mapper(td.FSSpecFileOpener(lister, mode="rb"), read)
    if kind == "hash":
        paths = sorted(os.path.join(root, "txt", n) for n in os.listdir(os.path.join(root, "txt")))
        return Mapper(td.HashChecker(_opened(root, "txt", "*.txt"), {p: _sha256(p) for p in paths}), read)
    if kind == "paragraphs":
        return Mapper(td.ParagraphAggregator(td.LineReader(_opened(root, "para", "*.txt"), decode=True)), base)
    if kind == "saver":
        writes = Mapper(IterableWrapper(range(FILES)), to_file)
        return Mapper(td.Saver(writes, mode="wb", filepath_fn=functools.partial(_saved_path, root)), name_only)
    raise ValueError(f"unknown file source {kind!r}")


#: File sources sharded by file: a ``sharding_filter`` between the lister and the opener, so each
#: item at the sharding point is a whole file of samples.
SHARDED_KINDS = ("tar_shards", "gz_lines", "txt_lines")


def sharded_source(kind: str, root: str) -> Any:
    """The file source ``kind`` of :data:`SHARDED_KINDS` over the files under ``root``."""
    from torch.utils.data.datapipes.iter import ShardingFilter, Shuffler

    if kind == "tar_shards":  # WebDataset-style: the file names shuffled above the sharding point
        names = ShardingFilter(Shuffler(_lister(root, "shards", "*.tar"), buffer_size=SHARDED_FILES))
        return Mapper(td.WebDataset(td.TarArchiveLoader(FileOpener(names, mode="b"))), read_members)
    if kind == "gz_lines":
        opened = FileOpener(ShardingFilter(_lister(root, "gz", "*.jsonl.gz")), mode="b")
        return Mapper(td.LineReader(td.Decompressor(opened), decode=True), base)
    if kind == "txt_lines":
        opened = FileOpener(ShardingFilter(_lister(root, "txt", "*.txt")), mode="b")
        return Mapper(td.LineReader(opened, decode=True), base)
    raise ValueError(f"unknown sharded file source {kind!r}")
