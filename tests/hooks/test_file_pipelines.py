"""Real file pipelines (tar shards WebDataset-style, gzip JSON lines, CSV, zip, TFRecord) restore
exactly and in O(state): from the readers' addresses and offsets, nothing replayed, the bytes
read by a restore not growing with the position, and a file that changed refused."""

from __future__ import annotations

import functools
import gzip
import os
from typing import Any

import pytest

pytest.importorskip("torchdata.datapipes.iter")

from torch.utils.data.datapipes.iter import Batcher, Shuffler

import snapshot
from snapshot.graph import Graph
from snapshot.plan import RestoreStrategy, make_plan
from snapshot.testing import Cut, assert_resumes_exactly
from tests import file_corpus as corpus

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def root(tmp_path: Any) -> str:
    return corpus.write_corpus(str(tmp_path / "corpus"))


def _length(factory: Any) -> int:
    return len(list(factory()))


#: pipeline -> cut points (samples into epoch 0) that fall mid-member / mid-line / mid-file, on a file or
#: shard boundary, and at the last sample; every pipeline is also cut at the end and just after it.
PIPELINES = {
    # 4 shards of 7 samples: 3 and 10 mid-shard (a member pending in webdataset), 7 and 14 on a shard boundary
    "webdataset": (functools.partial(corpus.webdataset, shuffle=0), [1, 3, 7, 10, 14]),
    # 9, 10, 11 lines: 4 mid-file, 9 at the first file's end, 15 mid-second
    "gzip_lines": (corpus.gzip_lines, [4, 9, 15, 19]),
    # quoted multi-line fields: a row spans two lines
    "csv_rows": (corpus.csv_rows, [2, 6, 7, 13]),
    "csv_dicts": (functools.partial(corpus.csv_rows, as_dict=True), [1, 5, 6, 12]),
    # 5 members per zip (after a directory entry)
    "zip_members": (corpus.zip_members, [1, 5, 7]),
    "tar_members": (corpus.tar_members, [2, 17, 34, 50]),
    "tfrecords": (corpus.tfrecords, [3, 6, 11]),
    "json_docs": (corpus.json_docs, [1, 2]),
    "bz2_lines": (corpus.bz2_lines, [3, 12]),
}


def _cuts(length: int, inside: list[int]) -> list[Cut]:
    return [*(Cut(0, n) for n in inside), Cut(0, length - 1), Cut(0, length, finished=True), Cut(1, 1),
            Cut(0, inside[0], then=inside[-1])]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_resumes_exactly_from_state(name: str, root: str) -> None:
    make, inside = PIPELINES[name]
    factory = functools.partial(make, root)
    graph = Graph(factory())
    assert make_plan(graph, {n.path: 3 for n in graph}, RestoreStrategy.AUTO).replay == frozenset()
    # "state": every node from its state (the strategy is refused if anything needs a replay)
    assert_resumes_exactly(factory, epochs=2, cuts=_cuts(_length(factory), inside), strategies=("state",),
                           via_file=False)


def _shuffled_batches(root: str) -> Any:
    return Batcher(corpus.webdataset(root, shuffle=5), 3)


def test_webdataset_behind_a_shuffle_resumes_with_2_workers_and_onto_1(root: str) -> None:
    # 10 batches an epoch: mid-shard, a restore saved again, after the epoch, in epoch 1
    factory = functools.partial(_shuffled_batches, root)
    two = functools.partial(snapshot.MultiProcessingReadingService, num_workers=2)
    one = functools.partial(snapshot.MultiProcessingReadingService, num_workers=1)
    cuts = [Cut(0, 1), Cut(0, 10, finished=True), Cut(1, 3)]
    assert_resumes_exactly(factory, reading_service=two, epochs=2, cuts=cuts, via_file=False)
    assert_resumes_exactly(factory, reading_service=two, restore_service=one, epochs=2,
                           cuts=[Cut(0, 5), Cut(0, 2, then=7), Cut(1, 3)], via_file=False)


def test_gzip_lines_resume_from_2_workers_in_process(root: str) -> None:
    # 30 lines in 3 files on 2 logical shards: 4 and 15 mid-file, 9 and 19 across a file's end
    factory = functools.partial(corpus.gzip_lines, root)
    two = functools.partial(snapshot.MultiProcessingReadingService, num_workers=2)
    cuts = [Cut(0, 4), Cut(0, 9), Cut(0, 4, then=19), Cut(0, 30, finished=True), Cut(1, 15)]
    assert_resumes_exactly(factory, reading_service=two, restore_service=snapshot.InProcessReadingService, epochs=2,
                           cuts=cuts, via_file=False)


# -- a restore costs the state, not the position ----------------------------------------------

