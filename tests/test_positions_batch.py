"""A shuffle buffer saved by position is re-produced in one batch (``Reproducer.many``): a file
reader reopens each file once and reads its buffered samples in offset order. The restored
stream equals the uninterrupted one, for every reader, buffers spanning several files, the
same address buffered twice and with 2 workers; a changed file is refused; and each file is
opened once by the buffer's restore, whatever the number of its samples in the buffer."""

from __future__ import annotations

import collections
import functools
import os
import re
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
    assert_resumes_exactly(factory, epochs=2, cuts=_cuts(len(list(factory()))), strategies=("state", "auto"),
                           via_file=False, buffer_state="positions")


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


def _opens_during_restore(factory: Any, snap: snapshot.Snapshot) -> collections.Counter[str]:
    """How many times each file is opened by a restore from ``snap`` and its first sample: the real
    ``open`` of the module that reopens files, counted."""
    opened: collections.Counter[str] = collections.Counter()

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened[os.path.basename(file)] += 1
        return open(file, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_streams, "open", counting_open, raising=False)
        with snapshot.DataLoader2(factory(), buffer_state="positions") as loader:
            loader.restore_snapshot(snap)
            next(iter(loader))
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
