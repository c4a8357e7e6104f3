"""The io benchmark's pipelines: what a user reading files with torchdata 0.9 writes.

Each ``build_*`` takes the corpus's folder of that format and returns the graph's sink.
Every pipeline lists its files, shuffles them, shards them, opens them in binary mode,
reads them with the torchdata 0.9 pipe for the format, decodes each sample with a ``map``,
shuffles samples in a buffer of 500 and batches them by 16. ``ids(batch)`` names a batch's
samples, to check that a restored stream continues with the same batch.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import torch

warnings.filterwarnings("ignore", category=UserWarning, module="torchdata")  # 0.9's deprecation banner
from torchdata.datapipes.iter import FileLister, IterDataPipe  # noqa: E402

__all__ = ["BATCH", "BUFFER", "PIPELINES", "Pipeline", "ids"]

BATCH = 16
BUFFER = 500


def _files(folder: str, mask: str) -> IterDataPipe:
    return FileLister(folder, mask).shuffle().sharding_filter().open_files(mode="b")


def _tail(dp: IterDataPipe) -> IterDataPipe:
    return dp.shuffle(buffer_size=BUFFER).batch(BATCH)


def decode_webdataset(sample: dict[str, Any]) -> dict[str, Any]:
    image = sample[".jpg"].read()
    return {"id": sample["__key__"].rsplit("/", 1)[-1],
            "image": torch.frombuffer(bytearray(image), dtype=torch.uint8),
            "meta": json.loads(sample[".json"].read()), "label": int(sample[".cls"].read())}


def build_tar(folder: str) -> IterDataPipe:
    """``FileLister -> shuffle -> sharding_filter -> FileOpener(mode="b") -> load_from_tar -> webdataset
    -> map(decode) -> shuffle(500) -> batch(16)``."""
    return _tail(_files(folder, "*.tar").load_from_tar().webdataset().map(decode_webdataset))


def read_members(sample: dict[str, Any]) -> dict[str, Any]:
    """The members' bytes (a tar's member streams share one file: read them in order, not in threads)."""
    return {k: v if k == "__key__" else v.read() for k, v in sample.items()}


def decode_read(sample: dict[str, Any]) -> dict[str, Any]:
    return {"id": sample["__key__"].rsplit("/", 1)[-1],
            "image": torch.frombuffer(bytearray(sample[".jpg"]), dtype=torch.uint8),
            "meta": json.loads(sample[".json"]), "label": int(sample[".cls"])}


def build_tar_threads(folder: str) -> IterDataPipe:
    """The tar pipeline, members read by a ``map`` and decoded in a thread pool:
    ``... webdataset -> map(read) -> threadpool_map(decode, max_workers=4) -> shuffle(500) -> batch(16)``."""
    return _tail(_files(folder, "*.tar").load_from_tar().webdataset().map(read_members)
                 .threadpool_map(decode_read, max_workers=4))


def decode_json_line(path_line: tuple[str, bytes]) -> dict[str, Any]:
    row: dict[str, Any] = json.loads(path_line[1])
    return row


def build_jsonl(folder: str) -> IterDataPipe:
    """``... FileOpener(mode="b") -> decompress -> readlines -> map(json.loads) -> shuffle(500) -> batch(16)``."""
    lines = _files(folder, "*.jsonl.gz").decompress(file_type="gzip").readlines(decode=False)
    return _tail(lines.map(decode_json_line))


def decode_csv_row(row: list[str]) -> dict[str, Any]:
    return {"id": int(row[0]), "label": int(row[1]), "score": float(row[2]), "text": row[3]}


def build_csv(folder: str) -> IterDataPipe:
    """``... FileOpener(mode="b") -> parse_csv(skip_lines=1) -> map(decode) -> shuffle(500) -> batch(16)``."""
    return _tail(_files(folder, "*.csv").parse_csv(skip_lines=1).map(decode_csv_row))


def decode_zip_member(path_stream: tuple[str, Any]) -> dict[str, Any]:
    path, stream = path_stream
    data = stream.read()
    return {"id": path.rsplit("/", 1)[-1], "blob": torch.frombuffer(bytearray(data), dtype=torch.uint8)}


def build_zip(folder: str) -> IterDataPipe:
    """``... FileOpener(mode="b") -> load_from_zip -> map(read) -> shuffle(500) -> batch(16)``."""
    return _tail(_files(folder, "*.zip").load_from_zip().map(decode_zip_member))


def decode_example(example: dict[str, Any]) -> dict[str, Any]:
    label = example["label"]
    return {"id": int(label[0]) if len(label) else -1, "blob": example["blob"][0]}


def build_tfrecord(folder: str) -> IterDataPipe:
    """``... FileOpener(mode="b") -> load_from_tfrecord -> map(decode) -> shuffle(500) -> batch(16)``."""
    return _tail(_files(folder, "*.tfrecord").load_from_tfrecord().map(decode_example))


def ids(batch: list[dict[str, Any]]) -> list[Any]:
    """What names each sample of a batch (its key, id or bytes' digest)."""
    import hashlib

    out = []
    for sample in batch:
        blob = sample.get("image", sample.get("blob"))
        if isinstance(blob, torch.Tensor):
            blob = blob.numpy().tobytes()
        digest = hashlib.sha1(blob).hexdigest()[:12] if blob is not None else None
        out.append((sample["id"], digest))
    return out


def _has_protobuf() -> str | None:
    from torchdata.datapipes.iter.util.tfrecordloader import HAS_PROTOBUF

    return None if HAS_PROTOBUF else "torchdata's TFRecordLoader needs protobuf, not installed in this environment"


class Pipeline:
    """A named pipeline over one format of the corpus; ``missing()`` says why it cannot run here."""

    def __init__(self, name: str, fmt: str, build: Callable[[str], IterDataPipe],
                 missing: Callable[[], str | None] = lambda: None):
        self.name, self.format, self.build, self.missing = name, fmt, build, missing


PIPELINES = {p.name: p for p in (
    Pipeline("tar", "tar", build_tar),
    Pipeline("tar+threads", "tar", build_tar_threads),
    Pipeline("jsonl.gz", "jsonl", build_jsonl),
    Pipeline("csv", "csv", build_csv),
    Pipeline("zip", "zip", build_zip),
    Pipeline("tfrecord", "tfrecord", build_tfrecord, _has_protobuf),
)}