def _rchar() -> int:
    """Bytes this process has read through system calls so far (Linux /proc/self/io)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _restore_reads(factory: Any, at: int, strategy: str) -> int:
    """Bytes read by restoring a snapshot taken after ``at`` samples and taking the next sample."""
    with snapshot.DataLoader2(factory()) as loader:
        loader.seed(0)
        it = iter(loader)
        for _ in range(at):
            next(it)
        snap = loader.save_snapshot()
    fresh = snapshot.DataLoader2(factory())
    with fresh:
        before = _rchar()
        fresh.restore_snapshot(snap, strategy=strategy)
        next(iter(fresh))
        return _rchar() - before


def _big_corpus(root: str) -> str:
    """16 tar shards of 40 samples of ~4 KB: a restore that re-reads earlier shards reads ~100x more."""
    import io
    import tarfile

    os.makedirs(root, exist_ok=True)
    for shard in range(16):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(40):
                for ext, size in (("txt", 4000), ("cls", 1)):
                    data = bytes([65 + (shard + i) % 26]) * size
                    info = tarfile.TarInfo(f"k{shard:02d}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        with open(os.path.join(root, f"big-{shard:02d}.tar"), "wb") as f:
            f.write(out.getvalue())
    return root


def _big_pipeline(root: str) -> Any:
    return corpus.webdataset(root, shuffle=0)


def test_bytes_read_by_a_restore_do_not_grow_with_the_position(tmp_path: Any) -> None:
    factory = functools.partial(_big_pipeline, _big_corpus(str(tmp_path / "big")))
    early, late = _restore_reads(factory, 60, "auto"), _restore_reads(factory, 600, "auto")
    replayed = _restore_reads(factory, 600, "fast_forward")
    shard = os.path.getsize(tmp_path / "big" / "big-00.tar")
    # a state restore reopens one shard at an offset: at most about a shard, whatever the position
    assert late < early + shard, (early, late)
    assert late < 2 * shard, (late, shard)
    # (the measure can fail: a replay from the start of the epoch reads the 15 shards before)
    assert replayed > 10 * shard, (replayed, shard)


# -- a file that changed is refused ------------------------------------------------------------

def test_a_file_that_changed_since_the_snapshot_is_refused(root: str) -> None:
    factory = functools.partial(corpus.gzip_lines, root)
    with snapshot.DataLoader2(factory()) as loader:
        loader.seed(0)
        it = iter(loader)
        for _ in range(4):  # mid-way through the first file
            next(it)
        name = next(it)[0]  # the file being read
        snap = loader.save_snapshot()
    path = os.path.join(root, name)
    assert name.endswith(".jsonl.gz") and os.path.exists(path)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # same bytes, touched
    with pytest.raises(snapshot.RestoreError) as info:
        snapshot.DataLoader2(factory()).restore_snapshot(snap)
    message = str(info.value)
    assert path in message and "changed since the snapshot was saved" in message and "mtime_ns" in message
    with open(path, "ab") as f:  # grown: refused too, naming the sizes
        f.write(b"\0")
    with pytest.raises(snapshot.RestoreError, match="size"):
        snapshot.DataLoader2(factory()).restore_snapshot(snap)
    # a replay from the start of the epoch does not read at the saved offset: it is allowed to try
    # (and here fails on the corrupted gzip, as the pipe itself would)


def test_a_stream_that_cannot_be_reopened_replays_only_the_input(root: str) -> None:
    """A reader fed by a map that builds its own streams cannot reopen its stream from an address:
    it restores from its state, its input replayed up to the stream it was reading (the plan says
    so), and reads that stream again up to where it stood; the stream is exact."""
    import torchdata.datapipes.iter as td
    from torch.utils.data.datapipes.iter import IterableWrapper, Mapper

    def factory() -> Any:
        return td.LineReader(Mapper(IterableWrapper([os.path.join(root, f"table-{i}.csv") for i in range(2)]),
                                    _open_plain))

    graph = Graph(factory())
    plan = make_plan(graph, {n.path: 2 for n in graph}, RestoreStrategy.AUTO)
    assert plan.method("0") == "state"
    assert plan.method("0/source_datapipe") == "replay"
    assert "cannot reopen" in plan.reasons["0/source_datapipe"]
    assert "its input is replayed up to the stream it was reading" in plan.reasons["0/source_datapipe"]
    assert_resumes_exactly(factory, epochs=2, via_file=False)


def _open_plain(path: str) -> Any:
    from torch.utils.data.datapipes.utils.common import StreamWrapper

    return path, StreamWrapper(open(path, "rb"))


# -- shuffle buffers of file samples saved as addresses (buffer_state="positions") ---------------

def _shuffled(name: str, root: str) -> Any:
    make, _ = PIPELINES[name]
    return Shuffler(make(root), buffer_size=6)


def _buffer_record(factory: Any, buffer_state: str, at: int = 3) -> dict[str, Any]:
    with snapshot.DataLoader2(factory(), buffer_state=buffer_state) as loader:
        loader.seed(0)
        it = iter(loader)
        for _ in range(at):
            next(it)
        return loader.save_snapshot().manifest["shards"][0]["nodes"]["0"]


#: one pipeline per way a sample is addressed (member, group of members, line, row, record, whole file)
ADDRESSED = ["tar_members", "webdataset", "gzip_lines", "csv_dicts", "tfrecords", "json_docs"]


@pytest.mark.parametrize("name", ADDRESSED)
def test_a_shuffle_of_file_samples_is_saved_by_address_and_resumes_exactly(name: str, root: str) -> None:
    factory = functools.partial(_shuffled, name, root)
    assert _buffer_record(factory, "positions")["buffer_state"] == "positions"
    length = _length(factory)
    cuts = [Cut(0, 0), Cut(0, 2), Cut(0, length // 2), Cut(0, length - 2), Cut(0, length, finished=True),
            Cut(1, 1), Cut(0, 1, then=max(2, length // 2))]
    assert_resumes_exactly(factory, epochs=2, cuts=cuts, strategies=("state",), via_file=False,
                           buffer_state="positions")


def test_webdataset_buffer_by_address_with_2_workers_and_onto_in_process(root: str) -> None:
    factory = functools.partial(_shuffled_batches, root)
    two = functools.partial(snapshot.MultiProcessingReadingService, num_workers=2)
    assert_resumes_exactly(factory, reading_service=two, restore_service=snapshot.InProcessReadingService,
                           epochs=2, cuts=[Cut(0, 2), Cut(0, 6), Cut(1, 1)], via_file=False, buffer_state="positions")


def test_a_buffer_by_address_does_not_grow_with_the_samples(tmp_path: Any) -> None:
    factory = functools.partial(_big_shuffled, _big_corpus(str(tmp_path / "big")))
    by_value, by_address = _buffer_record(factory, "values", 30), _buffer_record(factory, "positions", 30)
    assert by_address["buffer_state"] == "positions" and by_address["buffered"] == 20
    # 20 samples of ~4 KB by value (equal strings are stored once, and these samples repeat 26 letters);
    # by address, a few hundred bytes each
    assert by_value["state_bytes"] > 10 * 4000 and by_value["state_bytes"] > 4 * by_address["state_bytes"], (
        by_value, by_address)


def _big_shuffled(root: str) -> Any:
    return Shuffler(corpus.webdataset(root), buffer_size=20)


def test_a_buffered_sample_whose_file_changed_is_refused(root: str) -> None:
    factory = functools.partial(_shuffled, "tar_members", root)
    with snapshot.DataLoader2(factory(), buffer_state="positions") as loader:
        loader.seed(0)
        it = iter(loader)
        next(it)
        snap = loader.save_snapshot()
    path = os.path.join(root, "shard-00.tar")
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(snapshot.RestoreError, match="shard-00.tar changed since the snapshot was saved"):
        snapshot.DataLoader2(factory(), buffer_state="positions").restore_snapshot(snap)


def test_a_reader_state_of_the_old_layout_is_refused_not_misread(root: str) -> None:
    """Before streams had addresses, readers saved a path and a count; such a state is refused."""
    from snapshot.hooks import hook_for

    dp = corpus.gzip_lines(root)
    reader = dp.datapipe  # readlines
    cell = hook_for(reader).iterator(reader, [iter(())])
    with pytest.raises(snapshot.RestoreError, match="older version.*fast_forward"):
        cell.load_state_dict({"yielded": 3, "state": {"path": "lines-0.jsonl.gz", "read": 3}})
    fresh = hook_for(reader).iterator(reader, [iter(())])
    fresh.load_state_dict({"yielded": 0, "state": {"path": None, "read": 0}})  # between files: nothing to refuse


# -- an object store through open_files_by_fsspec (moto's S3 server on 127.0.0.1) ---------------

try:
    from tests.storage.test_s3 import s3
except pytest.skip.Exception:  # s3fs or moto not installed
    s3 = None


def _s3_lines(urls: list[str]) -> Any:
    import torchdata.datapipes.iter as td
    from torch.utils.data.datapipes.iter import IterableWrapper, Mapper

    opened = td.FSSpecFileOpener(IterableWrapper(urls), mode="rb")
    return Mapper(td.LineReader(td.Decompressor(opened)), corpus.parse_line)


@pytest.mark.skipif(s3 is None, reason="needs s3fs and moto")
def test_an_object_store_reader_resumes_by_offset_and_refuses_a_rewritten_object(s3, root: str) -> None:
    import s3fs

    bucket, _ = s3
    fs = s3fs.S3FileSystem()
    urls = []
    for index in range(2):
        key = f"{bucket}/lines/lines-{index}.jsonl.gz"
        fs.put(os.path.join(root, f"lines-{index}.jsonl.gz"), key)
        urls.append(f"s3://{key}")
    factory = functools.partial(_s3_lines, urls)
    assert make_plan(Graph(factory()), {n.path: 3 for n in Graph(factory())}, RestoreStrategy.AUTO).replay == set()
    assert_resumes_exactly(factory, epochs=1, cuts=[Cut(0, 4), Cut(0, 12)], strategies=("state",), via_file=False)
    with snapshot.DataLoader2(factory()) as loader:
        loader.seed(0)
        it = iter(loader)
        for _ in range(12):  # into the second object
            next(it)
        snap = loader.save_snapshot()
    fs.pipe(urls[1][len("s3://"):], gzip.compress(b'{"line": -1}\n'))  # rewritten: another ETag and size
    with pytest.raises(snapshot.RestoreError, match=r"lines-1\.jsonl\.gz changed since the snapshot was saved"):
        snapshot.DataLoader2(factory()).restore_snapshot(snap)
