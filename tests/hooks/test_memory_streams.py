"""Readers over streams that no opener made: ``io.StringIO`` / ``io.BytesIO`` in an ``IterableWrapper``.

This is the shape torchdata 0.9's own tests use (and what a user's own opener or an HTTP response
yields): the streams have no address, so a reader cannot reopen one. A restore replays the reader's
input up to the stream it was reading (one item per stream before it) and the reader reads that stream
again up to where it stood; nothing of a stream goes into the snapshot (no pickled section), and the plan
and ``snapshot inspect`` say what is replayed and read again.
"""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
import tarfile
from typing import Any

import pytest

import snapshot
from snapshot.testing import assert_resumes_exactly

td = pytest.importorskip("torchdata.datapipes.iter")


def texts(n: int = 4) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper([(f"f{i}.csv", io.StringIO("k,v\n" + "".join(f"{i},{j}\n" for j in range(3))))
                            for i in range(n)])


def jsons(n: int = 5) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper([(f"f{i}.json", io.StringIO(json.dumps({"a": i, "b": [i] * i}))) for i in range(n)])


def binaries(n: int = 3) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper([(f"b{i}", io.BytesIO(bytes(range(i, i + 11)))) for i in range(n)])


def _tar(i: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for j in range(3):
            data = f"{i}-{j}\n".encode()
            info = tarfile.TarInfo(f"m{j}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def open_archive(i: int) -> tuple[str, Any]:
    """A user's own opener: an archive made in memory (torch's archive loaders want a StreamWrapper)."""
    from torch.utils.data.datapipes.utils.common import StreamWrapper

    return f"a{i}.tar", StreamWrapper(io.BytesIO(_tar(i)))


def archives(n: int = 3) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(n)).map(open_archive)


def _read(pair: tuple[str, Any]) -> tuple[str, bytes]:
    return pair[0], pair[1].read()


def stream_reader() -> Any:
    from torch.utils.data.datapipes.iter import StreamReader

    return StreamReader(binaries(), chunk=4)


SHAPES = {
    "readlines": lambda: td.LineReader(texts()),
    "parse_csv": lambda: td.CSVParser(texts(), skip_lines=1),
    "parse_csv_as_dict": lambda: td.CSVDictParser(texts()),
    "parse_json_files": lambda: td.JsonParser(jsons()),
    "StreamReader": stream_reader,
    "load_from_tar": lambda: td.TarArchiveLoader(archives()).map(_read),
    "shuffled streams, readlines": lambda: td.LineReader(texts(6).shuffle(buffer_size=3)),
    "shuffled streams, parse_json_files": lambda: td.JsonParser(jsons().shuffle(buffer_size=3)),
    "readlines, shuffled lines": lambda: td.LineReader(texts()).shuffle(buffer_size=4),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_reader_over_streams_no_opener_made_resumes_exactly(name: str) -> None:
    assert_resumes_exactly(SHAPES[name], epochs=2, strategies=("auto", "fast_forward"))


def sharded_before() -> Any:
    return td.LineReader(texts(6).shuffle(buffer_size=3).sharding_filter())


def sharded_after() -> Any:
    return td.LineReader(texts(6)).sharding_filter().shuffle(buffer_size=3)


@pytest.mark.slow
@pytest.mark.parametrize("factory", [sharded_before, sharded_after], ids=lambda f: f.__name__)
def test_with_workers_and_logical_shards(factory: Any) -> None:
    # the reader below the sharding point (its input is the shard's port: the shard replays from the
    # sharding point) and above it (in the part every worker copies)
    workers = functools.partial(snapshot.MultiProcessingReadingService, 2, logical_shards=3, timeout=60)
    in_process = functools.partial(snapshot.InProcessReadingService, logical_shards=3)
    assert_resumes_exactly(factory, reading_service=workers, restore_service=in_process, epochs=2)
    assert_resumes_exactly(factory, reading_service=in_process, restore_service=workers, epochs=1)


@pytest.mark.parametrize("name", ["readlines", "shuffled streams, parse_json_files", "shuffled streams, readlines"])
def test_nothing_of_a_stream_is_saved(tmp_path, name: str) -> None:
    path = str(tmp_path / "data.snap")
    with snapshot.DataLoader2(SHAPES[name]()) as loader:
        loader.seed(3)
        it = iter(loader)
        for _ in range(4):
            next(it)
        loader.save_snapshot(path)
        rest = list(it)
    assert snapshot.read_manifest(path)["payload"]["pickled"] == []
    with snapshot.DataLoader2(SHAPES[name]()) as loader:
        loader.restore_snapshot(path)  # no key, no allow_pickle: the state is data
        assert list(loader) == rest


def test_the_plan_and_inspect_say_what_is_replayed_and_read_again(tmp_path) -> None:
    path = str(tmp_path / "data.snap")
    with snapshot.DataLoader2(SHAPES["readlines"]()) as loader:
        it = iter(loader)
        for _ in range(6):  # the third line of f1.csv: one stream before it
            next(it)
        loader.save_snapshot(path)
    plan = snapshot.read_manifest(path)["shards"][0]["plan"]
    assert plan["drivers"] == [{"path": "0/source_datapipe", "replay": 2}]  # the input, up to the stream read
    out = subprocess.run([sys.executable, "-m", "snapshot", "inspect", path], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "replay 2 samples of 0/source_datapipe" in text
    assert "0 reads streams that snapshot cannot reopen" in text and "replayed up to the stream it was reading" in text
