"""A shuffle buffer saved by position is re-produced in one batch (``Reproducer.many``): a file
reader reopens each file once and reads its buffered samples in offset order. The restored
stream equals the uninterrupted one, for every reader, buffers spanning several files, the
same address buffered twice and with 2 workers; a changed file is refused; and each file is
opened once by the buffer's restore, whatever the number of its samples in the buffer."""

from __future__ import annotations

import collections
import functools
import io
import os
import re
import tarfile
from typing import Any

import pytest

pytest.importorskip("torchdata.datapipes.iter")

import torchdata.datapipes.iter as td
from torch.utils.data.datapipes.iter import FileOpener, IterableWrapper, Mapper, Shuffler

import snapshot
from snapshot.hooks.builtin import _streams
from snapshot.testing import Cut, assert_resumes_exactly
from tests import file_corpus as corpus

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: larger than a file's samples (9 to 11 lines, 6 to 8 rows, 5 zip members, 7 tar samples), so that
#: the buffer holds samples of several files
BUFFER = 15


@pytest.fixture
def root(tmp_path: Any) -> str:
    return corpus.write_corpus(str(tmp_path / "corpus"))


READERS = {
    "gzip_lines": corpus.gzip_lines,
    "csv_rows": corpus.csv_rows,
    "csv_dicts": functools.partial(corpus.csv_rows, as_dict=True),
    "tar_members": corpus.tar_members,
    "zip_members": corpus.zip_members,
    "webdataset": corpus.webdataset,
    "tfrecords": corpus.tfrecords,
}


def shuffled(name: str, root: str, buffer: int = BUFFER) -> Any:
    return Shuffler(READERS[name](root), buffer_size=buffer)


