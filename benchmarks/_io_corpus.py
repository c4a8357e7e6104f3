"""The io benchmark's corpus: the same kinds of files real DataPipe jobs read, made in a directory.

``make(root, size)`` writes about ``size`` bytes, split between five formats (shares in
``SHARES``), each in several files so that a pipeline shuffles and shards files:

- ``tar/part-NNNN.tar``: WebDataset-style shards of 250 samples, each sample three members
  ``KEY.jpg`` (4 KiB of random, incompressible bytes, as encoded images are), ``KEY.json``
  (metadata) and ``KEY.cls`` (a label);
- ``jsonl/part-NNNN.jsonl.gz``: gzip JSON lines of about 300 bytes each (an id, a label and
  text made of words, so it compresses as text does);
- ``csv/part-NNNN.csv``: a header row, then rows of the same fields;
- ``zip/part-NNNN.zip``: 250 members of 2 KiB random bytes each, stored (not deflated);
- ``tfrecord/part-NNNN.tfrecord``: framed records (length, masked CRC-32C, data, masked
  CRC-32C) each holding a ``tf.train.Example`` with a 2 KiB bytes feature and an int label,
  encoded here by hand (no TensorFlow or protobuf needed to write them).

Every sample's content is a function of its index (``random.Random(index)``), so two
corpora made with the same size are byte for byte the same.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import struct
import tarfile
import zipfile
from dataclasses import dataclass, field

__all__ = ["SHARES", "Corpus", "make", "parse_size"]

#: Share of the corpus's bytes each format gets.
SHARES = {"tar": 0.40, "jsonl": 0.15, "csv": 0.15, "zip": 0.20, "tfrecord": 0.10}
IMAGE_BYTES = 4 * 1024
BLOB_BYTES = 2 * 1024
PER_FILE = 250          # samples per tar shard, zip archive or TFRecord file
LINES_PER_FILE = 4_000  # lines per JSON-lines or CSV file
_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "data", "pipe", "snapshot", "resume",
          "shard", "worker", "epoch", "batch", "sample", "buffer", "offset", "member", "archive", "stream", "record",
          "reader", "restore", "state"]


def parse_size(text: str) -> int:
    """``"20MB"``, ``"1GB"``, ``"500k"`` or a number of bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


@dataclass
class Corpus:
    """Where each format's files are, how many samples each holds, and the bytes written."""

    root: str
    samples: dict[str, int] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)
    largest: dict[str, int] = field(default_factory=dict)  # the largest file of each format

    def dir(self, fmt: str) -> str:
        return os.path.join(self.root, fmt)


def _row(i: int) -> dict[str, object]:
    rng = random.Random(i)
    text = " ".join(rng.choice(_WORDS) for _ in range(40))
    return {"id": i, "label": rng.randrange(1000), "score": round(rng.random(), 6), "text": text}


def _counts(total: int, per_file: int) -> list[int]:
    files = max(4, -(-total // per_file))
    base, extra = divmod(max(total, files), files)
    return [base + (k < extra) for k in range(files)]


def _tar(path: str, first: int, count: int) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(first, first + count):
            rng = random.Random(i)
            key = f"sample{i:09d}"
            members = {"jpg": rng.randbytes(IMAGE_BYTES),
                       "json": json.dumps({"key": key, "width": 64, "height": 64}).encode(),
                       "cls": str(rng.randrange(1000)).encode()}
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))


def _zip(path: str, first: int, count: int) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for i in range(first, first + count):
            archive.writestr(zipfile.ZipInfo(f"blob{i:09d}.bin", date_time=(2020, 1, 1, 0, 0, 0)),
                             random.Random(i).randbytes(BLOB_BYTES))


def _jsonl(path: str, first: int, count: int) -> None:
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(b"".join(json.dumps(_row(i)).encode() + b"\n" for i in range(first, first + count)))


def _csv(path: str, first: int, count: int) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "label", "score", "text"])
        for i in range(first, first + count):
            writer.writerow(_row(i).values())


# -- TFRecord, by hand: CRC-32C (Castagnoli) and the protobuf wire format of tf.train.Example --

def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # a length-delimited field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _example(i: int) -> bytes:
    rng = random.Random(i)
    blob = _field(1, _field(1, rng.randbytes(BLOB_BYTES)))          # Feature.bytes_list.value
    label = _field(3, _field(1, _varint(rng.randrange(1000))))      # Feature.int64_list.value (packed)
    features = b"".join(_field(1, _field(1, name.encode()) + _field(2, feature))  # map entry
                        for name, feature in (("blob", blob), ("label", label)))
    return _field(1, features)                                      # Example.features


def _tfrecord(path: str, first: int, count: int) -> None:
    with open(path, "wb") as f:
        for i in range(first, first + count):
            data = _example(i)
            length = struct.pack("<Q", len(data))
            # the data's CRC is not checked by torchdata's reader; a constant keeps writing fast
            f.write(length + struct.pack("<I", _masked(_crc32c(length))) + data + struct.pack("<I", 0))


_WRITERS = {"tar": (_tar, "tar", IMAGE_BYTES + 5 * 512, PER_FILE),
            "jsonl": (_jsonl, "jsonl.gz", 300, LINES_PER_FILE),
            "csv": (_csv, "csv", 290, LINES_PER_FILE),
            "zip": (_zip, "zip", BLOB_BYTES + 100, PER_FILE),
            "tfrecord": (_tfrecord, "tfrecord", BLOB_BYTES + 40, PER_FILE)}


def make(root: str, size: int, formats: tuple[str, ...] = tuple(SHARES)) -> Corpus:
    """Write the corpus under ``root`` (about ``size`` bytes before compression)."""
    corpus = Corpus(root)
    for fmt in formats:
        write, ext, sample_bytes, per_file = _WRITERS[fmt]
        os.makedirs(corpus.dir(fmt), exist_ok=True)
        first = 0
        for k, count in enumerate(_counts(int(size * SHARES[fmt]) // sample_bytes, per_file)):
            path = os.path.join(corpus.dir(fmt), f"part-{k:04d}.{ext}")
            write(path, first, count)
            first += count
            corpus.nbytes[fmt] = corpus.nbytes.get(fmt, 0) + os.path.getsize(path)
            corpus.largest[fmt] = max(corpus.largest.get(fmt, 0), os.path.getsize(path))
            corpus.files[fmt] = k + 1
        corpus.samples[fmt] = first
    return corpus
