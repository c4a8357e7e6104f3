"""Hooks for torchdata 0.9's parsers of streams: ``readlines``, ``parse_csv``,
``parse_csv_as_dict``, ``parse_json_files`` and ``load_from_tfrecord``.

The line and record readers save the address of the stream they are reading and the byte
offset after the last line or record they yielded (plus a CSV file's header for
``parse_csv_as_dict``); a restore reopens the stream there. A compressed stream (through
``decompress``) is re-inflated from the start of the current file up to that offset, never
the files before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from snapshot.hooks._base import Stateless
from snapshot.hooks.builtin._reader import OffsetReading, StreamReading

__all__ = ["CSVParserIterator", "JsonParserIterator", "LineReaderIterator", "TFRecordLoaderIterator"]

OFFSET = "offset"
FIELDNAMES = "fieldnames"


def _lines(stream: Any, skip: int) -> Iterator[Any]:
    """The lines of ``stream`` after the first ``skip`` (as iterating it gives them), read with
    ``readline`` so that ``tell()`` stays valid; the stream is closed at the end."""
    readline = stream.readline
    try:
        for _ in range(skip):
            if not readline():
                return
        while True:
            line = readline()
            if not line:
                return
            yield line
    finally:
        stream.close()


class _LineBased(StreamReading):
    """A reader of lines whose position is the byte offset after the last line it used."""

    def start(self, path: str, stream: Any) -> Iterator[Any]:
        return self.samples(path, _lines(stream, self.datapipe._helper._skip_lines), None)

    def resume(self, path: str, address: dict[str, Any], position: Any) -> Iterator[Any]:
        stream = self.reopen(address, position[OFFSET])
        return self.samples(path, _lines(stream, 0), position)

    def samples(self, path: str, lines: Iterator[Any], position: Any) -> Iterator[Any]:
        raise NotImplementedError

    def position(self) -> Any:
        return {OFFSET: self._stream.tell()}


class LineReaderIterator(_LineBased):
    """``readlines``: the lines of each stream; state: the stream's address and the byte offset
    after the last line yielded."""

    def samples(self, path: str, lines: Iterator[Any], position: Any) -> Iterator[Any]:
        helper = self.datapipe._helper
        return iter(helper.return_path(helper.decode(helper.strip_newline(lines)), path=path))


class CSVParserIterator(_LineBased):
    """``parse_csv`` and ``parse_csv_as_dict``: the rows of each stream; state: the stream's address,
    the byte offset after the last row yielded and (for dicts) the file's header."""

    def __init__(self, datapipe: Any, inputs: Any):
        super().__init__(datapipe, inputs)
        self._reader: Any = None

    def samples(self, path: str, lines: Iterator[Any], position: Any) -> Iterator[Any]:
        dp, helper = self.datapipe, self.datapipe._helper
        params = dict(dp.fmtparams)
        if position is not None and position.get(FIELDNAMES) is not None:
            params["fieldnames"] = position[FIELDNAMES]
        self._reader = dp._csv_reader(helper.decode(lines), **params)
        return iter(helper.return_path(helper.as_tuple(self._reader), path=path))

    def position(self) -> Any:
        names = getattr(self._reader, "_fieldnames", None)
        return {OFFSET: self._stream.tell(), FIELDNAMES: list(names) if names is not None else None}


class JsonParserIterator(Stateless):
    """``parse_json_files``: ``(path, json.loads(stream.read()))`` per stream."""

    def next(self) -> Any:
        name, stream = next(self.inputs[0])
        data = stream.read()
        stream.close()
        return name, json.loads(data, **self.datapipe.kwargs)


class TFRecordLoaderIterator(OffsetReading):
    """``load_from_tfrecord``: the examples of each stream; state: the stream's address and the byte
    offset after the last record yielded."""

    def read(self, path: str, stream: Any) -> Iterator[Any]:
        from torchdata.datapipes.iter.util import tfrecordloader as tf
        from torchdata.datapipes.iter.util.protobuf_template import _tfrecord_example_pb2 as pb2

        for record in tf.iterate_tfrecord_file(stream):
            example = pb2.SequenceExample()
            example.ParseFromString(record)
            yield tf.parse_tfrecord_sequence_example(example, self.datapipe.spec)