def _cuts(length: int) -> list[Cut]:
    return [Cut(0, 0), Cut(0, 2), Cut(0, length // 3), Cut(0, length // 2), Cut(0, length - 2),
            Cut(0, length, finished=True), Cut(1, 3), Cut(0, 1, then=length // 2)]


def _shuffle_record(snap: snapshot.Snapshot) -> dict[str, Any]:
    record: dict[str, Any] = snap.manifest["shards"][0]["nodes"]["0"]
    return record


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_buffer_over_several_files_restores_exactly_in_process(name: str, root: str) -> None:
    factory = functools.partial(shuffled, name, root)
    record = _shuffle_record(_snapshot_after(factory, 2))
    assert record["buffer_state"] == "positions" and record["buffered"] >= 10, record
    assert_resumes_exactly(factory, epochs=2, cuts=_cuts(len(list(factory()))), strategies=("state",),
                           via_file=False, buffer_state="positions")  # auto: state's plan (tests/helpers.py)


def batched_lines(root: str) -> Any:
    return Shuffler(corpus.gzip_lines(root), buffer_size=12).batch(2)


def test_gzip_lines_restore_exactly_with_2_workers_and_onto_in_process(root: str) -> None:
    factory = functools.partial(batched_lines, root)
    two = functools.partial(snapshot.MultiProcessingReadingService, num_workers=2)
    cuts = [Cut(0, 1), Cut(0, 4), Cut(0, 7), Cut(1, 2)]
    assert_resumes_exactly(factory, reading_service=two, epochs=2, cuts=cuts, via_file=False,
                           buffer_state="positions")
    assert_resumes_exactly(factory, reading_service=two, restore_service=snapshot.InProcessReadingService,
                           epochs=2, cuts=cuts[:2], via_file=False, buffer_state="positions")


def batched_tar(root: str) -> Any:
    return Shuffler(corpus.webdataset(root), buffer_size=9).batch(2)


def test_webdataset_restores_exactly_with_2_workers(root: str) -> None:
    two = functools.partial(snapshot.MultiProcessingReadingService, num_workers=2)
    assert_resumes_exactly(functools.partial(batched_tar, root), reading_service=two, epochs=2,
                           cuts=[Cut(0, 1), Cut(0, 5), Cut(1, 1)], via_file=False, buffer_state="positions")


def streams_buffered(root: str, webdataset: bool) -> Any:
    """A shuffle that holds member streams (read after it, in the shuffled order): the restored ones
    share one opening of their archive and are read out of its order."""
    tar = td.TarArchiveLoader(FileOpener(corpus.listed(root, "*.tar"), mode="b"))
    if webdataset:
        return Mapper(Shuffler(td.WebDataset(tar), buffer_size=BUFFER), corpus.decode_sample)
    return Mapper(Shuffler(tar, buffer_size=BUFFER), corpus.read_member)


@pytest.mark.parametrize("webdataset", [False, True], ids=["tar_members", "webdataset"])
def test_a_buffer_of_member_streams_restores_exactly(webdataset: bool, root: str) -> None:
    factory = functools.partial(streams_buffered, root, webdataset)
    assert _snapshot_after(factory, 2).manifest["shards"][0]["nodes"]["0/datapipe"]["buffer_state"] == "positions"
    assert_resumes_exactly(factory, epochs=2, cuts=_cuts(len(list(factory()))), strategies=("state",),
                           via_file=False, buffer_state="positions")


# -- the same address twice in a buffer (a file listed twice) -----------------------------------

def _twice(root: str, pattern: str, count: int) -> Any:
    """``FileOpener`` over the first ``count`` files of ``pattern``, the first one listed twice."""
    names = sorted(n for n in os.listdir(root) if n.endswith(pattern))[:count]
    paths = [os.path.join(root, n) for n in names]
    return FileOpener(IterableWrapper([paths[0], *paths]), mode="b")


def twice_gzip(root: str) -> Any:
    return Mapper(td.LineReader(td.Decompressor(_twice(root, ".jsonl.gz", 2))), corpus.parse_line)


def twice_csv(root: str) -> Any:
    return Mapper(td.CSVParser(_twice(root, ".csv", 2), return_path=True), corpus.basename_first)


def twice_tar(root: str) -> Any:
    return Mapper(td.TarArchiveLoader(_twice(root, ".tar", 2)), corpus.read_member)


def twice_webdataset(root: str) -> Any:
    return Mapper(td.WebDataset(td.TarArchiveLoader(_twice(root, ".tar", 1))), corpus.decode_sample)


def twice_zip(root: str) -> Any:
    return Mapper(td.ZipArchiveLoader(_twice(root, ".zip", 2)), corpus.read_member)


def twice_tfrecords(root: str) -> Any:
    return Mapper(td.TFRecordLoader(_twice(root, ".tfrecord", 1)), corpus.tensors_to_lists)


TWICE = {"gzip": twice_gzip, "csv": twice_csv, "tar": twice_tar, "webdataset": twice_webdataset,
         "zip": twice_zip, "tfrecords": twice_tfrecords}


def shuffled_twice(name: str, root: str) -> Any:
    return Shuffler(TWICE[name](root), buffer_size=20)


@pytest.mark.parametrize("name", sorted(TWICE))
def test_the_same_address_twice_in_a_buffer_restores_exactly(name: str, root: str) -> None:
    factory = functools.partial(shuffled_twice, name, root)
    stream = list(factory())
    assert len(stream) > len(set(map(repr, stream))), "the pipeline must yield some samples twice"
    assert_resumes_exactly(factory, epochs=2, cuts=_cuts(len(stream)), strategies=("state",), via_file=False,
                           buffer_state="positions")


# -- one opening per file; a changed file ------------------------------------------------------

def _snapshot_after(factory: Any, samples: int, service: Any = None, buffer_state: str = "positions") -> Any:
    with snapshot.DataLoader2(factory(), reading_service=service, buffer_state=buffer_state) as loader:
        loader.seed(0)
        it = iter(loader)
        for _ in range(samples):
            next(it)
        return loader.save_snapshot()


def _restore_opening_with(opener: Any, factory: Any, snap: snapshot.Snapshot) -> None:
    """Restore from ``snap`` and take the first sample, the module that reopens files opening them
    with ``opener`` (in place of ``open``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_streams, "open", opener, raising=False)
        with snapshot.DataLoader2(factory(), buffer_state="positions") as loader:
            loader.restore_snapshot(snap)
            next(iter(loader))


def _opens_during_restore(factory: Any, snap: snapshot.Snapshot) -> collections.Counter[str]:
    """How many times each file is opened by a restore from ``snap`` and its first sample: the real
    ``open`` of the module that reopens files, counted."""
    opened: collections.Counter[str] = collections.Counter()

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened[os.path.basename(file)] += 1
        return open(file, *args, **kwargs)

    _restore_opening_with(counting_open, factory, snap)
    return opened


def _buffer_opens(factory: Any, samples: int) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """The openings of each file by the shuffle buffer's restore (a restore of the snapshot saved by
    position, less one of the same cut saved by value), and by the rest of the restore (the readers')."""
    by_value = _opens_during_restore(factory, _snapshot_after(factory, samples, buffer_state="values"))
    by_position = _opens_during_restore(factory, _snapshot_after(factory, samples))
    return by_position - by_value, by_value


@pytest.mark.parametrize("name", ["gzip_lines", "csv_rows", "tar_members", "webdataset", "zip_members", "tfrecords"])
def test_the_buffer_restore_opens_each_file_once(name: str, root: str) -> None:
    factory = functools.partial(shuffled, name, root, 10)
    assert _shuffle_record(_snapshot_after(factory, 1))["buffered"] == 10
    by_buffer, _ = _buffer_opens(factory, 1)
    # 10 buffered samples (tar: members), of files of 5 to 17 samples: one by one, a file would be
    # opened once per sample (a webdataset sample: once per member)
    assert by_buffer and set(by_buffer.values()) == {1}, by_buffer


@pytest.mark.parametrize("name", ["gzip_lines", "csv_dicts", "tar_members", "webdataset", "zip_members", "tfrecords"])
def test_a_buffered_file_that_changed_is_refused(name: str, root: str) -> None:
    """The file changed is one that only the buffer's samples come from (the reader has left it)."""
    factory = functools.partial(shuffled, name, root, 25)
    by_buffer, by_readers = _buffer_opens(factory, 1)
    changed = sorted(set(by_buffer) - set(by_readers))
    assert changed, (by_buffer, by_readers)
    snap = _snapshot_after(factory, 1)
    path = os.path.join(root, changed[0])
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    refused = f"{re.escape(changed[0])} changed since the snapshot was saved"
    with pytest.raises(snapshot.RestoreError, match=refused), \
            snapshot.DataLoader2(factory(), buffer_state="positions") as loader:
        loader.restore_snapshot(snap)
        next(iter(loader))


class _CountingFile(io.FileIO):
    """A real local file that counts the bytes read from it, by file name."""

    def __init__(self, path: str, counts: collections.Counter[str]) -> None:
        super().__init__(path)
        self._name, self._counts = os.path.basename(path), counts

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        self._counts[self._name] += len(data or b"")
        return data

    def readinto(self, buffer: Any) -> int:
        n = super().readinto(buffer) or 0
        self._counts[self._name] += n
        return n

    def readall(self) -> bytes:
        data = super().readall()
        self._counts[self._name] += len(data)
        return data


def _bytes_read_by_restore(factory: Any, snap: snapshot.Snapshot) -> collections.Counter[str]:
    """Bytes read from each file by a restore from ``snap`` and its first sample (binary files)."""
    counts: collections.Counter[str] = collections.Counter()

    def counting_open(file: Any, mode: str, buffering: int = -1, encoding: Any = None) -> Any:
        assert mode == "rb", mode
        return io.BufferedReader(_CountingFile(file, counts), buffering if buffering > 0 else io.DEFAULT_BUFFER_SIZE)

    _restore_opening_with(counting_open, factory, snap)
    return counts


def _restore_reads(factory: Any, samples: int) -> collections.Counter[str]:
    """Bytes read from each file by the buffer's restore (by position, less by value)."""
    by_value = _bytes_read_by_restore(factory, _snapshot_after(factory, samples, buffer_state="values"))
    return _bytes_read_by_restore(factory, _snapshot_after(factory, samples)) - by_value


def test_the_buffer_restore_inflates_each_gzip_file_once(root: str) -> None:
    by_buffer = _restore_reads(functools.partial(shuffled, "gzip_lines", root, 10), 1)
    assert by_buffer and all(read <= os.path.getsize(os.path.join(root, f)) for f, read in by_buffer.items()), by_buffer


#: what ``tarfile.open(mode="r:*")`` reads first, trying each compression
PROBE = 24 * 1024


def _write_shards(folder: str) -> str:
    """2 tar shards of 40 samples of 3 members (a 3 KB, a 200-byte and a 2-byte member)."""
    os.makedirs(folder, exist_ok=True)
    for shard in range(2):
        with tarfile.open(os.path.join(folder, f"big-{shard}.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(40):
                for ext, size in (("txt", 3000), ("json", 200), ("cls", 2)):
                    data = (f"{shard}/{i}/{ext} " * size).encode()[:size]
                    info = tarfile.TarInfo(f"s{shard}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder


def big_samples(folder: str, members: bool) -> Any:
    tar = td.TarArchiveLoader(FileOpener(IterableWrapper(sorted(
        os.path.join(folder, n) for n in os.listdir(folder))), mode="b"))
    return Shuffler(Mapper(tar, corpus.read_member) if members else Mapper(td.WebDataset(tar), corpus.decode_sample),
                    buffer_size=30)


@pytest.mark.parametrize("members", [True, False], ids=["tar_members", "webdataset"])
def test_the_buffer_restore_reads_each_member_once(members: bool, tmp_path: Any) -> None:
    """An archive's members are read where they lie, once: not read again by a read buffer that the
    headers of a webdataset sample's later members moved past them."""
    folder = _write_shards(str(tmp_path / "shards"))
    factory = functools.partial(big_samples, folder, members)
    assert_resumes_exactly(factory, epochs=1, cuts=[Cut(0, 1), Cut(0, 20)], strategies=("state",), via_file=False,
                           buffer_state="positions")
    by_buffer = _restore_reads(factory, 1)
    assert set(by_buffer) == {"big-0.tar"}, by_buffer  # 30 samples (members) of the first shard's 40 (120)
    assert by_buffer["big-0.tar"] <= os.path.getsize(os.path.join(folder, "big-0.tar")) * 3 // 4 + PROBE, by_buffer
