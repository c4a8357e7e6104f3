"""A small real corpus for the file pipelines (tar shards WebDataset-style, gzip JSON lines,
CSV, zip, TFRecord) and the pipelines that read it, as module-level functions so that they
pickle into worker processes.

:func:`write_corpus` is idempotent and safe to call from several processes at once (each
file is written to a temporary name and renamed). A pipeline lists its files through
:func:`listed`, which writes the corpus when the graph is first iterated (building a graph
has no side effect).
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
import struct
import tarfile
import zipfile
from typing import Any

import torchdata.datapipes.iter as td
from torch.utils.data.datapipes.iter import FileLister, FileOpener, IterableWrapper, Mapper, ShardingFilter, Shuffler

SHARDS = 4
SAMPLES_PER_SHARD = 7
JSONL_FILES = 3
LINES_PER_FILE = 9


def _write(path: str, data: bytes) -> None:
    if os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _tar_bytes(shard: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(SAMPLES_PER_SHARD):
            key = f"s{shard:02d}_{i:03d}"
            parts = {"txt": f"text {shard}/{i} " * (i % 5 + 1), "cls": str((shard * 7 + i) % 10)}
            if i % 3 == 0:
                parts["json"] = json.dumps({"shard": shard, "i": i})
            for ext, text in parts.items():
                data = text.encode()
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _jsonl(index: int) -> bytes:
    rows = [json.dumps({"file": index, "line": j, "text": "x" * (j % 7)}) for j in range(LINES_PER_FILE + index)]
    return ("\n".join(rows) + "\n").encode()


def _csv(index: int) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["id", "name", "note"])
    for j in range(6 + index):
        note = "multi\nline" if j % 4 == 1 else f"n{j}"
        writer.writerow([f"{index}-{j}", f"name {j}", note])
    return out.getvalue().encode()


def _zip(index: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("dir/", "")
        for j in range(5):
            z.writestr(f"dir/m{index}_{j}.txt", f"zip {index} member {j}\n" * (j + 1))
    return out.getvalue()


def _tfrecord(index: int) -> bytes:
    from torchdata.datapipes.iter.util.protobuf_template import _tfrecord_example_pb2 as pb2

    out = io.BytesIO()
    for j in range(6):
        example = pb2.SequenceExample()
        example.context.feature["id"].int64_list.value.append(index * 100 + j)
        example.context.feature["x"].float_list.value.extend([float(j), float(index)])
        data = example.SerializeToString()
        out.write(struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4)
    return out.getvalue()


def _notes(index: int) -> bytes:
    paragraphs = [" ".join(f"w{index}.{p}.{k}" for k in range(p % 3 + 1)) for p in range(5 + index)]
    return "\n\n".join(p.replace(" ", "\n", 1) for p in paragraphs).encode() + b"\n"


def write_corpus(root: str) -> str:
    """Write the corpus under ``root`` (once); returns ``root``."""
    os.makedirs(root, exist_ok=True)
    for shard in range(SHARDS):
        _write(os.path.join(root, f"shard-{shard:02d}.tar"), _tar_bytes(shard))
    for index in range(JSONL_FILES):
        _write(os.path.join(root, f"lines-{index}.jsonl.gz"), gzip.compress(_jsonl(index), mtime=0))
        _write(os.path.join(root, f"table-{index}.csv"), _csv(index))
        _write(os.path.join(root, f"pack-{index}.zip"), _zip(index))
        _write(os.path.join(root, f"records-{index}.tfrecord"), _tfrecord(index))
        _write(os.path.join(root, f"doc-{index}.json"), json.dumps({"doc": index, "tags": list(range(index))}).encode())
        _write(os.path.join(root, f"notes-{index}.txt.bz2"), bz2.compress(_notes(index)))
        _write(os.path.join(root, f"notes-{index}.txt.xz"), lzma.compress(_notes(index)))
    return root


# -- element functions ----------------------------------------------------------------------

def read_member(item: tuple[str, Any]) -> tuple[str, bytes]:
    path, stream = item
    data = stream.read()
    stream.close()
    return os.path.basename(path), data


def decode_sample(sample: dict[str, Any]) -> tuple[Any, ...]:
    out = []
    for key, value in sample.items():
        if key == "__key__":
            out.append(os.path.basename(value))
        else:
            out.append((key, value.read().decode()))
            value.close()
    return tuple(out)


def parse_line(item: Any) -> Any:
    path, line = item
    return os.path.basename(path), json.loads(line)["line"]


def basename_first(item: Any) -> Any:
    return (os.path.basename(item[0]), *item[1:])


def tensors_to_lists(example: dict[str, Any]) -> Any:
    return sorted((k, v.tolist()) for k, v in example.items())


# -- pipelines ------------------------------------------------------------------------------

def listed(root: str, mask: str) -> Any:
    """``FileLister`` over ``root`` (the corpus is written there first, when iterated)."""
    return FileLister(Mapper(IterableWrapper([root]), write_corpus), mask)


def webdataset(root: str, *, shuffle: int = 0) -> Any:
    """FileLister -> shuffle -> sharding_filter -> FileOpener -> load_from_tar -> webdataset -> map [-> shuffle]."""
    dp: Any = Shuffler(listed(root, "*.tar"), buffer_size=SHARDS)
    dp = FileOpener(ShardingFilter(dp), mode="b")
    dp = Mapper(td.WebDataset(td.TarArchiveLoader(dp)), decode_sample)
    return Shuffler(dp, buffer_size=shuffle) if shuffle else dp


def gzip_lines(root: str) -> Any:
    """FileLister -> sharding_filter -> FileOpener -> decompress -> readlines -> map(json)."""
    dp = FileOpener(ShardingFilter(listed(root, "*.jsonl.gz")), mode="b")
    return Mapper(td.LineReader(td.Decompressor(dp)), parse_line)


def csv_rows(root: str, as_dict: bool = False) -> Any:
    dp = FileOpener(listed(root, "*.csv"), mode="t")
    parsed = td.CSVDictParser(dp, return_path=True) if as_dict else td.CSVParser(dp, return_path=True)
    return Mapper(parsed, basename_first)


def zip_members(root: str) -> Any:
    return Mapper(td.ZipArchiveLoader(FileOpener(listed(root, "*.zip"), mode="b")), read_member)


def tar_members(root: str) -> Any:
    return Mapper(td.TarArchiveLoader(FileOpener(listed(root, "*.tar"), mode="b")), read_member)


def tfrecords(root: str) -> Any:
    return Mapper(td.TFRecordLoader(FileOpener(listed(root, "*.tfrecord"), mode="b")), tensors_to_lists)


def bz2_lines(root: str) -> Any:
    return td.LineReader(td.Bz2FileLoader(FileOpener(listed(root, "*.bz2"), mode="b")), decode=True)


def xz_paragraphs(root: str) -> Any:
    lines = td.LineReader(td.XzFileLoader(FileOpener(listed(root, "*.xz"), mode="b")), decode=True)
    return td.ParagraphAggregator(lines)


def checked_csv(root: str) -> Any:
    hashes = {os.path.join(root, f"table-{i}.csv"): hashlib.sha256(_csv(i)).hexdigest() for i in range(JSONL_FILES)}
    checked = td.HashChecker(FileOpener(listed(root, "*.csv"), mode="b"), hashes, rewind=True)
    return Mapper(td.CSVParser(checked, return_path=True), basename_first)


def json_docs(root: str) -> Any:
    return Mapper(td.JsonParser(FileOpener(listed(root, "*.json"), mode="b")), basename_first)
