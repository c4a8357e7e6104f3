"""A decompressed view moved by :func:`snapshot.hooks.builtin._streams.seek` (reads of 1 MiB) lands where the
standard library's ``seek`` (reads of 8 KiB) lands, forward, backward, at and past the end."""

from __future__ import annotations

import bz2
import gzip
import lzma
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.utils.common import StreamWrapper

from snapshot.hooks.builtin._streams import seek

OPENERS: dict[str, Callable[[Any], Any]] = {"gzip": lambda f: gzip.GzipFile(fileobj=f), "bz2": bz2.BZ2File,
                                            "xz": lzma.LZMAFile}
WRITERS = {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lambda data: lzma.compress(data, preset=0)}


@pytest.fixture(scope="module")
def text() -> bytes:
    rng = random.Random(5)
    words = ("".join(rng.choices("abcdef ", k=rng.randrange(9, 40))).encode() for _ in range(70_000))
    return b"".join(b'{"id": %d, "text": "%s"}\n' % (i, w) for i, w in enumerate(words))  # 3.5 MB: 4 reads of 1 MiB


@pytest.mark.parametrize("kind", sorted(OPENERS))
def test_a_decompressed_view_lands_where_its_own_seek_does(kind: str, text: bytes, tmp_path: Path) -> None:
    path = tmp_path / f"t.{kind}"
    path.write_bytes(WRITERS[kind](text))
    size = len(text)
    # (start, target): from the start, across several reads, onto a read's edge, backward, at and past the end
    moves = [(0, 8191), (0, (1 << 20) + 7), (12_345, 2 * (1 << 20) + 1), (0, size + 10), (size - 5, 100)]
    for start, target in moves:
        with open(path, "rb") as a, open(path, "rb") as b:
            ours, theirs = StreamWrapper(OPENERS[kind](a)), OPENERS[kind](b)
            ours.read(start)
            theirs.read(start)
            seek(ours, target)
            theirs.seek(target)
            assert ours.tell() == theirs.tell() == min(target, size), (kind, start, target)
            assert ours.read(64) == theirs.read(64) == text[min(target, size):min(target, size) + 64]
